"""Memory snapshots on CUDA/ROCm: recording started before the step, dumped at the end and at OOM.

torch's caching allocator can record every allocation and free with the Python stack that made
it (``torch.cuda.memory._record_memory_history``; ROCm builds share the API) and dump its state
and that history (``torch.cuda.memory._dump_snapshot``). The recipe of torch's "Understanding
CUDA Memory Usage" page, made safe for a sweep:

- recording starts before the first step, so the peak's allocations have their stacks;
- a bounded ring (``max_entries``; torch's default is unbounded, several KB an entry) and Python
  stacks only (C++ frames make each entry larger and cost more per allocation);
- an OOM observer (``torch._C._cuda_attach_out_of_memory_observer``) dumps ``rank<r>-oom.pickle``
  at the failing allocation, before the exception unwinds the state away;
- ``rank<r>.pickle`` at the end; recording stopped whatever happens.

What a snapshot says is computed in Python by :mod:`perfkit.analyse.memory_snapshot` (``perfkit
memory-snapshot FILE``), so a large file never needs a browser. The CPU has no caching allocator
to record: :func:`skip_reason` says so, and the configuration is ``skipped`` with it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

__all__ = ["DEFAULT_MAX_ENTRIES", "skip_reason", "snapshot_paths", "recording"]

#: Alloc/free events the ring keeps: a training step of a mid-sized model makes tens of thousands.
DEFAULT_MAX_ENTRIES = 100_000


def skip_reason(device_type: str) -> str | None:
    """Why ``device_type`` cannot record a snapshot; None when it can."""
    if device_type != "cuda":
        return (f"memory_snapshot records the CUDA/ROCm caching allocator (torch.cuda.memory."
                f"_record_memory_history); device {device_type!r} has none to record")
    if not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        return "this torch build has no CUDA memory-history recording"
    return None


def snapshot_paths(folder: str | Path, rank: int) -> tuple[Path, Path]:
    """(end-of-run snapshot, OOM snapshot) of ``rank`` under ``folder``."""
    folder = Path(folder)
    return folder / f"rank{rank}.pickle", folder / f"rank{rank}-oom.pickle"


@contextlib.contextmanager
def recording(folder: str | Path | None, rank: int, *, max_entries: int = DEFAULT_MAX_ENTRIES):
    """Record this process's CUDA allocations while the block runs; yields the end snapshot's
    path (None when ``folder`` is None: nothing is recorded)."""
    if folder is None:
        yield None
        return
    global _oom_path, _observer_attached
    end_path, oom_path = snapshot_paths(folder, rank)
    end_path.parent.mkdir(parents=True, exist_ok=True)
    # What the process holds on the device before the window (an earlier step's cuBLAS workspace,
    # caches, a test's tensors): the snapshot's bytes_before_window is this, unless its ring dropped
    # events (on the H200 a test asserted 0 and read 2560 bytes held from before).
    _allocated_before[str(end_path)] = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries)
    if not _observer_attached:  # torch keeps every observer attached: one per process
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)
        _observer_attached = True
    _oom_path = oom_path
    try:
        yield end_path
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(end_path))
    finally:
        _oom_path = None
        torch.cuda.memory._record_memory_history(enabled=None)


#: End snapshot path -> ``torch.cuda.memory_allocated()`` when its recording began (:func:`rank_columns`).
_allocated_before: dict[str, int] = {}
#: Where the OOM observer dumps while a :func:`recording` block runs (None: outside one).
_oom_path: Path | None = None
_observer_attached = False


def _on_oom(device, alloc, device_alloc, device_free) -> None:  # torch's observer signature
    if _oom_path is not None:
        torch.cuda.memory._dump_snapshot(str(_oom_path))


def rank_columns(path: str | Path, *, top: int = 5) -> dict:
    """What a rank's result carries of its end snapshot: the file, the peak it replays to, and
    the ``top`` stacks held at that peak (JSON ``[[stack, bytes], ...]``), and the bytes the process
    held on the device when the recording began (``memory_snapshot_allocated_before_bytes``: the
    snapshot's ``bytes_before_window`` when its ring kept every event)."""
    import json

    from perfkit.analyse.memory_snapshot import load, summarize

    summary = summarize(load(path), top=top)
    return {"memory_snapshot_path": str(path),
            "memory_snapshot_peak_bytes": summary.peak_allocated_bytes,
            "memory_snapshot_top_at_peak": json.dumps([[s.stack, s.bytes] for s in summary.top_at_peak]),
            "memory_snapshot_allocated_before_bytes": _allocated_before.pop(str(path), None),
            "memory_snapshot_bytes_before_window": summary.bytes_before_window}
