"""``perfkit query DIR "SQL"``: SQL over a results folder, read in place by DuckDB.

Every results file under DIR (as :func:`perfkit.load` finds them) is one table named ``results``:
files with different columns (rows of different notebooks) line up by column name, a column a
file lacks reading as NULL, types widened where they differ
(https://duckdb.org/docs/data/multiple_files/combining_schemas). DuckDB reads the Parquet files
in place: only the columns the query names, skipping row groups whose statistics rule out its
filter, in parallel, without loading DIR into memory first.

Where the folder has an index (:mod:`perfkit.core.results_index`, built by the first question
over a big writable folder, or ``perfkit index DIR``), the table is its few parts, rows of
removed or changed files masked out, beside the files it does not hold as they are now: the
same rows, without opening every file.

How the table is made from files: DuckDB's ``union_by_name=true`` opens and keeps every file's
schema at bind time, which over thousands of small files costs more than reading them whole
(10,000 files: ~20 s and 1.5 GB here; duckdb/duckdb#12730, #15435). Instead the files are
grouped by their exact Parquet schema (``parquet_schema()``, read in batches), each group is one
``read_parquet(files)`` (identical schemas need no union), and the groups are joined with
``UNION ALL BY NAME``; past ``_MAX_GROUPS`` distinct schemas it falls back to ``union_by_name``.

The answer is printed as a table, or written whole with ``--csv PATH`` / ``--parquet PATH``
(DuckDB writes it, streaming).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

from ..core.errors import BadInputError
from ..core.results_files import result_files

__all__ = ["query", "connect", "require_duckdb", "add_query_command", "run_query", "HELP"]

HELP = """\
Run SQL over every results file under DIR, as one table named `results` (DuckDB reads the
Parquet files in place; files with different columns are combined by column name, a missing
column is NULL). Only the columns and row groups the query needs are read.

  perfkit query runs/nightly "SELECT batch_size, median(tokens_per_s) FROM results
                              WHERE status = 'ok' GROUP BY batch_size ORDER BY batch_size"
  perfkit query runs/nightly "SELECT * FROM results WHERE status <> 'ok'" --csv failures.csv

Columns carry their unit in their name (step_time_s, tokens_per_s, peak_mem_bytes). Needs the
query extra: pip install 'perfkit[query]'. Exit 2 on bad input (no results, bad SQL).
"""


def require_duckdb() -> None:
    """Raise :class:`BadInputError` naming the extra when DuckDB is not installed."""
    if importlib.util.find_spec("duckdb") is None:
        raise BadInputError("perfkit query needs the query extra (DuckDB): pip install 'perfkit[query]'")


def connect(directory: str | Path):
    """A DuckDB connection with the view ``results`` over every results file under ``directory``."""
    directory = Path(directory)
    if not directory.exists():
        raise BadInputError(f"results directory {str(directory)!r} does not exist")
    files = result_files(directory) if directory.is_dir() else [directory]
    if not files:
        raise BadInputError(f"no results files under {str(directory)!r} (a sweep's --out holds results/*.parquet)")
    require_duckdb()
    import duckdb

    con = duckdb.connect()
    if directory.is_dir():
        from ..core.results_index import plan

        how = plan(directory, files)
        if how is not None and _indexed_view(con, how):
            return con
    groups = _by_schema(con, [str(f) for f in files])
    if len(groups) > _MAX_GROUPS:
        con.read_parquet([f for g in groups for f in g], union_by_name=True).to_view("results")
        return con
    for i, group in enumerate(groups):
        con.read_parquet(group).to_view(f"_results_{i}")
    con.execute("CREATE VIEW results AS " + " UNION ALL BY NAME ".join(
        f"SELECT * FROM _results_{i}" for i in range(len(groups))))
    return con


_MAX_GROUPS, _BATCH = 64, 2000


def _indexed_view(con, how) -> bool:
    """The view ``results`` over the folder's index parts (rows of removed or changed files
    masked out by file id) and the files the index does not hold as they are now; False (and
    nothing made) past ``_MAX_GROUPS`` groups."""
    import pyarrow as pa

    from ..core.results_index import ID

    if not how.parts:  # nothing indexed: the caller groups every file itself, once
        return False
    groups = _by_schema(con, [str(f) for f in how.direct]) if how.direct else []
    if len(how.parts) + len(groups) > _MAX_GROUPS:
        return False
    selects = []
    live = [i for p in how.parts if p.live_ids is not None for i in p.live_ids]
    if live:  # file ids are unique across parts: one table of the current ones masks them all
        con.register("_perfkit_live", pa.table({"id": pa.array(live, pa.int64())}))
    for part in how.parts:
        path = str(part.path).replace("'", "''")
        where = f' WHERE "{ID}" IN (SELECT id FROM _perfkit_live)' if part.live_ids is not None else ""
        selects.append(f"""SELECT * EXCLUDE ("{ID}") FROM read_parquet('{path}'){where}""")
    for i, group in enumerate(groups):
        con.read_parquet(group).to_view(f"_results_{i}")
        selects.append(f"SELECT * FROM _results_{i}")
    con.execute("CREATE VIEW results AS " + " UNION ALL BY NAME ".join(selects))
    return True


def _by_schema(con, files: list[str]) -> list[list[str]]:
    """The files grouped by their exact Parquet schema (every column's name, physical, logical
    and DuckDB type, in order), in the order of each group's first file."""
    groups: dict[str, list[str]] = {}
    for start in range(0, len(files), _BATCH):
        batch = files[start:start + _BATCH]
        sigs = dict(con.execute(
            "SELECT file_name, md5(string_agg(CAST(ROW(name, type, type_length, repetition_type, num_children, "
            "converted_type, scale, precision, logical_type, duckdb_type) AS VARCHAR), ';' ORDER BY column_id)) "
            "FROM parquet_schema(?) GROUP BY file_name", [batch]).fetchall())
        for f in batch:
            groups.setdefault(sigs[f], []).append(f)
    return list(groups.values())


def _relation(con, sql: str):
    import duckdb

    try:
        rel = con.sql(sql)
    except duckdb.Error as exc:
        raise BadInputError(f"SQL: {' '.join(str(exc).split())}") from None
    if rel is None:
        raise BadInputError("the SQL returned no table: give a query (SELECT ...) over `results`")
    return rel


def query(directory: str | Path, sql: str) -> pd.DataFrame:
    """The answer to ``sql`` over the results under ``directory`` (table ``results``), as a DataFrame."""
    con = connect(directory)
    import duckdb

    try:
        rel = _relation(con, sql)
        try:
            return rel.to_arrow_table().to_pandas()
        except duckdb.Error as exc:
            raise BadInputError(f"SQL: {' '.join(str(exc).split())}") from None
    finally:
        con.close()


def add_query_command(sub) -> None:
    """Register ``perfkit query`` on the CLI's subparsers."""
    p = sub.add_parser("query", help="SQL over a results folder (table `results`, DuckDB reads the Parquet in place)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR", help="a results directory (a sweep's --out, a run's --out)")
    p.add_argument("sql", metavar="SQL", help="the query; the table is `results`")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", metavar="PATH", help="write the whole answer as CSV instead of printing it")
    out.add_argument("--parquet", metavar="PATH", help="write the whole answer as Parquet instead of printing it")
    p.add_argument("--max-rows", type=int, default=100, metavar="N",
                   help="rows to print (default 100; --csv/--parquet write them all)")
    p.set_defaults(func=run_query)


def run_query(args) -> int:
    """``perfkit query``: print the answer, or write it with ``--csv``/``--parquet``."""
    require_duckdb()
    import duckdb

    if args.max_rows < 1:
        raise BadInputError("--max-rows must be at least 1")
    con = connect(args.dir)
    try:
        rel = _relation(con, args.sql)
        target = args.csv or args.parquet
        try:
            if target:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                (rel.write_csv if args.csv else rel.write_parquet)(str(target))
                print(f"query: wrote {target}", file=sys.stderr)
                return 0
            frame = rel.limit(args.max_rows + 1).to_arrow_table().to_pandas()
        except duckdb.Error as exc:
            raise BadInputError(f"SQL: {' '.join(str(exc).split())}") from None
    finally:
        con.close()
    more = len(frame) > args.max_rows
    frame = _whole_numbers(frame.head(args.max_rows))
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_colwidth", 60):
        print(frame.to_string(index=False) if len(frame.columns) else "(no columns)")
    if more:
        print(f"(first {args.max_rows} rows shown: --max-rows N for more, --csv/--parquet PATH for all)",
              file=sys.stderr)
    return 0


def _whole_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """Float columns holding only whole numbers shown as integers (a batch size is 16, not 16.0:
    Parquet stores it as a float where other workloads' rows leave it empty); empty cells blank."""
    out = frame.copy()
    for name in out.columns:
        col = out[name]
        if pd.api.types.is_float_dtype(col):
            values = col.dropna()
            if len(values) and bool((values == values.round()).all()) and bool((values.abs() < 2**53).all()):
                out[name] = [("" if pd.isna(v) else str(int(v))) for v in col]
    return out
