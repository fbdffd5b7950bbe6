"""The same model on two devices (or two builds), op by op.

Kernel names never match across vendors: an H100's cutlass/cuBLAS/flash kernels against an
MI300X's Tensile ``Cijk_*`` and ``attn_fwd``. Ops do. Each side's ops
(:func:`perfkit.analyse.trace.ops.trace_ops`, one unique shape a row) are matched by **op name,
input shapes, dtypes and scalar inputs**, as TraceLens's ``compare_perf_reports`` matches them;
per matched shape the kernel time of each side, their difference (test − control) and the
achieved TFLOP/s of each; per category the time of each side; the ops one side runs and the
other does not; and the GPU timeline of each side's window beside its difference.

Both sides should cover the same work (one ProfilerStep each, say): the figures are sums over
each side's window, not per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfkit.analyse.trace.ops import TraceOps

__all__ = ["OpDiff", "op_diff", "MATCH_KEYS"]

MATCH_KEYS = ("op", "input_dims", "input_types", "concrete_inputs")


@dataclass(frozen=True)
class OpDiff:
    """Two traces' ops compared; times in seconds, ``diff_*`` = test − control."""

    shapes: pd.DataFrame
    """Ops on both sides, one row per matched shape: ``op``, ``category``, ``input_dims``,
    ``dtype``, ``control_count``, ``test_count``, ``control_time_s``, ``test_time_s``,
    ``diff_time_s``, ``relative_change``, ``control_flop_per_s``, ``test_flop_per_s``; by |diff|."""
    categories: pd.DataFrame
    """Per category: ``control_time_s``, ``test_time_s``, ``diff_time_s``, ``relative_change``."""
    only_control: pd.DataFrame
    """Shapes the control runs and the test does not (``op``, ``input_dims``, ``count``, ``time_s``)."""
    only_test: pd.DataFrame
    timeline: pd.DataFrame
    """Per GPU-timeline figure: ``control_s``, ``test_s``, ``diff_s``, ``relative_change``."""
    control_device: str | None
    test_device: str | None


def _side(ops: TraceOps) -> pd.DataFrame:
    s = ops.shapes
    return s.groupby(list(MATCH_KEYS), as_index=False, sort=False).agg(
        category=("category", "first"), dtype=("dtype", "first"), count=("count", "sum"),
        time_s=("kernel_time_s", "sum"), flop=("flop", "first"))


def op_diff(control: TraceOps, test: TraceOps, *, control_timeline: pd.Series | None = None,
            test_timeline: pd.Series | None = None) -> OpDiff:
    """``control`` and ``test`` compared op by op (module docstring); the timelines, when given,
    are one :func:`~perfkit.analyse.trace.timeline.gpu_timeline` row of each side's window."""
    a, b = _side(control), _side(test)
    both = a.merge(b, on=list(MATCH_KEYS), how="outer", suffixes=("_c", "_t"), indicator=True)
    matched = both[both["_merge"] == "both"]
    shapes = pd.DataFrame({
        "op": matched["op"], "category": matched["category_c"], "input_dims": matched["input_dims"],
        "dtype": matched["dtype_c"], "control_count": matched["count_c"], "test_count": matched["count_t"],
        "control_time_s": matched["time_s_c"], "test_time_s": matched["time_s_t"],
        "diff_time_s": matched["time_s_t"] - matched["time_s_c"],
        "relative_change": matched["time_s_t"] / matched["time_s_c"].where(matched["time_s_c"] > 0) - 1,
        "control_flop_per_s": matched["flop_c"] * matched["count_c"] / matched["time_s_c"].where(matched["time_s_c"] > 0),
        "test_flop_per_s": matched["flop_t"] * matched["count_t"] / matched["time_s_t"].where(matched["time_s_t"] > 0),
    })
    shapes = shapes.iloc[np.argsort(-shapes["diff_time_s"].abs().to_numpy(), kind="stable")].reset_index(drop=True)

    def only(side: str, suffix: str) -> pd.DataFrame:
        rows = both[both["_merge"] == side]
        out = pd.DataFrame({"op": rows["op"], "category": rows[f"category{suffix}"], "input_dims": rows["input_dims"],
                            "count": rows[f"count{suffix}"], "time_s": rows[f"time_s{suffix}"]})
        return out.sort_values("time_s", ascending=False, kind="stable").reset_index(drop=True)

    cats = control.categories()[["category", "kernel_time_s"]].merge(
        test.categories()[["category", "kernel_time_s"]], on="category", how="outer", suffixes=("_c", "_t")).fillna(0.0)
    categories = pd.DataFrame({"category": cats["category"], "control_time_s": cats["kernel_time_s_c"],
                               "test_time_s": cats["kernel_time_s_t"],
                               "diff_time_s": cats["kernel_time_s_t"] - cats["kernel_time_s_c"]})
    categories["relative_change"] = categories["test_time_s"] / categories["control_time_s"].where(
        categories["control_time_s"] > 0) - 1
    categories = categories.iloc[np.argsort(-categories["diff_time_s"].abs().to_numpy(), kind="stable")]
    timeline = pd.DataFrame(columns=["figure", "control_s", "test_s", "diff_s", "relative_change"])
    if control_timeline is not None and test_timeline is not None:
        figures = [c for c in control_timeline.index if str(c).endswith("_time_s")]
        timeline = pd.DataFrame({"figure": [f.removesuffix("_s") for f in figures],
                                 "control_s": [float(control_timeline[f]) for f in figures],
                                 "test_s": [float(test_timeline[f]) for f in figures]})
        timeline["diff_s"] = timeline["test_s"] - timeline["control_s"]
        timeline["relative_change"] = timeline["test_s"] / timeline["control_s"].where(timeline["control_s"] > 0) - 1
    return OpDiff(shapes=shapes, categories=categories.reset_index(drop=True), only_control=only("left_only", "_c"),
                  only_test=only("right_only", "_t"), timeline=timeline, control_device=control.device,
                  test_device=test.device)
