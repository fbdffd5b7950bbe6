"""A step's execution graph: nodes, typed dependencies, and its replay as a longest path.

Lumos (Liang et al., MLSys 2025, arXiv:2504.09307) predicts a distributed step by replaying the
dependency graph of a measured trace with re-costed tasks; Holistic Trace Analysis's critical-path
analysis (HTA 0.5.0, ``hta/analyzers/critical_path_analysis.py``) builds the same kind of graph from
the same events. :func:`perfkit.analyse.trace.graph.step_graphs` reads it from a Kineto trace (one
rank, one window); :mod:`perfkit.analyse.predict` edits it; this module is the graph and its replay.

**Nodes** are :data:`HOST` tasks (a thread's leaf ops and runtime calls), :data:`DEVICE` tasks (a
stream's kernels, copies and sets; NCCL/RCCL kernels among them, with ``op`` set) and :data:`COMM`
spans (a collective that runs on a thread of its own, as gloo's do).

**Edges** (each typed, :data:`EDGE_KINDS`; ``lag_us`` is the measured time the dependency did not
explain, on the edge that bound):

- ``thread``: a thread's tasks in order (end → start, the measured gap: Python, dispatch);
- ``fork``: another thread's first task after the step thread's task that ran before it;
- ``join``: a host task after a side lane's task (the autograd thread, a collective) that ended
  inside the gap before it: the gap was a wait;
- ``launch``: a runtime call to the device task with its ``correlation`` (start → start);
- ``stream``: a stream's tasks in order;
- ``event_wait``: the first task a stream runs after a ``cudaStreamWaitEvent``/``hipStreamWaitEvent``
  follows the task the event recorded on another stream;
- ``sync``: a synchronising call (device, stream and event synchronisation, a blocking copy) returns
  after the device task it waited for ends (the call is two nodes, its own work and its return);
- ``issue``: a collective after the task that issued or produced it; ``wait``: a what-if's waiter.

**Replay** is a longest-path pass in topological order: each node starts at the latest of its
incoming edges (``end`` or ``start`` of the source, plus the lag) and its release, and runs its
duration. With every duration as measured it reproduces the step when the edges are the ones that
held; a graph with an edge missing or a duration changed moves by what that edge or task carried,
which is what the tests check (kernels × 2 and × 0.5 on the critical path, a removed event wait, a
removed synchronisation).

**The step's time** is its period: the host's window (its start to the step thread's last task plus
the measured tail), or, where the device runs behind the host (a GPU-bound step, whose launch queue
was already full when the window opened), from when the device finished the work queued before the
window to when it finished this window's work, whichever is longer. A host ProfilerStep of 16.8 ms
whose kernels end 32 ms later is a GPU-bound step of the device's period, not a 16.8 ms step
(TraceLens's MI300X ResNet training trace: host steps of 15.9–16.8 ms, device periods of
18.6–19.0 ms, summing to TraceLens's own 56.52 ms of GPU time).
"""

from __future__ import annotations

import copy
import heapq
from dataclasses import dataclass, field

import numpy as np

__all__ = ["COMM", "DEVICE", "EDGE_KINDS", "HOST", "StepGraph", "critical_path", "critical_path_length_us", "replay",
           "replay_error"]

HOST, DEVICE, COMM = "host", "device", "comm"
THREAD, FORK, JOIN, LAUNCH, STREAM, EVENT_WAIT, SYNC, ISSUE, WAIT = (
    "thread", "fork", "join", "launch", "stream", "event_wait", "sync", "issue", "wait")
EDGE_KINDS = (THREAD, FORK, JOIN, LAUNCH, STREAM, EVENT_WAIT, SYNC, ISSUE, WAIT)
"""``wait``: an added collective's waiter (a what-if's edge, :mod:`perfkit.analyse.predict`)."""


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
    _launchers: tuple | None = field(default=None, repr=False, compare=False)
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
        self._launchers = None
        renumber = {e: k for k, e in enumerate(kept)}
        self.idle_us = {renumber[e]: t for e, t in self.idle_us.items() if e in renumber}

    def launcher(self, node: int) -> int:
        """The runtime call that launched a device task (its ``launch`` edge's source), or -1; one
        pass over the edges builds the map, rebuilt after the edges change."""
        if self._launchers is None or self._launchers[0] != len(self.src):
            self._launchers = (len(self.src), {d: s for s, d, k in zip(self.src, self.dst, self.edge_kind) if k == LAUNCH})
        return self._launchers[1].get(node, -1)

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


def critical_path_length_us(g: StepGraph, *, count_host_idle: bool = True) -> float:
    """The replayed critical path's length, from its first task's start to its last task's end.

    ``count_host_idle=False`` counts a thread's time between its top-level ops as zero, as HTA's
    ``critical_path_analysis`` does (its ``DEPENDENCY`` edges weigh nothing): the figure to hold
    against HTA's on the same window."""
    h = g
    if not count_host_idle:
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
