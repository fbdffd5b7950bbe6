"""Which events of a Kineto trace are a step's tasks: its windows and each host thread's leaves.

**Windows** (:func:`windows`). Each host ``ProfilerStep#N`` that holds host work is one window; a
trace without one (HTA's benchmarks, a ``torch.compile`` run, a step annotated on another process)
is one window of the process that launched the most GPU work (or ran the most ops); ``annotation=``
takes the host annotations whose name holds it instead, as HTA's ``critical_path_analysis`` does.
A ``ProfilerStep`` with no host work in it (the closing step of a schedule) is skipped, and said.

**Host tasks** (:func:`leaves`): the events of a thread with no other event of that thread inside
them, or whose children are a sliver of them, so a CUDA or HIP runtime call is a task of its own;
:func:`outermost` names the top-level op each ran under.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from perfkit.analyse.trace.events import TraceEvents
from perfkit.core.errors import BadInputError

__all__ = ["DEVICE_CATS", "HOST_CATS", "RUNTIME_CATS", "Window", "is_cat", "leaves", "name_of", "outermost", "phase",
           "windows"]

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")


def leaves(ts: np.ndarray, end: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
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


def outermost(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For start-sorted events of one thread, the position of the outermost event containing each."""
    root = np.arange(len(ts))
    stack: list[int] = []
    for i in range(len(ts)):
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        root[i] = root[stack[0]] if stack else i
        stack.append(i)
    return root


def name_of(ev: TraceEvents, i: int) -> str:
    return ev.names[ev.name_id[i]]


def is_cat(ev: TraceEvents, *cats: str) -> np.ndarray:
    return np.isin(ev.cat_id, ev.ids_of(lambda c: c in cats))


@dataclass
class Window:
    step: int
    row: int  # the ProfilerStep event's row, or -1
    pid: int
    tid: int
    s0: float
    s1: float
    label: str


def windows(ev: TraceEvents, annotation: str | None = None) -> tuple[list[Window], list[str]]:
    """The trace's windows, and a line per ProfilerStep skipped for having no host work. With
    ``annotation``, the host annotations whose name holds it (as HTA's ``critical_path_analysis``
    matches them), numbered from 0 in time order."""
    host = is_cat(ev, *HOST_CATS)
    runtime = is_cat(ev, *RUNTIME_CATS)
    step_cats = is_cat(ev, "user_annotation", "cpu_op")
    windows, skipped = [], []
    if annotation:
        rows = np.flatnonzero(step_cats & np.isin(ev.name_id, ev.ids_of(lambda n: annotation in n)))
        rows = rows[np.argsort(ev.ts_us[rows], kind="stable")]
        if not len(rows):
            raise BadInputError(f"{ev.path}: no host annotation holds {annotation!r}")
        return [Window(k, int(i), int(ev.pid[i]), int(ev.tid[i]), float(ev.ts_us[i]), float(ev.ts_us[i] + ev.dur_us[i]),
                        f"{name_of(ev, i)} #{k}") for k, i in enumerate(rows)], []
    for i in np.flatnonzero(step_cats & np.isin(ev.name_id, ev.ids_of(lambda n: _STEP_RE.match(n) is not None))):
        s0, s1 = float(ev.ts_us[i]), float(ev.ts_us[i] + ev.dur_us[i])
        inside = host & (ev.pid == ev.pid[i]) & (ev.tid == ev.tid[i]) & (ev.ts_us >= s0) & (ev.ts_us < s1)
        number = int(_STEP_RE.match(name_of(ev, i)).group(1))
        if int(inside.sum()) <= 1:
            skipped.append(f"ProfilerStep#{number}: no host work on its thread (skipped)")
            continue
        windows.append(Window(number, int(i), int(ev.pid[i]), int(ev.tid[i]), s0, s1, f"ProfilerStep#{number}"))
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
    return [Window(-1, -1, pid, tid, s0, s1, "whole trace")], [
        f"{why}no ProfilerStep with host work: the whole trace of process {pid} is one window"]


def phase(ev: TraceEvents, in_step: np.ndarray, prefix: str) -> tuple[float, float] | None:
    """The measured span of the step's host events whose name starts with ``prefix``."""
    rows = [i for i in np.flatnonzero(in_step) if name_of(ev, i).startswith(prefix)
            and not ev.names[ev.cat_id[i]].startswith("gpu_")]
    if not rows:
        return None
    return float(min(ev.ts_us[i] for i in rows)), float(max(ev.end_us[i] for i in rows))

