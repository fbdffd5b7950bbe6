"""``perfkit.load(DIR, columns=..., filters=...)``: column selection and filters pushed down to
``pyarrow.dataset``, so one question over thousands of results files reads their footers and the
asked columns, not every file whole. Called by :func:`perfkit.core.results.load`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from .errors import BadInputError

__all__ = ["scan"]


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


def scan(files: list[Path], columns, filters, statuses, directory: Path) -> tuple[pd.DataFrame, dict]:
    """``load`` with columns and filters pushed down to ``pyarrow.dataset``.

    Files are scanned in chunks of ``_CHUNK``, a few at once: each file's footer is read once
    (the fragment keeps it for the scan, which skips row groups whose statistics rule the filter
    out and reads only the columns asked for and those the filter names), and memory stays
    bounded by a chunk's footers plus the rows kept. Rows of different notebooks have different
    columns: a chunk's schema is the union of its files' (a column a file lacks reads as null),
    and the chunks' answers are concatenated with type promotion (``null`` → any, ``int`` →
    ``double``). A chunk that lacks a column the filter names is scanned last, with the type the
    other chunks found for it."""
    import concurrent.futures as cf

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

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
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))

    def scan(source, schema):
        dataset = ds.FileSystemDataset(list(source.get_fragments()), schema, fmt, source.filesystem)
        wanted = None if columns is None else [c for c in columns if c in schema.names]
        try:
            return dataset.to_table(columns=wanted, filter=expr, use_threads=False)
        except pa.ArrowInvalid as exc:
            if "No match for FieldRef" in str(exc):
                return None  # the (expression) filter names a column this chunk lacks
            raise

    def chunk(paths):
        source = ds.dataset([str(p) for p in paths], format=fmt)
        schemas = [f.physical_schema for f in source.get_fragments()]  # read once, kept for the scan
        schema = _unified(schemas, needed)
        table = scan(source, schema) if by_filter <= {n for s in schemas for n in s.names} else None
        return table, schema, {raw for s in schemas if (raw := (s.metadata or {}).get(b"perfkit.units"))}

    chunks = [files[i:i + _CHUNK] for i in range(0, len(files), _CHUNK)]
    try:
        with cf.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(chunks))) as pool:
            parts = list(pool.map(chunk, chunks))
        whole = _unified([schema for _, schema, _ in parts], None)
        if missing := [c for c in list(columns or []) + sorted(by_filter) if c not in whole.names]:
            raise BadInputError(f"column {missing[0]!r} is in no results file under {str(directory)!r}; "
                                f"columns there include: {', '.join(sorted(whole.names)[:30])}")
        tables = []
        for paths, (table, _, _) in zip(chunks, parts):
            if table is None:  # scanned again with the columns' types from the other chunks
                table = scan(ds.dataset([str(p) for p in paths], format=fmt), whole)
                if table is None:
                    raise BadInputError(f"the filter {filters} names a column that is in no results file "
                                        f"under {str(directory)!r}")
            tables.append(table)
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise BadInputError(f"cannot read {str(directory)!r} with columns={columns} filters={filters}: "
                            f"{str(exc).splitlines()[0]}") from None
    if columns is not None:
        table = table.select(columns)
    units: dict = {}
    for raw in {raw for _, _, raws in parts for raw in raws}:
        units.update(json.loads(raw))
    frame = table.replace_schema_metadata(None).to_pandas()
    return frame, {c: u for c, u in units.items() if c in frame.columns}


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
