"""A results folder's profiled runs: which rows name traces, and where their rank files are now.

A run's rows carry ``trace_path`` (rank 0) and ``rank_trace_paths`` (every rank), absolute where the
run wrote them; a folder copied off a cluster node holds the same ``traces/...`` itself, which wins.
The report's Traces section and ``perfkit predict`` both read runs this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["TracedRun", "traced_rows", "traced_runs"]


@dataclass(frozen=True)
class TracedRun:
    """One profiled run of a configuration: its rank files and the row that lists them."""

    config_id: str
    run: str
    """The run's folder name (a configuration may run several trainings, e.g. one per world size)."""
    paths: tuple[Path, ...]
    """One per rank, as found on disk (see :func:`traced_runs`)."""
    row: dict

    @property
    def label(self) -> str:
        return f"{self.config_id}/{self.run}"


def traced_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that name a trace (``trace_path`` not null)."""
    if "trace_path" not in df:
        return df.iloc[0:0]
    return df[df["trace_path"].notna()]


def _found(path: str, results_dir: Path | None) -> Path:
    """The trace file at ``path`` as recorded (absolute, where the run wrote it), unless
    ``results_dir`` holds the same ``traces/...`` itself: the folder reported on wins, whether
    it was copied off a cluster node or the original has gone."""
    recorded = Path(path)
    if results_dir is None or "traces" not in recorded.parts:
        return recorded
    tail = recorded.parts[len(recorded.parts) - 1 - recorded.parts[::-1].index("traces"):]
    mine = Path(results_dir, *tail)
    return mine if mine.exists() else recorded


def traced_runs(rows: pd.DataFrame, results_dir: str | Path | None = None) -> list[TracedRun]:
    """One :class:`TracedRun` per distinct set of rank files among ``rows``, in row order."""
    runs: dict[tuple, TracedRun] = {}
    results_dir = Path(results_dir) if results_dir is not None else None
    for row in traced_rows(rows).to_dict("records"):
        ranks = row.get("rank_trace_paths")
        ranks = [p for p in ranks if isinstance(p, str)] if ranks is not None and len(ranks) else [row["trace_path"]]
        paths = tuple(_found(p, results_dir) for p in ranks)
        runs.setdefault(paths, TracedRun(config_id=str(row.get("config_id", "")), run=paths[0].parent.name,
                                         paths=paths, row=row))
    return list(runs.values())
