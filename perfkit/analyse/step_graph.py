"""A step's execution graph from its Kineto trace: typed dependencies, replayed as a longest path.

Lumos (Liang et al., MLSys 2025, arXiv:2504.09307) predicts a distributed step by replaying the
dependency graph of a measured trace with re-costed tasks; Holistic Trace Analysis's critical-path
analysis (HTA 0.5.0, ``hta/analyzers/critical_path_analysis.py``) builds the same kind of graph
from the same events. This module builds it for one rank and one window of its trace, and replays
it in topological order, reporting the critical path.

**Windows.** Each host ``ProfilerStep#N`` that holds host work is one window; a trace without one
(HTA's benchmarks, a ``torch.compile`` run, a step annotated on another process) is one window of
the process that launched the most GPU work (or ran the most ops). A ``ProfilerStep`` with no host
work in it (the closing step of a schedule) is skipped, and said in :attr:`StepGraph.note`.

**Nodes** (:data:`HOST`, :data:`DEVICE`, :data:`COMM`):

- the host tasks of every thread of the process that ran ops in the window: the leaves (an event
  with no other event of its thread inside it, or whose children are a sliver of it), so a CUDA or
  HIP runtime call is a task of its own;
- each GPU stream's kernels, copies and sets launched in the window (CUDA and HIP alike);
- a collective that runs on a thread of its own (gloo's ``gloo:all_reduce`` ...). NCCL's and
  RCCL's ``nccl:*`` annotations are host work on the thread that enqueued them (for DDP, the
  autograd thread): their work is the ``ncclDevKernel_*`` kernels, device nodes whose ``op``
  names the collective.

**Edges** (each typed, :data:`EDGE_KINDS`; ``lag_us`` is the measured time the dependency did not
explain, on the edge that bound):

- ``thread``: a thread's tasks in order (end → start, the measured gap: Python, dispatch);
- ``fork``: another thread's first task after the step thread's task that ran before it;
- ``join``: a host task after a side lane's task (the autograd thread, a collective) that ended
  inside the gap before it: the gap was a wait;
- ``launch``: a runtime call to the device task with its ``correlation``;
- ``stream``: a stream's tasks in order;
- ``event_wait``: ``cudaStreamWaitEvent``/``hipStreamWaitEvent``: the first task the waiting stream
  runs after the wait follows the task the event recorded (from the trace's ``cuda_sync`` events,
  which say which stream and which ``cudaEventRecord``; a trace without them keeps the measured
  gap on the stream or launch edge);
- ``sync``: a synchronising call (device, stream and event synchronisation, a blocking copy)
  returns after the device task it waited for ends (end → end: the call is two nodes, its own
  work and its return);
- ``issue``: a collective's span after the host task that issued it.

**Replay** is a longest-path pass in topological order: each node starts at the latest of its
incoming edges (``end`` or ``start`` of the source, plus the lag), runs its duration. With every
duration as measured it reproduces the step when the edges are the ones that held; a graph with an
edge missing or a duration changed moves by what that edge or task carried, which is what the
tests check (kernels × 2 on the critical path, a removed event wait, a removed synchronisation).

**The step's time** is its period: the host's window (ProfilerStep start to the step thread's last
task plus the measured tail), or, where the device runs behind the host (a GPU-bound step, whose
launch queue was already full when the window opened), from when the device finished the work
queued before the window to when it finished this window's work, whichever is longer. A host
ProfilerStep of 16.8 ms whose kernels end 32 ms later is a GPU-bound step of the device's period,
not a 16.8 ms step (TraceLens's MI300X ResNet training trace: host steps 15.9–16.8 ms, the GPU's
queue growing by 2–3 ms a step).

Not modelled (said where it matters): other threads' work than the process's (a DataLoader's
worker processes), the skew between ranks (a collective's measured time holds the wait for the
slowest rank), a kernel's dependence on another stream where the trace recorded no sync events.
"""

from __future__ import annotations

import bisect
import heapq
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from perfkit.analyse.trace.events import TraceEvents, read_trace
from perfkit.core.errors import BadInputError

__all__ = ["HOST", "DEVICE", "COMM", "EDGE_KINDS", "StepGraph", "step_graphs", "replay", "replay_error",
           "critical_path"]

HOST, DEVICE, COMM = "host", "device", "comm"
THREAD, FORK, JOIN, LAUNCH, STREAM, EVENT_WAIT, SYNC, ISSUE, WAIT = (
    "thread", "fork", "join", "launch", "stream", "event_wait", "sync", "issue", "wait")
EDGE_KINDS = (THREAD, FORK, JOIN, LAUNCH, STREAM, EVENT_WAIT, SYNC, ISSUE, WAIT)
"""``wait``: an added collective's waiter (a what-if's edge, :mod:`perfkit.analyse.predict`)."""
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
_SIDE_COMM_RE = re.compile(r"^(gloo|mpi|ucc):")  # a collective executed on a thread (its span is its work)
_COMM_ANNOTATION_RE = re.compile(r"^(nccl|rccl|gloo|mpi|ucc):(\w+)")
_COMM_KERNEL_RE = re.compile(r"^(?:nccl|rccl)\w*?Kernel_([A-Za-z]+)|^ncclDevKernel_([A-Za-z]+)", re.IGNORECASE)
_KERNEL_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "alltoall": "all_to_all"}
_LAUNCH_LATENCY_CAP = 1.0
"""A queued task's launch edge binds by at most the runtime call's own duration (the call returns
when the task is queued; it cannot start before)."""
# Calls that return only when the device has finished (CUDA and HIP names alike).
_DEVICE_SYNC_RE = re.compile(r"^(cuda|hip)(DeviceSynchronize|CtxSynchronize)$")
_STREAM_SYNC_RE = re.compile(r"^(cuda|hip)(StreamSynchronize|EventSynchronize|Memcpy|MemcpyWithStream|MemcpyDtoH|MemcpyHtoD|MemcpyDtoD)$")
_STREAM_WAIT_RE = re.compile(r"^(cuda|hip)StreamWaitEvent$")


@dataclass
class StepGraph:
    """One rank's window: nodes (row ``i`` is node ``i``) and typed edges ``src → dst``.

    An edge says ``dst``'s start (or, ``to_end``, its end) is no earlier than ``src``'s end (or,
    not ``from_end``, its start) plus ``lag_us``. ``release_us`` is a node's earliest start where
    something outside the window holds it (the step's start; a stream still busy with work queued
    before the window); ``-inf`` otherwise. ``op`` names a communication task's collective
    (gloo spans and NCCL/RCCL kernels alike), ``aten`` the outermost op a task ran under (a
    kernel: its launch's), ``bytes`` a collective's size where known.
    """

    path: str
    rank: int
    step: int
    """The ProfilerStep's number; -1 for a whole-trace window."""
    measured_us: float
    """The step's time (the longer of the host's window and the device's period)."""
    start_us: float
    tail_us: float
    """From the step thread's last node's end to the window's end."""
    device_from_us: float = -np.inf
    """When the device finished the work queued before the window (the window's start if earlier)."""
    measured_host_us: float = 0.0
    measured_device_us: float = 0.0
    window: str = ""
    note: str = ""
    inferred_waits: int = 0
    """Cross-stream waits read from when a task started, where the trace did not say (no
    ``cuda_sync`` events): each after a ``cudaStreamWaitEvent``/``hipStreamWaitEvent`` call."""
    first_op_us: float = np.inf
    """The start of the step thread's first top-level op."""
    names: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    lane: list[str] = field(default_factory=list)
    start_measured_us: list[float] = field(default_factory=list)
    dur_us: list[float] = field(default_factory=list)
    release_us: list[float] = field(default_factory=list)
    op: list[str | None] = field(default_factory=list)
    aten: list[str] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    edge_kind: list[str] = field(default_factory=list)
    lag_us: list[float] = field(default_factory=list)
    from_end: list[bool] = field(default_factory=list)
    to_end: list[bool] = field(default_factory=list)
    idle_us: dict[int, float] = field(default_factory=dict)
    """Per ``thread`` edge from one top-level op to the next, the part of its lag outside any op
    (from the one's end to the other's start: Python, the framework), which HTA's critical path
    counts as zero."""
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Measured (start, end) µs of the step's ``backward`` (the autograd engine's functions, any
    thread), ``optimizer`` (``Optimizer.step#``) and ``zero_grad``, where the trace has them."""

    def __len__(self) -> int:
        return len(self.names)

    def add(self, *, name: str, kind: str, lane: str, start_us: float, dur_us: float, release_us: float = -np.inf,
            op: str | None = None, aten: str = "", nbytes: float = float("nan")) -> int:
        self.names.append(name)
        self.kind.append(kind)
        self.lane.append(lane)
        self.start_measured_us.append(start_us)
        self.dur_us.append(dur_us)
        self.release_us.append(release_us)
        self.op.append(op)
        self.aten.append(aten or name)
        self.bytes.append(nbytes)
        return len(self.names) - 1

    def edge(self, src: int, dst: int, kind: str, lag_us: float = 0.0, *, from_end: bool = True,
             to_end: bool = False) -> int:
        if kind not in EDGE_KINDS:
            raise ValueError(f"edge kind {kind!r}: one of {EDGE_KINDS}")
        self.src.append(src)
        self.dst.append(dst)
        self.edge_kind.append(kind)
        self.lag_us.append(lag_us)
        self.from_end.append(from_end)
        self.to_end.append(to_end)
        return len(self.src) - 1

    def remove_edges(self, keep) -> None:
        """Keep only the edges ``e`` for which ``keep(e)`` is true (a perturbation, a what-if)."""
        kept = [e for e in range(len(self.src)) if keep(e)]
        for name in ("src", "dst", "edge_kind", "lag_us", "from_end", "to_end"):
            column = getattr(self, name)
            setattr(self, name, [column[e] for e in kept])
        renumber = {e: k for k, e in enumerate(kept)}
        self.idle_us = {renumber[e]: t for e, t in self.idle_us.items() if e in renumber}

    def edges_into(self, node: int, kind: str | None = None) -> list[int]:
        return [e for e in range(len(self.dst)) if self.dst[e] == node and (kind is None or self.edge_kind[e] == kind)]

    def order(self) -> list[int]:
        """Node indices in topological order (Kahn; among ready nodes the earliest measured start
        first). A cycle is a :class:`ValueError` naming a node on it."""
        n = len(self)
        indegree = [0] * n
        out: list[list[int]] = [[] for _ in range(n)]
        for s, d in zip(self.src, self.dst):
            out[s].append(d)
            indegree[d] += 1
        ready = [(self.start_measured_us[i], i) for i in range(n) if indegree[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, i = heapq.heappop(ready)
            order.append(i)
            for d in out[i]:
                indegree[d] -= 1
                if indegree[d] == 0:
                    heapq.heappush(ready, (self.start_measured_us[d], d))
        if len(order) < n:
            stuck = next(i for i in range(n) if indegree[i] > 0)
            raise ValueError(f"the step graph has a cycle through node {stuck} ({self.names[stuck]}, {self.lane[stuck]})")
        return order

    def host_nodes(self) -> list[int]:
        return sorted((i for i in range(len(self)) if self.kind[i] == HOST), key=lambda i: (self.start_measured_us[i], i))

    def is_comm(self, i: int) -> bool:
        """A communication task: a collective's span, or an NCCL/RCCL kernel."""
        return self.kind[i] == COMM or (self.kind[i] == DEVICE and self.op[i] is not None)


def _leaves(ts: np.ndarray, end: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Positions (into the given, start-sorted arrays) of the events that are the host's tasks: each
    outermost event whose direct children cover at most half of it (no child at all, or an aten::mm
    whose only children are two µs-long aten::resolve_conj: its time is its own matmul, which a
    what-if must be able to re-cost), unless one of its descendants is in ``keep`` (a CUDA runtime
    call, whose launch edge must stay a node of its own). The children of a task are not tasks."""
    n = len(ts)
    dur = end - ts
    child_s = np.zeros(n)
    pinned = np.zeros(n, dtype=bool)
    stack: list[int] = []
    for i in range(n):
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            child_s[stack[-1]] += dur[i]
            if keep is not None and keep[i]:
                pinned[stack] = True
        stack.append(i)
    take = np.zeros(n, dtype=bool)
    inside: list[tuple[int, bool]] = []
    for i in range(n):
        while inside and end[inside[-1][0]] <= ts[i]:
            inside.pop()
        covered = bool(inside) and inside[-1][1]
        take[i] = not covered and not pinned[i] and child_s[i] <= 0.5 * dur[i]
        inside.append((i, covered or take[i]))
    return np.flatnonzero(take)


def _outermost(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For start-sorted events of one thread, the position of the outermost event containing each."""
    root = np.arange(len(ts))
    stack: list[int] = []
    for i in range(len(ts)):
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        root[i] = root[stack[0]] if stack else i
        stack.append(i)
    return root


def _name(ev: TraceEvents, i: int) -> str:
    return ev.names[ev.name_id[i]]


def _is_cat(ev: TraceEvents, *cats: str) -> np.ndarray:
    return np.isin(ev.cat_id, ev.ids_of(lambda c: c in cats))


def _kernel_op(name: str) -> str | None:
    m = _COMM_KERNEL_RE.match(name)
    if not m:
        return None
    word = (m.group(1) or m.group(2) or "").lower()
    return _KERNEL_OPS.get(word, word or "collective")


@dataclass
class _Window:
    step: int
    row: int  # the ProfilerStep event's row, or -1
    pid: int
    tid: int
    s0: float
    s1: float
    label: str


def _windows(ev: TraceEvents, annotation: str | None = None) -> tuple[list[_Window], list[str]]:
    """The trace's windows, and a line per ProfilerStep skipped for having no host work. With
    ``annotation``, the host annotations whose name holds it (as HTA's ``critical_path_analysis``
    matches them), numbered from 0 in time order."""
    host = _is_cat(ev, *_HOST_CATS)
    runtime = _is_cat(ev, *_RUNTIME_CATS)
    step_cats = _is_cat(ev, "user_annotation", "cpu_op")
    windows, skipped = [], []
    if annotation:
        rows = np.flatnonzero(step_cats & np.isin(ev.name_id, ev.ids_of(lambda n: annotation in n)))
        rows = rows[np.argsort(ev.ts_us[rows], kind="stable")]
        if not len(rows):
            raise BadInputError(f"{ev.path}: no host annotation holds {annotation!r}")
        return [_Window(k, int(i), int(ev.pid[i]), int(ev.tid[i]), float(ev.ts_us[i]), float(ev.ts_us[i] + ev.dur_us[i]),
                        f"{_name(ev, i)} #{k}") for k, i in enumerate(rows)], []
    for i in np.flatnonzero(step_cats & np.isin(ev.name_id, ev.ids_of(lambda n: _STEP_RE.match(n) is not None))):
        s0, s1 = float(ev.ts_us[i]), float(ev.ts_us[i] + ev.dur_us[i])
        inside = host & (ev.pid == ev.pid[i]) & (ev.tid == ev.tid[i]) & (ev.ts_us >= s0) & (ev.ts_us < s1)
        number = int(_STEP_RE.match(_name(ev, i)).group(1))
        if int(inside.sum()) <= 1:
            skipped.append(f"ProfilerStep#{number}: no host work on its thread (skipped)")
            continue
        windows.append(_Window(number, int(i), int(ev.pid[i]), int(ev.tid[i]), s0, s1, f"ProfilerStep#{number}"))
    windows.sort(key=lambda w: w.s0)
    if windows:
        return windows, skipped
    # One window: the thread that launched the most device work, else the one that ran the most ops.
    pool = np.flatnonzero(runtime & (ev.correlation >= 0)) if (runtime & (ev.correlation >= 0)).any() else np.flatnonzero(host)
    if not len(pool):
        return [], skipped
    pairs, counts = np.unique(np.stack([ev.pid[pool], ev.tid[pool]]), axis=1, return_counts=True)
    pid, tid = (int(x) for x in pairs[:, int(np.argmax(counts))])
    mine = np.flatnonzero(host & (ev.pid == pid))
    s0, s1 = float(ev.ts_us[mine].min()), float(ev.end_us[mine].max())
    why = "; ".join(skipped) + "; " if skipped else ""
    return [_Window(-1, -1, pid, tid, s0, s1, "whole trace")], [
        f"{why}no ProfilerStep with host work: the whole trace of process {pid} is one window"]


def _phase(ev: TraceEvents, in_step: np.ndarray, prefix: str) -> tuple[float, float] | None:
    """The measured span of the step's host events whose name starts with ``prefix``."""
    rows = [i for i in np.flatnonzero(in_step) if _name(ev, i).startswith(prefix)
            and not ev.names[ev.cat_id[i]].startswith("gpu_")]
    if not rows:
        return None
    return float(min(ev.ts_us[i] for i in rows)), float(max(ev.end_us[i] for i in rows))


class _Builder:
    """One window's nodes and edges, built in one pass over its events in measured start order."""

    def __init__(self, ev: TraceEvents, w: _Window, note: str):
        self.ev, self.w = ev, w
        self.end = ev.end_us  # once: the property builds the array
        self.g = StepGraph(path=ev.path, rank=ev.rank, step=w.step, measured_us=w.s1 - w.s0, start_us=w.s0,
                           tail_us=0.0, window=w.label, note=note)

    def build(self) -> StepGraph:
        ev, w, g = self.ev, self.w, self.g
        s0, s1 = w.s0, w.s1
        in_step = (ev.ts_us >= s0) & (ev.ts_us < s1)
        mine = ev.pid == w.pid
        host_cats = _is_cat(ev, *_HOST_CATS)
        runtime = _is_cat(ev, *_RUNTIME_CATS)
        annotation = _is_cat(ev, "user_annotation")
        side_comm = annotation & np.isin(ev.name_id, ev.ids_of(lambda n: _SIDE_COMM_RE.match(n) is not None))
        comm = [int(i) for i in np.flatnonzero(side_comm & in_step & mine)]
        # A thread whose only work is collectives' spans (gloo's) is a communication lane; one that
        # also runs ops (the autograd thread enqueuing NCCL) is a host lane like any other.
        busy = {int(t) for t in ev.tid[in_step & mine & host_cats & ~side_comm]}
        lanes = [w.tid] + sorted(busy - {w.tid})
        host_rows: list[int] = []
        self.lane_of: dict[int, str] = {}
        self.aten_of: dict[int, str] = {}
        self.root_of: dict[int, int] = {}
        self.last_root: dict[str, int] = {}
        self.comm_op_of: dict[int, str] = {}
        for t in lanes:
            on = np.flatnonzero(mine & (ev.tid == t) & in_step & host_cats & ~side_comm)
            on = on[on != w.row]
            on = on[np.lexsort((-ev.dur_us[on], ev.ts_us[on]))]
            root = _outermost(ev.ts_us[on], self.end[on])
            # the collective annotation (nccl:all_reduce) a runtime call ran inside names its kernel's op
            enclosing_comm: dict[int, str] = {}
            stack: list[int] = []
            for k, i in enumerate(on):
                while stack and self.end[on[stack[-1]]] <= ev.ts_us[i]:
                    stack.pop()
                m = _COMM_ANNOTATION_RE.match(_name(ev, i))
                if m is None:
                    for j in reversed(stack):
                        m2 = _COMM_ANNOTATION_RE.match(_name(ev, on[j]))
                        if m2:
                            enclosing_comm[k] = m2.group(2)
                            break
                stack.append(k)
            for k in _leaves(ev.ts_us[on], self.end[on], runtime[on]):
                i = int(on[k])
                self.lane_of[i] = HOST if t == w.tid else f"host thread {t}"
                self.aten_of[i] = _name(ev, on[root[k]]) if on[root[k]] != w.row else _name(ev, i)
                self.root_of[i] = int(on[root[k]])
                if k in enclosing_comm:
                    self.comm_op_of[i] = enclosing_comm[k]
                host_rows.append(i)
        if not any(self.lane_of[i] == HOST for i in host_rows):
            raise BadInputError(f"{ev.path}: {w.label} has no host events to replay")
        g.phases = {name: span for name, span in (("backward", _phase(ev, in_step & mine, "autograd::engine::evaluate_function")),
                                                  ("optimizer", _phase(ev, in_step & mine, "Optimizer.step#")),
                                                  ("zero_grad", _phase(ev, in_step & mine, "Optimizer.zero_grad#")))
                    if span is not None}
        self.launch_of = {int(ev.correlation[i]): i for i in host_rows if runtime[i] and ev.correlation[i] >= 0}
        device_all = np.flatnonzero(_is_cat(ev, *_DEVICE_CATS) & (ev.stream >= 0))
        device = [int(i) for i in device_all if int(ev.correlation[i]) in self.launch_of]
        self._stream_history(device_all, device)
        self._sync_events()
        # Stream waits the trace did not describe (no cuda_sync events: ROCm, older PyTorch): their
        # correlations, for inferring which task a stream waited for from when it started.
        self.blind_waits = sorted(int(ev.correlation[i]) for i in host_rows
                                  if _STREAM_WAIT_RE.match(_name(ev, i)) and int(ev.correlation[i]) not in self.sync_of)
        events = sorted([(float(ev.ts_us[i]), 0, i) for i in host_rows] + [(float(ev.ts_us[i]), 1, i) for i in device]
                        + [(float(ev.ts_us[i]), 2, i) for i in comm]
                        + [(float(self.end[i]), -1, i) for i in host_rows if self._is_sync(i)])
        self.node_of: dict[int, int] = {}
        self.last_on: dict[str, int] = {}
        self.lane_end: dict[str, float] = {}
        self.side_ends: dict[str, tuple[list[float], list[int]]] = {}
        self.device_nodes: list[int] = []  # in launch order per stream
        self.stream_tasks: dict[int, list[tuple[int, int]]] = defaultdict(list)  # stream → [(correlation, node)]
        self.corr_of: dict[int, int] = {}
        # stream → (recording stream, the cudaEventRecord's correlation, the wait call's correlation)
        self.pending_waits: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for start, what, i in events:
            if what == -1:
                self._return(i)
            elif what == 0:
                self._host(i, start)
            elif what == 1:
                self._device(i, start)
            else:
                self._comm(i, start)
        g.tail_us = max(0.0, s1 - self.lane_end[HOST])
        host_end = self.lane_end[HOST] + g.tail_us
        g.measured_host_us = host_end - s0
        ends = [g.start_measured_us[d] + g.dur_us[d] for d in self.device_nodes]
        g.device_from_us = max([s0] + list(self.backlog.values()))
        g.measured_device_us = (max(ends) - g.device_from_us) if ends else 0.0
        g.measured_us = max(g.measured_host_us, g.measured_device_us)
        return g

    def _stream_history(self, device_all: np.ndarray, device: list[int]) -> None:
        """Per stream, when the work queued on it before the window ended (a backlog)."""
        ev = self.ev
        self.backlog: dict[int, float] = {}
        self.before_end: dict[int, float] = {}
        mine = set(device)
        first: dict[int, int] = {}
        for i in device:
            s = int(ev.stream[i])
            if s not in first or ev.ts_us[i] < ev.ts_us[first[s]]:
                first[s] = i
        for s, f in first.items():
            earlier = [int(i) for i in device_all if ev.stream[i] == s and i not in mine and ev.ts_us[i] < ev.ts_us[f]]
            if earlier:
                end = float(max(self.end[i] for i in earlier))
                self.before_end[s] = end
                if end > self.w.s0:
                    self.backlog[s] = end

    def _sync_events(self) -> None:
        """The trace's cuda_sync events by the correlation of the runtime call they belong to."""
        ev = self.ev
        self.sync_of: dict[int, tuple[str, int, int, int]] = {}
        for row, (kind, on_stream, record_corr) in ev.sync_args.items():
            corr = int(ev.correlation[row])
            if corr >= 0:
                self.sync_of[corr] = (kind, on_stream, record_corr, int(ev.stream[row]))

    def _recorded(self, stream: int, before_corr: int) -> int:
        """The last task of this window on ``stream`` launched before the call with ``before_corr``."""
        tasks = [n for c, n in self.stream_tasks.get(stream, []) if c < before_corr]
        return tasks[-1] if tasks else -1

    def _host(self, i: int, start: float) -> None:
        ev, g = self.ev, self.g
        end = float(self.end[i])
        lane = self.lane_of[i]
        prev = self.last_on.get(lane, -1)
        prev_end = self.lane_end.get(lane, self.w.s0)
        gap = start - prev_end
        waits = []
        if gap > 0:  # the last node of each other lane that ended inside this gap
            for other, (ends, nodes) in self.side_ends.items():
                k = bisect.bisect_right(ends, start) - 1
                if other != lane and k >= 0 and ends[k] >= prev_end:
                    waits.append((nodes[k], start - ends[k]))
        if waits:  # the gap was a wait: only the part after what it waited for is the host's
            gap = min(t for _, t in waits)
        name = _name(ev, i)
        corr = int(ev.correlation[i])
        n = g.add(name=name, kind=HOST, lane=lane, start_us=start, dur_us=end - start,
                  release_us=self.w.s0 + gap if prev < 0 and lane == HOST else -np.inf,
                  aten=self.aten_of.get(i, name))
        if prev >= 0:
            e = g.edge(prev, n, THREAD, gap)
            before = self.last_root.get(lane, -1)
            if before >= 0 and before != self.root_of.get(i, -1):
                idle = float(ev.ts_us[self.root_of[i]]) - float(self.end[before])
                g.idle_us[e] = min(gap, max(0.0, idle))
        elif lane != HOST and self.last_on.get(HOST, -1) >= 0:  # a side lane starts from the step's thread
            issuer = self.last_on[HOST]
            g.edge(issuer, n, FORK, start - g.start_measured_us[issuer], from_end=False)
        elif lane != HOST:
            g.release_us[n] = start
        for c, tail in waits:
            g.edge(c, n, JOIN, tail)
        if lane == HOST and prev < 0:
            g.first_op_us = float(ev.ts_us[self.root_of.get(i, i)])
        self.node_of[i] = n
        self.last_on[lane] = n
        self.last_root[lane] = self.root_of.get(i, -1)
        self.lane_end[lane] = max(end, prev_end)
        if lane != HOST:
            self._side(n)
        if _STREAM_WAIT_RE.match(name) and corr in self.sync_of:
            _, on_stream, record_corr, waiting = self.sync_of[corr]
            if waiting >= 0 and on_stream >= 0:
                self.pending_waits[waiting].append((on_stream, record_corr if record_corr >= 0 else corr, corr))

    def _is_sync(self, i: int) -> bool:
        name = _name(self.ev, i)
        if _STREAM_WAIT_RE.match(name):
            return False
        return int(self.ev.correlation[i]) in self.sync_of or bool(_DEVICE_SYNC_RE.match(name) or _STREAM_SYNC_RE.match(name))

    def _return(self, i: int) -> None:
        """A synchronising call's return, at its measured end (when every device task it could have
        waited for has been seen): after the task it waited for, a node of its own."""
        g = self.g
        n = self.node_of[i]
        start, end = g.start_measured_us[n], float(self.end[i])
        name, lane = g.names[n], g.lane[n]
        dep = self._sync_target(i, name, int(self.ev.correlation[i]), end)
        if dep < 0:
            return
        dep_end = g.start_measured_us[dep] + g.dur_us[dep]
        waited = dep_end > start
        if waited:  # its time was the wait: the call's own work is what follows the task's end
            g.dur_us[n] = 0.0
        back = g.add(name=f"{name} (returns)", kind=HOST, lane=lane, start_us=max(start, min(end, dep_end)),
                     dur_us=0.0, aten=g.aten[n])
        g.edge(n, back, THREAD, 0.0)
        g.edge(dep, back, SYNC, end - dep_end if waited else 0.0)  # may be -1 µs: timestamps in whole µs
        if self.last_on.get(lane) == n:
            self.last_on[lane] = back
        if lane != HOST:
            self._side(back)

    def _sync_target(self, i: int, name: str, corr: int, end: float) -> int:
        """The device task a synchronising call waited for, or -1."""
        g = self.g
        if corr in self.sync_of and not _STREAM_WAIT_RE.match(name):
            kind, on_stream, record_corr, stream = self.sync_of[corr]
            if "Event" in kind and on_stream >= 0:
                return self._recorded(on_stream, record_corr if record_corr >= 0 else corr)
            if "Stream" in kind and stream >= 0:
                return self._recorded(stream, corr)
        if not (_DEVICE_SYNC_RE.match(name) or _STREAM_SYNC_RE.match(name)):
            return -1
        # Without the trace's sync events: the latest-ending task launched before the call (a
        # blocking copy: including its own copy) that ended by the call's return.
        launched = [n for tasks in self.stream_tasks.values() for c, n in tasks if c <= corr or corr < 0]
        done = [d for d in launched if g.start_measured_us[d] + g.dur_us[d] <= end + 1.0]
        return max(done, key=lambda d: g.start_measured_us[d] + g.dur_us[d]) if done else -1

    def _device(self, i: int, start: float) -> None:
        ev, g = self.ev, self.g
        end = float(self.end[i])
        stream = int(ev.stream[i])
        lane = f"stream {stream}"
        corr = int(ev.correlation[i])
        launcher = self.node_of.get(self.launch_of[corr], -1)
        prev = self.last_on.get(lane, -1)
        name = _name(ev, i)
        op = _kernel_op(name) if ev.names[ev.cat_id[i]] == "kernel" else None
        if op is not None and self.comm_op_of.get(self.launch_of[corr]):
            op = self.comm_op_of[self.launch_of[corr]] if op in ("generic", "collective") else op
        aten = self.aten_of.get(self.launch_of[corr], name)
        # Candidate constraints at their nominal lags; the one that binds carries what is left.
        cands: list[tuple[float, str, int, bool]] = []  # (time, kind, source, from its end)
        if launcher >= 0:
            cands.append((g.start_measured_us[launcher] + min(start - g.start_measured_us[launcher],
                                                              g.dur_us[launcher] * _LAUNCH_LATENCY_CAP), LAUNCH, launcher, False))
        if prev >= 0:  # after the task ahead; one that overlapped it (a CUDA graph's branches) after its start
            prev_end = g.start_measured_us[prev] + g.dur_us[prev]
            overlapped = prev_end > start
            cands.append((g.start_measured_us[prev] if overlapped else prev_end, STREAM, prev, not overlapped))
        pending = self.pending_waits.get(stream, [])
        for on_stream, record_corr, wait_corr in [w for w in pending if w[2] < corr]:
            rec = self._recorded(on_stream, record_corr)  # the first task issued after the wait waits
            if rec >= 0:
                cands.append((g.start_measured_us[rec] + g.dur_us[rec], EVENT_WAIT, rec, True))
        self.pending_waits[stream] = [w for w in pending if w[2] >= corr]
        if not any(c[1] == EVENT_WAIT for c in cands) and self.blind_waits:
            other = self._inferred_wait(stream, corr, prev, start)
            if other >= 0:
                cands.append((g.start_measured_us[other] + g.dur_us[other], EVENT_WAIT, other, True))
                self.g.inferred_waits += 1
        release = -np.inf
        if prev < 0 and stream in self.before_end and self.before_end[stream] >= (
                g.start_measured_us[launcher] + g.dur_us[launcher] if launcher >= 0 else -np.inf):
            release = self.before_end[stream]  # queued behind work launched before the window
            cands.append((release, "release", -1, True))
        n = g.add(name=name, kind=DEVICE, lane=lane, start_us=start, dur_us=end - start, op=op, aten=aten)
        bind = max(cands, key=lambda c: c[0]) if cands else None
        residual = max(0.0, start - bind[0]) if bind else 0.0
        for t, kind, src, from_end in cands:
            lag = residual if (t, kind, src) == bind[:3] else 0.0
            if kind == LAUNCH:
                base = t - g.start_measured_us[launcher]
                g.edge(launcher, n, LAUNCH, base + lag, from_end=False)
            elif kind == "release":
                g.release_us[n] = release + lag
            elif from_end:
                g.edge(src, n, kind, lag)
            else:
                g.edge(src, n, kind, lag, from_end=False)
        if launcher < 0 and not cands:
            g.release_us[n] = start
        self.node_of[i] = n
        self.last_on[lane] = n
        self.device_nodes.append(n)
        self.stream_tasks[stream].append((corr, n))
        self.corr_of[n] = corr

    def _inferred_wait(self, stream: int, corr: int, prev: int, start: float) -> int:
        """Where a stream wait the trace did not describe was issued between this task's launch and
        the one before it on its stream: the task of another stream, launched before the wait, that
        ended last before this one started (within 1 µs), or -1."""
        g = self.g
        prev_corr = self.corr_of.get(prev, -1)
        k = bisect.bisect_right(self.blind_waits, prev_corr)
        if k >= len(self.blind_waits) or self.blind_waits[k] >= corr:
            return -1
        wait_corr = max(c for c in self.blind_waits[k:bisect.bisect_left(self.blind_waits, corr)])
        best, best_end = -1, -np.inf
        for s, tasks in self.stream_tasks.items():
            if s == stream:
                continue
            for c, n in reversed(tasks):
                if c >= wait_corr:
                    continue
                end = g.start_measured_us[n] + g.dur_us[n]
                if end <= start + 1.0 and end > best_end:
                    best, best_end = n, end
                break  # the last task launched before the wait on that stream
        return best

    def _comm(self, i: int, start: float) -> None:
        # A collective thread runs its calls in order; the step thread's isend/irecv spans overlap
        # one another (a send beside its recv), each on a lane of its own.
        ev, g = self.ev, self.g
        name = _name(ev, i)
        lane = f"thread {int(ev.tid[i])}" if ev.tid[i] != self.w.tid else f"p2p {name} {i}"
        prev = self.last_on.get(lane, -1)
        issuer = self.last_on.get(HOST, -1)
        n = g.add(name=name, kind=COMM, lane=lane, start_us=start, dur_us=float(self.end[i]) - start,
                  op=name.split(":", 1)[1])
        if prev >= 0:
            g.edge(prev, n, THREAD, 0.0)
        if issuer >= 0:
            g.edge(issuer, n, ISSUE, start - g.start_measured_us[issuer], from_end=False)
        else:
            g.release_us[n] = start
        self.node_of[i] = n
        self.last_on[lane] = n
        self._side(n)

    def _side(self, n: int) -> None:
        """Record a side lane's node (a host task of another thread, a collective): what a gap waits for."""
        g = self.g
        ends, nodes = self.side_ends.setdefault(g.lane[n], ([], []))
        end = g.start_measured_us[n] + g.dur_us[n]
        if ends and end < ends[-1]:  # a lane's nodes end in order; keep the list sorted regardless
            k = bisect.bisect_right(ends, end)
            ends.insert(k, end)
            nodes.insert(k, n)
        else:
            ends.append(end)
            nodes.append(n)


def replay(g: StepGraph) -> tuple[float, np.ndarray, np.ndarray]:
    """(step µs, start µs per node, end µs per node) of the graph with its durations: a longest
    path in topological order.

    The step is the longer of the host's (the window's start to the step thread's last node's end
    plus the measured tail) and the device's (from when it finished the work queued before the
    window to its last task's end): in a steady state the next step waits for the slower.
    """
    start, end, _ = _longest_path(g)
    return _step_us(g, end), start, end


def _step_us(g: StepGraph, end: np.ndarray) -> float:
    host = [end[i] for i in range(len(g)) if g.lane[i] == HOST]
    last = (max(host) if host else g.start_us) + g.tail_us - g.start_us
    device = [end[i] for i in range(len(g)) if g.kind[i] == DEVICE]
    if device:
        last = max(last, max(device) - max(g.start_us, g.device_from_us))
    return last


def _longest_path(g: StepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(g)
    start, end = np.zeros(n), np.zeros(n)
    binding = np.full(n, -1)  # the edge that set each node's start (or its end)
    into_start: list[list[int]] = [[] for _ in range(n)]
    into_end: list[list[int]] = [[] for _ in range(n)]
    for e, d in enumerate(g.dst):
        (into_end if g.to_end[e] else into_start)[d].append(e)
    for i in g.order():
        t, b = g.release_us[i], -1
        for e in into_start[i]:
            s = g.src[e]
            c = (end[s] if g.from_end[e] else start[s]) + g.lag_us[e]
            if c > t:
                t, b = c, e
        if t == -np.inf:
            t = g.start_measured_us[i]
        start[i] = t
        end[i] = t + g.dur_us[i]
        for e in into_end[i]:
            s = g.src[e]
            c = (end[s] if g.from_end[e] else start[s]) + g.lag_us[e]
            if c > end[i]:
                end[i], b = c, e
        binding[i] = b
    return start, end, binding


def critical_path(g: StepGraph) -> list[tuple[int, str, int]]:
    """The replayed step's critical path, first node first: ``(node, how, edge)``, where ``how`` is
    the kind of the edge that bound it (``start`` for the first, whose ``edge`` is -1). A node's
    duration is on the path where the next edge leaves from its end (``g.from_end``)."""
    start, end, binding = _longest_path(g)
    host = [i for i in range(len(g)) if g.lane[i] == HOST]
    device = [i for i in range(len(g)) if g.kind[i] == DEVICE]
    last = max(host, key=lambda i: end[i]) if host else None
    if device:
        d = max(device, key=lambda i: end[i])
        if last is None or end[d] - max(g.start_us, g.device_from_us) > end[last] + g.tail_us - g.start_us:
            last = d
    path = []
    node = last
    while node is not None and node >= 0:
        e = int(binding[node])
        path.append((node, g.edge_kind[e] if e >= 0 else "start", e))
        node = g.src[e] if e >= 0 else None
    return path[::-1]


def replay_error(g: StepGraph) -> float:
    """Replayed ÷ measured step − 1."""
    return replay(g)[0] / g.measured_us - 1.0


def step_graphs(path: str | os.PathLike | TraceEvents, steps: tuple[int, int] | None = None,
                annotation: str | None = None) -> list[StepGraph]:
    """The graph of every window of the trace at ``path``: each host ProfilerStep with host work
    (or of ``steps=(a, b)`` only), else the whole trace as one window (``step`` -1); with
    ``annotation``, each host annotation whose name holds it (``step`` its instance, from 0)."""
    ev = path if isinstance(path, TraceEvents) else read_trace(path, round_to_us=False)
    windows, skipped = _windows(ev, annotation)
    if not windows:
        raise BadInputError(f"{ev.path}: no host events: not a PyTorch profiler trace of a step to replay")
    note = "; ".join(skipped)
    return [_Builder(ev, w, note).build() for w in windows
            if steps is None or w.step < 0 or steps[0] <= w.step <= steps[1]]


def critical_path_length_us(g: StepGraph, *, count_host_idle: bool = True) -> float:
    """The replayed critical path's length, from its first task's start to its last task's end.

    ``count_host_idle=False`` counts a thread's time between its top-level ops as zero, as HTA's
    ``critical_path_analysis`` does (its ``DEPENDENCY`` edges weigh nothing): the figure to hold
    against HTA's on the same window."""
    h = g
    if not count_host_idle:
        import copy

        h = copy.deepcopy(g)
        for e, idle in h.idle_us.items():
            h.lag_us[e] -= idle
        for e in range(len(h.src)):  # a blocking call's return weighs nothing in HTA (is_blocking)
            if h.edge_kind[e] == SYNC:
                h.lag_us[e] = 0.0
                for t in h.edges_into(h.dst[e], THREAD):
                    h.dur_us[h.src[t]] = 0.0
        first = min((i for i in range(len(h)) if h.lane[i] == HOST), key=lambda i: h.start_measured_us[i])
        h.release_us[first] = h.start_measured_us[first]
        start, end, _ = _longest_path(h)
        return float(end.max() - min(start.min(), h.first_op_us))  # the first op's own lead-in counts
    start, end, _ = _longest_path(h)
    return float(end.max() - start.min())
