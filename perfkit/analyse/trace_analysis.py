"""Communication/computation overlap from PyTorch profiler (Kineto) Chrome traces, per rank.

A trace is the JSON that ``torch.profiler`` exports (``export_chrome_trace``), plain or gzipped:
``traceEvents`` with complete events (``ph == "X"``) whose ``ts`` and ``dur`` are microseconds,
and, for distributed runs, ``distributedInfo.rank``. GPU kernels are the events of category
``kernel``; a kernel whose name starts with ``nccl`` (NCCL, and RCCL, which keeps the names) is
communication, every other kernel is compute. ``gpu_memcpy``/``gpu_memset`` are neither and are
reported on their own.

Every time below is the length of a *union of intervals*, not a sum of durations: kernels of
several streams running at once are counted once (the method of Holistic Trace Analysis'
comm/comp overlap, which also works on kernel intervals). Per rank (and device):

- ``comm_time_s``: |∪ comm kernels|;  ``compute_time_s``: |∪ compute kernels|
- ``overlap_time_s``: |∪comm ∩ ∪compute|, communication hidden behind computation
- ``exposed_comm_time_s`` = comm − overlap: communication the GPU waits on with nothing else to do
- ``gpu_busy_time_s`` = |∪ comm ∪ ∪ compute| = comm + compute − overlap
- ``gpu_span_s``: first kernel start to last kernel end (so span − busy is kernel-idle time)
- ``memory_op_time_s``: |∪ memcpy/memset|, left out of all of the above
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from perfkit.core.errors import BadInputError

__all__ = ["load_trace", "gpu_events", "comm_compute_overlap", "interval_union", "union_length",
           "intersection_length"]

_US = 1e-6  # trace ts/dur are microseconds
_GZIP_MAGIC = b"\x1f\x8b"
_MEMORY_CATS = {"gpu_memcpy", "gpu_memset"}


def load_trace(path: str | os.PathLike) -> dict:
    """The parsed trace at ``path`` (``.json`` or gzipped, detected from the bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        raw = gzip.decompress(raw)
    try:
        trace = json.loads(raw)
    except ValueError as err:
        raise BadInputError(f"{path}: not a JSON trace ({err})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BadInputError(f"{path}: no traceEvents list; not a Chrome/Kineto trace")
    return trace


def gpu_events(trace: Mapping, *, comm_prefixes: Sequence[str] = ("nccl",)) -> pd.DataFrame:
    """One row per GPU activity (kernel, memcpy, memset) of ``trace``.

    Columns: ``name``, ``kind`` (``comm``, ``compute`` or ``memory``), ``device``, ``stream``,
    ``start_us``, ``end_us`` (trace microseconds, kept as in the trace for traceability).
    """
    prefixes = tuple(p.lower() for p in comm_prefixes)
    rows = []
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat == "kernel":
            kind = "comm" if str(ev.get("name", "")).lower().startswith(prefixes) else "compute"
        elif cat in _MEMORY_CATS:
            kind = "memory"
        else:
            continue
        args = ev.get("args") or {}
        start = float(ev["ts"])
        rows.append({
            "name": ev.get("name", ""),
            "kind": kind,
            # Kineto puts the device in args; older exports only in pid.
            "device": args.get("device", ev.get("pid")),
            "stream": args.get("stream", ev.get("tid")),
            "start_us": start,
            "end_us": start + float(ev.get("dur", 0.0)),
        })
    columns = ["name", "kind", "device", "stream", "start_us", "end_us"]
    return pd.DataFrame(rows, columns=columns)


def interval_union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points as ``intervals``."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``intervals``."""
    return sum(e - s for s, e in interval_union(intervals))


def intersection_length(a: Iterable[tuple[float, float]], b: Iterable[tuple[float, float]]) -> float:
    """Length of (∪a) ∩ (∪b): a two-pointer sweep over the two merged lists."""
    ua, ub = interval_union(a), interval_union(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo = max(ua[i][0], ub[j][0])
        hi = min(ua[i][1], ub[j][1])
        if hi > lo:
            total += hi - lo
        # Advance whichever ends first; the other may still overlap the next one.
        if ua[i][1] <= ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def _rank_of(trace: Mapping, source) -> int:
    info = trace.get("distributedInfo") or {}
    if "rank" not in info:
        raise BadInputError(
            f"{source}: the trace has no distributedInfo.rank; "
            "pass {rank: path} to say which rank it is"
        )
    return int(info["rank"])


def _row(events: pd.DataFrame) -> dict:
    # Relative to the first activity so float microseconds keep sub-microsecond precision
    # (absolute ts are ~1.7e15 us, near the end of a double's exact integers).
    origin = events["start_us"].min()

    def spans(kind):
        sel = events[events["kind"] == kind]
        return list(zip(sel["start_us"] - origin, sel["end_us"] - origin))

    comm, compute, memory = spans("comm"), spans("compute"), spans("memory")
    comm_us, compute_us = union_length(comm), union_length(compute)
    overlap_us = intersection_length(comm, compute)
    kernels = events[events["kind"] != "memory"]
    span_us = (kernels["end_us"].max() - kernels["start_us"].min()) if len(kernels) else 0.0
    return {
        "comm_time_s": comm_us * _US,
        "compute_time_s": compute_us * _US,
        "overlap_time_s": overlap_us * _US,
        "exposed_comm_time_s": (comm_us - overlap_us) * _US,
        "gpu_busy_time_s": (comm_us + compute_us - overlap_us) * _US,
        "gpu_span_s": span_us * _US,
        "memory_op_time_s": union_length(memory) * _US,
        "n_comm_kernels": len(comm),
        "n_compute_kernels": len(compute),
    }


def comm_compute_overlap(
    traces: Sequence[str | os.PathLike | Mapping] | Mapping[int, str | os.PathLike | Mapping],
    *,
    comm_prefixes: Sequence[str] = ("nccl",),
) -> pd.DataFrame:
    """Per-rank communication, computation and their overlap, from one trace per rank.

    ``traces`` is a sequence of trace paths (or parsed traces), each naming its rank in
    ``distributedInfo.rank``, or a mapping ``{rank: trace}`` when the traces do not. Returns one
    row per rank, sorted by rank, with the ``*_s`` columns of the module docstring plus
    ``rank``, ``device``, ``n_comm_kernels``, ``n_compute_kernels`` and ``trace``. A rank whose
    trace has kernels on several devices gets one row per device (each device's intervals are
    its own; a union across GPUs would hide work).
    """
    if isinstance(traces, Mapping):
        items = [(int(rank), src) for rank, src in traces.items()]
    else:
        items = [(None, src) for src in traces]
    if not items:
        raise BadInputError("comm_compute_overlap needs at least one trace")
    rows = []
    for rank, source in items:
        trace = source if isinstance(source, Mapping) else load_trace(source)
        label = "<dict>" if isinstance(source, Mapping) else os.fspath(source)
        if rank is None:
            rank = _rank_of(trace, label)
        events = gpu_events(trace, comm_prefixes=comm_prefixes)
        if events.empty:
            raise BadInputError(f"{label}: no GPU kernels in the trace (a CPU-only profile?)")
        for device, per_device in events.groupby("device", sort=True, dropna=False):
            rows.append({"rank": rank, "device": device, **_row(per_device), "trace": label})
    out = pd.DataFrame(rows)
    if out.duplicated(["rank", "device"]).any():
        raise BadInputError("two traces claim the same rank and device")
    return out.sort_values(["rank", "device"], ignore_index=True)
