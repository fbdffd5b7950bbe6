"""``perfkit.load(DIR, columns=..., filters=...)``: column selection and filters pushed down to
``pyarrow.dataset``, so one question over thousands of results files reads their footers and the
asked columns, not every file whole. Called by :func:`perfkit.core.results.load`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .errors import BadInputError
from .results_files import concat_to_pandas, merge_units, parquet_format, read_tables

__all__ = ["scan", "read_all"]


def _filter_expression(filters, statuses):
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    expr = None
    if filters is not None:
        if isinstance(filters, pc.Expression):
            expr = filters
        else:
            try:
                expr = pq.filters_to_expression(list(filters))
            except (TypeError, ValueError) as exc:
                raise BadInputError(
                    f"filters must be a pyarrow expression or a DNF list like [(\"batch_size\", \"==\", 64)]: {exc}"
                ) from None
    if statuses is not None:
        by_status = ds.field("status").isin(sorted(set(statuses)))
        expr = by_status if expr is None else expr & by_status
    return expr


_CHUNK = 64  # files per dataset: their footers stay cached until the chunk is scanned


@dataclass
class _Source:
    """What one scan reads: a chunk of results files, or one part of the folder's index."""

    fragments: list
    schemas: list
    """The physical schema of each of its files (an index part: the one schema its files share)."""
    units: set
    extra: str | None = None
    """A column read besides the asked ones to put rows in the files' order: the index's file id,
    or ``__filename`` for a file read directly beside the index; None in a plain scan."""
    mask: object = None
    """A filter keeping the rows of the part's current files (the others were removed or changed)."""
    at: list | None = None
    """Beside an index: the listing position of each of ``schemas``' files (a part: of its first)."""


def scan(files: list[Path], columns, filters, statuses, directory: Path) -> tuple[pd.DataFrame, dict]:
    """``load`` with columns and filters pushed down to ``pyarrow.dataset``.

    Files are scanned in chunks of ``_CHUNK``, a few at once: each file's footer is read once
    (the fragment keeps it for the scan, which skips row groups whose statistics rule the filter
    out and reads only the columns asked for and those the filter names), and memory stays
    bounded by a chunk's footers plus the rows kept. Rows of different notebooks have different
    columns: a chunk's schema is the union of its files' (a column a file lacks reads as null),
    and the chunks' answers are concatenated with type promotion (``null`` → any, ``int`` →
    ``double``). A chunk that lacks a column the filter names is scanned last, with the type the
    other chunks found for it.

    Where the folder has an index (:mod:`perfkit.core.results_index`; the first question over a
    big writable folder builds it), its parts are the chunks instead (one per Arrow schema, so
    each is scanned with its files' own types), beside the files it does not hold as they are
    now, and the rows are put back in the files' order: the same answer, from a few files. Any
    error there is answered by the plain scan (its answer, or its error)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    expr = _filter_expression(filters, statuses)
    if columns is not None:
        if isinstance(columns, str):
            raise BadInputError(f"columns takes a list of names, e.g. columns=[{columns!r}]")
        columns = list(dict.fromkeys(columns))
    if not files:
        names = columns if columns is not None else ["config_id", "status"]
        return pd.DataFrame({c: pd.Series(dtype="object") for c in names}), {}
    known = not isinstance(filters, pc.Expression)  # a DNF list names its columns; an expression does not
    by_filter = (_dnf_names(filters) if known else set()) | ({"status"} if statuses is not None else set())
    needed = set(columns) | by_filter if columns is not None and known else None
    q = _Question(columns, filters, expr, by_filter, needed, directory)
    if directory.is_dir():
        from .results_index import plan

        if (how := plan(directory, files)) is not None:
            try:
                return q.answer(_indexed_sources(how), how)
            except _NoSuchColumn:
                raise  # the index holds every current file's schema: the plain scan would say the same
            except (BadInputError, OSError, pa.lib.ArrowException):
                pass  # the plain scan gives the answer, or the error, as without an index
    return q.answer(_file_sources(files, q), None)


def _chunks(files: list[Path], extra: str | None) -> list:
    """The files in chunks of ``_CHUNK``, each opened (footers read) a few at once."""
    import concurrent.futures as cf

    import pyarrow.dataset as ds

    def chunk(paths):
        source = ds.dataset([str(p) for p in paths], format=parquet_format())
        fragments = list(source.get_fragments())
        schemas = [f.physical_schema for f in fragments]  # read once, kept for the scan
        return _Source(fragments, schemas, {raw for s in schemas if (raw := (s.metadata or {}).get(b"perfkit.units"))},
                       extra)

    chunks = [files[i:i + _CHUNK] for i in range(0, len(files), _CHUNK)]
    if not chunks:
        return []
    with cf.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(chunks))) as pool:
        return list(pool.map(chunk, chunks))


def _file_sources(files, q) -> list:
    try:
        return _chunks(files, None)
    except (_pa_errors()) as exc:
        raise q.unreadable(exc) from None


def _indexed_sources(how) -> list:
    import pyarrow.dataset as ds

    from .results_index import ID

    sources = [_Source([p.fragment], [p.schema], {p.units} if p.units else set(), ID,
                       None if p.live_ids is None else ds.field(ID).isin(p.live_ids), [p.first]) for p in how.parts]
    for src in _chunks(how.direct, "__filename"):
        src.at = [how.position[f.path] for f in src.fragments]
        sources.append(src)
    return sources


def _pa_errors() -> tuple:
    import pyarrow as pa

    return pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError


class _NoSuchColumn(BadInputError):
    """A column the question names is in no current file."""


@dataclass
class _Question:
    columns: list | None
    filters: object
    expr: object
    by_filter: set
    needed: set | None
    directory: Path

    def unreadable(self, exc) -> BadInputError:
        return BadInputError(f"cannot read {str(self.directory)!r} with columns={self.columns} "
                             f"filters={self.filters}: {str(exc).splitlines()[0]}")

    def scan(self, src: _Source, schema):
        import pyarrow as pa
        import pyarrow.dataset as ds

        from .results_index import ID

        full = schema.append(pa.field(ID, pa.int64())) if src.extra == ID else schema
        dataset = ds.FileSystemDataset(src.fragments, full, parquet_format(), src.fragments[0].filesystem)
        wanted = None if self.columns is None else [c for c in self.columns if c in schema.names]
        if src.extra is not None:
            wanted = (schema.names if wanted is None else wanted) + [src.extra]
        where = src.mask if self.expr is None else self.expr if src.mask is None else self.expr & src.mask
        try:
            return dataset.to_table(columns=wanted, filter=where, use_threads=False)
        except pa.ArrowInvalid as exc:
            if "No match for FieldRef" in str(exc):
                return None  # the (expression) filter names a column this chunk lacks
            raise

    def answer(self, sources: list, how) -> tuple[pd.DataFrame, dict]:
        import pyarrow as pa

        def first(src):
            schema = _unified(src.schemas, self.needed)
            names = {n for s in src.schemas for n in s.names}
            return self.scan(src, schema) if self.by_filter <= names else None, schema

        columns, filters = self.columns, self.filters
        try:
            parts = [first(src) for src in sources]
            whole = _unified([schema for _, schema in parts], None)
            if missing := [c for c in list(columns or []) + sorted(self.by_filter) if c not in whole.names]:
                raise _NoSuchColumn(f"column {missing[0]!r} is in no results file under {str(self.directory)!r}; "
                                    f"columns there include: {', '.join(sorted(whole.names)[:30])}")
            tables = []
            for src, (table, _) in zip(sources, parts):
                if table is None:  # scanned again with the columns' types from the other chunks
                    table = self.scan(src, whole)
                    if table is None:
                        raise _NoSuchColumn(f"the filter {filters} names a column that is in no results file "
                                            f"under {str(self.directory)!r}")
                tables.append(table)
            if how is not None:
                table = _in_file_order(tables, sources, how)
            else:
                table = pa.concat_tables(tables, promote_options="permissive")
        except _pa_errors() as exc:
            raise self.unreadable(exc) from None
        if columns is not None:
            table = table.select(columns)

        units = merge_units(raw for src in sources for raw in src.units)
        frame = table.replace_schema_metadata(None).to_pandas()
        return frame, {c: u for c, u in units.items() if c in frame.columns}


def _in_file_order(tables: list, sources: list, how):
    """The rows of index parts and direct files in the files' listing order (each file's rows in
    its own order), with columns in order of first appearance, as a plain scan returns them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    positions = []
    for i, (table, src) in enumerate(zip(tables, sources)):
        ids = table[src.extra]
        if src.extra == "__filename":
            paths = pc.dictionary_encode(ids.combine_chunks())
            at = np.array([how.position[p] for p in paths.dictionary.to_pylist()], dtype=np.int64)
            pos = at[paths.indices.to_numpy(zero_copy_only=False)] if len(at) else np.zeros(0, np.int64)
        else:
            pos = how.id_position[ids.to_numpy()]
        positions.append(pos)
        tables[i] = table.drop_columns([src.extra])
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.take(pc.sort_indices(pa.array(np.concatenate(positions)) if positions else pa.array([], pa.int64())))
    seen = sorted((at, s.names) for src in sources for at, s in zip(src.at, src.schemas))
    present = set(table.column_names)
    return table.select([n for n in dict.fromkeys(n for _, names in seen for n in names) if n in present])


def read_all(directory: Path, files: list[Path]) -> tuple[pd.DataFrame, dict] | None:
    """``load(DIR)`` (every row, every column) from the folder's index where it has one (new and
    changed files read directly, nothing written; a folder without one is not indexed for this: a
    one-off full read would pay for a build), equal to reading the files: the same rows in the
    files' order, columns in order of first appearance among files with rows, types promoted
    alike, a column no Arrow type holds (int64 here, bool there) as Python objects. None: read the files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from .results_index import ID, plan

    # A plain load never writes: a sweep that adds files between loads would rewrite the index
    # inside every read. Folding is left to pushdown questions, `perfkit query` and `perfkit index`.
    how = plan(directory, files, create=False, fold=False)
    if how is None or not how.parts:
        return None
    try:
        found = []  # (first position with rows, table, positions)
        units = set()
        for part in how.parts:
            table = pq.ParquetFile(part.path).read()
            if part.live_ids is not None:
                table = table.filter(pc.is_in(table[ID], value_set=pa.array(part.live_ids, pa.int64())))
            found.append((how.id_position[table[ID].to_numpy()], table.drop_columns([ID])))
            units.add(part.units)
        for f, table in zip(how.direct, read_tables(how.direct)):
            found.append((np.full(table.num_rows, how.position[str(f)], dtype=np.int64), table))
            units.add((table.schema.metadata or {}).get(b"perfkit.units"))
    except (OSError, pa.lib.ArrowException):
        return None
    found = sorted(((pos.min(), pos, t.replace_schema_metadata(None)) for pos, t in found if t.num_rows),
                   key=lambda x: x[0])
    if not found:
        return None
    order = np.argsort(np.concatenate([pos for _, pos, _ in found]), kind="stable")
    tables = [t for _, _, t in found]

    return concat_to_pandas(tables).iloc[order].reset_index(drop=True), merge_units(units)


def _dnf_names(filters) -> set[str]:
    names: set[str] = set()
    for item in filters or []:
        if isinstance(item, tuple) and item:
            names.add(str(item[0]))
        elif isinstance(item, list):
            names |= _dnf_names(item)
    return names


def _unified(schemas, needed: set[str] | None):
    import pyarrow as pa

    if needed is not None:
        schemas = [pa.schema([s.field(n) for n in s.names if n in needed]) for s in schemas]
    distinct = dict.fromkeys(s.remove_metadata() for s in schemas)  # most files of a sweep share one
    try:
        return pa.unify_schemas(list(distinct), promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise BadInputError(f"results files disagree on a column's type ({exc}); "
                            "ask for fewer columns, or load the files separately") from None
