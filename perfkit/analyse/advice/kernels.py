"""The advice rules of kernels, collectives and noise: latency-bound collectives, a GEMM below the
ceiling, noisy rows (their thresholds and sources: perfkit.analyse.advice.rules)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from .findings import (Finding, Rule, confidence_below, finite, flag, noisy_mask, notebook_of, point_labels, present,
                     rows_of)
from ..compare_match import canon

__all__ = ["collectives_latency_bound", "device_roof", "gemm_below_ceiling", "noisy"]


# ------------------------------------------------------------------------------ collectives


def _fastest(rows: pd.DataFrame) -> float:
    """The fastest time seen at these rows' size: their raw samples' minimum, else their ``time_s``."""
    samples = [min(v) for v in rows.get("time_samples_s", pd.Series(dtype=object))
               if isinstance(v, (list, np.ndarray)) and len(v)]
    return float(min(samples)) if samples else float(rows["time_s"].min())


def collectives_latency_bound(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """The latency's share of the largest message's time, t = alpha + S/beta through the smallest
    and the largest size at their *fastest* samples (noise only adds time, so those are nearest
    the link's own): share = 1 - (t_max - t_min)/t_max * S_max/(S_max - S_min), in [0, 1]. It is
    the alpha-beta fit's alpha over t_max with two points, and holds where noise leaves the fit
    bad; the fit (analyse/commfit.py) is given beside it when it describes the series."""
    from ..commfit import DEFAULT_BY, fit_alpha_beta

    rows = rows_of(ok, "collectives", "size_bytes", "time_s")
    if rows.empty:
        return
    by = [c for c in DEFAULT_BY if c in rows]
    keys = [rows[c].map(lambda v: str(canon(v))) for c in by]  # str: a missing value is a key too
    for _, group in (rows.groupby(keys, sort=False) if by else [((), rows)]):
        s_min, s_max = float(group["size_bytes"].min()), float(group["size_bytes"].max())
        if s_max < 4 * s_min:
            continue  # sizes too close together to separate latency from bandwidth
        t_min, t_max = _fastest(group[group["size_bytes"] == s_min]), _fastest(group[group["size_bytes"] == s_max])
        share = min(1.0, max(0.0, 1 - (t_max - t_min) / t_max * s_max / (s_max - s_min)))
        if share < rule.threshold:
            continue
        fit = fit_alpha_beta(group).iloc[0]
        first = group.iloc[0]
        yield Finding(
            rule=rule.name, constraint=rule.constraint,
            point=(f"{notebook_of(first).removesuffix('.ipynb')} ({first.get('op')}"
                   f"{', in-place' if flag(first, 'inplace') else ''}, {canon(first.get('world_size'))} ranks)"),
            config_ids=tuple(dict.fromkeys(group["config_id"])), cost_share=share, source=rule.source,
            robust=True, confidence="low" if rule.near(share) else "high",
            evidence={"min_size_bytes": s_min, "max_size_bytes": s_max, "fastest_min_size_time_s": t_min,
                      "fastest_max_size_time_s": t_max, "latency_share_at_max_size": share,
                      "fit_alpha_s": float(fit["alpha_s"]) if fit["fit_ok"] and finite(fit["alpha_s"]) else math.nan,
                      "fit_note": fit["fit_note"]},
            summary=(f"a {int(s_max / s_min)}x larger message ({int(s_min)} -> {int(s_max)} B) takes "
                     f"{t_max * 1e6:.0f} us against {t_min * 1e6:.0f} us (fastest samples): {share:.0%} of the "
                     f"largest's time is per-call latency"),
            advice=("send fewer, larger messages: bucket gradients (DDP bucket_cap_mb, FSDP's flat parameters) "
                    "or coalesce small collectives; measure larger sizes to see the bandwidth regime"))


# ------------------------------------------------------------------------------ GEMM


_ORIGIN_ORDER = {"measured": 0, "spec": 1, "theoretical": 2}


def _device_of(row: pd.Series) -> str:
    """The device a row measured, by name where the fingerprint has one (rows of one folder may
    come from several machines: each is held against its own device's roofs)."""
    for column in ("env_device_name", "device_name", "env_device", "device"):
        if present(row.get(column)) and str(row.get(column)):
            return str(row.get(column))
    return "?"


def device_roof(ceilings: pd.DataFrame, devices: pd.Series, device: str, dtype: str) -> tuple[float, str] | None:
    """The compute roof of ``dtype`` on ``device`` and its origin in words (``devices``: each
    ceiling row's device, :func:`_device_of`): the best measured ceiling of that device where one
    was measured, else its spec sheet's, else the theoretical; None without any. (Issue 44: the
    max over every origin and device called the H200's spec sheet, 989.4 TFLOP/s, the folder's
    "measured" ceiling, where it had measured 681-738.)"""
    if ceilings.empty:
        return None
    mine = ceilings[(devices == device) & (ceilings["dtype"] == dtype)]
    if mine.empty:
        return None
    origin = min(mine["origin"].fillna("measured"), key=lambda o: _ORIGIN_ORDER.get(o, 3))
    rows = mine[mine["origin"].fillna("measured") == origin]
    best = rows.loc[rows["value"].astype(float).idxmax()]
    words = {"measured": "measured ceiling", "spec": "spec-sheet peak", "theoretical": "theoretical peak"}
    return float(best["value"]), (f"{device}'s {words.get(origin, origin)} of {dtype} "
                                  f"({origin}: {best.get('source')})")


def gemm_below_ceiling(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    rows = rows_of(ok, "gemm", "flop_per_s")
    if rows.empty:
        return
    ceilings = ok[(ok.get("workload") == "ceiling") & (ok.get("kind") == "compute")] if "kind" in ok else ok.iloc[0:0]
    devices = rows.apply(_device_of, axis=1)
    roof_devices = ceilings.apply(_device_of, axis=1) if len(ceilings) else pd.Series(dtype=object)
    for (device, dtype), group in rows.groupby([devices, rows["dtype"].fillna("?")]):
        found = device_roof(ceilings, roof_devices, device, dtype)
        if found is None:
            if len(group) < 2:
                continue  # one GEMM and no ceiling: nothing to hold it against
            found = (float(group["flop_per_s"].max()),
                     f"the fastest {dtype} GEMM on {device} in the folder (no ceiling of it here)")
        roof, origin = found
        for i, row in group.iterrows():
            fraction = float(row["flop_per_s"]) / roof
            if fraction >= rule.threshold:
                continue
            # Noise only adds time: the fastest sample's rate is the most the GEMM was seen to reach.
            samples = row.get("time_samples_s")
            best = (fraction * float(row["time_s"]) / min(samples)
                    if finite(row.get("time_s")) and samples is not None and len(samples) else math.nan)
            robust = finite(best) and best < rule.threshold
            # The verdict is this point's (one size of a sweep), said so, with what the rest of its
            # sweep reaches beside it (issue 55: the H200's 1024 GEMM at 18 % of spec was the
            # configuration's verdict, where 2048 and up reach 65-69 %).
            shape = "×".join(str(int(row[d])) for d in ("m", "n", "k") if finite(row.get(d)))
            others = group[(group["config_id"] == row["config_id"]) & (group.index != i)]
            fractions = (others["flop_per_s"].astype(float) / roof).sort_values()
            beside = (f"; the rest of this sweep's {dtype} GEMMs reach {fractions.iloc[0]:.0%}–{fractions.iloc[-1]:.0%}"
                      if len(fractions) else "")
            yield Finding(
                rule=rule.name, constraint=rule.constraint,
                point=f"{labels[i]}, GEMM {shape or '?'} {dtype}", config_ids=(row["config_id"],),
                cost_share=1 - fraction, confidence=confidence_below(rule, fraction, row) if robust else "low",
                source=rule.source, robust=robust,
                evidence={"flop_per_s": float(row["flop_per_s"]), "ceiling_flop_per_s": float(roof),
                          "ceiling_origin": origin, "fraction_of_ceiling": fraction,
                          "fastest_sample_fraction_of_ceiling": best,
                          "m": row.get("m"), "n": row.get("n"), "k": row.get("k")},
                summary=(f"this point ({shape or 'its shape'}) reaches {fraction:.0%} of {origin}, "
                         f"{float(roof) / 1e12:.4g} TFLOP/s; its fastest sample {best:.0%}{beside}"),
                advice=("too small to fill the device: fixed per-call cost dominates. Batch such GEMMs (bmm, "
                        "grouped GEMM), fuse them (torch.compile) or grow the shapes"))


# ------------------------------------------------------------------------------ noise


#: The timed metrics a noisy row may be noisy in, each with its ``<name>_iqr_s``.
_TIMED = ("step_time_s", "time_s", "ttft_s", "tpot_s", "itl_s", "e2e_latency_s", "prefill_time_s",
          "loader_batch_time_s")


def _which(row: pd.Series) -> str | None:
    """The row in words among its configuration's: what tells it apart (its batch, size, op)."""
    for column in ("batch_size", "size_bytes", "size", "op", "world_size"):
        if present(row.get(column)) and not isinstance(row.get(column), (list, np.ndarray)):
            value = row[column]
            return f"{column}={int(value) if isinstance(value, float) and value.is_integer() else value}"
    return None


def noisy(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """One finding per point with noisy rows: how many of its rows, and the widest spread."""
    if "noisy" not in ok:
        return
    labels = point_labels(ok)
    flagged = noisy_mask(ok)
    for point, rows in ok.groupby(labels, sort=False):
        shaky = rows[flagged[rows.index]]
        if shaky.empty:
            continue
        spreads = []
        for _, row in shaky.iterrows():
            # Every timed metric the row has with its IQR, the widest spread of them (an inference
            # row's TPOT can be the noisy one while its TTFT is steady).
            for metric in _TIMED:
                iqr = row.get(f"{metric.removesuffix('_s')}_iqr_s")
                if finite(row.get(metric)) and finite(iqr) and float(row[metric]) > 0:
                    spreads.append((float(iqr) / float(row[metric]), metric, _which(row)))
        widest, metric, which = max(spreads) if spreads else (math.nan, None, None)
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=point,
            config_ids=tuple(dict.fromkeys(shaky["config_id"])), cost_share=math.nan, confidence="low",
            source=rule.source,
            evidence={"noisy_rows": len(shaky), "rows": len(rows), "widest_iqr_over_median": widest, "metric": metric,
                      "row": which},
            summary=(f"{len(shaky)} of its {len(rows)} rows {'is' if len(shaky) == 1 else 'are'} noisy"
                     + (f" (widest: {metric}{f' of the {which} row' if which else ''} IQR {widest:.0%} of the median)"
                        if finite(widest) else "")),
            advice=("rerun with more samples (steps, min_run_time_s, iters) or rounds, on a quieter machine: a "
                    "noisy median cannot say what binds it"))
