"""What a CUDA/ROCm memory snapshot says, computed in Python: no browser, whatever its size.

A snapshot is the pickled dict of ``torch.cuda.memory._snapshot()`` (schema in that function's
docstring): ``segments`` (the allocator's state when it was taken: each segment's ``blocks``,
``active_allocated`` ones with the ``frames`` that allocated them) and ``device_traces`` (per
device, the alloc/free events recorded since ``_record_memory_history``, a ring of at most
``max_entries``). pytorch.org/memory_viz draws the same file in a browser; above ~1 GB it crashes
there (pytorch PR #176290), which is why this module exists.

:func:`summarize` replays one device's events and reports

- the peak of the allocated bytes over the recorded window and the stacks that held the most at
  that instant (``top_at_peak``), and what was still allocated when the snapshot was taken
  (``top_at_end``);
- the bytes allocated before the window began (the ring dropped their events, or they predate
  recording): ``bytes_before_window`` = allocated at the end − (allocs − frees in the window),
  exact whatever the ring kept, so the peak is absolute, not relative to the window's start;
- every ``oom`` event: the bytes asked for and what the device still had free.

A stack is named by its innermost frame outside torch's own files (the model code that asked
for the memory) and, before it, the innermost frame (the op that allocated). The file is read
with an unpickler that refuses every global: a snapshot holds only dicts, lists, strings and
numbers, so a hostile file cannot run code.
"""

from __future__ import annotations

import io
import pickle
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfkit.core.errors import BadInputError

__all__ = ["StackBytes", "SnapshotSummary", "load", "summarize", "format_summary"]

#: Frames from these path fragments are the framework, not the code that asked for the memory.
_FRAMEWORK_PATHS = ("/torch/", "/site-packages/torch", "<frozen ", "/contextlib.py", "/functools.py")
#: Frames without a file (torch's converter of a profile names the frame only).
_NO_FILE = ("", "none", "??")
#: " at 0x7f..." in a built-in method's name: an address, different in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
#: Trace actions that end an allocation: its memory is the allocator's again.
_FREE = "free_completed"


@dataclass(frozen=True)
class StackBytes:
    """Bytes held by one allocating stack at one instant."""

    stack: str
    bytes: int
    allocations: int
    category: str | None = None  # present where the snapshot has one (a profiler-made snapshot)


@dataclass(frozen=True)
class SnapshotSummary:
    """One device's snapshot, summarized (see the module docstring)."""

    device: int
    entries: int
    """Alloc/free events in the recorded window."""
    peak_allocated_bytes: int
    peak_entry: int
    """Index of the event after which the peak was reached (-1: the window's start)."""
    allocated_at_end_bytes: int
    reserved_at_end_bytes: int
    bytes_before_window: int
    top_at_peak: list[StackBytes] = field(default_factory=list)
    top_at_end: list[StackBytes] = field(default_factory=list)
    ooms: list[dict] = field(default_factory=list)
    """``{"requested_bytes", "device_free_bytes", "entry"}`` per out-of-memory event."""

    def as_dict(self) -> dict:
        return asdict(self)


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a memory snapshot holds only data, not {module}.{name}")


def load(path: str | Path) -> dict:
    """A snapshot file (``torch.cuda.memory._dump_snapshot``'s pickle) as its dict."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such snapshot file")
    try:
        data = _DataOnly(io.BytesIO(path.read_bytes())).load()
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same answer
        raise BadInputError(f"{path}: not a torch memory snapshot pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or "segments" not in data:
        raise BadInputError(f"{path}: not a torch memory snapshot (a dict with 'segments' and 'device_traces')")
    return data


def _frame(f: dict) -> str:
    filename, name = str(f.get("filename", "")), _ADDRESS.sub("", str(f.get("name", "?")))
    if filename in _NO_FILE:  # a profiler-made snapshot: the name says "file.py(line): function"
        return name
    return f"{Path(filename).name}:{f.get('line', 0)}:{name}"


def _is_framework(f: dict) -> bool:
    filename = str(f.get("filename", ""))
    return (any(part in filename for part in _FRAMEWORK_PATHS)
            or str(f.get("name", "")).startswith("<built-in method"))


def stack_name(frames: list[dict] | None) -> str:
    """The name a stack is grouped under: ``op-frame ← model-frame`` (innermost first)."""
    if not frames:
        return "(no stack recorded)"
    inner = frames[0]
    caller = next((f for f in frames if not _is_framework(f)), None)
    if caller is None or caller is inner:
        return _frame(inner)
    return f"{_frame(inner)} ← {_frame(caller)}"


def _top(held: dict[str, list[int]], categories: dict[str, str | None], top: int) -> list[StackBytes]:
    ranked = sorted(held.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return [StackBytes(stack, total, count, categories.get(stack)) for stack, (total, count) in ranked]


def _device_of(snapshot: dict, device: int | None) -> int:
    traces = snapshot.get("device_traces") or []
    if device is not None:
        if not 0 <= device < max(len(traces), 1):
            raise BadInputError(f"the snapshot has traces for devices 0..{len(traces) - 1}, not {device}")
        return device
    busiest = max(range(len(traces)), key=lambda d: len(traces[d]), default=0)
    if traces and traces[busiest]:
        return busiest
    devices = [seg.get("device", 0) for seg in snapshot.get("segments", [])]
    return devices[0] if devices else 0


def summarize(snapshot: dict, *, top: int = 10, device: int | None = None) -> SnapshotSummary:
    """Replay ``snapshot``'s events on ``device`` (None: the one with the most events)."""
    if top < 1:
        raise BadInputError(f"top must be ≥ 1, got {top}")
    dev = _device_of(snapshot, device)
    traces = snapshot.get("device_traces") or []
    events = traces[dev] if dev < len(traces) else []
    segments = [s for s in snapshot.get("segments", []) if s.get("device", dev) == dev]

    end_held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    categories: dict[str, str | None] = {}
    allocated_end = reserved_end = 0
    for seg in segments:
        reserved_end += int(seg.get("total_size", 0))
        for block in seg.get("blocks", []):
            if block.get("state") == "active_allocated":
                size = int(block.get("size", 0))
                allocated_end += size
                name = stack_name(block.get("frames"))
                end_held[name][0] += size
                end_held[name][1] += 1

    # Replay: the window's own allocations by address; frees of addresses it never saw allocated
    # are memory from before the window.
    live: dict[int, tuple[int, str]] = {}
    net = 0
    before_freed = 0
    for entry in events:
        action = entry.get("action")
        if action == "alloc":
            net += int(entry["size"])
        elif action == _FREE:
            net -= int(entry["size"])
    before = allocated_end - net
    running, peak, peak_entry = before, before, -1
    ooms = []
    for i, entry in enumerate(events):
        action = entry.get("action")
        if action == "alloc":
            size = int(entry["size"])
            name = stack_name(entry.get("frames"))
            categories.setdefault(name, entry.get("category"))
            live[int(entry["addr"])] = (size, name)
            running += size
        elif action == _FREE:
            size = int(entry["size"])
            if live.pop(int(entry["addr"]), None) is None:
                before_freed += size
            running -= size
        elif action == "oom":
            ooms.append({"requested_bytes": int(entry.get("size", 0)),
                         "device_free_bytes": int(entry.get("device_free", 0)), "entry": i})
        if running > peak:
            peak, peak_entry = running, i
            peak_live, peak_before_freed = dict(live), before_freed
    at_peak: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    if peak_entry >= 0:
        for size, name in peak_live.values():
            at_peak[name][0] += size
            at_peak[name][1] += 1
        still_before = before - peak_before_freed
    else:
        still_before = before
    if still_before > 0:
        at_peak["(allocated before the recorded window)"] = [still_before, 0]
    return SnapshotSummary(
        device=dev, entries=len(events), peak_allocated_bytes=peak, peak_entry=peak_entry,
        allocated_at_end_bytes=allocated_end, reserved_at_end_bytes=reserved_end,
        bytes_before_window=before, top_at_peak=_top(at_peak, categories, top),
        top_at_end=_top(end_held, categories, top), ooms=ooms)


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if abs(n) >= 2**28 else f"{n / 2**20:.2f} MiB"


def format_summary(summary: SnapshotSummary) -> str:
    """The summary as the text ``perfkit memory-snapshot`` prints."""
    s = summary
    lines = [f"device {s.device}: {s.entries} events recorded; peak allocated {_gib(s.peak_allocated_bytes)} "
             f"(after event {s.peak_entry}); at the end {_gib(s.allocated_at_end_bytes)} allocated, "
             f"{_gib(s.reserved_at_end_bytes)} reserved; {_gib(s.bytes_before_window)} allocated before the window"]
    for oom in s.ooms:
        lines.append(f"OUT OF MEMORY at event {oom['entry']}: asked for {_gib(oom['requested_bytes'])}, "
                     f"the device had {_gib(oom['device_free_bytes'])} free")
    for title, rows in (("held at the peak", s.top_at_peak), ("held at the end", s.top_at_end)):
        lines.append(f"{title}:")
        lines += [f"  {_gib(r.bytes):>12}  {r.allocations:>6}×  {r.stack}"
                  + (f"  [{r.category}]" if r.category else "") for r in rows]
        if not rows:
            lines.append("  (nothing)")
    return "\n".join(lines)
