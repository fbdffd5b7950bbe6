"""Roofline analysis: ceilings and counted ops in, roofline points out (DataFrames only).

attainable(I) = min over memory levels of min(P_dtype, I × B_level); ridge = P / B
(``reference/formulas.md``; Williams, Waterman & Patterson, CACM 2009).

The intensity of a point is its counted FLOP over its *minimum* bytes (``perfkit.measuring.ops.counting``):
every input read once and every output written once, i.e. the traffic from main memory when
caches hold nothing between ops. Against that intensity the binding memory roof is the slowest
level (DRAM/HBM), which is what the min over levels picks. A cache level's roof applies to the
traffic at that level, which a counter cannot see; ``level=`` draws the point against one
chosen level (the hierarchical-roofline reading), never against the min.

Ceilings table (produced by ``perfkit.measuring.kernels.ceilings`` and by the spec table), one row per ceiling:
``kind`` ("compute"|"memory"), ``dtype`` (compute: fp64, fp32, tf32, bf16, fp16, fp8; None for
memory), ``level`` (memory: L1, L2, L3, DRAM, HBM; None for compute), ``value`` (FLOP/s or
bytes/s), ``unit`` ("FLOP/s"|"bytes/s"), ``origin`` ("measured"|"spec"), ``source``.
Several rows for the same roof (repeated measurements, two sources) resolve to the highest: a
roof is what the machine was shown to reach.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfkit.core.errors import BadInputError

__all__ = [
    "CEILING_COLUMNS",
    "COMPUTE_DTYPES",
    "MEMORY_LEVELS",
    "STEP_OP",
    "POINT_COLUMNS",
    "ceiling_dtype",
    "attainable_flop_per_s",
    "ridge_point",
    "roofline_points",
    "join_counts_with_times",
]

CEILING_COLUMNS = ("kind", "dtype", "level", "value", "unit", "origin", "source")
COMPUTE_DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
MEMORY_LEVELS = ("L1", "L2", "L3", "DRAM", "HBM")
#: The ``op`` of the whole-step row of :func:`roofline_points`.
STEP_OP = "<step>"

_TORCH_TO_CEILING = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_OPS_COLUMNS = {"op", "flop", "bytes_read", "bytes_written", "time_s", "counted"}
POINT_COLUMNS = ("op", "family", "input_shapes", "dtype", "ceiling_dtype", "calls", "flop",
                 "bytes", "intensity_flop_per_byte", "time_s", "flop_per_s", "bytes_per_s",
                 "attainable_flop_per_s", "percent_of_roof", "bound", "time_share")


def ceiling_dtype(torch_dtype: str | None) -> str | None:
    """The ceiling dtype ("fp32") of a torch dtype name ("float32" or "torch.float32").

    None for dtypes without a FLOP roof (integers, bool). float32 maps to fp32, not tf32:
    whether TF32 ran is a setting, so pass ``dtype="tf32"`` explicitly when it was enabled.
    """
    if torch_dtype is None or (isinstance(torch_dtype, float) and math.isnan(torch_dtype)):
        return None
    name = str(torch_dtype).removeprefix("torch.")
    if name.startswith("float8"):
        return "fp8"
    return _TORCH_TO_CEILING.get(name)


def _check_ceilings(ceilings: pd.DataFrame, origin: str) -> pd.DataFrame:
    missing = set(CEILING_COLUMNS) - set(ceilings.columns)
    if missing:
        raise BadInputError(f"ceilings table lacks columns {sorted(missing)}; "
                            f"expected {', '.join(CEILING_COLUMNS)}")
    rows = ceilings[ceilings["origin"] == origin]
    if rows.empty:
        raise BadInputError(f"no ceilings with origin {origin!r}; origins present: "
                            f"{sorted(set(ceilings['origin']))}")
    return rows


def _compute_roof(rows: pd.DataFrame, dtype: str) -> float:
    hits = rows[(rows["kind"] == "compute") & (rows["dtype"] == dtype)]
    if hits.empty:
        have = sorted(set(rows.loc[rows["kind"] == "compute", "dtype"].dropna()))
        raise BadInputError(f"no compute ceiling for dtype {dtype!r}; available: {have}")
    return float(hits["value"].max())


def _memory_roof(rows: pd.DataFrame, level: str | None) -> tuple[str, float]:
    """(level, bytes/s): the named level, or the slowest level when ``level`` is None."""
    mem = rows[rows["kind"] == "memory"].groupby("level")["value"].max()
    if mem.empty:
        raise BadInputError("no memory ceiling in the ceilings table; measure or add one")
    if level is None:
        return str(mem.idxmin()), float(mem.min())
    if level not in mem.index:
        raise BadInputError(
            f"no memory ceiling for level {level!r}; available: {sorted(mem.index)}")
    return level, float(mem[level])


def attainable_flop_per_s(intensity_flop_per_byte, ceilings: pd.DataFrame, dtype: str,
                          origin: str = "measured", level: str | None = None):
    """Attainable FLOP/s at an arithmetic intensity (FLOP/byte), per ``formulas.md``.

    ``level=None``: min over memory levels of min(P_dtype, I × B_level). A level name: the
    per-level roof min(P_dtype, I × B_level). Follows numpy: a float for a scalar intensity,
    an array for an array-like.
    """
    intensity = np.asarray(intensity_flop_per_byte, dtype=float)
    if np.any(intensity < 0):
        raise BadInputError("arithmetic intensity must be >= 0 FLOP/byte")
    rows = _check_ceilings(ceilings, origin)
    _, bandwidth = _memory_roof(rows, level)
    result = np.minimum(_compute_roof(rows, dtype), intensity * bandwidth)
    return float(result) if result.ndim == 0 else result


def ridge_point(ceilings: pd.DataFrame, dtype: str, level: str | None = None,
                origin: str = "measured") -> float:
    """Ridge intensity P_dtype / B_level in FLOP/byte; the slowest memory level by default."""
    rows = _check_ceilings(ceilings, origin)
    return _compute_roof(rows, dtype) / _memory_roof(rows, level)[1]


def _as_shapes(shapes) -> tuple[tuple[int, ...], ...]:
    """Tuples of ints from tuples, lists or the arrays a Parquet round trip gives back."""
    if shapes is None or (isinstance(shapes, float) and math.isnan(shapes)):
        return ()
    return tuple(tuple(int(d) for d in s) for s in shapes)


def _shapes_key(shapes) -> str:
    return repr(_as_shapes(shapes))


def roofline_points(ops_df: pd.DataFrame, ceilings: pd.DataFrame, dtype: str | None = None,
                    step_time_s: float | None = None, origin: str = "measured",
                    level: str | None = None) -> pd.DataFrame:
    """One roofline point per (op, input shapes, dtype) of a ``count_ops`` frame, plus the step.

    ``dtype``: the compute roof for every point ("tf32" when TF32 was on); None maps each op's
    torch dtype with :func:`ceiling_dtype` (NaN roof for dtypes without one). Uncounted ops and
    zero-work rows (views) are not points; :func:`perfkit.measuring.ops.counting.coverage` reports them.
    ``time_share`` divides by ``step_time_s``, or, when None, by the summed ``time_s`` of every
    row of ``ops_df``; the ``<step>`` row (op :data:`STEP_OP`) carries the counted totals over
    that same time, its bytes the sum of per-op minimum bytes (no reuse across ops).
    ``percent_of_roof`` is achieved/attainable × 100: FLOP/s over P when compute-bound, bytes/s
    over B when memory-bound (equal to the FLOP ratio, and defined for zero-FLOP copies).
    ``bound`` is "compute" or the memory level whose roof binds.
    """
    missing = _OPS_COLUMNS - set(ops_df.columns)
    if missing:
        raise BadInputError(f"roofline_points needs a count_ops frame; missing {sorted(missing)}")
    if step_time_s is not None and not step_time_s > 0:
        raise BadInputError(f"step_time_s must be > 0 seconds, got {step_time_s!r}")
    rows = _check_ceilings(ceilings, origin)
    mem_level, bandwidth = _memory_roof(rows, level)
    if dtype is not None:
        _compute_roof(rows, dtype)  # fail early on a dtype without a roof

    df = ops_df.copy()
    for col in ("family", "input_shapes", "dtype"):
        if col not in df.columns:
            df[col] = None
    total_time_s = float(step_time_s) if step_time_s is not None else float(df["time_s"].sum())
    work = df[df["counted"].astype(bool)].copy()
    work["bytes"] = work["bytes_read"] + work["bytes_written"]
    work = work[(work["flop"] > 0) | (work["bytes"] > 0)]
    work["_shapes"] = work["input_shapes"].map(_shapes_key)
    points = (work.groupby(["op", "_shapes", "dtype"], dropna=False, sort=False)
              .agg(family=("family", "first"), input_shapes=("input_shapes", "first"),
                   calls=("op", "size"), flop=("flop", "sum"), bytes=("bytes", "sum"),
                   time_s=("time_s", "sum"))
              .reset_index().drop(columns="_shapes"))
    points["ceiling_dtype"] = dtype if dtype is not None else points["dtype"].map(ceiling_dtype)
    points = points.sort_values("time_s", ascending=False, kind="stable")

    step_dtype = dtype
    if step_dtype is None and not points.empty:
        by_flop = points.groupby("ceiling_dtype")["flop"].sum()
        step_dtype = by_flop.idxmax() if not by_flop.empty else None
    step = pd.DataFrame([{
        "op": STEP_OP, "family": None, "input_shapes": None, "dtype": None,
        "ceiling_dtype": step_dtype, "calls": len(df), "flop": points["flop"].sum(),
        "bytes": points["bytes"].sum(), "time_s": total_time_s,
    }])
    out = pd.concat([points, step], ignore_index=True) if not points.empty else step
    return _place(out, rows, bandwidth, mem_level, total_time_s)


def _place(points: pd.DataFrame, rows: pd.DataFrame, bandwidth: float, mem_level: str,
           total_time_s: float) -> pd.DataFrame:
    """Add intensity, achieved and attainable rates, percent of roof, bound and time share."""
    compute = rows[rows["kind"] == "compute"].groupby("dtype")["value"].max()
    peak = points["ceiling_dtype"].map(lambda d: compute.get(d, math.nan) if d else math.nan)
    flop = points["flop"].astype(float)
    nbytes = points["bytes"].astype(float)
    time_s = points["time_s"].astype(float).where(points["time_s"] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flop / nbytes, np.where(flop > 0, np.inf, 0.0))
    memory_roof = intensity * bandwidth
    compute_bound = memory_roof >= peak
    points["intensity_flop_per_byte"] = intensity
    points["flop_per_s"] = flop / time_s
    points["bytes_per_s"] = nbytes / time_s
    points["attainable_flop_per_s"] = np.minimum(peak, memory_roof)
    points["percent_of_roof"] = np.where(compute_bound, 100 * points["flop_per_s"] / peak,
                                         100 * points["bytes_per_s"] / bandwidth)
    points["bound"] = np.where(peak.isna(), None, np.where(compute_bound, "compute", mem_level))
    points.loc[peak.isna(), "percent_of_roof"] = math.nan
    points["time_share"] = points["time_s"] / total_time_s if total_time_s > 0 else math.nan
    points["calls"] = points["calls"].astype("int64")
    points["flop"] = points["flop"].astype("int64")
    return points[list(POINT_COLUMNS)].reset_index(drop=True)


def _profiler_name(op: str) -> str:
    """``aten.mm.default`` -> ``aten::mm`` (the profiler names ops without the overload)."""
    namespace, name = op.split(".")[:2]
    return f"{namespace}::{name}"


def _nonscalar(shapes) -> tuple:
    return tuple(s for s in _as_shapes(shapes) if s)


def join_counts_with_times(counts_df: pd.DataFrame, times_df: pd.DataFrame) -> pd.DataFrame:
    """``counts_df`` with ``time_s`` replaced by profiler time per call from ``times_df``.

    ``times_df`` is a :func:`perfkit.measuring.ops.counting.profile_op_times` frame. A call takes its op's
    mean profiler time per call for the same non-scalar input shapes (``time_match`` "shapes"),
    else over all shapes of that op name ("op"), else NaN ("none"): a missing time stays
    missing rather than falling back to the dispatch-level one. The profiler merges calls of
    one name and shapes made at top level and inside other kernels, so the mean is per call.
    """
    if not {"op", "input_shapes", "time_s"} <= set(counts_df.columns):
        raise BadInputError("join_counts_with_times needs a count_ops frame as counts_df")
    if not {"op", "input_shapes", "calls", "time_s"} <= set(times_df.columns):
        raise BadInputError("join_counts_with_times needs a profile_op_times frame as times_df")
    by_shape: dict[tuple, list[float]] = {}
    by_op: dict[str, list[float]] = {}
    for op, shapes, calls, t in times_df[["op", "input_shapes", "calls", "time_s"]].itertuples(
            index=False):
        for bucket, key in ((by_shape, (op, _nonscalar(shapes))), (by_op, op)):
            acc = bucket.setdefault(key, [0.0, 0])
            acc[0] += t
            acc[1] += calls

    def lookup(op: str, shapes) -> tuple[float, str]:
        name = _profiler_name(op)
        for bucket, key, match in ((by_shape, (name, _nonscalar(shapes)), "shapes"),
                                   (by_op, name, "op")):
            if key in bucket and bucket[key][1] > 0:
                return bucket[key][0] / bucket[key][1], match
        return math.nan, "none"

    out = counts_df.copy()
    found = [lookup(op, shapes) for op, shapes in zip(out["op"], out["input_shapes"])]
    out["time_s"] = [t for t, _ in found]
    out["time_match"] = [m for _, m in found]
    return out
