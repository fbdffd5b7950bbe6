"""The α-β (latency-bandwidth, Hockney) model of a collective, fitted to a size sweep.

t(S) = α + S / β, per configuration (op, in-place, dtype, ranks, backend, knobs...): α is the
per-call latency in seconds, β the asymptotic algorithm bandwidth in bytes/s (S and algbw as in
nccl-tests, ``shared/reference/formulas.md``), and β × busbw factor the asymptotic busbw, the
number to hold against a link's spec bandwidth.

Sizes span decades, so an unweighted least-squares fit would be decided by the largest messages
alone and α would come out as noise (even negative). The fit minimises *relative* residuals,
Σ ((α + S/β − t) / t)², i.e. weights 1/t², so every size counts alike; α is constrained to be
non-negative (a negative latency is a misfit, and the fit is then redone through the origin).

Analysis only: DataFrames in, DataFrames out; nothing here touches a device.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfkit.errors import BadInputError

__all__ = ["DEFAULT_BY", "SPEC_LINKS", "spec_link", "fit_alpha_beta", "busbw_curve"]

#: Columns that identify a configuration in :func:`perfkit.collectives.run_collectives` rows;
#: those absent from a frame are ignored.
DEFAULT_BY = ("op", "inplace", "dtype", "world_size", "backend", "device", "knobs")

#: Spec-sheet per-direction link bandwidth (bytes/s) by device-name pattern, with sources: what
#: an intra-node busbw can approach. Anything else is unknown (NaN), never another part's number.
SPEC_LINKS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", math.nan, "H100 PCIe: NVLink only with bridges; unknown without the topology"),
    (r"H100|H200|H800", 450e9, "NVIDIA H100/H200 datasheet: NVLink 4, 900 GB/s bidirectional"),
    (r"A100", 300e9, "NVIDIA A100 datasheet: NVLink 3, 600 GB/s bidirectional"),
)


def spec_link(device_name: str | None) -> tuple[float, str | None]:
    """(per-direction link bytes/s, source) for a device name; (NaN, None) when unknown."""
    for pattern, value, source in SPEC_LINKS:
        if device_name and re.search(pattern, device_name):
            return value, source
    return math.nan, None


def _fit_one(size: np.ndarray, t: np.ndarray) -> tuple[float, float, bool]:
    """(α, 1/β, clamped) minimising Σ((α + S·g − t)/t)²; α >= 0, g >= 0."""
    a = np.column_stack([1.0 / t, size / t])  # each row divided by t: relative residuals
    b = np.ones_like(t)
    if len(t) >= 2 and np.ptp(size) > 0:
        (alpha, g), *_ = np.linalg.lstsq(a, b, rcond=None)
        if alpha >= 0 and g > 0:
            return float(alpha), float(g), False
    # α < 0 (or one size only): no latency term, g from the relative residuals through 0.
    x = size / t
    g = float(x.sum() / (x * x).sum()) if (x * x).sum() > 0 else math.nan
    return 0.0, g, True


def fit_alpha_beta(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    size_col: str = "size_bytes",
    time_col: str = "time_s",
    device_col: str | None = None,
    spec_link_bytes_per_s: float | None = None,
) -> pd.DataFrame:
    """Fit t = α + S/β per group of ``by`` (default: the :data:`DEFAULT_BY` columns present).

    Returns one row per group: the ``by`` columns, ``alpha_s``, ``beta_bytes_per_s``
    (asymptotic algbw), ``busbw_factor`` (from the rows' busbw/algbw, or from op and world_size),
    ``busbw_asymptote_bytes_per_s`` (β × factor), ``half_bandwidth_bytes`` (S at which
    algbw = β/2, i.e. α·β: below it latency dominates), ``n_points``, ``min_size_bytes``,
    ``max_size_bytes``, ``rel_rms_residual``, ``alpha_clamped`` (the fit wanted α < 0),
    ``spec_link_bytes_per_s`` and ``spec_link_source`` (``spec_link_bytes_per_s`` if given, else
    from ``device_col`` via :data:`SPEC_LINKS`, else NaN/None: unknown).
    """
    missing = [c for c in (size_col, time_col) if c not in df.columns]
    if missing:
        raise BadInputError(f"fit_alpha_beta needs columns {missing}")
    by = [c for c in (DEFAULT_BY if by is None else by) if c in df.columns]
    data = df[np.isfinite(df[time_col].astype(float)) & (df[time_col].astype(float) > 0)]
    if data.empty:
        raise BadInputError(f"no rows with a positive finite {time_col}")
    groups = data.groupby(by, sort=False, dropna=False) if by else [((), data)]
    rows = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        size = g[size_col].to_numpy(dtype=float)
        t = g[time_col].to_numpy(dtype=float)
        alpha, inv_beta, clamped = _fit_one(size, t)
        beta = 1.0 / inv_beta if inv_beta > 0 else math.inf
        pred = alpha + size * inv_beta
        factor = _factor(g)
        if spec_link_bytes_per_s is not None:
            link, source = float(spec_link_bytes_per_s), "given"
        elif device_col and device_col in g.columns:
            link, source = spec_link(str(g[device_col].iloc[0]))
        else:
            link, source = math.nan, None
        rows.append({
            **dict(zip(by, key)),
            "alpha_s": alpha, "beta_bytes_per_s": beta, "busbw_factor": factor,
            "busbw_asymptote_bytes_per_s": beta * factor,
            "half_bandwidth_bytes": alpha * beta if math.isfinite(beta) else math.nan,
            "n_points": len(g), "min_size_bytes": float(size.min()), "max_size_bytes": float(size.max()),
            "rel_rms_residual": float(np.sqrt(np.mean(((pred - t) / t) ** 2))),
            "alpha_clamped": clamped,
            "spec_link_bytes_per_s": link, "spec_link_source": source,
        })
    return pd.DataFrame(rows)


def _factor(g: pd.DataFrame) -> float:
    if {"busbw_bytes_per_s", "algbw_bytes_per_s"} <= set(g.columns):
        ratio = (g["busbw_bytes_per_s"] / g["algbw_bytes_per_s"]).dropna()
        if len(ratio):
            return float(ratio.median())
    if {"op", "world_size"} <= set(g.columns):
        from perfkit.collectives import busbw_factor  # the nccl-tests table, one source of truth

        return busbw_factor(str(g["op"].iloc[0]), int(g["world_size"].iloc[0]))
    return math.nan


def busbw_curve(fit: pd.DataFrame, sizes_bytes: Sequence[float] | None = None, *,
                points: int = 50) -> pd.DataFrame:
    """The fitted model at ``sizes_bytes`` (default: ``points`` log-spaced sizes over each fit's
    measured range), one row per (fit row, size): the fit's non-fit columns, ``size_bytes``,
    ``time_s``, ``algbw_bytes_per_s`` = S/t and ``busbw_bytes_per_s`` = algbw × factor."""
    need = {"alpha_s", "beta_bytes_per_s", "busbw_factor"}
    if not need <= set(fit.columns):
        raise BadInputError(f"busbw_curve needs a fit_alpha_beta frame (columns {sorted(need)})")
    keys = [c for c in fit.columns if c in DEFAULT_BY or c in ("spec_link_bytes_per_s",)]
    rows = []
    for _, f in fit.iterrows():
        if sizes_bytes is None:
            s = np.geomspace(max(f["min_size_bytes"], 1.0), max(f["max_size_bytes"], 1.0), points)
        else:
            s = np.asarray(sizes_bytes, dtype=float)
        t = f["alpha_s"] + s / f["beta_bytes_per_s"]
        algbw = s / t
        for si, ti, ai in zip(s, t, algbw):
            rows.append({**{k: f[k] for k in keys}, "size_bytes": si, "time_s": ti,
                         "algbw_bytes_per_s": ai, "busbw_bytes_per_s": ai * f["busbw_factor"]})
    return pd.DataFrame(rows)
