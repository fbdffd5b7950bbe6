"""Endings a scheduler decided: what the Slurm and Ray drivers record for a configuration whose
task was ended (cancelled, timed out, lost with its node) before it could record its own.

The task records its own ending whenever it can (:func:`.engine.run_one`); a driver that learns
from its scheduler that the task is gone calls :func:`settle`, which writes the same two things
an ending always has: the final ledger entry (the ``running`` entry of that attempt, finished;
or, for a task that never started, an entry of its own) and a status row in the configuration's
results file, so that every configuration leaves a row whatever ended it.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...core.results import record
from ..execute import Outcome, banner, has_status_row
from .engine import config_paths
from .ledger import RUNNING, Ledger, LedgerEntry
from .spec import Config

__all__ = ["settle", "outcome_of"]


def settle(c: Config, attempt: int, status: str, error_name: str, message: str, *, out_dir: Path,
           ledger: Ledger, slot: str) -> LedgerEntry:
    """Record ``status`` as the ending of ``c``'s ``attempt`` (ledger entry and status row) unless
    the task wrote an ending of that attempt after all; the ending either way. ``slot`` names
    where a task that never started was to run."""
    last = ledger.state().get(c.config_id)
    if last is not None and last.status != RUNNING and last.attempt >= attempt:
        return last
    nb, results_path = config_paths(c, out_dir)
    now = time.time()
    if last is not None and last.status == RUNNING and last.attempt >= attempt:
        entry = LedgerEntry(**{**last.__dict__, "status": status, "end": now, "duration_s": now - (last.start or now),
                               "error_name": error_name, "message": message, "cell": None})
        if nb.exists():
            banner(nb, f"perfkit: this configuration ended <b>{status}</b>: {message.splitlines()[0]}")
    else:  # never started (cancelled while pending, or it died before writing its first entry)
        results_path.unlink(missing_ok=True)
        entry = LedgerEntry(config_id=c.config_id, status=status, attempt=attempt, notebook=str(c.notebook),
                            params=c.params, start=None, end=now, duration_s=0.0, error_name=error_name,
                            message=message, output_notebook=str(nb), results_path=str(results_path),
                            slot=slot, variant=c.variant_name, round=c.round)
    if not has_status_row(results_path, status, c.config_id):
        record([{}], status=status, reason=f"{error_name}: {message}", context=c.run_context(results_path))
    ledger.append(entry)
    return entry


def outcome_of(c: Config, e: LedgerEntry, out_dir: Path) -> Outcome:
    """The :class:`~perfkit.run.execute.Outcome` a ledger entry records (a driver's view of a task)."""
    nb, res = config_paths(c, out_dir)
    return Outcome(config_id=c.config_id, status=e.status, error_name=e.error_name, message=e.message, cell=e.cell,
                   output_notebook=Path(e.output_notebook) if e.output_notebook else nb,
                   results_path=Path(e.results_path) if e.results_path else res,
                   started_at=e.start or 0.0, duration_s=e.duration_s or 0.0)
