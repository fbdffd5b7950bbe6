"""The α-β (latency-bandwidth, Hockney) model of a collective, fitted to a size sweep.

t(S) = α + S / β, per configuration (op, in-place, dtype, ranks, backend, knobs...): α is the
per-call latency in seconds, β the asymptotic algorithm bandwidth in bytes/s (S and algbw as in
nccl-tests, ``shared/reference/formulas.md``), and β × busbw factor the asymptotic busbw, the
number to hold against a link's spec bandwidth. S½ = α·β is the size at which algbw is β/2:
below it latency dominates, above it bandwidth.

**The fit.** Each size's times (every raw sample in ``time_samples_s`` when the rows carry them,
else the rows' ``time_s``) give its median m(S). Sizes span decades, so least squares on absolute
time would be decided by the largest messages alone; the fit minimises the *relative* residuals
Σ ((α + S/β − m)/m)² (weights 1/m) under α ≥ 0 and 1/β ≥ 0 (non-negative least squares, solved
exactly: two unknowns). 95 % confidence intervals come from a seeded bootstrap: each size's raw
samples resampled (measurement noise) and the fit's relative residuals resampled (what the model
misses); each interval is the wider of the two.

**What the data can tell** (``alpha_resolved``, ``beta_resolved``). A fit is *bad* (``fit_ok``
False) when its relative RMS residual exceeds :data:`MAX_REL_RMS` or it has fewer than 3 sizes:
the model does not describe the series, so neither parameter is resolved, nothing is drawn and
only model-free bounds are given (α ≤ every measured time, β ≥ every measured algbw). Otherwise,
with S½ from the point fit:

- β is resolved iff the largest size is in the bandwidth-bound regime, S_max ≥ :data:`RESOLVE_FACTOR` · S½
  (S/β is at least 2/3 of the predicted time there), and β's interval is finite and spans at most
  a factor :data:`MAX_CI_RATIO` (high/low);
- α is resolved iff the smallest size is in the latency-bound regime, S_min ≤ S½ / :data:`RESOLVE_FACTOR`
  (α is at least 2/3 of the predicted time there), and, when the sizes also reach the
  bandwidth-bound regime (α is then the fit's intercept, an extrapolation to S = 0), α's interval
  is positive and spans at most a factor :data:`MAX_CI_RATIO`. When they do not, α is measured
  directly (below) and its interval says how precisely.

The interval conditions keep a regime that noise alone seems to reach, or a slope the noise
leaves undetermined, from counting as resolved.

When the sizes never reach the bandwidth-bound regime, α is the median time of the smallest
message (with its bootstrap interval) and β is NaN with ``beta_lower_bytes_per_s``: the larger of
the highest measured algbw and the interval's lower end of β. When they never reach the
latency-bound regime, α is NaN with ``alpha_upper_s``: the smaller of the lowest measured time
and the interval's upper end of α. Estimates, intervals and bounds are never clamped silently.

Analysis only: DataFrames in, DataFrames out; nothing here touches a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfkit.core.errors import BadInputError
from perfkit.core.formulas import busbw_factor
from perfkit.core.specs import spec_link

__all__ = ["DEFAULT_BY", "MAX_REL_RMS", "RESOLVE_FACTOR", "MAX_CI_RATIO", "CONFIDENCE",
           "fit_alpha_beta", "predict", "busbw_curve"]

#: Columns that identify a configuration in :func:`perfkit.measuring.collectives.benchmark.run_collectives` rows
#: (and, for rows imported from nccl-tests, the device model, the file and the run within it: two runs of one op under
#: different settings are two fits); those absent from a frame are ignored.
DEFAULT_BY = ("op", "inplace", "dtype", "world_size", "backend", "device", "knobs", "env_device_name", "source_path",
              "run_index")

#: Relative RMS residual above which a fit is bad. The per-size medians of a clean sweep sit
#: within a few percent of the model (5 % noise per sample gives ~0.02 on medians of 10); a
#: residual of 0.25 means sizes off by a quarter of their time: a protocol switch inside the
#: range or a machine too busy to measure, not a latency and a bandwidth.
MAX_REL_RMS = 0.25
#: How far past S½ the extreme sizes must reach: at S_min = S½/2 latency is 2/3 of the time,
#: at S_max = 2·S½ the bandwidth term is.
RESOLVE_FACTOR = 2.0
#: Largest high/low ratio of a fitted parameter's 95 % interval for it to count as resolved:
#: beyond it the data bracket the parameter but do not pin it (a factor 2 is ±40 % around it).
MAX_CI_RATIO = 2.0
#: Confidence level of every interval and statistical bound.
CONFIDENCE = 0.95

# The columns fit_alpha_beta adds after the group keys; anything else in a fit frame is a key.
_FIT_COLUMNS = (
    "alpha_s", "alpha_ci_low_s", "alpha_ci_high_s", "alpha_resolved", "alpha_upper_s",
    "beta_bytes_per_s", "beta_ci_low_bytes_per_s", "beta_ci_high_bytes_per_s", "beta_resolved",
    "beta_lower_bytes_per_s", "busbw_factor", "busbw_asymptote_bytes_per_s", "half_bandwidth_bytes",
    "fit_ok", "rel_rms_residual", "fit_note", "model_alpha_s", "model_time_per_byte_s",
    "n_points", "n_sizes", "n_samples", "min_size_bytes", "max_size_bytes", "smallest_size_time_s",
    "spec_link_bytes_per_s", "spec_link_source",
)
_N_BOOT = 400


def _nnls(size: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(α, g = 1/β) per row of ``m`` (replicates × sizes) minimising Σ((α + S·g − m)/m)², α, g >= 0.

    Two unknowns: the optimum is the unconstrained one when it is feasible, else the better of
    the two one-variable fits (α alone, g alone), each of which is non-negative since S, m > 0.
    """
    t_ref, s_ref = float(np.median(m)), float(size.max())  # O(1) numbers in the 2×2 system
    a1, a2 = t_ref / m, (size / s_ref) * t_ref / m  # each row divided by m: relative residuals
    c11, c12, c22 = (a1 * a1).sum(-1), (a1 * a2).sum(-1), (a2 * a2).sum(-1)
    b1, b2 = a1.sum(-1), a2.sum(-1)
    det = c11 * c22 - c12 * c12
    with np.errstate(divide="ignore", invalid="ignore"):
        x1, x2 = (b1 * c22 - b2 * c12) / det, (c11 * b2 - c12 * b1) / det
    only_alpha = b1 * b1 / c11 >= b2 * b2 / c22  # the larger explained sum of squares wins
    bad = ~(np.isfinite(x1) & np.isfinite(x2) & (x1 >= 0) & (x2 >= 0))
    x1 = np.where(bad, np.where(only_alpha, b1 / c11, 0.0), x1)
    x2 = np.where(bad, np.where(only_alpha, 0.0, b2 / c22), x2)
    return x1 * t_ref, x2 * t_ref / s_ref


def _per_size(g: pd.DataFrame, size_col: str, time_col: str, samples_col: str | None):
    """Sorted sizes and, per size, every positive finite time measured at it."""
    pooled: dict[float, list[float]] = {}
    has_samples = samples_col is not None and samples_col in g.columns
    for size, t, samples in zip(g[size_col].astype(float), g[time_col].astype(float),
                                g[samples_col] if has_samples else [None] * len(g)):
        values = np.asarray(samples if samples is not None else [], dtype=float).ravel()
        values = values[np.isfinite(values) & (values > 0)]
        pooled.setdefault(size, []).extend(values.tolist() if len(values) else [t])
    sizes = np.array(sorted(pooled))
    return sizes, [np.asarray(pooled[s]) for s in sizes]


def _interval(x: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(x, [tail, 100 - tail])
    return float(lo), float(hi)


def _bootstrap(size, samples, m, pred, rng) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(α*, g*, m*(S_min)) replicates: resampled residuals, and resampled raw samples when every
    size has at least 3 (fewer say nothing about a median's spread)."""
    n = len(size)
    log_res = np.log(m / pred)
    log_res = (log_res - log_res.mean()) * math.sqrt(n / max(n - 2, 1))  # 2 parameters fitted
    draws = np.exp(rng.choice(log_res, size=(_N_BOOT, n)))
    boots = [(*_nnls(size, pred * draws), m[0] * draws[:, 0])]  # the smallest median, scattered alike
    if min(len(s) for s in samples) >= 3:
        rep = np.column_stack([
            np.median(s[rng.integers(0, len(s), size=(_N_BOOT, len(s)))], axis=1) for s in samples])
        boots.append((*_nnls(size, rep), rep[:, 0]))
    return boots


def _envelope(boots, index: int) -> tuple[float, float]:
    """The widest of the bootstraps' intervals for replicate field ``index``."""
    intervals = [_interval(b[index]) for b in boots]
    return min(lo for lo, _ in intervals), max(hi for _, hi in intervals)


def _fit_group(size: np.ndarray, samples: list[np.ndarray], rng) -> dict:
    m = np.array([np.median(s) for s in samples])
    n = len(size)
    out = {"n_sizes": n, "n_samples": int(sum(len(s) for s in samples)),
           "min_size_bytes": float(size[0]), "max_size_bytes": float(size[-1]),
           "smallest_size_time_s": float(m[0])}
    hard_alpha_upper, hard_beta_lower = float(m.min()), float((size / m).max())
    nan = math.nan
    unresolved = {"alpha_s": nan, "alpha_ci_low_s": nan, "alpha_ci_high_s": nan, "alpha_resolved": False,
                  "alpha_upper_s": hard_alpha_upper, "beta_bytes_per_s": nan, "beta_ci_low_bytes_per_s": nan,
                  "beta_ci_high_bytes_per_s": nan, "beta_resolved": False,
                  "beta_lower_bytes_per_s": hard_beta_lower}
    if n < 2:
        return {**out, **unresolved, "fit_ok": False, "rel_rms_residual": nan, "model_alpha_s": nan,
                "model_time_per_byte_s": nan, "fit_note": "one size: no fit (sweep at least 3 sizes)"}
    alpha_fit, g_fit = (float(v[0]) for v in _nnls(size, m[None, :]))
    pred = alpha_fit + size * g_fit
    rms = float(np.sqrt(np.mean(((pred - m) / m) ** 2)))
    out.update(rel_rms_residual=rms, model_alpha_s=alpha_fit, model_time_per_byte_s=g_fit)
    if n < 3 or rms > MAX_REL_RMS:
        note = (f"bad fit: relative RMS residual {rms:.2f} > {MAX_REL_RMS} (the α-β model does not "
                "describe these sizes)" if n >= 3 else "bad fit: 2 sizes cannot test a 2-parameter model")
        return {**out, **unresolved, "fit_ok": False, "fit_note": note}
    boots = _bootstrap(size, samples, m, pred, rng)
    half = alpha_fit / g_fit if g_fit > 0 else math.inf
    latency_reached = alpha_fit > 0 and size[0] <= half / RESOLVE_FACTOR
    bandwidth_reached = g_fit > 0 and size[-1] >= RESOLVE_FACTOR * half
    # α: the fit's intercept when the sizes reach both regimes, else the smallest size's median.
    if bandwidth_reached:
        alpha, (a_lo, a_hi) = alpha_fit, _envelope(boots, 0)
    else:
        alpha, (a_lo, a_hi) = float(m[0]), _envelope(boots, 2)
    g_lo, g_hi = _envelope(boots, 1)
    alpha_ok = latency_reached and a_lo > 0 and (not bandwidth_reached or a_hi / a_lo <= MAX_CI_RATIO)
    beta_ok = bandwidth_reached and g_lo > 0 and g_hi / g_lo <= MAX_CI_RATIO
    res = dict(unresolved, alpha_resolved=alpha_ok, beta_resolved=beta_ok)
    if alpha_ok:
        res.update(alpha_s=alpha, alpha_ci_low_s=a_lo, alpha_ci_high_s=a_hi, alpha_upper_s=nan)
    else:
        res["alpha_upper_s"] = min(hard_alpha_upper, a_hi)
    if beta_ok:
        res.update(beta_bytes_per_s=1 / g_fit, beta_ci_low_bytes_per_s=1 / g_hi,
                   beta_ci_high_bytes_per_s=1 / g_lo, beta_lower_bytes_per_s=nan)
    elif g_hi > 0:
        res["beta_lower_bytes_per_s"] = max(hard_beta_lower, 1 / g_hi)
    if alpha_ok and beta_ok:
        note = "resolved: the sizes reach both the latency- and the bandwidth-bound regime"
    elif alpha_ok:
        note = ("β unresolved: latency-bound sizes; α is the smallest message's median time"
                if not bandwidth_reached else f"β unresolved: its 95 % interval spans more than {MAX_CI_RATIO:g}×")
    elif beta_ok:
        note = ("α unresolved: bandwidth-bound sizes" if not latency_reached else
                f"α unresolved: its 95 % interval spans more than {MAX_CI_RATIO:g}×")
    else:
        note = "α and β unresolved: the sizes reach neither regime clearly, or the times are too noisy"
    return {**out, **res, "fit_ok": True, "fit_note": note}


def fit_alpha_beta(
    df: pd.DataFrame,
    *,
    by: Sequence[str] | None = None,
    size_col: str = "size_bytes",
    time_col: str = "time_s",
    samples_col: str | None = "time_samples_s",
    device_col: str | None = None,
    spec_link_bytes_per_s: float | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Fit t = α + S/β per group of ``by`` (default: the :data:`DEFAULT_BY` columns present), as
    the module docstring says; ``seed`` seeds the bootstrap (the estimates do not depend on it).

    One row per group: the ``by`` columns; ``alpha_s`` with ``alpha_ci_low_s``/``alpha_ci_high_s``
    (95 %), ``alpha_resolved`` and ``alpha_upper_s`` (only when unresolved); ``beta_bytes_per_s``
    (asymptotic algbw) with ``beta_ci_low_bytes_per_s``/``beta_ci_high_bytes_per_s``,
    ``beta_resolved`` and ``beta_lower_bytes_per_s`` (only when unresolved); ``busbw_factor``
    (the rows' busbw/algbw, else from op and world_size), ``busbw_asymptote_bytes_per_s``
    (β × factor), ``half_bandwidth_bytes`` (S½ = α·β); ``fit_ok``, ``rel_rms_residual`` and
    ``fit_note`` (what was resolved, or why not); ``model_alpha_s`` and ``model_time_per_byte_s``
    (the fitted curve's coefficients, which :func:`predict` interpolates with whatever the flags
    say: an unresolved coefficient is a fitting artefact, not a measurement); ``n_points`` (rows),
    ``n_sizes``, ``n_samples``, ``min_size_bytes``, ``max_size_bytes``, ``smallest_size_time_s``;
    ``spec_link_bytes_per_s`` and ``spec_link_source`` (``spec_link_bytes_per_s`` if given, else
    from ``device_col`` via :data:`perfkit.core.specs.SPEC_LINKS`, else NaN/None: unknown).

    Rows whose ``status`` is not ``ok`` measured nothing and are left out. In the others, every
    size, time and raw sample must be positive and finite: one that is not (a NaN size, a time of
    0) raises :class:`BadInputError` naming the rows, never a fit that drops or sorts it silently.
    """
    missing = [c for c in (size_col, time_col) if c not in df.columns]
    if missing:
        raise BadInputError(f"fit_alpha_beta needs columns {missing}")
    by = [c for c in (DEFAULT_BY if by is None else by) if c in df.columns]
    data = df[df["status"] == "ok"] if "status" in df.columns else df
    if data.empty:
        raise BadInputError(f"no rows with status ok and a positive finite {time_col} to fit")
    _refuse_bad_values(data, size_col, time_col, samples_col)
    groups = data.groupby(by, sort=False, dropna=False) if by else [((), data)]
    rows = []
    for i, (key, g) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        size, samples = _per_size(g, size_col, time_col, samples_col)
        fitted = _fit_group(size, samples, np.random.default_rng([seed, i]))
        factor = _factor(g)
        if spec_link_bytes_per_s is not None:
            link, source = float(spec_link_bytes_per_s), "given"
        elif device_col and device_col in g.columns:
            link, source = spec_link(str(g[device_col].iloc[0]))
        else:
            link, source = math.nan, None
        rows.append({
            **dict(zip(by, key)), **fitted, "n_points": len(g), "busbw_factor": factor,
            "busbw_asymptote_bytes_per_s": fitted["beta_bytes_per_s"] * factor,
            "half_bandwidth_bytes": fitted["alpha_s"] * fitted["beta_bytes_per_s"],
            "spec_link_bytes_per_s": link, "spec_link_source": source,
        })
    return pd.DataFrame(rows, columns=[*by, *_FIT_COLUMNS])


def _refuse_bad_values(data: pd.DataFrame, size_col: str, time_col: str, samples_col: str | None) -> None:
    """BadInputError naming the rows whose size, time or a raw sample is not positive and finite:
    S/β of no bytes, a NaN size (it sorts anywhere) or a time of 0 make a fit of garbage."""
    def finite_positive(values) -> np.ndarray:
        v = np.asarray(values, dtype=float).ravel()
        return np.isfinite(v) & (v > 0)

    def no_samples(x) -> bool:  # a row without raw samples: its time_s is the one measurement
        return x is None or (np.ndim(x) == 0 and pd.isna(x))

    bad = {c: data.index[~finite_positive(pd.to_numeric(data[c], errors="coerce"))].tolist()
           for c in (size_col, time_col)}
    if samples_col is not None and samples_col in data.columns:
        bad[samples_col] = [i for i, x in zip(data.index, data[samples_col])
                            if not no_samples(x) and not finite_positive(x).all()]
    for col, rows in bad.items():
        if rows:
            shown = data.loc[rows[:5], col].tolist()
            raise BadInputError(
                f"fit_alpha_beta: {col} must be positive finite, but {len(rows)} "
                f"{'row is' if len(rows) == 1 else 'rows are'} not (index {rows[:5]}{' …' if len(rows) > 5 else ''}: "
                f"{shown}); the α-β model needs sizes of at least one byte and measured times: fix or drop "
                f"those rows (rows whose status is not ok are left out)")


def _factor(g: pd.DataFrame) -> float:
    if {"busbw_bytes_per_s", "algbw_bytes_per_s"} <= set(g.columns):
        ratio = (g["busbw_bytes_per_s"] / g["algbw_bytes_per_s"]).dropna()
        if len(ratio):
            return float(ratio.median())
    if {"op", "world_size"} <= set(g.columns):
        return busbw_factor(str(g["op"].iloc[0]), int(g["world_size"].iloc[0]))
    return math.nan


def _check_fit_frame(fit: pd.DataFrame, who: str) -> None:
    need = {"model_alpha_s", "model_time_per_byte_s", "fit_ok", "alpha_resolved", "beta_resolved",
            "min_size_bytes", "max_size_bytes", "busbw_factor"}
    if not need <= set(fit.columns):
        raise BadInputError(f"{who} needs a fit_alpha_beta frame (columns {sorted(need)}); "
                            "pass what perfkit.analyse.commfit.fit_alpha_beta returned")


def _predict_row(f, sizes: np.ndarray) -> list[tuple[float, bool, str | None]]:
    """(time_s, extrapolated, reason time_s is NaN) for each size from one fit row."""
    out = []
    for s in sizes:
        below, above = s < f["min_size_bytes"], s > f["max_size_bytes"]
        reason = None
        if not f["fit_ok"]:
            reason = f"no prediction from a bad fit ({f['fit_note']})"
        elif below and not f["alpha_resolved"]:
            reason = "α unresolved: below the measured sizes the time is mostly α"
        elif above and not f["beta_resolved"]:
            reason = "β unresolved: above the measured sizes the time is mostly S/β"
        t = math.nan if reason else f["model_alpha_s"] + s * f["model_time_per_byte_s"]
        out.append((t, bool(below or above), reason))
    return out


def predict(fit: pd.DataFrame, sizes_bytes: Sequence[float]) -> pd.DataFrame:
    """Expected time of each message size from each row of a :func:`fit_alpha_beta` frame.

    One row per (fit row, size): the fit's key columns, ``size_bytes``, ``time_s``,
    ``extrapolated`` (True outside the measured size range: the model carried past the data) and
    ``reason`` (None, or why ``time_s`` is NaN: a bad fit, or an extrapolation that leans on an
    unresolved parameter: α below the measured sizes, β above them). Inside the range the fitted
    curve interpolates the per-size medians whether or not α and β were resolved separately.
    """
    _check_fit_frame(fit, "predict")
    sizes = np.asarray(sizes_bytes, dtype=float).ravel()
    keys = [c for c in fit.columns if c not in _FIT_COLUMNS]
    rows = []
    for _, f in fit.iterrows():
        for s, (t, extrapolated, reason) in zip(sizes, _predict_row(f, sizes)):
            rows.append({**{k: f[k] for k in keys}, "size_bytes": s, "time_s": t,
                         "extrapolated": extrapolated, "reason": reason})
    return pd.DataFrame(rows, columns=[*keys, "size_bytes", "time_s", "extrapolated", "reason"])


def busbw_curve(fit: pd.DataFrame, sizes_bytes: Sequence[float] | None = None, *,
                points: int = 50) -> pd.DataFrame:
    """:func:`predict` at ``sizes_bytes`` (default: ``points`` log-spaced sizes over each fit's
    measured range) with ``algbw_bytes_per_s`` = S/t and ``busbw_bytes_per_s`` = algbw × factor:
    the busbw the model predicts, rising with S and saturating at β × factor."""
    _check_fit_frame(fit, "busbw_curve")
    parts = []
    for i in range(len(fit)):
        f = fit.iloc[i]
        sizes = (np.geomspace(max(f["min_size_bytes"], 1.0), max(f["max_size_bytes"], 1.0), points)
                 if sizes_bytes is None else sizes_bytes)
        part = predict(fit.iloc[i:i + 1], sizes)
        part["algbw_bytes_per_s"] = part["size_bytes"] / part["time_s"]
        part["busbw_bytes_per_s"] = part["algbw_bytes_per_s"] * f["busbw_factor"]
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else predict(fit, [])
