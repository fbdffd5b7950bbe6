"""How busy a sweep kept its devices: the share of its wall time each slot spent measuring.

A configuration holds its slot's device for measuring from its first code cell to the release
before its first ``view`` cell (:data:`perfkit.run.execute.WINDOW_COLUMNS`; the whole notebook
without one). A slot's busy share is the sum of its configurations' windows over the sweep's wall
time; what is left is start-up, hand-over and viewing that was not overlapped. The sweep prints it
(:meth:`BusyShare.line`), appends it to ``DIR/ledger/sweeps.json-lines`` and the report shows it.

**Slurm and Ray** (:func:`allocation_share`). There a configuration is a task with its own
allocation, held from the task's start to its end, and nothing of the sweep holds a device between
tasks: what is paid for is the allocations. Their busy share is Σ windows ÷ Σ allocations' held
time (Slurm: ``sacct``'s elapsed time of each array task, never less than its ledger attempt; Ray:
the task's attempt in the ledger). The sweep's wall time, queue wait included, is printed beside it
but not divided by: a queue holds no device. View cells run inside each allocation (a job array's
tasks share no kernel pool to hand a device over to).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["BusyShare", "busy_share", "allocation_share", "append_summary", "read_summaries", "SUMMARY_FILENAME"]

#: Beside the configurations' event files in ``DIR/ledger/``; not ``*.jsonl``, which are those.
SUMMARY_FILENAME = "sweeps.json-lines"


@dataclass(frozen=True)
class BusyShare:
    wall_s: float
    """The sweep's wall time, seconds."""
    measured_s: dict[str, float]
    """Per slot: the sum of its configurations' measurement windows, seconds."""
    overlap: bool
    """Whether view cells ran beside the next configuration's measurement."""
    configs: int = 0
    """Configurations whose window is known."""
    ended_unix_s: float = field(default_factory=time.time)
    held_s: dict[str, float] | None = None
    """Slurm and Ray: per allocation (task), the seconds it held its device; None for a local
    sweep, whose slots are held for the sweep's wall time."""
    executor: str = "local"
    held_from: str = ""
    """Where ``held_s`` comes from (``sacct``, ``ledger``)."""

    @property
    def per_slot(self) -> dict[str, float]:
        if self.held_s is not None:
            return {k: (self.measured_s.get(k, 0.0) / h if h > 0 else 0.0) for k, h in self.held_s.items()}
        return {slot: (s / self.wall_s if self.wall_s > 0 else 0.0) for slot, s in self.measured_s.items()}

    @property
    def share(self) -> float | None:
        """The slots' mean busy share (allocations: Σ measuring ÷ Σ held); None when nothing measured."""
        if self.held_s is not None:
            held = sum(self.held_s.values())
            return sum(self.measured_s.values()) / held if held > 0 and self.measured_s else None
        shares = list(self.per_slot.values())
        return sum(shares) / len(shares) if shares else None

    def line(self) -> str:
        """The sweep's closing line: the share, per slot where there are several, and the rule applied."""
        if self.share is None:
            return "device busy: no configuration measured"
        if self.held_s is not None:
            shares = self.per_slot.values()
            spread = f"; lowest {min(shares):.2f}, highest {max(shares):.2f}" if len(self.held_s) > 1 else ""
            return (f"device busy {self.share:.2f} of {len(self.held_s)} {self.executor} allocations' "
                    f"{sum(self.held_s.values()):.1f} s held ({self.held_from}): "
                    f"{sum(self.measured_s.values()):.1f} s measuring{spread}; the sweep's {self.wall_s:.1f} s wall "
                    f"includes queue wait, not counted; view cells run inside each allocation")
        slots = self.per_slot
        each = "" if len(slots) == 1 else " (" + ", ".join(f"{k} {v:.2f}" for k, v in slots.items()) + ")"
        gpu = any(k.startswith("gpu:") for k in slots)
        if self.overlap:
            how = "view cells overlapped with the next measurement"
        elif gpu:
            how = "view cells not overlapped (--overlap off)"
        else:
            how = ("CPU slots: view cells not overlapped, they would compete for the measured cores "
                   "(--overlap on to allow)")
        return (f"device busy {self.share:.2f} of {self.wall_s:.1f} s wall: "
                f"{sum(self.measured_s.values()):.1f} s measuring{each}; {how}")


def busy_share(windows: Iterable[tuple[str | None, float | None, float | None]], wall_s: float,
               overlap: bool) -> BusyShare:
    """From ``(slot, start_unix_s, end_unix_s)`` of each configuration (a window of None is skipped)."""
    measured: dict[str, float] = {}
    n = 0
    for slot, start, end in windows:
        if start is None or end is None:
            continue
        measured[slot or "-"] = measured.get(slot or "-", 0.0) + max(0.0, end - start)
        n += 1
    return BusyShare(wall_s=wall_s, measured_s=measured, overlap=overlap, configs=n)


def allocation_share(entries: Iterable[tuple[str, float | None, float | None, float | None]], wall_s: float,
                     executor: str, held_from: str) -> BusyShare:
    """From ``(task, held_s, window_start, window_end)`` of each task that ran (held None: skipped)."""
    held: dict[str, float] = {}
    measured: dict[str, float] = {}
    for task, held_s, start, end in entries:
        if held_s is None:
            continue
        held[task] = held.get(task, 0.0) + held_s
        if start is not None and end is not None:
            measured[task] = measured.get(task, 0.0) + max(0.0, end - start)
    return BusyShare(wall_s=wall_s, measured_s=measured, overlap=False, configs=len(measured), held_s=held,
                     executor=executor, held_from=held_from)


def append_summary(out_dir: str | Path, busy: BusyShare) -> None:
    """One line per sweep run, appended and fsynced (one sweep at a time holds DIR's lock)."""
    path = Path(out_dir) / "ledger" / SUMMARY_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**asdict(busy), "share": busy.share, "per_slot": busy.per_slot}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_summaries(out_dir: str | Path) -> list[BusyShare]:
    """Every sweep run's summary under ``out_dir``, oldest first (a torn last line is skipped)."""
    path = Path(out_dir) / "ledger" / SUMMARY_FILENAME
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            out.append(BusyShare(**{k: data[k] for k in ("wall_s", "measured_s", "overlap", "configs",
                                                          "ended_unix_s")},
                                 **{k: data[k] for k in ("held_s", "executor", "held_from") if k in data}))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return out
