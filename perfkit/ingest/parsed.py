"""What a reader of another tool's output returns (:mod:`perfkit.ingest`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ParsedRun"]


@dataclass
class ParsedRun:
    """What one file says: its rows (dicts in perfkit's columns: collectives, inference, ...) and
    the facts of the run it records (its tool, library, devices and hosts), for the rows'
    fingerprint (:func:`perfkit.ingest.store.import_files`)."""

    rows: list[dict]
    facts: dict = field(default_factory=dict)
    finished: bool = True
    """False: the run stopped before its end (``reason`` says how; nccl-tests' ``--partial``)."""
    reason: str | None = None
