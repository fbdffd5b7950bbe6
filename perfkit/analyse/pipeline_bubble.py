"""The pipeline bubble: predicted, measured from per-rank timelines, and fitted from step times.

Pure functions on numbers and DataFrames; no torch, no device.

**Predicted.** With p pipeline ranks, m microbatches per step and forward and backward times t_f
and t_b per microbatch and stage, the bubble of GPipe and 1F1B lasts t_pb = (p−1)·(t_f + t_b)
against an ideal t_id = m·(t_f + t_b); interleaving v stages per rank shrinks it to
(p−1)·(t_f + t_b)/v (Narayanan et al., SC'21, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2, eqs. for t_pb/t_id). As a fraction of the step,
t_pb / (t_pb + t_id):

- GPipe, 1F1B: (p−1) / (m + p − 1)
- Interleaved1F1B: (p−1) / (v·m + p − 1)

The zero-bubble schedules (Qi et al., ICLR'24) have no closed form that holds without knowing
the separate input- and weight-gradient times: their prediction is NaN, with the reason.

**Measured** (:func:`measured_bubble_fraction`). Each rank records the wall intervals of its
stage computations (every forward and backward of one of its stages, for one microbatch) inside
one window that is the same on every rank: from a barrier before the schedule's step to a
barrier after it. A rank's bubble is the part of the window covered by none of its intervals
(waiting on a peer's activation or gradient, send/recv, loss, splitting the batch all count as
idle), over the window's length; the configuration's bubble fraction is the mean over ranks.

**Fitted** (:func:`fit_step_time`). The step time of GPipe/1F1B is (m + p − 1)·(t_f + t_b):
linear in m, T(m) = α·m + β with β/α = p − 1. An ordinary least-squares line through (m, T).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from perfkit.core.errors import BadInputError

__all__ = ["SCHEDULES", "predicted_bubble_fraction", "prediction_reason", "measured_bubble_fraction",
           "rank_bubble_fraction", "StepTimeFit", "fit_step_time", "bubble_table", "row_columns"]

#: Schedule names as perfkit spells them (torch.distributed.pipelining's `get_schedule_class`
#: names), and how many stages each puts on one rank: 1, or None for "two or more".
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": None, "InterleavedZeroBubble": None,
             "ZBVZeroBubble": 2}
_ONE_STAGE = ("GPipe", "1F1B")


def prediction_reason(schedule: str) -> str | None:
    """Why :func:`predicted_bubble_fraction` is NaN for ``schedule``, or None when it is not."""
    if schedule in _ONE_STAGE or schedule == "Interleaved1F1B":
        return None
    if schedule in SCHEDULES:
        return (f"{schedule} fills its bubble with weight-gradient work; its size depends on the "
                "separate input- and weight-gradient times (no closed form used here)")
    return f"unknown schedule {schedule!r}"


def predicted_bubble_fraction(schedule: str, ranks: int, microbatches: int,
                              stages_per_rank: int = 1) -> float:
    """The bubble's share of the step, (p−1)/(v·m + p−1) (v = 1 for GPipe and 1F1B); NaN where
    :func:`prediction_reason` says why."""
    if min(ranks, microbatches, stages_per_rank) < 1:
        raise BadInputError(f"ranks, microbatches and stages_per_rank must be >= 1, got "
                            f"{ranks}, {microbatches}, {stages_per_rank}")
    if prediction_reason(schedule) is not None:
        return math.nan
    v = 1 if schedule in _ONE_STAGE else stages_per_rank
    return (ranks - 1) / (v * microbatches + ranks - 1)


def _union_s(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the union of ``intervals`` (clipped to the window)."""
    covered, reach = 0.0, start
    for lo, hi in sorted((max(lo, start), min(hi, end)) for lo, hi in intervals):
        if hi <= max(lo, reach):  # outside the window, or inside what is already covered
            continue
        covered += hi - max(lo, reach)
        reach = hi
    return covered


def rank_bubble_fraction(intervals: Sequence[tuple[float, float]], window: tuple[float, float]) -> float:
    """One rank's idle share of ``window``: 1 − (union of its compute ``intervals``) / window."""
    start, end = window
    if not end > start:
        raise BadInputError(f"a window must end after it starts, got {window}")
    if any(hi < lo for lo, hi in intervals):
        raise BadInputError("an interval ends before it starts")
    return 1.0 - _union_s(intervals, start, end) / (end - start)


def measured_bubble_fraction(rank_intervals: Sequence[Sequence[tuple[float, float]]],
                             rank_windows: Sequence[tuple[float, float]]) -> float:
    """The mean over ranks of :func:`rank_bubble_fraction` (each rank in its own clock: only
    differences within one rank are used, so no clock is compared across ranks)."""
    if not rank_intervals or len(rank_intervals) != len(rank_windows):
        raise BadInputError("need one window per rank and at least one rank")
    shares = [rank_bubble_fraction(i, w) for i, w in zip(rank_intervals, rank_windows)]
    return sum(shares) / len(shares)


def row_columns(schedule: str, microbatches: int, stages_per_rank: int,
                rank_intervals: Sequence[Sequence[Sequence[tuple[float, float]]]],
                rank_windows_s: Sequence[Sequence[float]]) -> dict:
    """A pipeline row's bubble columns from every rank's timed steps: ``rank_intervals[r][i]`` the
    compute intervals of rank r in step i, ``rank_windows_s[r][i]`` that step's window length
    (the intervals are seconds from the window's start). The measured bubble is the median over
    steps of :func:`measured_bubble_fraction` (per step in ``bubble_fraction_samples``; per rank,
    the median over steps, in ``bubble_fraction_per_rank``) beside the predicted one."""
    steps = range(len(rank_windows_s[0]))
    per_step = [measured_bubble_fraction([r[i] for r in rank_intervals],
                                         [(0.0, w[i]) for w in rank_windows_s]) for i in steps]
    per_rank = [statistics.median(rank_bubble_fraction(iv, (0.0, w)) for iv, w in zip(ivs, ws))
                for ivs, ws in zip(rank_intervals, rank_windows_s)]
    return {
        "bubble_fraction": statistics.median(per_step), "bubble_fraction_samples": per_step,
        "bubble_fraction_per_rank": per_rank,
        "bubble_fraction_predicted": predicted_bubble_fraction(
            schedule, len(rank_intervals), microbatches, stages_per_rank),
        "bubble_fraction_predicted_reason": prediction_reason(schedule),
        # The span between the two barriers around the schedule's step, slowest rank per step.
        "pipeline_time_s": statistics.median(max(w) for w in zip(*rank_windows_s)),
    }


@dataclass(kw_only=True, frozen=True)
class StepTimeFit:
    """T(m) = α·m + β, least squares."""

    alpha_s: float
    """Seconds per microbatch (the slope)."""
    beta_s: float
    """Seconds at zero microbatches (the intercept): the pipeline's fill and drain."""
    r2: float
    """Coefficient of determination of the line."""

    @property
    def beta_over_alpha(self) -> float:
        """(p − 1) for GPipe and 1F1B with balanced stages."""
        return self.beta_s / self.alpha_s


def fit_step_time(microbatches: Sequence[float], step_time_s: Sequence[float]) -> StepTimeFit:
    """The least-squares line through (m, T(m)); needs two distinct microbatch counts."""
    m, t = [float(x) for x in microbatches], [float(x) for x in step_time_s]
    if len(m) != len(t) or len(set(m)) < 2:
        raise BadInputError("fit_step_time needs as many times as counts, and two distinct counts")
    mean_m, mean_t = sum(m) / len(m), sum(t) / len(t)
    sxx = sum((x - mean_m) ** 2 for x in m)
    alpha = sum((x - mean_m) * (y - mean_t) for x, y in zip(m, t)) / sxx
    beta = mean_t - alpha * mean_m
    ss_tot = sum((y - mean_t) ** 2 for y in t)
    ss_res = sum((y - alpha * x - beta) ** 2 for x, y in zip(m, t))
    return StepTimeFit(alpha_s=alpha, beta_s=beta, r2=1.0 - ss_res / ss_tot if ss_tot else 1.0)


_KEYS = ["pp_schedule", "world_size", "stages_per_rank", "n_microbatches"]


def bubble_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (schedule, ranks, stages per rank, microbatches) of the ``ok`` pipeline rows: the
    median measured and the predicted bubble fraction, and the median step time."""
    rows = df
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    if "parallelism" in rows:
        rows = rows[rows["parallelism"] == "pp"]
    if rows.empty or not set(_KEYS) <= set(rows):
        return pd.DataFrame(columns=[*_KEYS, "bubble_fraction", "bubble_fraction_predicted", "step_time_s"])
    return (rows.groupby(_KEYS, as_index=False)
            .agg(bubble_fraction=("bubble_fraction", "median"),
                 bubble_fraction_predicted=("bubble_fraction_predicted", "first"),
                 step_time_s=("step_time_s", "median"))
            .sort_values(_KEYS, ignore_index=True))
