"""A training step's execution graph from its Kineto trace, and its replay to a step time.

Lumos (Liang et al., MLSys 2025, arXiv:2504.09307) predicts a distributed step by replaying the
dependency graph of a measured trace with re-costed tasks. This module builds that graph for one
rank and one ``ProfilerStep#N`` from what ``torch.profiler`` records, and replays it:

- **Host lane**: the leaves of the thread that runs the ProfilerStep (events with no other event
  of that thread inside them: aten ops' kernels on a CPU, runtime calls on a GPU), in order; the
  gap before each is kept as measured (Python, dispatch, launch overhead).
- **Device lanes**: each GPU stream's kernels, copies and sets, in order. A task starts after the
  one before it on its stream and after its launch (the runtime call with its ``correlation``).
  Which of the two held is read from the trace: a task launched before the one ahead of it ended
  was queued (the stream's measured gap binds, the launch by the call's duration); otherwise it
  waited for its launch (the measured launch latency binds, no stream gap).
- **Communication lanes**: a gloo or NCCL collective that runs on a thread of its own
  (``gloo:all_reduce`` ...), issued from the host leaf that was running when it started.
- **Waits.** A host gap that ends after a communication task ended inside it was a wait: the
  next leaf starts ``tail`` after that task ends (``tail``, the measured time from its end), or
  ``tail`` after the leaf before it, whichever is later. A synchronising runtime call
  (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``, a blocking
  copy; HIP's alike) ends after the last device task launched before it, likewise.

Each node starts at the latest of its constraints and runs its own duration; the graph is
processed in measured start order, which is topological (every constraint points to an event
that started earlier). With every duration as measured, the replay returns the measured step
when the dependencies are the ones that held: the replay error says how well the graph explains
the step. :mod:`perfkit.analyse.predict` re-costs and adds communication tasks on this graph.

Not modelled (said where it matters): cross-stream event waits (``cudaStreamWaitEvent``; NCCL's
stream waiting for the compute stream), other host threads than the step's and the collectives'
(a DataLoader's workers run outside the step's critical path here), and the skew between ranks
(a collective's measured duration already holds the wait for the slowest rank).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from perfkit.analyse.trace.events import TraceEvents, read_trace
from perfkit.core.errors import BadInputError

__all__ = ["HOST", "DEVICE", "COMM", "StepGraph", "step_graphs", "replay", "replay_error"]

HOST, DEVICE, COMM = "host", "device", "comm"
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_COMM_NAME_RE = re.compile(r"^(gloo|nccl|rccl|mpi|ucc):")
_SYNC_RE = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH)$")


@dataclass
class StepGraph:
    """One rank's step: nodes in measured start order (row ``i`` is node ``i``).

    ``lane`` names a node's lane (``host``, ``stream <n>``, a communication thread); ``kind`` is
    :data:`HOST`, :data:`DEVICE` or :data:`COMM`. Constraints, each ``-1`` when absent:
    ``lane_prev`` (+ ``lane_gap_us``), ``issue`` (+ ``issue_offset_us``: starts that long after its
    issuer *starts*), ``waits`` (start no earlier than each one's end + ``wait_tail_us``), and
    ``end_wait`` (ends no earlier than its end + ``end_tail_us``; ``dur_us`` is then the node's own
    work). ``bytes`` and ``op`` describe a communication task where known.
    """

    path: str
    rank: int
    step: int
    measured_us: float
    """The ProfilerStep's duration on the host."""
    start_us: float
    tail_us: float
    """From the last host node's end to the ProfilerStep's end."""
    names: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    lane: list[str] = field(default_factory=list)
    start_measured_us: list[float] = field(default_factory=list)
    dur_us: list[float] = field(default_factory=list)
    lane_prev: list[int] = field(default_factory=list)
    lane_gap_us: list[float] = field(default_factory=list)
    issue: list[int] = field(default_factory=list)
    issue_offset_us: list[float] = field(default_factory=list)
    waits: list[list[tuple[int, float]]] = field(default_factory=list)
    end_wait: list[int] = field(default_factory=list)
    end_tail_us: list[float] = field(default_factory=list)
    op: list[str | None] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Measured (start, end) µs of the step's ``backward`` (the autograd engine's functions, any
    thread), ``optimizer`` (``Optimizer.step#``) and ``zero_grad``, where the trace has them."""

    def __len__(self) -> int:
        return len(self.names)

    def add(self, *, name: str, kind: str, lane: str, start_us: float, dur_us: float, lane_prev: int = -1,
            lane_gap_us: float = 0.0, issue: int = -1, issue_offset_us: float = 0.0,
            waits: list[tuple[int, float]] | None = None, end_wait: int = -1, end_tail_us: float = 0.0,
            op: str | None = None, nbytes: float = float("nan")) -> int:
        self.names.append(name)
        self.kind.append(kind)
        self.lane.append(lane)
        self.start_measured_us.append(start_us)
        self.dur_us.append(dur_us)
        self.lane_prev.append(lane_prev)
        self.lane_gap_us.append(lane_gap_us)
        self.issue.append(issue)
        self.issue_offset_us.append(issue_offset_us)
        self.waits.append(list(waits or []))
        self.end_wait.append(end_wait)
        self.end_tail_us.append(end_tail_us)
        self.op.append(op)
        self.bytes.append(nbytes)
        return len(self.names) - 1

    def order(self) -> list[int]:
        """Node indices in processing order (measured start; insertion order breaks ties)."""
        return sorted(range(len(self)), key=lambda i: (self.start_measured_us[i], i))

    def host_nodes(self) -> list[int]:
        return [i for i in self.order() if self.kind[i] == HOST]


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


def _name(ev: TraceEvents, i: int) -> str:
    return ev.names[ev.name_id[i]]


def _steps(ev: TraceEvents) -> list[tuple[int, int]]:
    """(step number, event row) of each host ProfilerStep annotation, in time order."""
    cats = {ev.names.index(c) for c in ("user_annotation", "cpu_op") if c in ev.names}
    rows = [i for i in np.flatnonzero(np.isin(ev.cat_id, list(cats)))
            if _STEP_RE.match(_name(ev, i))]
    return sorted(((int(_STEP_RE.match(_name(ev, i)).group(1)), int(i)) for i in rows),
                  key=lambda s: ev.ts_us[s[1]])


def _phase(ev: TraceEvents, in_step: np.ndarray, prefix: str) -> tuple[float, float] | None:
    """The measured span of the step's host events whose name starts with ``prefix``."""
    rows = [i for i in np.flatnonzero(in_step) if _name(ev, i).startswith(prefix)
            and not ev.names[ev.cat_id[i]].startswith("gpu_")]
    if not rows:
        return None
    return float(min(ev.ts_us[i] for i in rows)), float(max(ev.end_us[i] for i in rows))


def _build(ev: TraceEvents, step: int, row: int) -> StepGraph:
    s0, s1 = float(ev.ts_us[row]), float(ev.ts_us[row] + ev.dur_us[row])
    pid, tid = ev.pid[row], ev.tid[row]
    def is_cat(*names: str) -> np.ndarray:  # by category id: no per-event strings
        return np.isin(ev.cat_id, ev.ids_of(lambda c: c in names))

    in_step = (ev.ts_us >= s0) & (ev.ts_us < s1)
    # Communication spans (gloo:all_reduce on gloo's threads; gloo:send/recv on the step's own
    # thread, an isend's span that outlives the call issuing it): nodes of their own lanes, issued
    # by the op running at their start, never the host's tasks.
    comm_named = is_cat("user_annotation") & np.isin(ev.name_id, ev.ids_of(lambda n: _COMM_NAME_RE.match(n) is not None))
    comm = [int(i) for i in np.flatnonzero(comm_named & in_step & (ev.pid == pid))]
    comm_threads = {int(ev.tid[i]) for i in comm}
    # The step's thread, and every other thread of its process that ran ops in the step (the
    # autograd engine's device threads run a GPU backward), each one host lane of its leaves.
    host_cats = is_cat("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
    runtime = is_cat("cuda_runtime", "cuda_driver")
    lanes = [int(tid)] + sorted({int(t) for t in ev.tid[in_step & (ev.pid == pid) & host_cats]}
                               - {int(tid)} - comm_threads)
    host_rows: list[int] = []
    lane_of: dict[int, str] = {}
    for t in lanes:
        on = np.flatnonzero((ev.pid == pid) & (ev.tid == t) & in_step & host_cats & ~comm_named)
        on = on[on != row]
        on = on[np.lexsort((-ev.dur_us[on], ev.ts_us[on]))]
        on = on[_leaves(ev.ts_us[on], ev.end_us[on], runtime[on])]
        for i in on:
            lane_of[int(i)] = HOST if t == tid else f"host thread {t}"
        host_rows += [int(i) for i in on]
    g = StepGraph(path=ev.path, rank=ev.rank, step=step, measured_us=s1 - s0, start_us=s0, tail_us=0.0)
    if not any(lane_of[i] == HOST for i in host_rows):
        raise BadInputError(f"{ev.path}: ProfilerStep#{step} has no host events to replay")
    g.phases = {name: span for name, span in (("backward", _phase(ev, in_step, "autograd::engine::evaluate_function")),
                                              ("optimizer", _phase(ev, in_step, "Optimizer.step#")),
                                              ("zero_grad", _phase(ev, in_step, "Optimizer.zero_grad#")))
                if span is not None}
    launch_of = {int(ev.correlation[i]): i for i in host_rows
                 if runtime[i] and ev.correlation[i] >= 0}
    device = [int(i) for i in np.flatnonzero(is_cat(*_DEVICE_CATS) & (ev.stream >= 0))
              if int(ev.correlation[i]) in launch_of]
    # One pass over every event in measured start order: hosts, devices, collectives.
    events = sorted([(float(ev.ts_us[i]), 0, i) for i in host_rows] + [(float(ev.ts_us[i]), 1, i) for i in device]
                    + [(float(ev.ts_us[i]), 2, i) for i in comm])
    node_of: dict[int, int] = {}
    last_on: dict[str, int] = {}
    side_nodes: list[int] = []  # collectives and side host lanes: what a host gap may wait for
    device_nodes: list[int] = []
    lane_end: dict[str, float] = {}
    for start, what, i in events:
        end = float(ev.end_us[i])
        if what == 0:
            lane = lane_of[i]
            prev = last_on.get(lane, -1)
            prev_end = lane_end.get(lane, s0)
            gap = start - prev_end
            ended: dict[str, tuple[int, float]] = {}
            for c in side_nodes:  # the last node of each other lane that ended inside this gap
                c_end = g.start_measured_us[c] + g.dur_us[c]
                if g.lane[c] != lane and prev_end <= c_end <= start and gap > 0:
                    if g.lane[c] not in ended or c_end > ended[g.lane[c]][1]:
                        ended[g.lane[c]] = (c, c_end)
            waits = [(c, start - c_end) for c, c_end in ended.values()]
            end_wait, end_tail, work = -1, 0.0, end - start
            if _SYNC_RE.match(_name(ev, i)):
                done = [d for d in device_nodes if g.start_measured_us[d] + g.dur_us[d] <= end + 1.0]
                if done:
                    end_wait = max(done, key=lambda d: g.start_measured_us[d] + g.dur_us[d])
                    dep_end = g.start_measured_us[end_wait] + g.dur_us[end_wait]
                    end_tail, work = max(0.0, end - dep_end), (end - start) - max(0.0, dep_end - start)
            if waits:  # the gap was a wait: only the part after what it waited for is the host's
                gap = min(t for _, t in waits)
            issue, offset = -1, 0.0
            if prev < 0 and lane != HOST and last_on.get(HOST, -1) >= 0:  # a side lane starts from the step's thread
                issue = last_on[HOST]
                offset = start - g.start_measured_us[issue]
            name = _name(ev, i)
            n = g.add(name=name, kind=HOST, lane=lane, start_us=start, dur_us=max(0.0, work),
                      lane_prev=prev, lane_gap_us=gap, issue=issue, issue_offset_us=offset, waits=waits,
                      end_wait=end_wait, end_tail_us=end_tail)
            lane_end[lane] = max(end, prev_end)
            if lane != HOST:
                side_nodes.append(n)
        elif what == 1:
            lane = f"stream {int(ev.stream[i])}"
            launcher = node_of.get(launch_of[int(ev.correlation[i])], -1)
            prev = last_on.get(lane, -1)
            prev_end = g.start_measured_us[prev] + g.dur_us[prev] if prev >= 0 else -np.inf
            offset = start - (g.start_measured_us[launcher] if launcher >= 0 else start)
            gap = 0.0
            if launcher >= 0 and prev_end >= g.start_measured_us[launcher] + g.dur_us[launcher]:
                # Queued behind the stream (launched before the task ahead ended): the stream's gap
                # binds, and the launch only by the call's own time.
                gap, offset = max(0.0, start - prev_end), min(offset, g.dur_us[launcher])
            n = g.add(name=_name(ev, i), kind=DEVICE, lane=lane, start_us=start, dur_us=end - start,
                      lane_prev=prev, lane_gap_us=gap, issue=launcher, issue_offset_us=offset)
            device_nodes.append(n)
        else:
            # A collective thread runs its calls in order; the step thread's isend/irecv spans
            # overlap one another (a send beside its recv), each on a lane of its own.
            lane = f"thread {int(ev.tid[i])}" if ev.tid[i] != tid else f"p2p {_name(ev, i)} {i}"
            prev = last_on.get(lane, -1)
            issuer = last_on.get(HOST, -1)
            n = g.add(name=_name(ev, i), kind=COMM, lane=lane, start_us=start, dur_us=end - start, lane_prev=prev,
                      issue=issuer, issue_offset_us=start - (g.start_measured_us[issuer] if issuer >= 0 else s0),
                      op=_name(ev, i).split(":", 1)[1])
            side_nodes.append(n)
        node_of[i] = n
        last_on[g.lane[n]] = n
    g.tail_us = max(0.0, s1 - lane_end[HOST])
    return g


def replay(g: StepGraph) -> tuple[float, np.ndarray, np.ndarray]:
    """(step µs, start µs per node, end µs per node) of the graph with its durations.

    The step is the host's: from the ProfilerStep's start to its step thread's last node's end
    plus the measured tail, or to the last device task's end where that is later (in a steady
    state the next step's host waits for it).
    """
    n = len(g)
    start, end = np.zeros(n), np.zeros(n)
    for i in g.order():
        t = g.start_us if g.kind[i] == HOST and g.lane_prev[i] < 0 else -np.inf
        p = g.lane_prev[i]
        if p >= 0:
            t = max(t, end[p] + g.lane_gap_us[i])
        elif g.kind[i] == HOST:
            t = g.start_us + g.lane_gap_us[i]
        if g.issue[i] >= 0:
            t = max(t, start[g.issue[i]] + g.issue_offset_us[i])
        elif t == -np.inf:
            t = g.start_measured_us[i]
        for w, tail in g.waits[i]:
            t = max(t, end[w] + tail)
        start[i] = t
        end[i] = t + g.dur_us[i]
        if g.end_wait[i] >= 0:
            end[i] = max(end[i], end[g.end_wait[i]] + g.end_tail_us[i])
    last = max(end[i] for i in range(n) if g.lane[i] == HOST) + g.tail_us
    device = [end[i] for i in range(n) if g.kind[i] == DEVICE]
    if device:  # a device still running at the host's end holds the next step back by what is left
        last = max(last, max(device))
    return last - g.start_us, start, end


def replay_error(g: StepGraph) -> float:
    """Replayed ÷ measured step − 1."""
    return replay(g)[0] / g.measured_us - 1.0


def step_graphs(path: str | os.PathLike | TraceEvents, steps: tuple[int, int] | None = None) -> list[StepGraph]:
    """The graph of every host ProfilerStep in the trace at ``path`` (or of ``steps=(a, b)``
    only). A trace without ProfilerStep annotations is one line of :class:`BadInputError`."""
    ev = path if isinstance(path, TraceEvents) else read_trace(path, round_to_us=False)
    found = _steps(ev)
    if not found:
        raise BadInputError(f"{ev.path}: no ProfilerStep#N annotations: profile a training step "
                            "(train_step's profile: true) to replay it")
    return [_build(ev, s, r) for s, r in found if steps is None or steps[0] <= s <= steps[1]]
