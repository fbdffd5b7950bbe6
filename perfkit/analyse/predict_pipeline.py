"""A measured pipeline step re-costed at other stage counts, microbatch counts and schedules.

The base is one pipeline configuration (``parallelism = "pp"``) as its row records it, split by
:func:`perfkit.analyse.pipeline_bubble.row_columns` into what a critical-path slot (one stage, one
microbatch, forward and backward) costs: its compute ``t`` (``microbatch_compute_s``) and the
overhead beside it ``o`` (``microbatch_overhead_s``: the stage-to-stage send/recv, the loss, the
schedule's own work), inside the window ``W`` between the step's two barriers
(``pipeline_time_s``); the rest of the step ``R = step_time_s − W`` (the barriers and the
optimizer step) lies outside it.

At p′ ranks with v′ stages each and m′ microbatches of the base's size:

- ``t′ = t · p·v / (p′·v′)``: a stage holds 1/(p′·v′) of the blocks (assumed: blocks of equal
  cost, the stem and head spread with them, compute linear in the blocks a stage holds);
- ``o′ = o``: the same activation crosses every hop and the schedule does the same work per
  microbatch (the base's link: no network model is applied to it);
- the window: ``W′ = (v′·m′ + p′ − 1) · (t′ + o′)`` slots on the critical path of GPipe, 1F1B and
  Interleaved1F1B (Narayanan et al., SC'21, §2.2: the bubble (p − 1)·(t_f + t_b)/v beside the
  ideal m·(t_f + t_b)), which is also what :mod:`.pipeline_bubble` splits the base with, so the
  base's own point is reproduced by construction;
- ``R′ = R · p/p′``: each rank's optimizer steps the parameters of its stages.

The breakdown: compute ``v′·m′·t′``, bubble ``(p′ − 1)·t′``, exposed communication and schedule
overhead ``(v′·m′ + p′ − 1)·o′``, the rest ``R′``. Scaling efficiency is the share of the step that
is compute or the rest (the same work on one rank, divided by p′, over the predicted step). The
zero-bubble schedules have no closed form (:func:`.pipeline_bubble.prediction_reason`): refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfkit.analyse.pipeline_bubble import SCHEDULES, check_schedule, point_reason, prediction_reason
from perfkit.analyse.predict import Prediction
from perfkit.core.errors import BadInputError

__all__ = ["PipelineBase", "pipeline_base", "predict_pipeline"]


@dataclass(frozen=True)
class PipelineBase:
    """One measured pipeline configuration, as :func:`predict_pipeline` needs it."""

    config_id: str
    schedule: str
    ranks: int
    stages_per_rank: int
    microbatches: int
    slot_compute_s: float
    """t: one stage's forward and backward of one microbatch."""
    slot_overhead_s: float
    """o: the time beside it on each critical-path slot."""
    window_s: float
    step_s: float
    microbatch_size: float
    """Samples a microbatch holds (the batch over the microbatches)."""
    tokens_per_microbatch: float


def _number(row: dict, name: str) -> float:
    value = row.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def pipeline_base(row: dict) -> PipelineBase:
    """The base from a ``pp`` row; :class:`BadInputError` where the row lacks the split."""
    cid = row.get("config_id")
    if str(row.get("parallelism")) != "pp":
        raise BadInputError(f"{cid}: not a pipeline configuration (parallelism {row.get('parallelism')!r})")
    schedule = str(row.get("pp_schedule"))
    if schedule not in SCHEDULES or prediction_reason(schedule) is not None:
        raise BadInputError(f"{cid}: a {schedule} step cannot be re-costed: "
                            f"{prediction_reason(schedule) if schedule in SCHEDULES else 'unknown schedule'}")
    values = {k: _number(row, k) for k in ("microbatch_compute_s", "microbatch_overhead_s", "pipeline_time_s",
                                           "step_time_s", "world_size", "n_microbatches", "batch_size")}
    missing = [k for k, v in values.items() if not math.isfinite(v)]
    if missing:
        raise BadInputError(f"{cid}: its row has no {', '.join(missing)}: record it again with this perfkit "
                            "(the pipeline split columns)")
    m = int(values["n_microbatches"])
    seq = _number(row, "seq_len")
    return PipelineBase(config_id=str(cid), schedule=schedule, ranks=int(values["world_size"]),
                        stages_per_rank=int(_number(row, "stages_per_rank")) if math.isfinite(
                            _number(row, "stages_per_rank")) else 1,
                        microbatches=m, slot_compute_s=values["microbatch_compute_s"],
                        slot_overhead_s=values["microbatch_overhead_s"], window_s=values["pipeline_time_s"],
                        step_s=values["step_time_s"], microbatch_size=values["batch_size"] / m,
                        tokens_per_microbatch=values["batch_size"] / m * (seq if math.isfinite(seq) else 1.0))


def predict_pipeline(base: PipelineBase, *, ranks: int, microbatches: int | None = None,
                     schedule: str | None = None, stages_per_rank: int | None = None) -> Prediction:
    """The step at ``ranks`` pipeline ranks (module docstring); ``None``: the base's value."""
    m = microbatches or base.microbatches
    sched = schedule or base.schedule
    v = stages_per_rank or (base.stages_per_rank if SCHEDULES.get(sched) is None else SCHEDULES[sched])
    check_schedule(sched, v)
    reason = prediction_reason(sched)
    if reason is not None:
        raise BadInputError(f"--schedule {sched}: no closed form to predict it from ({reason})")
    if ranks < 1 or m < 1:
        raise BadInputError(f"pipeline ranks and microbatches must be >= 1, got {ranks} and {m}")
    if (why := point_reason(sched, ranks, m)) is not None:
        raise BadInputError(why)
    t = base.slot_compute_s * base.ranks * base.stages_per_rank / (ranks * v)
    o = base.slot_overhead_s
    slots = v * m + ranks - 1
    window = slots * (t + o)
    rest = max(0.0, base.step_s - base.window_s) * base.ranks / ranks
    step = window + rest
    compute, bubble, overhead = v * m * t, (ranks - 1) * t, slots * o
    notes = [f"pipeline: base {base.config_id} ({base.schedule}, {base.ranks} rank(s) x {base.stages_per_rank} stage(s), "
             f"{base.microbatches} microbatches): t = {base.slot_compute_s * 1e3:.3g} ms compute and "
             f"o = {o * 1e3:.3g} ms overhead per stage and microbatch",
             "pipeline: a stage's compute scales with the blocks it holds (equal blocks, stem and head spread with them); "
             "the microbatch keeps the base's size; the per-slot overhead (send/recv, loss, the schedule's work) as measured",
             "pipeline: step = (v·m + p − 1)·(t + o) + the rest of the base's step x p_base/p (Narayanan et al. SC'21 §2.2)"]
    if sched != base.schedule:
        notes.append(f"pipeline: {sched} predicted from a {base.schedule} run: the same slot count, the base's overhead")
    return Prediction(layout="pp", world_size=ranks, step_s=step, compute_s=compute + rest,
                      exposed_comm_s=overhead, comm_s=overhead, collectives=2 * (ranks - 1) * m,
                      tokens_per_s=base.tokens_per_microbatch * m / step,
                      busy_share=(compute + rest) / step, assumptions=notes, bubble_s=bubble,
                      detail={"schedule": sched, "microbatches": m, "stages_per_rank": v})
