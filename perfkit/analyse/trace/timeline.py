"""Where a GPU's time goes in a window of a trace: computation, exposed communication, exposed
memcpy, busy and idle, from exact times, each figure naming its window.

The quantities and their names are AMD TraceLens's ``gpu_timeline``
(``TraceLens/TreePerf/gpu_event_analyser.py``, ``compute_metrics_dict``), the breakdown its users
read beside every report, here in seconds:

- GPU events are ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events. *Memcpy* is ``gpu_memcpy``
  (and ROCm 7.1's copy kernels, ``__amd_rocclr_copyBuffer*``/``MEMORY_COPY_*``); *communication* a
  kernel whose name holds ``nccl``, ``rccl`` or ``cross_device_reduce`` (any case); the rest,
  memsets included, is *computation*;
- ``computation_time_s`` = |∪ computation|; ``exposed_comm_time_s`` = |∪ comm \\ ∪ computation|;
  ``exposed_memcpy_time_s`` = |∪ memcpy \\ (∪ computation ∪ ∪ comm)|; ``busy_time_s`` = |∪ all|;
  ``total_time_s`` = last end − first start; ``idle_time_s`` = total − busy; ``total_comm_time_s``
  and ``total_memcpy_time_s`` the unions whole. A difference of sets is |A ∪ B| − |B|: no figure
  is ever negative, and computation + exposed comm + exposed memcpy + idle = total.

**Windows** (the ``window`` column says which):

- ``ProfilerStep#N``: the GPU work the host launched inside that step (its runtime call, matched by
  ``correlation``, starts within the host-side ``ProfilerStep#N``), over its own span. On CUDA this
  span is the step's GPU-side annotation (Qwen1.5 on an H100: 34,892.42 µs either way); ROCm's
  GPU-side annotations last microseconds (a ResNet step on an MI300X: 16 µs), so the launches
  decide, never the annotation;
- ``steps``: every step's GPU work together, where there are several (TraceLens's window on a
  trace whose launches all sit in steps);
- ``launched``: every GPU event whose launch the trace holds (TraceLens's ``include_unlinked_kernels
  = False``), for a trace without ``ProfilerStep``;
- ``trace``: every GPU event, first start to last end, launched in the trace or not (the kernels
  a step left running when profiling began count here: Qwen1.5 on an H100, 49.65 ms against the
  step's 34.89).

**Recompute** (activation checkpointing): GPU work launched inside
``torch/utils/checkpoint.py(...): recompute_fn`` on the launching thread is *recompute*. Where a
window has any, its rows come three times (``kernels`` column): ``all``, ``normal`` and
``recompute``, each subset over its own span, as TraceLens's ``detect_recompute`` splits them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from perfkit.analyse.trace.events import TraceEvents
from perfkit.analyse.trace.window import STEP_RE, merge_intervals

__all__ = ["GPU_CATS", "TIMELINE_COLUMNS", "gpu_timeline", "gpu_kinds", "launch_of", "step_windows",
           "recompute_mask", "WINDOWS", "LINKS", "main_window"]

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_COMM_RE = re.compile(r"nccl|rccl|cross_device_reduce", re.IGNORECASE)
_ROCM_COPY_RE = re.compile(r"^(MEMORY_COPY_(HOST_TO_DEVICE|DEVICE_TO_HOST|DEVICE_TO_DEVICE)"
                           r"|__amd_rocclr_copyBuffer(Rect)?(Aligned)?)(\.kd)?$")
TIMELINE_COLUMNS = ("computation_time_s", "exposed_comm_time_s", "exposed_memcpy_time_s", "busy_time_s",
                    "idle_time_s", "total_time_s", "total_comm_time_s", "total_memcpy_time_s")
WINDOWS = ("auto", "steps", "launched", "trace")
"""``auto``: each step and ``steps`` where the trace has ProfilerSteps, else ``launched``; and ``trace``."""
COMPUTATION, COMMUNICATION, MEMCPY = 0, 1, 2


def gpu_kinds(ev: TraceEvents) -> np.ndarray:
    """Per event: 0 computation, 1 communication, 2 memcpy (TraceLens's rules); -1 not a GPU event."""
    names = ev.names
    is_gpu_name = np.array([s in GPU_CATS for s in names])
    copy_cat = np.array([s in ("gpu_memcpy", "Memcpy") for s in names])
    comm_name = np.array([bool(_COMM_RE.search(s)) for s in names])
    rocm_copy = np.array([bool(_ROCM_COPY_RE.match(s)) for s in names])
    gpu = is_gpu_name[ev.cat_id]
    out = np.full(len(ev), -1, dtype=np.int8)
    out[gpu] = COMPUTATION
    out[gpu & comm_name[ev.name_id]] = COMMUNICATION
    out[gpu & (copy_cat[ev.cat_id] | rocm_copy[ev.name_id])] = MEMCPY
    return out


LINKS = ("correlation", "flow")
"""How a GPU event is tied to its launch: ``correlation`` (the runtime call with its id is in the
trace), or ``flow`` (also an ``ac2g`` flow with both ends, as TraceLens links). ROCm's tracer draws
no flow for ``hipMemsetAsync``: 81 memsets (0.33 ms) of a ResNet MI300X trace's steps are then
left out, as TraceLens leaves them."""


def launch_of(ev: TraceEvents, link: str = "correlation") -> np.ndarray:
    """Per event, the row of the runtime/driver call that launched it (same ``correlation``; with
    ``link="flow"`` only through an ``ac2g`` flow), or -1."""
    runtime = np.isin(ev.cat_id, ev.ids_of(lambda s: s in _RUNTIME_CATS)) & (ev.correlation >= 0)
    if link == "flow":
        runtime &= np.isin(ev.correlation, ev.flow_ids)
    out = np.full(len(ev), -1, dtype=np.int64)
    host = np.flatnonzero(runtime)
    if not len(host):
        return out
    # The runtime call (cudaLaunchKernel) over the driver call inside it: the earliest with the id.
    order = host[np.lexsort((ev.ts_us[host], ev.correlation[host]))]
    keys, first = np.unique(ev.correlation[order], return_index=True)
    owner = order[first]
    dev = np.flatnonzero(~runtime & (ev.correlation >= 0))
    pos = np.clip(np.searchsorted(keys, ev.correlation[dev]), 0, len(keys) - 1)
    hit = keys[pos] == ev.correlation[dev]
    out[dev[hit]] = owner[pos[hit]]
    return out


def _host_steps(ev: TraceEvents) -> np.ndarray:
    named = np.isin(ev.name_id, ev.ids_of(lambda s: STEP_RE.match(s) is not None))
    host_side = np.isin(ev.cat_id, ev.ids_of(lambda s: s in ("user_annotation", "cpu_op", "python_function")))
    rows = np.flatnonzero(named & host_side & (ev.stream == -1))
    return rows[np.argsort(ev.ts_us[rows], kind="stable")]


def step_windows(ev: TraceEvents, launch: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``ProfilerStep#N`` → the GPU events launched inside that host step, in time order of the steps."""
    launch = launch_of(ev) if launch is None else launch
    gpu = np.flatnonzero((gpu_kinds(ev) >= 0) & (launch >= 0))
    at = ev.ts_us[launch[gpu]]
    out = {}
    for row in _host_steps(ev):
        inside = (at >= ev.ts_us[row]) & (at < ev.ts_us[row] + ev.dur_us[row])
        out.setdefault(ev.names[ev.name_id[row]], np.array([], dtype=np.int64))
        out[ev.names[ev.name_id[row]]] = np.union1d(out[ev.names[ev.name_id[row]]], gpu[inside])
    return out


def recompute_mask(ev: TraceEvents, launch: np.ndarray | None = None) -> np.ndarray:
    """Per event: a GPU event launched inside activation checkpointing's ``recompute_fn`` span on
    the launching thread (TraceLens's ``is_recompute``)."""
    launch = launch_of(ev) if launch is None else launch
    out = np.zeros(len(ev), dtype=bool)
    spans = np.flatnonzero(np.isin(ev.name_id, ev.ids_of(lambda s: "recompute_fn" in s))
                           & np.isin(ev.cat_id, ev.ids_of(lambda s: s == "python_function")))
    gpu = np.flatnonzero((gpu_kinds(ev) >= 0) & (launch >= 0))
    if not len(spans) or not len(gpu):
        return out
    host = launch[gpu]
    for key in {(int(ev.pid[r]), int(ev.tid[r])) for r in spans}:
        mine = spans[(ev.pid[spans] == key[0]) & (ev.tid[spans] == key[1])]
        s, e = merge_intervals(ev.ts_us[mine], ev.end_us[mine])
        on_thread = (ev.pid[host] == key[0]) & (ev.tid[host] == key[1])
        k = np.searchsorted(s, ev.ts_us[host], side="right") - 1
        inside = on_thread & (k >= 0) & (ev.ts_us[host] < e[np.maximum(k, 0)])
        out[gpu[inside]] = True
    return out


def _union_s(ts: np.ndarray, end: np.ndarray) -> float:
    s, e = merge_intervals(ts, end)
    return float((e - s).sum()) / 1e6


def _metrics(ev: TraceEvents, rows: np.ndarray, kinds: np.ndarray) -> dict:
    ts, end, kind = ev.ts_us[rows], ev.end_us[rows], kinds[rows]

    def union(*wanted) -> float:
        pick = np.isin(kind, wanted)
        return _union_s(ts[pick], end[pick])

    comp, comm, copy = union(COMPUTATION), union(COMMUNICATION), union(MEMCPY)
    comp_comm, busy = union(COMPUTATION, COMMUNICATION), union(COMPUTATION, COMMUNICATION, MEMCPY)
    total = float(end.max() - ts.min()) / 1e6 if len(rows) else 0.0
    return {"computation_time_s": comp, "exposed_comm_time_s": comp_comm - comp,
            "exposed_memcpy_time_s": busy - comp_comm, "busy_time_s": busy, "idle_time_s": total - busy,
            "total_time_s": total, "total_comm_time_s": comm, "total_memcpy_time_s": copy}


def _windows(ev: TraceEvents, window: str, kinds: np.ndarray, launch: np.ndarray) -> list[tuple[str, np.ndarray]]:
    gpu = np.flatnonzero(kinds >= 0)
    launched = gpu[launch[gpu] >= 0]
    steps = step_windows(ev, launch) if window in ("auto", "steps") else {}
    out: list[tuple[str, np.ndarray]] = []
    if steps:
        out += list(steps.items())
        if len(steps) > 1:
            out.append(("steps", np.unique(np.concatenate(list(steps.values())))))
    elif window == "launched" or (window == "auto" and len(launched)):
        out.append(("launched", launched))
    if window in ("auto", "trace"):
        out.append(("trace", gpu))
    return [(name, rows) for name, rows in out if len(rows)]


def main_window(ev: TraceEvents, link: str = "correlation") -> tuple[str, np.ndarray]:
    """(name, GPU event rows) of the window a trace is summarised over: its ``steps`` where it has
    ProfilerSteps, else what it ``launched``, else the whole ``trace``."""
    kinds, launch = gpu_kinds(ev), launch_of(ev, link)
    windows = _windows(ev, "auto", kinds, launch)
    steps = [(name, rows) for name, rows in windows if STEP_RE.match(name)]
    if len(steps) == 1:
        return steps[0]
    for name, rows in windows:
        if name in ("steps", "launched", "trace"):
            return name, rows
    return "trace", np.flatnonzero(kinds >= 0)


def gpu_timeline(events: list[TraceEvents] | TraceEvents, *, window: str = "auto",
                 recompute: bool = True, link: str = "correlation") -> pd.DataFrame:
    """The GPU timeline of every window of every rank (module docstring): columns ``rank``,
    ``window``, ``kernels`` (``all``; ``normal``/``recompute`` where a window has recompute),
    ``gpu_events`` and :data:`TIMELINE_COLUMNS`. ``link``: :data:`LINKS`. A trace without GPU work
    gives no rows."""
    from perfkit.core.errors import BadInputError

    if window not in WINDOWS:
        raise BadInputError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    if link not in LINKS:
        raise BadInputError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    events = [events] if isinstance(events, TraceEvents) else list(events)
    rows = []
    for ev in events:
        kinds, launch = gpu_kinds(ev), launch_of(ev, link)
        again = recompute_mask(ev, launch) if recompute else np.zeros(len(ev), dtype=bool)
        for name, picked in _windows(ev, window, kinds, launch):
            parts = [("all", picked)]
            if again[picked].any():
                parts += [("normal", picked[~again[picked]]), ("recompute", picked[again[picked]])]
            for label, subset in parts:
                if len(subset):
                    rows.append({"rank": ev.rank, "window": name, "kernels": label, "gpu_events": len(subset),
                                 **_metrics(ev, subset, kinds)})
    return pd.DataFrame(rows, columns=["rank", "window", "kernels", "gpu_events", *TIMELINE_COLUMNS])
