"""Every op of a trace on the roofline: its kernels, its FLOP and bytes from its recorded shapes,
its achieved rates and its share of the device's roof.

**Which op a kernel belongs to.** A GPU event's launch (the runtime call with its ``correlation``)
sits inside nested ``cpu_op`` spans on its thread: ``aten::linear`` › ``aten::addmm``, or
``aten::scaled_dot_product_attention`` › ``aten::_scaled_dot_product_flash_attention`` ›
``aten::_flash_attention_forward``. The kernel belongs to the innermost of those an op model
covers (:mod:`perfkit.analyse.trace.op_models`): the ``addmm``, the ``_scaled_dot_product_flash_
attention``; composites (``linear``, ``matmul``, ``layer_norm``) are never counted beside what they
call. A covered op inside a covered op of its own family is a step of the outer one
(``_flash_attention_forward`` of ``_scaled_dot_product_flash_attention``). An op's kernel time is
the sum of its GPU events' durations (a cuBLAS GEMM's memset
included, as TraceLens's "Kernel Time"). A kernel no covered op launched is *unexplained*: listed
with the op that did launch it (a compiled graph's Triton kernels, an embedding's gather).

**The roof.** The device is the trace's ``deviceProperties`` name, looked up in perfkit's
spec-sheet table (:func:`perfkit.core.specs.spec_peaks`: H100, H200, A100, MI250X, MI300X; an
unknown device gets no roof, and says so). An op's attainable rate is min(P, I·B) (Williams et
al. 2009) with B the HBM bandwidth and P the dense peak of the op's dtype on the units its family
runs on (GEMM, attention, convolution: the matrix units, :meth:`SpecPeaks.mfu_peak_key`; the
rest: the dtype's own peak where the table has one, else fp32's). ``roof_share`` = achieved
FLOP/s ÷ attainable; for an op without FLOP (a copy), achieved bytes/s ÷ B.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd

from perfkit.analyse.trace.events import TraceEvents
from perfkit.analyse.trace.op_models import model_of, op_work
from perfkit.analyse.trace.timeline import COMMUNICATION, COMPUTATION, MEMCPY, gpu_kinds, launch_of, recompute_mask
from perfkit.core.specs import spec_peaks

__all__ = ["TraceOps", "trace_ops", "device_roof", "OP_COLUMNS", "SHAPE_COLUMNS"]

OP_COLUMNS = ("rank", "op", "category", "input_dims", "input_types", "concrete_inputs", "dtype", "flop",
              "bytes", "kernel_time_s", "kernels", "recompute", "model_reason")
SHAPE_COLUMNS = ("rank", "op", "category", "input_dims", "input_types", "concrete_inputs", "dtype", "recompute", "count",
                 "flop", "bytes", "kernel_time_s", "kernel_time_mean_s", "kernel_time_median_s",
                 "flop_per_s", "bytes_per_s", "intensity_flop_per_byte", "attainable_flop_per_s",
                 "roof_share", "roof_bound", "kernel_names")
_MATRIX_FAMILIES = ("GEMM", "attention", "convolution")


class TraceOps:
    """One trace's ops: ``instances`` (one row per op call with GPU work), ``shapes`` (one row per
    unique op, shapes, dtypes and scalars), ``unexplained`` (kernels no covered op launched), and
    the ``device`` and its ``roof`` (or the reason there is none)."""

    def __init__(self, instances, shapes, unexplained, device, roof, gpu_time_s, other=None, rank=0, window=""):
        self.rank, self.window = rank, window
        """The rank whose trace this is; the window its GPU events come from."""
        self.instances, self.shapes, self.unexplained = instances, shapes, unexplained
        self.device, self.roof, self.gpu_time_s = device, roof, gpu_time_s
        self.other = other or {}
        """``communication`` and ``memcpy``: (GPU events, seconds); no op model places them."""

    def categories(self) -> pd.DataFrame:
        """Per category: kernel time, its share of all GPU kernel time, FLOP, bytes, the achieved
        rates and the time-weighted roof share; unexplained kernels as one more line."""
        inst = self.shapes
        rows = []
        for cat, g in inst.groupby("category", sort=False):
            t = g["kernel_time_s"].sum()
            flop, moved = (g["flop"] * g["count"]).sum(), (g["bytes"] * g["count"]).sum()
            share = (g["roof_share"] * g["kernel_time_s"]).sum() / t if t and g["roof_share"].notna().any() else np.nan
            rows.append({"category": cat, "ops": int(g["count"].sum()), "kernel_time_s": t,
                         "time_share": t / self.gpu_time_s if self.gpu_time_s else np.nan,
                         "flop": flop, "bytes": moved, "flop_per_s": flop / t if t else np.nan,
                         "bytes_per_s": moved / t if t else np.nan, "roof_share": share})
        for cat, (n, t) in self.other.items():
            if n:
                rows.append({"category": cat, "ops": n, "kernel_time_s": t, "time_share": t / self.gpu_time_s,
                             "flop": np.nan, "bytes": np.nan, "flop_per_s": np.nan, "bytes_per_s": np.nan,
                             "roof_share": np.nan})
        t = self.unexplained["kernel_time_s"].sum() if len(self.unexplained) else 0.0
        if t:
            rows.append({"category": "unexplained kernels", "ops": int(self.unexplained["kernels"].sum()),
                         "kernel_time_s": t, "time_share": t / self.gpu_time_s, "flop": np.nan, "bytes": np.nan,
                         "flop_per_s": np.nan, "bytes_per_s": np.nan, "roof_share": np.nan})
        out = pd.DataFrame(rows, columns=["category", "ops", "kernel_time_s", "time_share", "flop", "bytes",
                                          "flop_per_s", "bytes_per_s", "roof_share"])
        return out.sort_values("kernel_time_s", ascending=False, kind="stable").reset_index(drop=True)


def device_roof(ev: TraceEvents) -> tuple[str | None, object | None, str | None]:
    """(device name, its spec row or None, why there is no roof or None)."""
    props = ev.device_properties
    name = props[0].get("name") if props and isinstance(props[0], dict) else None
    if not name:
        return None, None, "the trace names no device (no deviceProperties): no roof"
    row = spec_peaks(name, props[0].get("numSms") or props[0].get("multiProcessorCount"))
    if row is None:
        return name, None, f"{name!r} is not in perfkit's spec-sheet table: no roof (never another device's)"
    return name, row, None


def _peak(row, category: str, dtype: str) -> float:
    if row is None:
        return np.nan
    key = row.mfu_peak_key(dtype) if category in _MATRIX_FAMILIES else dtype
    if key not in row.flop_per_s:
        key = row.mfu_peak_key("fp32") if category not in _MATRIX_FAMILIES else key
    return float(row.flop_per_s.get(key, np.nan))


def _op_parents(ev: TraceEvents, ops: np.ndarray, runtimes: np.ndarray) -> tuple[dict, dict]:
    """(op row → its enclosing op row or -1, runtime row → innermost op row or -1), by time
    nesting on each thread: an event inside another's [ts, ts + dur] is its child."""
    parent, innermost = {}, {}
    rows = np.concatenate([ops, runtimes])
    is_op = np.concatenate([np.ones(len(ops), bool), np.zeros(len(runtimes), bool)])
    by_thread = defaultdict(list)
    for i, r in enumerate(rows):
        by_thread[(int(ev.pid[r]), int(ev.tid[r]))].append(i)
    for members in by_thread.values():
        m = np.array(members)
        r = rows[m]
        # Start order; at one start the longer (enclosing) first, an op before a runtime call.
        order = m[np.lexsort((~is_op[m], -ev.dur_us[r], ev.ts_us[r]))]
        stack: list[int] = []
        for i in order:
            row = int(rows[i])
            ts = ev.ts_us[row]
            while stack and ev.end_us[stack[-1]] <= ts:
                stack.pop()
            top = stack[-1] if stack else -1
            if is_op[i]:
                parent[row] = top
                stack.append(row)
            else:
                innermost[row] = top
    return parent, innermost


def _text(value) -> str:
    return json.dumps(value) if value is not None else ""


def trace_ops(ev: TraceEvents, *, link: str = "correlation", rows: np.ndarray | None = None,
              window: str = "launched") -> TraceOps:
    """The ops of one trace read with ``op_args=True`` (module docstring), over the GPU events
    launched in the trace, or ``rows`` (a window's: :func:`perfkit.analyse.trace.timeline.step_windows`).
    Communication and memcpy kernels are counted apart (``other``), as the timeline counts them."""
    from perfkit.core.errors import BadInputError

    if not ev.op_args and (ev.cat_id == ev.names.index("cpu_op") if "cpu_op" in ev.names else np.zeros(0)).any():
        raise BadInputError(f"{ev.path}: read without op arguments: read_trace(path, op_args=True)")
    kinds, launch = gpu_kinds(ev), launch_of(ev, link)
    gpu = np.flatnonzero((kinds >= 0) & (launch >= 0)) if rows is None else np.asarray(rows)
    gpu_time_s = float(ev.dur_us[gpu].sum()) / 1e6
    moves = {COMMUNICATION: float(ev.dur_us[gpu[kinds[gpu] == COMMUNICATION]].sum()) / 1e6,
             MEMCPY: float(ev.dur_us[gpu[kinds[gpu] == MEMCPY]].sum()) / 1e6}
    counts = {k: int((kinds[gpu] == k).sum()) for k in moves}
    gpu = gpu[kinds[gpu] == COMPUTATION]
    cpu_op = ev.ids_of(lambda s: s == "cpu_op")
    ops = np.flatnonzero(np.isin(ev.cat_id, cpu_op))
    launched = gpu[launch[gpu] >= 0]
    runtimes = np.unique(launch[launched])
    parent, innermost = _op_parents(ev, ops, runtimes)
    covered = {}

    def family(op_row: int) -> str | None:
        if op_row not in covered:
            covered[op_row] = model_of(ev.names[ev.name_id[op_row]])
        return covered[op_row]

    def owner(op_row: int) -> int:
        while op_row >= 0 and family(op_row) is None:
            op_row = parent.get(op_row, -1)
        # A covered op inside a covered op of its family (sdpa's flash attention and its
        # _flash_attention_forward) is a step of it: the outer one is the op.
        while op_row >= 0 and (up := parent.get(op_row, -1)) >= 0 and family(up) == family(op_row):
            op_row = up
        return op_row

    again = recompute_mask(ev, launch)
    per_op: dict[int, list[int]] = defaultdict(list)
    unexplained: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for g in gpu:
        inner = innermost.get(int(launch[g]), -1) if launch[g] >= 0 else -1
        op = owner(inner)
        if op >= 0:
            per_op[op].append(g)
        else:
            by = ev.names[ev.name_id[inner]] if inner >= 0 else "no op"
            entry = unexplained[(ev.names[ev.name_id[g]], by)]
            entry[0] += 1
            entry[1] += ev.dur_us[g] / 1e6
    name, row, reason = device_roof(ev)
    records = []
    for op, kernels in per_op.items():
        args = ev.op_args.get(op, {})
        work, why = op_work(ev.names[ev.name_id[op]], args.get("dims"), args.get("types"), args.get("concrete"))
        records.append({"rank": ev.rank, "op": ev.names[ev.name_id[op]], "category": model_of(ev.names[ev.name_id[op]]),
                        "input_dims": _text(args.get("dims")), "input_types": _text(args.get("types")),
                        "concrete_inputs": _text(args.get("concrete")), "dtype": work.dtype if work else None,
                        "flop": work.flop if work else np.nan, "bytes": work.bytes if work else np.nan,
                        "kernel_time_s": float(ev.dur_us[kernels].sum()) / 1e6, "kernels": len(kernels),
                        "recompute": bool(again[kernels].any()), "model_reason": why,
                        "_names": sorted({ev.names[ev.name_id[k]] for k in kernels})})
    inst = pd.DataFrame(records, columns=[*OP_COLUMNS, "_names"])
    shapes = _shapes(inst, row)
    unexp = pd.DataFrame([{"rank": ev.rank, "kernel": k, "launched_by": by, "kernels": n, "kernel_time_s": t}
                          for (k, by), (n, t) in unexplained.items()],
                         columns=["rank", "kernel", "launched_by", "kernels", "kernel_time_s"])
    unexp = unexp.sort_values("kernel_time_s", ascending=False, kind="stable").reset_index(drop=True)
    roof = {"device": name, "model": row.model if row else None, "source": row.source if row else None,
            "memory_bytes_per_s": row.memory_bytes_per_s if row else None, "reason": reason}
    other = {"communication": (counts[COMMUNICATION], moves[COMMUNICATION]),
             "memcpy": (counts[MEMCPY], moves[MEMCPY])}
    return TraceOps(inst.drop(columns="_names"), shapes, unexp, name, roof, gpu_time_s, other, rank=int(ev.rank),
                    window=window)


def _shapes(inst: pd.DataFrame, row) -> pd.DataFrame:
    keys = ["rank", "op", "category", "input_dims", "input_types", "concrete_inputs", "dtype", "recompute"]
    if inst.empty:
        return pd.DataFrame(columns=list(SHAPE_COLUMNS))
    g = inst.assign(dtype=inst["dtype"].fillna("")).groupby(keys, sort=False, dropna=False)
    out = g.agg(count=("op", "size"), flop=("flop", "first"), bytes=("bytes", "first"),
                kernel_time_s=("kernel_time_s", "sum"), kernel_time_mean_s=("kernel_time_s", "mean"),
                kernel_time_median_s=("kernel_time_s", "median"),
                kernel_names=("_names", lambda s: sorted({n for names in s for n in names}))).reset_index()
    out["dtype"] = out["dtype"].replace("", None)
    total = out["kernel_time_s"].where(out["kernel_time_s"] > 0)
    out["flop_per_s"] = out["flop"] * out["count"] / total
    out["bytes_per_s"] = out["bytes"] * out["count"] / total
    out["intensity_flop_per_byte"] = out["flop"] / out["bytes"].where(out["bytes"] > 0)
    bandwidth = float(row.memory_bytes_per_s) if row is not None and row.memory_bytes_per_s else np.nan
    peaks = np.array([_peak(row, c, d) if d else np.nan for c, d in zip(out["category"], out["dtype"])])
    memory_roof = out["intensity_flop_per_byte"] * bandwidth
    out["attainable_flop_per_s"] = np.fmin(peaks, memory_roof) if row is not None else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        by_flop = out["flop_per_s"] / out["attainable_flop_per_s"]
        by_bytes = out["bytes_per_s"] / bandwidth
    out["roof_share"] = np.where(out["flop"] > 0, by_flop, by_bytes)
    out["roof_bound"] = np.where(out["flop"] > 0, np.where(peaks <= memory_roof, "compute", "memory"), "memory")
    out.loc[out["attainable_flop_per_s"].isna() & (out["flop"] > 0), "roof_bound"] = None
    return out[list(SHAPE_COLUMNS)].sort_values("kernel_time_s", ascending=False, kind="stable").reset_index(drop=True)
