"""Cutting a workload's model into pipeline stages, and timing what the stages compute.

The models of :mod:`perfkit.measuring.models` run a stem, ``blocks`` and a head: a stage is a
contiguous run of blocks (:func:`stage_bounds`: as-equal counts), after the stem on the first
stage and before the head on the last. :class:`Timeline` and :func:`timed_stage_class` record the
wall interval of every stage forward and backward on a rank, for the bubble
(:mod:`perfkit.analyse.pipeline_bubble`). Used by :mod:`perfkit.measuring.pipeline`.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from perfkit.measuring import workloads
from perfkit.measuring.models import GPT, ConvNet

__all__ = ["V_SHAPED", "n_blocks", "StageModule", "stage_bounds", "rank_stage_indices", "Timeline",
           "timed_stage_class"]

#: Schedules whose stages sit on the ranks in a V (torch: generate_stage_to_rank_mapping "v").
V_SHAPED = ("ZBVZeroBubble",)


def n_blocks(spec) -> int:
    """How many blocks the model of workload ``spec`` runs between its stem and head."""
    if isinstance(spec, workloads.TransformerConfig):
        return spec.n_layers
    if isinstance(spec, workloads.MLPConfig):
        return spec.depth
    return len(spec.widths) * spec.blocks_per_stage


class StageModule(nn.Module):
    """Blocks [lo, hi) of a workload's model, after its stem (first stage) and before its head
    (last stage). The stem and head repeat the models' own forward around ``blocks``
    (:mod:`perfkit.measuring.models`); the loss parity test fails if they drift apart."""

    def __init__(self, model: nn.Module, lo: int, hi: int, *, first: bool, last: bool,
                 autocast: torch.dtype | None):
        super().__init__()
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.first, self.last, self.gpt, self.autocast = first, last, isinstance(model, GPT), autocast
        self.stem = self.head = None
        if first and isinstance(model, GPT):
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        elif first and isinstance(model, ConvNet):
            self.stem = model.stem
        if last and isinstance(model, GPT):
            self.ln_f, self.lm_head = model.ln_f, model.lm_head
        elif last and isinstance(model, ConvNet):
            self.head = model.head

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            if self.first and self.gpt:
                x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
            elif self.stem is not None:
                x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            if self.last and self.gpt:
                x = self.lm_head(self.ln_f(x))
            elif self.head is not None:
                x = self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
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
