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

**Split** (:func:`row_columns`). That idle time is the schedule's bubble *and* everything else
between the stage computations: stage-to-stage send/recv, the loss, the schedule's own work per
microbatch. The schedule's part is what the formula leaves idle at the measured compute: with
C the busiest rank's compute in a step, one stage's compute per microbatch is t = C/(v·m), and a
pipeline with no communication and no per-microbatch overhead would last W* = C + (p−1)·t
(t_id + t_pb above, at the measured t). A rank's schedule part is (min(W*, W) − C_r)/W, its
overhead part max(0, W − W*)/W; the two sum to its idle share. The overhead per critical-path
slot (one stage, one microbatch, forward and backward) is o = (W − W*)/(v·m + p − 1). Stages of
unequal cost make W* slightly long (the busiest stage's t for every fill and drain slot), so
the split errs toward the schedule.

**Too small to mean the bubble** (``bubble_fraction_reason``): when the overhead part exceeds
:data:`OVERHEAD_LIMIT` = ½ of the schedule's, the measured fraction is more than 1.5× the
schedule's bubble. 1.5× is the smallest step the prediction takes when m doubles
((v·2m+p−1)/(v·m+p−1) ≥ 1.5 for v·m ≥ p − 1): beyond it the overhead is as large as the effect
the bubble is measured for (how much more microbatches buy), and the number cannot be read as
the bubble nor against the prediction. In per-microbatch terms (W − W* = (v·m+p−1)·o,
W* − C = (p−1)·t): compute per microbatch and stage t below 2·o·(v·m + p − 1)/(p − 1), i.e.
o/t above half the predicted fraction: the more microbatches, the more compute per microbatch
the bubble needs to show (one rank: no bubble, no rule).

**Fitted** (:func:`fit_step_time`). The step time of GPipe/1F1B is (m + p − 1)·(t_f + t_b):
linear in m, T(m) = α·m + β with β/α = p − 1. An ordinary least-squares line through (m, T).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfkit.core import checks
from perfkit.core.errors import BadInputError

if TYPE_CHECKING:  # pandas is imported where rows are built: a rank never pays for it
    import pandas as pd

__all__ = ["SCHEDULES", "WORKLOAD_KEYS", "OVERHEAD_LIMIT", "check_schedule", "point_reason", "predicted_bubble_fraction", "prediction_reason", "measured_bubble_fraction",
           "rank_bubble_fraction", "StepTimeFit", "fit_step_time", "bubble_table", "row_columns"]

#: Schedule names as perfkit spells them (torch.distributed.pipelining's `get_schedule_class`
#: names), and how many stages each puts on one rank: 1, or None for "two or more".
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": None, "InterleavedZeroBubble": None,
             "ZBVZeroBubble": 2}
_ONE_STAGE = ("GPipe", "1F1B")
#: The largest overhead part, as a share of the schedule's part, at which a measured bubble is
#: still read as the schedule's (module docstring: "Too small to mean the bubble").
OVERHEAD_LIMIT = 0.5


def check_schedule(schedule: str, stages_per_rank: int) -> None:
    """Raise :class:`BadInputError` when ``schedule`` is not one of :data:`SCHEDULES` or cannot
    hold ``stages_per_rank`` stages on a rank (GPipe and 1F1B one, the interleaved two or more,
    ZBVZeroBubble two): a stage count is never silently read as another."""
    checks.one_of("pp_schedule", schedule, tuple(SCHEDULES))
    needed, v = SCHEDULES[schedule], stages_per_rank
    if needed == 1 and v != 1:
        raise BadInputError(f"{schedule} runs one stage per rank; stages_per_rank is {v} "
                            "(leave it 1, or interleave with Interleaved1F1B)")
    if needed is None and v < 2:
        raise BadInputError(f"{schedule} interleaves several stages per rank; set "
                            f"stages_per_rank >= 2 (got {v})")
    if needed is not None and needed > 1 and v != needed:
        raise BadInputError(f"{schedule} needs exactly {needed} stages per rank, got {v}")


def point_reason(schedule: str, ranks: int, microbatches: int) -> str | None:
    """Why torch's ``schedule`` refuses ``microbatches`` on ``ranks`` pipeline ranks, or None: 1F1B
    needs a microbatch per stage in flight; the interleaved schedules split the microbatches into
    rounds of max(1, m // p)."""
    p, m = ranks, microbatches
    if schedule == "1F1B" and m < p:  # torch's Schedule1F1B refuses it
        return f"1F1B needs n_microbatches >= stages ({p}), got {m}"
    if SCHEDULES.get(schedule, 1) != 1:
        rounds = max(1, m // p)
        if m % rounds:
            return f"{schedule} needs n_microbatches a multiple of max(1, m // p) = {rounds}, got {m}"
    return None


def prediction_reason(schedule: str) -> str | None:
    """Why :func:`predicted_bubble_fraction` is NaN for ``schedule``, or None when it is not;
    :class:`BadInputError` for an unknown schedule."""
    checks.one_of("pp_schedule", schedule, tuple(SCHEDULES))
    if schedule in _ONE_STAGE or schedule == "Interleaved1F1B":
        return None
    return (f"{schedule} fills its bubble with weight-gradient work; its size depends on the "
            "separate input- and weight-gradient times (no closed form used here)")


def predicted_bubble_fraction(schedule: str, ranks: int, microbatches: int,
                              stages_per_rank: int = 1) -> float:
    """The bubble's share of the step, (p−1)/(v·m + p−1) (v = 1 for GPipe and 1F1B); NaN where
    :func:`prediction_reason` says why; :class:`BadInputError` where :func:`check_schedule` does."""
    if min(ranks, microbatches, stages_per_rank) < 1:
        raise BadInputError(f"ranks, microbatches and stages_per_rank must be >= 1, got "
                            f"{ranks}, {microbatches}, {stages_per_rank}")
    check_schedule(schedule, stages_per_rank)
    if prediction_reason(schedule) is not None:
        return math.nan
    return (ranks - 1) / (stages_per_rank * microbatches + ranks - 1)


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


def _split_step(intervals: Sequence[Sequence[tuple[float, float]]], windows: Sequence[float],
                slots: int, fill_slots: int) -> tuple[float, float, float, float]:
    """One step's (schedule part, overhead part, compute per slot s, overhead per slot s): the
    split of the module docstring, the parts as means over ranks of shares of their windows."""
    busy = [_union_s(iv, 0.0, w) for iv, w in zip(intervals, windows)]
    compute_s = max(busy) / (slots - fill_slots)  # t = C/(v·m)
    ideal = max(busy) + fill_slots * compute_s  # W* = C + (p−1)·t
    schedule = [(min(ideal, w) - c) / w for c, w in zip(busy, windows)]
    overhead = [max(0.0, w - ideal) / w for w in windows]
    return (statistics.fmean(schedule), statistics.fmean(overhead), compute_s,
            max(0.0, max(windows) - ideal) / slots)


def _too_small_reason(schedule_part: float, overhead_part: float, compute_s: float,
                      overhead_s: float, slots: int, fill_slots: int) -> str | None:
    if fill_slots == 0 or not overhead_part > OVERHEAD_LIMIT * schedule_part:
        return None
    return (f"the step is too small for the bubble to mean the schedule's: overhead between the "
            f"stage computations (send/recv, loss, the schedule's work) is {overhead_part:.0%} of "
            f"the window against the schedule's bubble {schedule_part:.0%}; compute per "
            f"microbatch and stage {compute_s * 1e3:.3g} ms is under "
            f"{slots / fill_slots / OVERHEAD_LIMIT:.3g}× the overhead per microbatch "
            f"{overhead_s * 1e3:.3g} ms: give each microbatch more work")


def row_columns(schedule: str, microbatches: int, stages_per_rank: int,
                rank_intervals: Sequence[Sequence[Sequence[tuple[float, float]]]],
                rank_windows_s: Sequence[Sequence[float]]) -> dict:
    """A pipeline row's bubble columns from every rank's timed steps: ``rank_intervals[r][i]`` the
    compute intervals of rank r in step i, ``rank_windows_s[r][i]`` that step's window length
    (the intervals are seconds from the window's start). The measured bubble is the median over
    steps of :func:`measured_bubble_fraction` (per step in ``bubble_fraction_samples``; per rank,
    the median over steps, in ``bubble_fraction_per_rank``) beside the predicted one, and its
    split (module docstring) in the median step: ``bubble_schedule_fraction`` +
    ``bubble_overhead_fraction`` = ``bubble_fraction``,
    ``microbatch_compute_s`` and ``microbatch_overhead_s`` per critical-path slot, and
    ``bubble_fraction_reason`` when the bubble is not the schedule's (None when it is)."""
    steps, p = range(len(rank_windows_s[0])), len(rank_intervals)
    per_step = [measured_bubble_fraction([r[i] for r in rank_intervals],
                                         [(0.0, w[i]) for w in rank_windows_s]) for i in steps]
    per_rank = [statistics.median(rank_bubble_fraction(iv, (0.0, w)) for iv, w in zip(ivs, ws))
                for ivs, ws in zip(rank_intervals, rank_windows_s)]
    predicted = predicted_bubble_fraction(schedule, p, microbatches, stages_per_rank)
    slots, fill = stages_per_rank * microbatches + p - 1, p - 1
    # The split of the median step (the mean of the two middle ones for an even count, as
    # statistics.median), so that schedule part + overhead part = bubble_fraction exactly.
    order = sorted(steps, key=per_step.__getitem__)
    middle = order[(len(order) - 1) // 2: len(order) // 2 + 1]
    splits = [_split_step([r[i] for r in rank_intervals], [w[i] for w in rank_windows_s], slots, fill)
              for i in middle]
    sched, over, compute_s, over_s = (statistics.fmean(x) for x in zip(*splits))
    if math.isnan(predicted):  # no closed form: no schedule part to split off
        sched = over = over_s = math.nan
    return {
        "bubble_fraction": statistics.median(per_step), "bubble_fraction_samples": per_step,
        "bubble_fraction_per_rank": per_rank,
        "bubble_fraction_predicted": predicted,
        "bubble_fraction_predicted_reason": prediction_reason(schedule),
        "bubble_schedule_fraction": sched, "bubble_overhead_fraction": over,
        "microbatch_compute_s": compute_s, "microbatch_overhead_s": over_s,
        "bubble_fraction_reason": prediction_reason(schedule)
        or _too_small_reason(sched, over, compute_s, over_s, slots, fill),
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
#: What makes two pipeline rows at one point different work (a bubble depends on the
#: microbatch's cost): grouped on too, where present.
WORKLOAD_KEYS = ["model", "model_size", "batch_size", "seq_len", "precision"]
#: bubble_table's columns besides the keys, and how each reduces over a point's rows (rows
#: recorded before the split have no split columns: NaN / None there).
_TABLE = {"bubble_fraction": "median", "bubble_fraction_predicted": "first",
          "bubble_schedule_fraction": "median", "bubble_overhead_fraction": "median",
          "bubble_fraction_reason": "first", "step_time_s": "median"}


def bubble_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (schedule, ranks, stages per rank, microbatches) and workload (those of
    :data:`WORKLOAD_KEYS` present) of the ``ok`` pipeline rows: the median measured bubble
    fraction and its split, the predicted one, the first row's
    ``bubble_fraction_reason`` (None: the bubble is the schedule's) and the median step time."""
    import pandas as pd
    rows = df
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    if "parallelism" in rows:
        rows = rows[rows["parallelism"] == "pp"]
    if rows.empty or not set(_KEYS) <= set(rows):
        return pd.DataFrame(columns=[*_KEYS, *_TABLE])
    rows = rows.assign(**{c: math.nan if how == "median" else None
                          for c, how in _TABLE.items() if c not in rows})
    keys = _KEYS + [c for c in WORKLOAD_KEYS if c in rows]
    return (rows.groupby(keys, as_index=False, dropna=False)
            .agg(**{c: (c, how) for c, how in _TABLE.items()})
            .sort_values(keys, ignore_index=True))
