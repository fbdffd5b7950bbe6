"""Cutting a workload's model into pipeline stages, and timing what the stages compute.

The models of :mod:`perfkit.measuring.workloads.models` run a stem, ``blocks`` and a head: a stage is a
contiguous run of blocks (:func:`stage_bounds`: as-equal counts), after the stem on the first
stage and before the head on the last. :class:`Timeline` and :func:`timed_stage_class` record the
wall interval of every stage forward and backward on a rank, for the bubble
(:mod:`perfkit.analyse.pipeline_bubble`). Used by :mod:`perfkit.measuring.training.pipeline`.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from perfkit.analyse import pipeline_bubble
from perfkit.measuring.workloads import synthetic as workloads
from perfkit.measuring.workloads.user import UserModelSpec

__all__ = ["V_SHAPED", "GLOO_HANGS", "skip_reason", "n_blocks", "StageModule", "stage_bounds",
           "rank_stage_indices", "rank_of_stage", "rank_actions", "Timeline", "timed_stage_class"]

#: Schedules whose stages sit on the ranks in a V (torch: generate_stage_to_rank_mapping "v").
V_SHAPED = ("ZBVZeroBubble",)


#: Schedule -> why it is skipped on gloo, for schedules whose batched send/recv hangs there
#: (PiPPy#944: ``batch_isend_irecv`` had no stable gloo implementation). Empty for torch 2.13:
#: every schedule here finishes on gloo (2 and 3 ranks, 1 to 8 microbatches), after
#: pytorch/pytorch#152938 (``_batch_p2p`` waits on every gloo work) and 2.13's ``_batch_p2p``
#: sending homogeneous batches uncoalesced. tests/test_pipeline.py runs each schedule under a
#: timeout and fails when one hangs: add it here, with the reason, when a torch brings one back.
GLOO_HANGS: dict[str, str] = {}


def skip_reason(cfg, *, blocks: int, device: str) -> str | None:
    """Why the pipeline configuration ``cfg`` (a ``TrainConfig`` with parallelism ``pp``) cannot
    run, or None: decided from the schedule's rules, the model's ``blocks`` and the ``device``
    kind before any rank starts, so an invalid combination is skipped with its reason, never a hang."""
    schedule, p, v, m = cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, cfg.n_microbatches
    if cfg.batch_size % m:
        return f"batch_size {cfg.batch_size} does not split into {m} equal microbatches"
    # How many stages a schedule holds per rank is checked with the parameters (BadInputError,
    # pipeline_bubble.check_schedule): what is left here depends on the batch, the model, the device.
    if (why := pipeline_bubble.point_reason(schedule, p, m)) is not None:
        return why
    if blocks < p * v:
        return (f"the {cfg.model} has {blocks} blocks, fewer than the {p * v} stages "
                f"({p} ranks × {v}); give it more layers")
    if device == "cpu" and schedule in GLOO_HANGS:
        return GLOO_HANGS[schedule]
    if device != "cpu" and cfg.stage_delay_s:
        return "stage_delay_s is a host sleep: on a GPU it delays launches, not stage compute"
    return None


def n_blocks(spec) -> int:
    """How many blocks the model of workload ``spec`` runs between its stem and head."""
    if isinstance(spec, UserModelSpec):
        from perfkit.measuring.workloads import catalog

        return len(catalog.meta(spec).block_names)
    if isinstance(spec, workloads.TransformerConfig):
        return spec.n_layers
    if isinstance(spec, workloads.MLPConfig):
        return spec.depth
    return len(spec.widths) * spec.blocks_per_stage


class StageModule(nn.Module):
    """Blocks [lo, hi) of a workload's model, after its stem (first stage) and before its head
    (last stage). It holds the model's stem and head submodules under their own names
    (``model.STEM``, ``model.HEAD``) and runs the model's own ``forward_stem``/``forward_head``
    on them, so a stage computes exactly what the whole model does for its blocks."""

    def __init__(self, model: nn.Module, lo: int, hi: int, *, first: bool, last: bool,
                 autocast: torch.dtype | None):
        super().__init__()
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.first, self.last, self.autocast, self._model_cls = first, last, autocast, type(model)
        for name in (model.STEM if first else ()) + (model.HEAD if last else ()):
            setattr(self, name, getattr(model, name))

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            if self.first:
                x = self._model_cls.forward_stem(self, x)
            for block in self.blocks:
                x = block(x)
            if self.last:
                x = self._model_cls.forward_head(self, x)
        return x


def stage_bounds(n_blocks: int, n_stages: int) -> list[tuple[int, int]]:
    """Contiguous block ranges, sizes differing by at most one (the first ones larger)."""
    base, extra = divmod(n_blocks, n_stages)
    bounds, lo = [], 0
    for i in range(n_stages):
        hi = lo + base + (i < extra)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def rank_stage_indices(schedule: str, world_size: int, stages_per_rank: int, rank: int) -> list[int]:
    """The stages ``rank`` holds: r, r + p, ... (looped), or r and 2p − 1 − r (V-shaped)."""
    if schedule in V_SHAPED:
        return [rank, 2 * world_size - 1 - rank]
    return [rank + k * world_size for k in range(stages_per_rank)]


def rank_of_stage(schedule: str, world_size: int, stage: int) -> int:
    """The rank that holds ``stage`` (the inverse of :func:`rank_stage_indices`)."""
    if schedule in V_SHAPED and stage >= world_size:
        return 2 * world_size - 1 - stage
    return stage % world_size


def rank_actions(schedule: str, world_size: int, stages_per_rank: int, n_microbatches: int,
                 rank: int) -> list[tuple[str, int]] | None:
    """The order in which ``rank`` runs its stages' forwards and full backwards in one step:
    ``("F", stage)`` and ``("B", stage)``, as torch 2.13's schedules order them (GPipe: every
    forward, then every backward; 1F1B: min(m, p − r) forwards, then a backward before each
    further forward; Interleaved1F1B: torch's ``_get_warmup_ops`` warm-up forwards, depth
    first over the local stages in rounds of m // max(1, m // p) microbatches, then forward,
    backward pairs). None for the zero-bubble schedules, whose split backward keeps a
    microbatch's autograd graph from its input-gradient step to its weight-gradient step."""
    p, v, m, r = world_size, stages_per_rank, n_microbatches, rank
    if schedule == "GPipe":
        return [("F", r)] * m + [("B", r)] * m
    if schedule == "1F1B":
        warmup = min(m, p - r)
        steady = [a for i in range(m) for a in [("B", r)] + ([("F", r)] if warmup + i < m else [])]
        return [("F", r)] * warmup + steady
    if schedule != "Interleaved1F1B":
        return None
    per_round = m // max(1, m // p)
    ops = m * v
    warmup = min((v - 1) * per_round + 2 * (p - 1 - r), ops)
    forward = lambda op: ((op // per_round) % v) * p + r  # noqa: E731 - torch's forward_stage_index
    backward = lambda op: (v - 1 - ((op - warmup) // per_round) % v) * p + r  # noqa: E731
    out = [("F", forward(op)) for op in range(warmup)]
    for op in range(warmup, ops):
        out += [("F", forward(op)), ("B", backward(op))]
    return out + [("B", backward(op)) for op in range(ops, ops + warmup)]


class Timeline:
    """The wall intervals of one rank's stage computations inside the current window, in
    seconds from the window's start; CUDA events on a GPU, ``perf_counter`` on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.active, self._spans = False, []

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._spans, self.active = [], True
        self._start = self._mark()

    @contextlib.contextmanager
    def span(self):
        if not self.active:
            yield
            return
        begin = self._mark()
        try:
            yield
        finally:
            self._spans.append((begin, self._mark()))

    def stop(self) -> tuple[list[tuple[float, float]], float]:
        """(intervals, window length) in seconds from the window's start."""
        end, self.active = self._mark(), False
        if self.cuda:
            torch.cuda.synchronize()
            rel = lambda e: self._start.elapsed_time(e) / 1e3  # noqa: E731 - ms to s
        else:
            rel = lambda t: t - self._start  # noqa: E731
        return [(rel(a), rel(b)) for a, b in self._spans], rel(end)


def timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A stage whose forward and backward computations land on the rank's timeline."""

        def __init__(self, *args, timeline: Timeline, delay_s: float, **kwargs):
            super().__init__(*args, **kwargs)
            self._timeline, self._delay_s = timeline, delay_s

        def forward_maybe_with_nosync(self, *args, **kwargs):
            with self._timeline.span():
                if self._delay_s:
                    time.sleep(self._delay_s)
                return super().forward_maybe_with_nosync(*args, **kwargs)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            with self._timeline.span():
                if self._delay_s:  # a split backward's two halves cost one full backward
                    time.sleep(self._delay_s if backward_type == "full" else self._delay_s / 2)
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)

    return TimedStage
