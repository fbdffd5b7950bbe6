"""What a reader of another tool's output returns (:mod:`perfkit.ingest`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from perfkit.core.errors import BadInputError

__all__ = ["ParsedRun", "json_records"]


def json_records(text: str, source: str) -> list:
    """A file's JSON records: one document (a list is its items), or one object per line (JSON
    lines: vLLM's appended runs, rccl-tests' ``--output_file``); a bad line is named."""
    if not text.strip():
        raise BadInputError(f"{source} is empty")
    try:
        whole = json.loads(text)
        return whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        pass
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise BadInputError(f"{source} line {number}: not JSON ({err.msg} at column {err.colno})") from None
    return records


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
    parts: list["ParsedRun"] = field(default_factory=list)
    """A file of several runs (nccl-tests' binaries one after another): each run with its own
    facts; ``rows`` are all of theirs. Empty for a file of one run."""
