"""A Kineto trace window read as a :class:`~perfkit.analyse.step_graph.StepGraph`: which events are
tasks, and which dependencies held between them.

Its windows and host tasks are :mod:`perfkit.analyse.trace.windows`'s. Besides the host's, the tasks
are each GPU stream's kernels, copies and sets launched in the window (CUDA and HIP names alike) and
the collectives that run on a thread of their own (gloo's ``gloo:all_reduce``). NCCL's and RCCL's
``nccl:*`` annotations are host work on the thread that enqueued them (for DDP, the autograd thread);
their ``ncclDevKernel_*`` kernels are the communication, their ``op`` named by the kernel or by the
annotation around their launch.

**Dependencies.** One pass over the window's events in measured start order. A device task's
constraints are its launch, the task ahead on its stream (from its start where the two overlapped:
a CUDA graph's branches), an event it waited for, and, for a stream's first task, the work queued on
the stream before the window; each at its nominal lag, the one that binds carrying what is left of
the measured start. Cross-stream waits and synchronisations come from the trace's ``cuda_sync``
events (which stream, which ``cudaEventRecord``), resolved when the waiting task or the returning
call is reached, so a task the GPU ran late is seen; where a trace has none (ROCm, older PyTorch),
a wait issued between a task's launch and the previous one on its stream is read from when the task
started: after the task of another stream, launched before the wait, that ended last before it
(``StepGraph.inferred_waits`` counts them). A host gap that ends after a side lane's task ended
inside it was a wait (``join``).

Not modelled (said where it matters): other processes' work (a DataLoader's workers), the skew
between ranks (a collective's measured time holds the wait for the slowest rank).
"""

from __future__ import annotations

import bisect
import os
import re
from collections import defaultdict

import numpy as np

from perfkit.analyse.step_graph import (
    COMM,
    DEVICE,
    EVENT_WAIT,
    FORK,
    HOST,
    ISSUE,
    JOIN,
    LAUNCH,
    STREAM,
    SYNC,
    THREAD,
    StepGraph,
)
from perfkit.analyse.trace.events import TraceEvents, read_trace
from perfkit.analyse.trace.windows import (
    DEVICE_CATS,
    HOST_CATS,
    RUNTIME_CATS,
    Window,
    is_cat,
    leaves,
    name_of,
    outermost,
    phase,
    windows,
)
from perfkit.core.errors import BadInputError

__all__ = ["step_graphs"]

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



def _kernel_op(name: str) -> str | None:
    m = _COMM_KERNEL_RE.match(name)
    if not m:
        return None
    word = (m.group(1) or m.group(2) or "").lower()
    return _KERNEL_OPS.get(word, word or "collective")


class _Builder:
    """One window's nodes and edges, built in one pass over its events in measured start order."""

    def __init__(self, ev: TraceEvents, w: Window, note: str):
        self.ev, self.w = ev, w
        self.end = ev.end_us
        self.g = StepGraph(path=ev.path, rank=ev.rank, step=w.step, measured_us=w.s1 - w.s0, start_us=w.s0,
                           tail_us=0.0, window=w.label, note=note)

    def build(self) -> StepGraph:
        ev, w, g = self.ev, self.w, self.g
        s0, s1 = w.s0, w.s1
        in_step = (ev.ts_us >= s0) & (ev.ts_us < s1)
        mine = ev.pid == w.pid
        host_cats = is_cat(ev, *HOST_CATS)
        runtime = is_cat(ev, *RUNTIME_CATS)
        annotation = is_cat(ev, "user_annotation")
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
            root = outermost(ev.ts_us[on], self.end[on])
            # the collective annotation (nccl:all_reduce) a runtime call ran inside names its kernel's op
            enclosing_comm: dict[int, str] = {}
            stack: list[int] = []
            for k, i in enumerate(on):
                while stack and self.end[on[stack[-1]]] <= ev.ts_us[i]:
                    stack.pop()
                m = _COMM_ANNOTATION_RE.match(name_of(ev, i))
                if m is None:
                    for j in reversed(stack):
                        m2 = _COMM_ANNOTATION_RE.match(name_of(ev, on[j]))
                        if m2:
                            enclosing_comm[k] = m2.group(2)
                            break
                stack.append(k)
            for k in leaves(ev.ts_us[on], self.end[on], runtime[on]):
                i = int(on[k])
                self.lane_of[i] = HOST if t == w.tid else f"host thread {t}"
                self.aten_of[i] = name_of(ev, on[root[k]]) if on[root[k]] != w.row else name_of(ev, i)
                self.root_of[i] = int(on[root[k]])
                if k in enclosing_comm:
                    self.comm_op_of[i] = enclosing_comm[k]
                host_rows.append(i)
        if not any(self.lane_of[i] == HOST for i in host_rows):
            raise BadInputError(f"{ev.path}: {w.label} has no host events to replay")
        g.phases = {name: span for name, span in (("backward", phase(ev, in_step & mine, "autograd::engine::evaluate_function")),
                                                  ("optimizer", phase(ev, in_step & mine, "Optimizer.step#")),
                                                  ("zero_grad", phase(ev, in_step & mine, "Optimizer.zero_grad#")))
                    if span is not None}
        self.launch_of = {int(ev.correlation[i]): i for i in host_rows if runtime[i] and ev.correlation[i] >= 0}
        device_all = np.flatnonzero(is_cat(ev, *DEVICE_CATS) & (ev.stream >= 0))
        device = [int(i) for i in device_all if int(ev.correlation[i]) in self.launch_of]
        self._stream_history(device_all, device)
        self._sync_events()
        # Stream waits the trace did not describe (no cuda_sync events: ROCm, older PyTorch): their
        # correlations, for inferring which task a stream waited for from when it started.
        self.blind_waits = sorted(int(ev.correlation[i]) for i in host_rows
                                  if _STREAM_WAIT_RE.match(name_of(ev, i)) and int(ev.correlation[i]) not in self.sync_of)
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
        name = name_of(ev, i)
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
        name = name_of(self.ev, i)
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
        name = name_of(ev, i)
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
        name = name_of(ev, i)
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


def step_graphs(path: str | os.PathLike | TraceEvents, steps: tuple[int, int] | None = None,
                annotation: str | None = None) -> list[StepGraph]:
    """The graph of every window of the trace at ``path``: each host ProfilerStep with host work
    (or of ``steps=(a, b)`` only), else the whole trace as one window (``step`` -1); with
    ``annotation``, each host annotation whose name holds it (``step`` its instance, from 0)."""
    ev = path if isinstance(path, TraceEvents) else read_trace(path, round_to_us=False)
    found, skipped = windows(ev, annotation)
    if not found:
        raise BadInputError(f"{ev.path}: no host events: not a PyTorch profiler trace of a step to replay")
    note = "; ".join(skipped)
    return [_Builder(ev, w, note).build() for w in found
            if steps is None or w.step < 0 or steps[0] <= w.step <= steps[1]]
