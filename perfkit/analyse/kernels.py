"""A user's kernels against the reference: speedups with their confidence, and KernelBench's fast_p.

Rows are :func:`perfkit.measuring.ops.user_kernels.measure_kernels`'s (one per impl, shape and
dtype, with ``correct`` and the timer's raw samples).

- **Speedup** of an impl at a point: the reference's median time ÷ the impl's, with the percentile
  bootstrap CI of that ratio from both sides' raw samples (:func:`perfkit.analyse.ab_stats.bootstrap_ratio_ci`).
  ``verdict``: ``faster`` where the whole CI is above 1, ``slower`` where it is below, ``same``
  otherwise; an impl whose output is not within tolerance is ``incorrect`` however fast it runs,
  and one that failed is ``failed``.
- **fast_p** (KernelBench, Ouyang et al., arXiv:2502.10517, §3): per impl, the share of its points
  that are both correct and faster than the reference by more than p (speedup > p); a failed point
  counts against it. fast_0 is the share that is correct.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfkit.analyse.ab_stats import bootstrap_ratio_ci

__all__ = ["FAST_P", "fast_p", "roofline_points", "speedups"]

FAST_P = (0.0, 1.0, 1.5, 2.0)


def _point(row) -> tuple:
    return (str(row["shape"]), row["dtype"])


def speedups(rows: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """One row per impl and point: its time, the reference's, the speedup with its CI, and the verdict."""
    out = []
    for _, group in rows.groupby(["dtype", rows["shape"].astype(str)], sort=False):
        ref_name = group["reference"].iloc[0]
        ref = group[(group["impl"] == ref_name) & (group["status"] == "ok")]
        ref_samples = np.asarray(ref["time_samples_s"].iloc[0], dtype=float) if len(ref) else np.empty(0)
        for _, row in group.iterrows():
            rec = {k: row.get(k) for k in ("impl", "dtype", "shape", "status", "reason", "correct", "max_abs_error",
                                           "max_rel_error", "worst_index", "time_s", "flop_per_s", "bytes_per_s")}
            rec["reference"] = ref_name
            rec["reference_time_s"] = float(ref["time_s"].iloc[0]) if len(ref) else math.nan
            if row["status"] != "ok" or not len(ref):
                rec.update(speedup=math.nan, speedup_ci_low=math.nan, speedup_ci_high=math.nan, verdict="failed")
                out.append(rec)
                continue
            samples = np.asarray(row["time_samples_s"], dtype=float)
            speedup = rec["reference_time_s"] / float(row["time_s"])
            # time ratio impl/reference: its CI inverted is the speedup's
            lo, hi = bootstrap_ratio_ci([ref_samples], [samples], confidence=confidence)
            rec.update(speedup=speedup, speedup_ci_low=1 / hi if hi else math.nan, speedup_ci_high=1 / lo if lo else math.nan)
            if not bool(row["correct"]):
                rec["verdict"] = "incorrect"
            elif row["impl"] == ref_name:
                rec["verdict"] = "reference"
            elif rec["speedup_ci_low"] > 1:
                rec["verdict"] = "faster"
            elif rec["speedup_ci_high"] < 1:
                rec["verdict"] = "slower"
            else:
                rec["verdict"] = "same"
            out.append(rec)
    return pd.DataFrame(out)


def fast_p(table: pd.DataFrame, ps: Sequence[float] = FAST_P) -> pd.DataFrame:
    """Per impl (the reference's own row left out), fast_p for each p over every point it was run at."""
    others = table[table["verdict"] != "reference"]
    out = []
    for impl, group in others.groupby("impl", sort=False):
        ok = (group["status"] == "ok") & group["correct"].fillna(False).astype(bool)
        rec = {"impl": impl, "points": len(group), "correct": int(ok.sum()), "failed": int((group["status"] != "ok").sum())}
        for p in ps:
            rec[f"fast_{p:g}"] = float((ok & (group["speedup"].fillna(0) > p)).mean()) if p > 0 else float(ok.mean())
        out.append(rec)
    return pd.DataFrame(out)


def roofline_points(rows: pd.DataFrame, ceilings: pd.DataFrame | None, *, origin: str | None = None) -> pd.DataFrame:
    """Each ok point as a roofline point (:func:`perfkit.view.plots.roofline.roofline`'s columns):
    one "op" per impl, its intensity (FLOP ÷ bytes) and achieved FLOP/s, and its share of the
    device's roof at that intensity where the ceilings have the dtype (``percent_of_roof``)."""
    from perfkit.analyse.roofline import attainable_flop_per_s

    ok = rows[(rows["status"] == "ok")].copy()
    ok = ok[(ok["flop"] > 0) & (ok["bytes"] > 0)]
    dims = [c for c in ok.columns if c.startswith("dim_")]
    shapes = [(tuple(int(v) for v in values if v == v),) for values in ok[dims].itertuples(index=False)]
    op = ok["impl"] + np.where(ok["correct"].astype(bool), "", " (incorrect)")
    out = pd.DataFrame({
        "op": op, "family": op, "dtype": ok["dtype"], "input_shapes": shapes,
        "intensity_flop_per_byte": ok["flop"] / ok["bytes"], "flop_per_s": ok["flop_per_s"],
        "time_s": ok["time_s"], "calls": 1, "status": "ok",
    })
    out["attainable_flop_per_s"] = math.nan
    if ceilings is not None and not ceilings.empty:
        how = origin or (str(ceilings["origin"].iloc[0]) if "origin" in ceilings else "measured")
        for dtype, index in out.groupby("dtype").groups.items():  # one roof per dtype, every point at once
            try:
                out.loc[index, "attainable_flop_per_s"] = attainable_flop_per_s(
                    out.loc[index, "intensity_flop_per_byte"].to_numpy(), ceilings, dtype, origin=how)
            except Exception:  # noqa: BLE001 - a dtype the ceilings do not have: no roof, said by NaN
                pass
    out["percent_of_roof"] = 100 * out["flop_per_s"] / out["attainable_flop_per_s"]
    return out.reset_index(drop=True)
