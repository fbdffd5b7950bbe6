"""The files of a results folder, at the bottom of the store: which files are results, how many
are read at once, how their units metadata and their tables merge. :mod:`perfkit.core.results`
(record, load), :mod:`perfkit.core.results_scan` (pushdown) and :mod:`perfkit.core.results_index`
(the compacted copy) all stand on it, in that order: none imports one above it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

__all__ = ["TMP_MARK", "IGNORE_MARKER", "result_files", "read_tables", "merge_units", "concat_to_pandas",
           "parquet_format"]

#: In the name of a results file being written (temp, fsync, rename): never read as results.
TMP_MARK = ".tmp-"

#: A folder holding this file is not read for results: an export's copies of the Parquet files
#: (the MLflow store under DIR keeps them as artifacts) must not be loaded twice.
IGNORE_MARKER = ".perfkit-ignore"


def result_files(directory: str | Path) -> list[Path]:
    """Every complete results file under ``directory`` (temp files of interrupted writes excluded,
    and folders that hold an ``IGNORE_MARKER`` file)."""
    found = []
    for root, dirs, names in os.walk(directory):
        if IGNORE_MARKER in names:
            dirs.clear()
            continue
        dirs[:] = [d for d in dirs if d != ".ipynb_checkpoints"]
        found.extend(Path(root, n) for n in names if n.endswith(".parquet") and TMP_MARK not in n)
    return sorted(found)


def read_tables(files: list[Path]) -> list:
    """The Arrow tables of ``files``, read in parallel (pyarrow releases the GIL;
    ``ParquetFile.read`` skips the dataset machinery of ``read_table``), schema metadata kept."""
    import concurrent.futures as cf

    import pyarrow.parquet as pq

    if not files:
        return []
    with cf.ThreadPoolExecutor(max_workers=min(4, len(files))) as pool:
        return list(pool.map(lambda path: pq.ParquetFile(path).read(use_threads=False), files))


def merge_units(raw_units: Iterable[bytes | None]) -> dict:
    """One ``{column: unit}`` from the ``perfkit.units`` metadata of several files, missing ones
    skipped (a column's unit follows from its name, so files never disagree)."""
    units: dict = {}
    for raw in raw_units:
        if raw:
            units.update(json.loads(raw))
    return units


def concat_to_pandas(tables: list) -> pd.DataFrame:
    """Arrow tables of different files as one DataFrame: one Arrow concatenation with type
    promotion (``null`` → any, ``int`` → ``double``). Where two notebooks use one column name for
    values of different types (an int64 ``count`` of elements beside a bool ``count`` flag) no
    Arrow type holds both, but one such pair must not make a whole folder unreadable: that column
    becomes Python objects, each value as written; every other column keeps its type."""
    import pyarrow as pa

    try:
        return pa.concat_tables(tables, promote_options="permissive").to_pandas()
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        kinds: dict[str, set] = {}
        for t in tables:
            for column in t.schema:
                if not pa.types.is_null(column.type):
                    kinds.setdefault(column.name, set()).add(column.type)
        mixed = [name for name, types in kinds.items() if len(types) > 1]
        frames = [t.to_pandas().astype({c: object for c in mixed if c in t.column_names}) for t in tables]
        return pd.concat(frames, ignore_index=True, sort=False)


def parquet_format():
    """The Parquet format every scan here uses (no pre-buffering: small files, read once)."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))
