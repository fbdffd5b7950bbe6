"""Which events of a trace an analysis looks at, and what they are, as Holistic Trace Analysis decides.

HTA 0.5.0 (``hta/common/trace.py``, ``trace_filter.py``, ``utils/utils.py``) is the reference:

- **Host or GPU.** An event is a GPU event when ``stream >= 0`` and ``correlation >= 0``, or
  when it is a device-level ``Event Sync``/``Context Sync`` (HTA's ``GPUKernelFilter``); every
  other event is a host event. GPU *activity* for the breakdowns is every windowed event whose
  stream is not -1. ROCm: runtime events carry ``stream: "0x0"``, which is -1 (host).
- **Launch.** A GPU event's launch is the host event with the same ``correlation`` (the last one
  in file order; HTA's ``index_correlation``), e.g. ``cudaLaunchKernel``, ``hipLaunchKernel``,
  ``hipExtModuleLaunchKernel``, ``cudaMemcpyAsync``.
- **Default window.** When the traces analysed together hold two or more distinct ProfilerStep
  names, the host events that start before the last ProfilerStep starts (the last step is left
  out: its GPU work may be cut off), and each GPU event once per kept host event with its
  correlation (``Trace._filter_irrelevant_gpu_kernels``, an inner join on correlation). Otherwise
  every event. The join repeats a GPU event whose id several host events carry (a runtime call
  and the driver call inside it, ``cudaLaunchKernel`` > ``cuLaunchKernel``); HTA's breakdowns
  keep the repeats (``RankWindow.dev``), counts of what ran take each event once (``ran``).
- **Step window** ``steps=(a, b)``: the default window narrowed to ProfilerStep#a..#b: host
  events starting inside one of those host-side ProfilerStep spans, GPU events whose launch does
  (HTA's ``iteration``; HTA leaves GPU events on stream 0, every ROCm kernel, out of every
  iteration, and lets GPU-side ``ProfilerStep`` annotations claim host events; perfkit does not).
- **Kernel type** by name (``get_kernel_type``): COMMUNICATION ``^nccl.*Kernel`` (NCCL and
  RCCL), MEMORY ``^Memcpy|^Memset|^dma``, OTHER when the name contains ``Memcpy``, starts with
  ``Memset`` or contains ``Sync``, else COMPUTATION.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from perfkit.analyse.trace.events import TraceEvents, read_trace
from perfkit.core.errors import BadInputError

__all__ = ["RankWindow", "analysis_window", "kernel_type", "merge_intervals", "KERNEL_TYPES", "STEP_RE"]

KERNEL_TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY")
"""The types HTA's kernel breakdown analyses, in its order (sweep bits 1, 2, 4)."""
STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_COMM_RE = re.compile(r"^nccl.*Kernel")  # hta/utils/utils.py NCCL_KERNEL_RE
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")  # MEMORY_KERNEL_RE
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE
_SYNC_NAMES = ("Event Sync", "Context Sync")


def kernel_type(name: str) -> str:
    """HTA's type of a GPU activity name: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if _COMM_RE.match(name):
        return "COMMUNICATION"
    if _MEMORY_RE.match(name):
        return "MEMORY"
    return "OTHER" if _NOT_COMPUTE_RE.match(name) else "COMPUTATION"


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's ``merge_kernel_intervals``: the union of [ts, end) as disjoint groups sorted by start
    (touching intervals join); returns (starts, ends)."""
    if not len(ts):
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    starts = np.flatnonzero(np.concatenate([[True], ts[1:] > np.maximum.accumulate(end)[:-1]]))
    return ts[starts], np.maximum.reduceat(end, starts)


class RankWindow:
    """One rank's events and the rows of its analysis window (indices into ``ev``; a GPU event
    appears once per matching host event, as in HTA)."""

    def __init__(self, ev: TraceEvents, rows: np.ndarray, gpu: np.ndarray):
        self.ev, self.rank, self.rows, self.gpu = ev, ev.rank, rows, gpu
        self.dev = rows[ev.stream[rows] != -1]
        """The window's GPU activity (stream other than -1), repeated as HTA's join repeats it."""
        self.ran = np.unique(self.dev)
        """The window's GPU activity, each event once: what ran, for counts and summed times."""
        self.types = np.array([kernel_type(n) for n in ev.names], dtype=object)

    def intervals(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts = self.ev.ts_us[rows]
        return ts, ts + self.ev.dur_us[rows]

    def of_type(self, kind: str) -> np.ndarray:
        """The GPU activity rows of one kernel type."""
        return self.dev[self.types[self.ev.name_id[self.dev]] == kind]

    def launch(self) -> np.ndarray:
        """For every event, its launch (index into ``ev``), or -1 (host events, unmatched GPU ones)."""
        return _launch_of(self.ev, self.gpu)

    def step_rows(self) -> np.ndarray:
        """The window's host-side ProfilerStep spans, in time order."""
        ev = self.ev
        rows = np.unique(self.rows[_host_steps(ev, self.gpu)[self.rows]])
        return rows[np.argsort(ev.ts_us[rows], kind="stable")]


def _host_steps(ev: TraceEvents, gpu: np.ndarray) -> np.ndarray:
    """Mask of the host-side ``ProfilerStep#N`` spans (not the GPU timeline's copies)."""
    named = np.isin(ev.name_id, ev.ids_of(lambda s: STEP_RE.match(s) is not None))
    gpu_side = np.isin(ev.cat_id, ev.ids_of(lambda s: s == "gpu_user_annotation"))
    return named & ~gpu & ~gpu_side & (ev.stream == -1)


def _as_events(traces) -> list[TraceEvents]:
    if isinstance(traces, (str, os.PathLike, TraceEvents)):
        traces = [traces]
    if not isinstance(traces, Sequence) or not traces:
        raise BadInputError("expected a trace path, a TraceEvents, or a non-empty list of them")
    evs = [t if isinstance(t, TraceEvents) else read_trace(t) for t in traces]
    ranks = [e.rank for e in evs]
    if len(set(ranks)) != len(ranks):
        raise BadInputError(f"two traces claim the same rank (ranks {ranks}); pass one trace per rank")
    return sorted(evs, key=lambda e: e.rank)


def _gpu_pred(ev: TraceEvents) -> np.ndarray:
    sync = np.isin(ev.name_id, ev.ids_of(lambda s: s in _SYNC_NAMES))
    return ((ev.stream >= 0) & (ev.correlation >= 0)) | sync


def _launch_of(ev: TraceEvents, gpu: np.ndarray) -> np.ndarray:
    out = np.full(len(ev), -1, dtype=np.int64)
    host = np.flatnonzero(~gpu & (ev.correlation != -1))
    if not len(host):
        return out
    # Reversed, so that np.unique's first occurrence is the last host event in file order.
    keys, first = np.unique(ev.correlation[host][::-1], return_index=True)
    owner = host[::-1][first]
    dev = np.flatnonzero(gpu & (ev.correlation != -1))
    pos = np.clip(np.searchsorted(keys, ev.correlation[dev]), 0, len(keys) - 1)
    hit = keys[pos] == ev.correlation[dev]
    out[dev[hit]] = owner[pos[hit]]
    return out


def _step_of(ev: TraceEvents, gpu: np.ndarray) -> np.ndarray:
    """ProfilerStep number of each event, -1 outside every step."""
    steps = np.flatnonzero(_host_steps(ev, gpu))
    it = np.full(len(ev), -1, dtype=np.int64)
    if len(steps):
        steps = steps[np.argsort(ev.ts_us[steps], kind="stable")]
        number = np.array([int(STEP_RE.match(ev.names[i]).group(1)) for i in ev.name_id[steps]])
        k = np.searchsorted(ev.ts_us[steps], ev.ts_us, side="right") - 1
        inside = (k >= 0) & (ev.ts_us < ev.end_us[steps][np.maximum(k, 0)]) & ~gpu
        it[inside] = number[k[inside]]
    launch = _launch_of(ev, gpu)
    linked = gpu & (launch >= 0)
    it[linked] = it[launch[linked]]
    return it


def _hta_window(ev: TraceEvents, gpu: np.ndarray) -> np.ndarray:
    is_step = np.isin(ev.name_id, ev.ids_of(lambda s: "ProfilerStep" in s)) & ~gpu
    last_start = ev.ts_us[is_step].max() if is_step.any() else -np.inf
    host = np.flatnonzero(~gpu & (ev.ts_us < last_start))
    dev = np.flatnonzero(gpu)
    keys, count = np.unique(ev.correlation[host], return_counts=True)
    if not len(keys):
        return host
    pos = np.clip(np.searchsorted(keys, ev.correlation[dev]), 0, len(keys) - 1)
    times = np.where(keys[pos] == ev.correlation[dev], count[pos], 0)
    return np.concatenate([np.repeat(dev, times), host])


def _in_steps(ev: TraceEvents, gpu: np.ndarray, rows: np.ndarray, steps: tuple[int, int]) -> np.ndarray:
    first, last = steps
    if first > last:
        raise BadInputError(f"steps=({first}, {last}): the first step comes after the last")
    it = _step_of(ev, gpu)[rows]
    available = sorted(set(it[it >= 0].tolist()))
    if not any(first <= s <= last for s in available):
        raise BadInputError(f"{ev.path}: no ProfilerStep#{first}..#{last} in the analysed window, which "
                            f"has steps {available} (the trace's last step is left out, as HTA does)")
    return rows[(it >= first) & (it <= last)]


def analysis_window(traces, steps: tuple[int, int] | None = None) -> list[RankWindow]:
    """One :class:`RankWindow` per rank of ``traces`` (paths or TraceEvents, analysed together
    as one HTA ``TraceAnalysis``), sorted by rank; ``steps=(a, b)`` keeps ProfilerStep#a..#b."""
    evs = _as_events(traces)
    # HTA filters when its symbol table (all ranks together) has two or more ProfilerStep names.
    step_names = {s for ev in evs for s in ev.names if "ProfilerStep" in s}
    out = []
    for ev in evs:
        gpu = _gpu_pred(ev)
        rows = _hta_window(ev, gpu) if len(step_names) >= 2 else np.arange(len(ev))
        if steps is not None:
            rows = _in_steps(ev, gpu, rows, tuple(steps))
        out.append(RankWindow(ev, rows, gpu))
    return out
