"""Where the time of a profiled run goes: Holistic Trace Analysis' breakdowns, per rank.

Inputs are Kineto/Chrome traces (paths, or :class:`~perfkit.analyse.trace.events.TraceEvents`
from :func:`read_trace`), one per rank; a set passed together is analysed as HTA analyses one
``TraceAnalysis``. Outputs are DataFrames whose columns carry HTA's names for HTA's quantities
(times in microseconds, as HTA); the analyses HTA lacks (top kernels, data wait) use SI units.

Definitions are HTA 0.5.0's (``hta/analyzers/breakdown_analysis.py``,
``communication_analysis.py``), edge cases included; which events are analysed (the window,
host or GPU, launches, kernel types) is :mod:`perfkit.analyse.trace.window`'s, also HTA's.

- **Temporal**: ``kernel_time`` = last GPU activity end − first start; ``idle`` = kernel_time −
  |∪ activity|; ``compute`` = |∪ COMPUTATION|; ``non_compute`` = the rest.
- **Idle time per stream**: for each kernel/memcpy/memset after the first on its stream, the gap
  since the previous one ends is *host wait* when its launch (correlated runtime event) started
  after that end, else *kernel wait* when the gap is under ``consecutive_kernel_delay`` (30; HTA
  documents nanoseconds, but traces are in microseconds, so it is 30 µs), else *other*.
- **Kernel types**: time in each combination of ∪COMPUTATION, ∪COMMUNICATION, ∪MEMORY
  ("COMPUTATION overlapping COMMUNICATION", ...), segment lengths truncated to whole µs.
- **Overlap**: |∪comm ∩ ∪comp| / |∪comm| (NaN without communication kernels).

A rank without GPU activity (a CPU-only trace, which HTA cannot break down) gets zero times
and NaN shares; its top "kernels" are its CPU operators.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfkit.analyse.trace.events import read_trace
from perfkit.analyse.trace.window import (
    KERNEL_TYPES, STEP_RE, RankWindow, analysis_window, kernel_type, merge_intervals,
)
from perfkit.core.errors import BadInputError

__all__ = [
    "DATA_WAIT_SPAN", "DATALOADER_SPAN_PREFIX", "CONSECUTIVE_KERNEL_DELAY_US", "read_trace",
    "temporal_breakdown", "idle_time_breakdown", "kernel_type_breakdown", "comm_comp_overlap",
    "top_kernels", "data_wait_share", "trace_summary", "breakdowns", "kernel_type",
]

DATA_WAIT_SPAN = "data_wait"
"""The ``torch.profiler.record_function`` name perfkit's training step puts around a batch fetch."""
DATALOADER_SPAN_PREFIX = "enumerate(DataLoader)#"
"""torch's own span around ``DataLoader.__next__`` (``torch/utils/data/dataloader.py``)."""
CONSECUTIVE_KERNEL_DELAY_US = 30
"""HTA's default ``consecutive_kernel_delay`` (``TraceAnalysis.get_idle_time_breakdown``)."""
SHORT_KERNEL_US = 10.0
"""A GPU kernel shorter than this runs about as long as its launch costs the host (a few µs per
launch: NVIDIA, "Getting Started with CUDA Graphs", 2019), so a step of such kernels is
launch-bound; :func:`trace_summary`'s ``trace_short_kernel_share`` counts them."""

_KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
_IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


def _union_us(rk: RankWindow, rows: np.ndarray) -> float:
    s, e = merge_intervals(*rk.intervals(rows))
    return float((e - s).sum())


def _sweep(unions: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(state, segment length) of a sweep over merged unions; bit ``1 << i`` is union ``i``."""
    times = np.concatenate([np.concatenate([s, e]) for s, e in unions])
    delta = np.concatenate([np.concatenate([np.full(len(s), 1 << i), np.full(len(e), -(1 << i))])
                            for i, (s, e) in enumerate(unions)])
    order = np.argsort(times, kind="stable")
    times, state = times[order], np.cumsum(delta[order])
    return state[:-1], np.diff(times)


def _temporal(rk: RankWindow) -> dict:
    s, e = merge_intervals(*rk.intervals(rk.dev))
    kernel = float(e[-1] - s[0]) if len(s) else 0.0
    idle = kernel - float((e - s).sum())
    compute = _union_us(rk, rk.of_type("COMPUTATION"))
    return {"rank": rk.rank, "idle_time(us)": idle, "compute_time(us)": compute,
            "non_compute_time(us)": kernel - compute - idle, "kernel_time(us)": kernel}


def _temporal_table(ranks: list[RankWindow]) -> pd.DataFrame:
    df = pd.DataFrame([_temporal(rk) for rk in ranks])
    kernel = df["kernel_time(us)"].where(df["kernel_time(us)"] > 0)
    for col in ("idle_time", "compute_time", "non_compute_time"):
        df[f"{col}_pctg"] = (100 * (df[f"{col}(us)"] / kernel)).round(2)  # HTA's order of operations
    return df


def temporal_breakdown(traces, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per rank: ``idle_time(us)``, ``compute_time(us)``, ``non_compute_time(us)``,
    ``kernel_time(us)`` and their ``*_pctg`` of kernel_time (rounded to 2 decimals, as HTA)."""
    return _temporal_table(analysis_window(traces, steps))


def _launch_ts(rk: RankWindow, k: np.ndarray) -> np.ndarray:
    """Start of the runtime call that launched each GPU event of ``k`` (NaN when not in the window)."""
    ev = rk.ev
    link = rk.launch()[k]
    # HTA joins on index_correlation, which is 0 for a GPU event without a launch: it then takes
    # the start of the file's first event, when that event is in the window.
    unmatched = rk.gpu[k] & (link < 0) & (ev.correlation[k] >= 0)
    link[unmatched] = 0 if ev.index[0] == 0 else -1
    kept = np.zeros(len(ev), dtype=bool)
    kept[rk.rows] = True
    out = np.full(len(k), np.nan)
    ok = (link >= 0) & kept[np.maximum(link, 0)]
    out[ok] = ev.ts_us[link[ok]]
    return out


def _idle_rows(rk: RankWindow, delay_us: float) -> list[dict]:
    ev = rk.ev
    k = rk.dev[np.isin(ev.cat_id[rk.dev], ev.ids_of(lambda s: s in _KERNEL_CATS))]
    if not len(k):
        return []
    launched = _launch_ts(rk, k)
    ts, end = rk.intervals(k)
    streams = ev.stream[k]
    out = []
    for stream in np.unique(streams):
        sel = np.flatnonzero(streams == stream)
        sel = sel[np.argsort(ts[sel], kind="stable")]
        prev_end = np.concatenate([[np.nan], end[sel][:-1]])
        gap = ts[sel] - prev_end
        category = np.where(launched[sel] > prev_end, 0, np.where(gap < delay_us, 1, 2))
        sums = {c: float(np.nansum(gap[category == c])) for c in np.unique(category)}
        total = sum(sums.values())
        out += [{"rank": rk.rank, "stream": int(stream), "idle_category": _IDLE_CATEGORIES[c],
                 "idle_time": t, "idle_time_ratio": t / total if total else np.nan} for c, t in sums.items()]
    return out


def _idle_table(ranks: list[RankWindow], delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> pd.DataFrame:
    rows = [r for rk in ranks for r in _idle_rows(rk, delay_us)]
    return pd.DataFrame(rows, columns=["rank", "stream", "idle_category", "idle_time", "idle_time_ratio"])


def idle_time_breakdown(traces, *, steps: tuple[int, int] | None = None,
                        consecutive_kernel_delay: float = CONSECUTIVE_KERNEL_DELAY_US) -> pd.DataFrame:
    """Per rank, stream and category (``host_wait``, ``kernel_wait``, ``other``): ``idle_time``
    (µs) and ``idle_time_ratio``, its share of the stream's idle time (HTA rounds both to 2
    decimals; perfkit does not)."""
    return _idle_table(analysis_window(traces, steps), consecutive_kernel_delay)


def _kernel_type_rows(rk: RankWindow) -> list[dict]:
    state, length = _sweep([merge_intervals(*rk.intervals(rk.of_type(t))) for t in KERNEL_TYPES])
    live = state > 0
    # HTA casts each segment to int (whole microseconds, truncated) before summing.
    sums = pd.Series(np.trunc(length[live]).astype(np.int64)).groupby(state[live]).sum()
    total = sums.sum()
    return [{"rank": rk.rank, "kernel_type": " overlapping ".join(t for i, t in enumerate(KERNEL_TYPES) if s & (1 << i)),
             "sum": int(v), "percentage": round(v / total * 100, 1)} for s, v in sums.items()]


def _kernel_type_table(ranks: list[RankWindow]) -> pd.DataFrame:
    df = pd.DataFrame([r for rk in ranks for r in _kernel_type_rows(rk)],
                      columns=["rank", "kernel_type", "sum", "percentage"])
    return df.sort_values(["rank", "sum"], ascending=[True, False], ignore_index=True)


def kernel_type_breakdown(traces, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per rank and kernel-type combination (``COMPUTATION``, ``COMPUTATION overlapping
    COMMUNICATION``, ...): ``sum`` (µs) and ``percentage`` of the rank's GPU busy time. HTA's
    ``get_gpu_kernel_breakdown`` (memory kernels included) sums these over ranks; perfkit keeps
    one row per rank (sum ``sum`` by ``kernel_type`` for HTA's table)."""
    return _kernel_type_table(analysis_window(traces, steps))


def _overlap_us(rk: RankWindow) -> tuple[float, float]:
    """(|∪comm ∩ ∪comp|, |∪comm|) in µs."""
    comm = merge_intervals(*rk.intervals(rk.of_type("COMMUNICATION")))
    comp = merge_intervals(*rk.intervals(rk.of_type("COMPUTATION")))
    state, length = _sweep([comm, comp])
    return float(length[state == 3].sum()), float((comm[1] - comm[0]).sum())


def _overlap_table(ranks: list[RankWindow]) -> pd.DataFrame:
    rows = []
    for rk in ranks:
        both, comm = _overlap_us(rk)
        rows.append({"rank": rk.rank, "comp_comm_overlap_pctg": round(100 * (both / comm), 2) if comm else np.nan})
    return pd.DataFrame(rows, columns=["rank", "comp_comm_overlap_pctg"])


def comm_comp_overlap(traces, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per rank: ``comp_comm_overlap_pctg``, the share of communication time during which
    computation runs too (NaN without communication kernels), rounded to 2 decimals as HTA."""
    return _overlap_table(analysis_window(traces, steps))


def breakdowns(traces, *, steps: tuple[int, int] | None = None) -> dict[str, pd.DataFrame]:
    """The four HTA breakdowns from one read: ``temporal``, ``idle``, ``kernel_types``, ``overlap``."""
    ranks = analysis_window(traces, steps)
    return {"temporal": _temporal_table(ranks), "idle": _idle_table(ranks),
            "kernel_types": _kernel_type_table(ranks), "overlap": _overlap_table(ranks)}


def _top_rows(rk: RankWindow, n: int) -> list[dict]:
    ev = rk.ev
    if len(rk.ran):
        rows, kind = rk.ran, "kernel"  # each GPU event once, however many host events carry its id
        denominator_s = float(ev.dur_us[rows].sum()) * 1e-6
    else:
        rows = rk.rows[np.isin(ev.cat_id[rk.rows], ev.ids_of(lambda s: s == "cpu_op"))]
        kind = "cpu_op"
        steps = rk.step_rows()
        host = rk.rows[ev.stream[rk.rows] == -1]
        denominator_s = (float(ev.dur_us[steps].sum()) if len(steps) else
                         float(ev.end_us[host].max() - ev.ts_us[host].min()) if len(host) else 0.0) * 1e-6
    agg = (pd.DataFrame({"name_id": ev.name_id[rows], "dur": ev.dur_us[rows] * 1e-6})
           .groupby("name_id")["dur"].agg(["count", "sum"]).sort_values("sum", ascending=False).head(n))
    return [{"rank": rk.rank, "name": ev.names[nid], "kind": kind,
             "kernel_type": kernel_type(ev.names[nid]) if kind == "kernel" else "",
             "count": int(count), "total_time_s": float(total),
             "share": total / denominator_s if denominator_s > 0 else np.nan}
            for nid, count, total in zip(agg.index, agg["count"], agg["sum"])]


def top_kernels(traces, n: int = 10, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per rank, the ``n`` GPU activities with the most total time; CPU operators on a CPU-only trace.

    Columns: ``rank``, ``name``, ``kind`` (``kernel`` or ``cpu_op``), ``kernel_type`` (HTA's,
    kernels only), ``count`` (how many times it ran), ``total_time_s``, ``share``. A kernel's share
    is of the summed time of all GPU activity of the rank (the shares add to 1); a CPU operator's
    is of the window's wall time (its ProfilerSteps), nested operators each counting their
    inclusive time. Each GPU event counts once: HTA's kernel table counts one again for every
    further host event with its correlation id (a runtime call and the driver call inside it);
    on traces without such ids the two agree.
    """
    if n < 1:
        raise BadInputError(f"top_kernels needs n >= 1, got {n}")
    rows = [r for rk in analysis_window(traces, steps) for r in _top_rows(rk, n)]
    return pd.DataFrame(rows, columns=["rank", "name", "kind", "kernel_type", "count", "total_time_s", "share"])


def _data_wait_rows(rk: RankWindow) -> list[dict]:
    ev = rk.ev
    host = ev.stream == -1
    data = np.isin(ev.name_id, ev.ids_of(
        lambda s: s == DATA_WAIT_SPAN or (s.startswith(DATALOADER_SPAN_PREFIX) and s.endswith(".__next__"))))
    ds, de = merge_intervals(ev.ts_us[host & data], ev.end_us[host & data])
    out = []
    for i in rk.step_rows():
        s, e = ev.ts_us[i], ev.end_us[i]
        waited = float(np.clip(np.minimum(de, e) - np.maximum(ds, s), 0, None).sum())
        out.append({"rank": rk.rank, "step": int(STEP_RE.match(ev.names[ev.name_id[i]]).group(1)),
                    "step_time_s": (e - s) * 1e-6, "data_wait_time_s": waited * 1e-6,
                    "data_wait_share": waited / (e - s) if e > s else np.nan})
    return out


def data_wait_share(traces, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per rank and ProfilerStep of the window: the share of the step spent waiting for data.

    Waiting for data is the union of the host spans named :data:`DATA_WAIT_SPAN` or
    ``enumerate(DataLoader)#<iterator>.__next__`` (torch's own), clipped to the step: nested or
    repeated spans count once. Columns: ``rank``, ``step``, ``step_time_s``, ``data_wait_time_s``,
    ``data_wait_share``. The overall share of a rank is Σ data_wait_time_s / Σ step_time_s
    (:func:`trace_summary`).
    """
    rows = [r for rk in analysis_window(traces, steps) for r in _data_wait_rows(rk)]
    return pd.DataFrame(rows, columns=["rank", "step", "step_time_s", "data_wait_time_s", "data_wait_share"])


def _short_kernel_share(rk: RankWindow) -> float:
    ev = rk.ev
    kernels = rk.ran[np.isin(ev.cat_id[rk.ran], ev.ids_of(lambda s: s in ("kernel", "Kernel")))]
    return float((ev.dur_us[kernels] < SHORT_KERNEL_US).mean()) if len(kernels) else np.nan


def trace_summary(traces, *, steps: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per rank, the figures a results row carries (shares are fractions):

    - ``trace_idle_share``: GPU idle time / kernel_time (HTA's idle_time_pctg / 100);
    - ``trace_exposed_comm_share``: communication time with no computation running at once
      (|∪comm| − |∪comm ∩ ∪comp|) / kernel_time;
    - ``trace_data_wait_share``: Σ data wait / Σ step time over the window's ProfilerSteps;
    - ``trace_top_kernel``, ``trace_top_kernel_share``: the first row of :func:`top_kernels`;
    - ``trace_short_kernel_share``: the window's GPU kernels shorter than :data:`SHORT_KERNEL_US`,
      as a share of their count (each kernel once).
    All NaN (or empty) where the trace has nothing to measure them by (no GPU, no steps).
    """
    out = []
    for rk in analysis_window(traces, steps):
        t = _temporal(rk)
        kernel_us = t["kernel_time(us)"]
        both, comm = _overlap_us(rk)
        waits = pd.DataFrame(_data_wait_rows(rk), columns=["step_time_s", "data_wait_time_s"])
        step_s = waits["step_time_s"].sum()
        top = _top_rows(rk, 1)
        out.append({
            "rank": rk.rank,
            "trace_idle_share": t["idle_time(us)"] / kernel_us if kernel_us > 0 else np.nan,
            "trace_exposed_comm_share": (comm - both) / kernel_us if kernel_us > 0 else np.nan,
            "trace_data_wait_share": waits["data_wait_time_s"].sum() / step_s if step_s > 0 else np.nan,
            "trace_top_kernel": top[0]["name"] if top else "",
            "trace_top_kernel_share": top[0]["share"] if top else np.nan,
            "trace_short_kernel_share": _short_kernel_share(rk),
        })
    return pd.DataFrame(out)
