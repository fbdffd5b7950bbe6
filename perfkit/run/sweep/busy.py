"""How busy a sweep kept its devices: the share of its wall time each slot spent measuring.

A configuration holds its slot's device for measuring from its first code cell to the release
before its first ``view`` cell (:data:`perfkit.run.execute.WINDOW_COLUMNS`; the whole notebook
without one). A slot's busy share is the sum of its configurations' windows over the sweep's wall
time; what is left is start-up, hand-over and viewing that was not overlapped. The sweep prints it
(:meth:`BusyShare.line`), appends it to ``DIR/ledger/sweeps.json-lines`` and the report shows it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["BusyShare", "busy_share", "append_summary", "read_summaries", "SUMMARY_FILENAME"]

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

    @property
    def per_slot(self) -> dict[str, float]:
        return {slot: (s / self.wall_s if self.wall_s > 0 else 0.0) for slot, s in self.measured_s.items()}

    @property
    def share(self) -> float | None:
        """The slots' mean busy share; None when no configuration measured."""
        shares = list(self.per_slot.values())
        return sum(shares) / len(shares) if shares else None

    def line(self) -> str:
        """The sweep's closing line: the share, per slot where there are several, and the rule applied."""
        if self.share is None:
            return "device busy: no configuration measured"
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
                                                          "ended_unix_s")}))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return out
