"""Statistics of one A/B point: is the new side faster, slower, the same, or can the data not tell?

Each side arrives as *groups* of raw samples, one group per round (one process executing the
configuration; rounds interleave A, B, B, A, ...). Samples of one round are correlated and rounds
differ from each other (clocks, placement, caches), so the interval resamples rounds as well.

**Numbers** (:func:`compare_samples`): ratio = median(new) / median(base) over the pooled samples;
its percentile confidence interval from a two-level bootstrap (rounds with replacement, then samples
within each chosen round); and the two-sided Mann–Whitney U p-value of the pooled samples, computed
as ``scipy.stats.mannwhitneyu(method="auto")`` does (scipy is not a dependency).

**Verdict** (:func:`verdict`). slowdown = ratio for a lower-is-better metric (time), 1/ratio
otherwise (throughput): how many times worse the new side is; its CI likewise. With threshold t:

1. fewer than :data:`MIN_SAMPLES` pooled samples on a side → ``inconclusive`` ("too few samples");
2. significant := Holm-adjusted p < alpha AND the slowdown's CI excludes 1. The U-test sees only
   pooled samples; the CI holds run-to-run variation (below), so a change must stand out of it;
3. ``slower`` iff significant and slowdown > 1 + t; ``faster`` iff significant and
   slowdown < 1/(1 + t) (a symmetric factor);
4. else ``same`` iff the whole CI lies within [1/(1 + t), 1 + t]; else ``inconclusive``.

**Run-to-run variation.** Samples of one round share that run's level (clocks, placement, a
neighbour's job): GPU jobs on shared clusters vary 2–5 % from run to run (issue 53), far more than
the 1 % noise within a run. The bootstrap over rounds sees that spread only roughly, and with one
round a side not at all: simulated A/A pairs (20 samples a round, 1 % within, 5 % between runs)
were called ``slower`` 25 % of the time with one round a side. So the CI is the union of the
bootstrap's and a run-to-run interval on log(ratio), ±q·σ·√(1/k_base + 1/k_new) for k rounds a
side (round means of log-medians; Welch 1947 with a pooled variance, i.e. Student's two-sample t):

- σ **measured** where the rounds give it (k_base + k_new − 2 ≥ 4 degrees of freedom, e.g. 3
  rounds a side): the pooled standard deviation of the rounds' log-medians, q Student's t
  quantile at those degrees of freedom;
- σ **stated** otherwise (:data:`RUN_TO_RUN`, ``perfkit compare --run-to-run``): the spread the
  runs are known to have, q the normal quantile. One round a side cannot get under it.

With these, simulated A/A pairs at a 5 % spread are called ``slower`` ≤ 5 % of the time and a 10 %
regression is never ``same``, at 1, 2 and 3 rounds a side (``tests/test_ab_stats.py``).

Anchors: asv compare flags a benchmark only when the ratio passes ``--factor`` AND the two
sides differ significantly (asv ``compare.py``; a two-sample test on the raw samples, asv PR #754);
criterion.rs judges a change by a bootstrap CI of the relative change, a significance level
(0.05) and a noise threshold; google/benchmark ``tools/gbench/report.py`` runs the Mann–Whitney
U test and warns below ``UTEST_OPTIMAL_REPETITIONS = 9`` repetitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..core.errors import BadInputError

__all__ = [
    "VERDICTS", "MIN_SAMPLES", "RUN_TO_RUN", "SampleComparison",
    "mann_whitney_u", "holm", "bootstrap_ratio_ci", "run_to_run_interval", "compare_samples", "verdict",
]

VERDICTS = ("faster", "slower", "same", "inconclusive")
MIN_SAMPLES = 5
"""Fewer pooled samples on a side → ``inconclusive``: the exact U test's smallest two-sided p is
2/C(6,3) = 0.1 at 3 vs 3 and 2/C(8,4) ≈ 0.029 at 4 vs 4, no room for Holm; gbench warns below 9."""
RUN_TO_RUN = 0.05
"""σ of a run's log-median assumed where the rounds do not measure it (one round a side): the top
of the 2–5 % run-to-run spread of GPU jobs on shared clusters (issue 53). A machine known to be
quieter states its own (``perfkit compare --run-to-run 0.01``); more rounds measure it."""
MEASURED_DF = 4
"""Degrees of freedom (k_base + k_new − 2) from which the rounds' own spread is used (3 rounds a
side): a spread measured with 2 degrees of freedom is under half the true one 22 % of the time
(P(χ²₂ < 2·0.25) = 1 − e^−0.25), with 4 degrees 9 %; below, the stated spread stands."""
_CHUNK_ELEMENTS = 1 << 22  # bootstrap draws per chunk: bounds memory at ~32 MiB per array


def _ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1-based ranks, ties given their average rank, and the size of each tie block."""
    order = np.argsort(values, kind="mergesort")
    s = values[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1], True])
    counts = np.diff(starts)
    ranks = np.empty(values.size)
    ranks[order] = np.repeat(starts[:-1] + (counts + 1) / 2, counts)
    return ranks, counts


def _exact_count_at_most(k: int, m: int, n: int) -> int:
    """How many of the C(m+n, m) orderings give U ≤ k: Σ coefficients of q^0..q^k of the Gaussian
    binomial Π_{i=1..m} (1 − q^(n+i)) / (1 − q^i) (the U null distribution, Mann & Whitney 1947),
    in exact integers; dividing by (1 − q^i) is a running sum with stride i."""
    c = np.zeros(k + 1, dtype=object)
    c[0] = 1
    for i in range(1, m + 1):
        if n + i <= k:
            c[n + i:] = c[n + i:] - c[:k + 1 - n - i]
        for r in range(min(i, k + 1)):
            c[r::i] = np.cumsum(c[r::i])
    return int(c.sum())


def mann_whitney_u(x, y) -> tuple[float, float]:
    """(U statistic of x, two-sided p), as ``scipy.stats.mannwhitneyu(x, y)`` (scipy 1.17, "auto").

    Exact null distribution when a side has ≤ 8 samples and nothing ties; else the normal
    approximation with tie correction and continuity correction. All values equal gives p = 1;
    an empty side or a NaN gives (NaN, NaN), as scipy does.
    """
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    n1, n2 = x.size, y.size
    if n1 == 0 or n2 == 0 or np.isnan(x).any() or np.isnan(y).any():
        return math.nan, math.nan
    ranks, ties = _ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    u_big = max(u1, n1 * n2 - u1)
    if (n1 <= 8 or n2 <= 8) and ties.max() == 1:
        count = _exact_count_at_most(int(n1 * n2 - u_big), min(n1, n2), max(n1, n2))
        p = 2 * count / math.comb(n1 + n2, n1)
    else:
        n = n1 + n2
        tie_term = float(np.sum(ties.astype(float) ** 3 - ties))
        s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
        # s = 0 only when every value is equal: z = −0.5/0 = −∞ in scipy, so p = 1.
        p = 1.0 if s == 0 else math.erfc((u_big - n1 * n2 / 2 - 0.5) / s / math.sqrt(2))
    return u1, min(p, 1.0)


def holm(p_values) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values: sorted ascending, p_(i)·(m−i+1), running maximum, capped
    at 1 (Holm 1979). NaN entries stay NaN and do not count in m."""
    p = np.asarray(p_values, dtype=float).ravel()
    ok = ~np.isnan(p)
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        raise BadInputError(f"p-values must lie in [0, 1], got {p[ok].min():g}..{p[ok].max():g}")
    q = p[ok]
    order = np.argsort(q, kind="stable")
    adjusted = np.empty(q.size)
    scaled = (q.size - np.arange(q.size)) * q[order]
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    out = np.full(p.size, np.nan)
    out[ok] = adjusted
    return out


def _groups(groups, side: str) -> list[np.ndarray]:
    """Non-empty groups as float arrays; a flat list of numbers is refused (it is not rounds)."""
    out = []
    for g in groups:
        if np.ndim(g) == 0:
            raise BadInputError(f"{side} must be a list of rounds, each a list of samples; "
                                f"wrap a single round as [samples]")
        a = np.asarray(g, dtype=float).ravel()
        if not (np.isfinite(a) & (a > 0)).all():
            raise BadInputError(f"{side} holds a non-finite or non-positive sample; "
                                f"drop failed measurements first (ratios need values > 0)")
        if a.size:
            out.append(a)
    return out


def _bootstrap_medians(groups: list[np.ndarray], resamples: int, rng) -> np.ndarray:
    """Median of the pooled samples of each two-level resample (rounds, then samples in each)."""
    sizes = np.array([g.size for g in groups])
    flat = np.concatenate(groups)
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    width = int(sizes.max())
    slot = np.arange(width)
    medians = np.empty(resamples)
    chunk = max(1, _CHUNK_ELEMENTS // (len(groups) * width))
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        pick = rng.integers(len(groups), size=(b, len(groups)))
        n_pick = sizes[pick][..., None]
        draw = rng.integers(0, n_pick, size=(b, len(groups), width))
        # Rounds of unequal size: pad to the widest with +inf, which sorts past every sample.
        values = np.where(slot < n_pick, flat[offsets[pick][..., None] + draw], np.inf)
        values = np.sort(values.reshape(b, -1), axis=1)
        n = n_pick.sum(axis=(1, 2))
        lo = np.take_along_axis(values, ((n - 1) // 2)[:, None], axis=1)[:, 0]
        hi = np.take_along_axis(values, (n // 2)[:, None], axis=1)[:, 0]
        medians[start:start + b] = (lo + hi) / 2
    return medians


def _check_ci_args(confidence: float, resamples: int) -> None:
    if not 0 < confidence < 1:
        raise BadInputError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    if int(resamples) < 1:
        raise BadInputError(f"resamples must be at least 1, got {resamples}")


def bootstrap_ratio_ci(base_groups, new_groups, *, confidence=0.95, resamples=2000,
                       seed=0) -> tuple[float, float]:
    """Percentile CI of median(new pooled) / median(base pooled) by a two-level bootstrap: rounds
    resampled with replacement, then samples within each chosen round; sides independently.
    Deterministic for a seed; one group per side is the ordinary bootstrap."""
    _check_ci_args(confidence, resamples)
    base, new = _groups(base_groups, "base_groups"), _groups(new_groups, "new_groups")
    if not base or not new:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    n = int(resamples)
    ratios = _bootstrap_medians(new, n, rng) / _bootstrap_medians(base, n, rng)
    lo, hi = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with integer ``df``: the finite sums of Abramowitz & Stegun
    26.7.3 (odd df) and 26.7.4 (even df), θ = atan(t/√df)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos θ · (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + ...)
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    term, total = 1.0, 0.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile at p > 0.5 for integer df ≥ 1 (bisection on :func:`_t_two_sided`)."""
    target = 2 * p - 1
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, df) < target else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def run_to_run_interval(base: list[np.ndarray], new: list[np.ndarray], *, confidence: float,
                        stated: float) -> tuple[float, float, int]:
    """(half-width on log(ratio), σ used, degrees of freedom: 0 when σ is the ``stated`` one) of
    the run-to-run interval in the module docstring; rounds as non-empty arrays."""
    kb, kn = len(base), len(new)
    df = kb + kn - 2
    width = math.sqrt(1 / kb + 1 / kn)
    if df >= MEASURED_DF:
        logs = [np.log(np.median(g)) for g in base], [np.log(np.median(g)) for g in new]
        squares = sum(float(np.sum((np.asarray(side) - np.mean(side)) ** 2)) for side in logs)
        sigma = math.sqrt(squares / df)
        return t_quantile((1 + confidence) / 2, df) * sigma * width, sigma, df
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    return z * stated * width, stated, 0


@dataclass(frozen=True, kw_only=True)
class SampleComparison:
    """The numbers of one A/B point; :func:`verdict` turns them into words."""

    n_base: int
    n_new: int
    groups_base: int
    groups_new: int
    median_base: float
    median_new: float
    ratio: float
    """median_new / median_base, of the metric itself."""
    ci_low: float
    ci_high: float
    """The CI of ``ratio``: the two-level bootstrap's, widened to the run-to-run interval."""
    p_value: float
    """Mann–Whitney U on the pooled samples, two-sided, uncorrected; NaN if a side is empty."""
    confidence: float = 0.95
    """The CI's level, for the words."""
    run_to_run: float = math.nan
    """σ of a run's log-median the CI holds: measured from the rounds, or the stated one."""
    run_to_run_df: int = 0
    """Degrees of freedom σ was measured with; 0: σ is the stated one (too few rounds)."""
    run_to_run_bound: bool = False
    """True when the run-to-run interval, not the bootstrap, sets a bound of the CI."""


def compare_samples(base_groups, new_groups, *, confidence=0.95, resamples=2000,
                    seed=0, run_to_run: float = RUN_TO_RUN) -> SampleComparison:
    """Medians, ratio, its CI (bootstrap ∪ run-to-run) and the U-test p of one point; NaN where a
    side is empty. ``run_to_run``: σ of a run's log-median where the rounds cannot measure it."""
    _check_ci_args(confidence, resamples)
    if not (math.isfinite(run_to_run) and 0 <= run_to_run < 1):
        raise BadInputError(f"run_to_run is a fraction (0.05 = 5 % from run to run), got {run_to_run}")
    base, new = _groups(base_groups, "base_groups"), _groups(new_groups, "new_groups")
    pooled_base = np.concatenate(base) if base else np.empty(0)
    pooled_new = np.concatenate(new) if new else np.empty(0)
    med_base = float(np.median(pooled_base)) if base else math.nan
    med_new = float(np.median(pooled_new)) if new else math.nan
    ratio = med_new / med_base
    lo, hi = bootstrap_ratio_ci(base, new, confidence=confidence, resamples=resamples, seed=seed)
    sigma, df, bound = math.nan, 0, False
    if base and new:
        half, sigma, df = run_to_run_interval(base, new, confidence=confidence, stated=run_to_run)
        rr_lo, rr_hi = ratio * math.exp(-half), ratio * math.exp(half)
        bound = rr_lo < lo or rr_hi > hi
        lo, hi = min(lo, rr_lo), max(hi, rr_hi)
    return SampleComparison(
        n_base=pooled_base.size, n_new=pooled_new.size, groups_base=len(base), groups_new=len(new),
        median_base=med_base, median_new=med_new, ratio=ratio,
        ci_low=lo, ci_high=hi, p_value=mann_whitney_u(pooled_base, pooled_new)[1],
        confidence=confidence, run_to_run=sigma, run_to_run_df=df, run_to_run_bound=bound)


def _change(s: float) -> str:
    """A slowdown in words: 1.123 → "12.3 % slower", 0.9 → "11.1 % faster" (speed-up 1/0.9)."""
    return f"{(s - 1) * 100:.1f} % slower" if s >= 1 else f"{(1 / s - 1) * 100:.1f} % faster"


def _ci_words(lo: float, hi: float) -> str:
    if lo >= 1:
        return f"{(lo - 1) * 100:.1f}–{(hi - 1) * 100:.1f} % slower"
    if hi <= 1:
        return f"{(1 / hi - 1) * 100:.1f}–{(1 / lo - 1) * 100:.1f} % faster"
    return f"{_change(lo)} to {_change(hi)}"


def verdict(c: SampleComparison, *, p_adjusted: float, lower_is_better: bool, threshold=0.05,
            alpha=0.05) -> tuple[str, str]:
    """(verdict, why in plain words) by the rule in the module docstring."""
    if threshold < 0 or not 0 < alpha < 1:
        raise BadInputError(f"need threshold ≥ 0 and 0 < alpha < 1, got {threshold}, {alpha}")
    if min(c.n_base, c.n_new) < MIN_SAMPLES:
        return "inconclusive", (f"too few samples ({c.n_base} vs {c.n_new}; need ≥ {MIN_SAMPLES} per side: "
                                "time more of them (a training step: steps ≥ warmup_steps + "
                                f"{MIN_SAMPLES}; iters, min_run_time_s) or run more rounds)")
    if lower_is_better:
        s, lo, hi = c.ratio, c.ci_low, c.ci_high
    else:
        s, lo, hi = 1 / c.ratio, 1 / c.ci_high, 1 / c.ci_low
    bound = 1 + threshold
    level = f"{c.confidence * 100:g} % CI"
    p_words = "p<0.0001" if p_adjusted < 1e-4 else f"p={p_adjusted:.2g}"
    numbers = f"({level} {_ci_words(lo, hi)}), {p_words} after Holm"
    significant = p_adjusted < alpha and (lo > 1 or hi < 1)
    if significant and s > bound:
        return "slower", f"{_change(s)} {numbers}"
    if significant and s < 1 / bound:
        return "faster", f"{_change(s)} {numbers}"
    if 1 / bound <= lo and hi <= bound:
        return "same", f"no change beyond ±{threshold * 100:g} %: {_change(s)} {numbers}"
    return "inconclusive", (f"too noisy to tell: {_change(s)}, but the {level} "
                            f"({_ci_words(lo, hi)}) reaches past ±{threshold * 100:g} %, "
                            f"{p_words} after Holm{_run_to_run_words(c)}")


def _run_to_run_words(c: SampleComparison) -> str:
    """Why the CI is as wide as it is, where run-to-run variation sets it, and what narrows it."""
    if not c.run_to_run_bound:
        return ""
    rounds = f"{c.groups_base} and {c.groups_new} rounds"
    if c.run_to_run_df == 0:
        return (f"; run-to-run spread ±{c.run_to_run * 100:.3g} % assumed ({rounds} cannot measure it): "
                f"run an A/B sweep with rounds ≥ 3, or state your runs' spread with --run-to-run")
    return (f"; the {rounds} differ by ±{c.run_to_run * 100:.3g} % from run to run: "
            f"more rounds narrow it")
