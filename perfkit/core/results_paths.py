"""Paths a row stores, kept relative to its results folder: a folder copied off a cluster node,
or shared, still finds its traces and memory snapshots.

A row's ``trace_path``, ``rank_trace_paths``, ``memory_snapshot_path`` and
``memory_snapshot_oom_paths`` name files perfkit wrote beside the rows (``DIR/traces/...``,
``DIR/.../memory/...``). :func:`relative_to_folder` writes them relative to the results folder
``DIR`` (POSIX separators); :func:`resolved_in_folder` makes them absolute again when rows are
loaded, against the folder they were loaded from. A path recorded absolute by an older perfkit
that no longer exists is re-anchored at the folder by its ``traces``/``memory`` tail when that
file is there, else to the one file under the folder whose name ends with its name (issue 55: a
copied H200 folder said "No such file or directory: '…/sweep/traces/…'"). A path outside the
folder stays as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

__all__ = ["PATH_COLUMNS", "relative_to_folder", "resolved_in_folder", "results_folder_of"]

PATH_COLUMNS = ("trace_path", "rank_trace_paths", "memory_snapshot_path", "memory_snapshot_oom_paths")
"""Columns that name files beside the rows: one path, a list of them, or a JSON list of them."""
_ANCHORS = ("traces", "memory")


def results_folder_of(results_file: str | Path) -> Path:
    """``DIR`` of ``DIR/results/<config_id>.parquet``."""
    return Path(results_file).resolve().parent.parent


def _map(value, fn):
    if isinstance(value, str) and value.startswith("["):
        try:
            return json.dumps([fn(v) for v in json.loads(value)])
        except ValueError:
            return fn(value)
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return [fn(v) if isinstance(v, str) else v for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        return [fn(v) if isinstance(v, str) else v for v in value.tolist()]
    return value


def relative_to_folder(frame: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """``frame`` with its :data:`PATH_COLUMNS` relative to ``folder`` where they lie under it."""
    folder = Path(folder).resolve()

    def rel(text: str) -> str:
        path = Path(text)
        if not path.is_absolute():
            return text
        try:
            return path.resolve().relative_to(folder).as_posix()
        except ValueError:
            return text
    present = [c for c in PATH_COLUMNS if c in frame]
    if not present:
        return frame
    frame = frame.copy()
    for c in present:
        frame[c] = frame[c].map(lambda v: _map(v, rel))
    return frame


def resolved_in_folder(frame: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """``frame`` with its :data:`PATH_COLUMNS` absolute: relative ones against ``folder``, missing
    absolute ones re-anchored there by their ``traces``/``memory`` tail where that file exists."""
    folder = Path(folder)

    def absolute(text: str) -> str:
        path = Path(text)
        if not path.is_absolute():
            return os.fspath(folder / path)
        if path.exists():
            return text
        parts = path.parts
        for anchor in _ANCHORS:
            if anchor in parts:
                tail = parts[len(parts) - 1 - parts[::-1].index(anchor):]
                candidate = folder.joinpath(*tail)
                if candidate.exists():
                    return os.fspath(candidate)
        # Last, a folder whose files were renamed when it was shared (the H200 reference keeps its
        # rank0.json.gz as trace/hf-llama-bf16-b16-rank0.json.gz): the one file under it whose
        # name ends with this one's; none or several, and the path stays as recorded.
        found = [f for f in _files(folder) if f.name.endswith(path.name)]
        return os.fspath(found[0]) if len(found) == 1 else text

    listing: list[Path] | None = None

    def _files(root: Path) -> list[Path]:
        nonlocal listing
        if listing is None:
            listing = [f for pattern in ("*.json", "*.json.gz", "*.pickle") for f in root.rglob(pattern)
                       if "results" not in f.relative_to(root).parts[:1]]
        return listing
    present = [c for c in PATH_COLUMNS if c in frame and frame[c].notna().any()]
    for c in present:
        frame[c] = frame[c].map(lambda v: _map(v, absolute) if v is not None else v)
    return frame
