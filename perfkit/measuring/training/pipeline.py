"""Pipeline-parallel training steps (``parallelism = "pp"``) with ``torch.distributed.pipelining``.

A :class:`~perfkit.measuring.training.config.TrainConfig` with ``parallelism = "pp"`` runs through
:func:`perfkit.measuring.training.step.run_training` like every other parallelism; this module is its
rank target, :func:`pipeline_rank`. The workload's model (a stem, ``blocks``, a head:
:mod:`perfkit.measuring.workloads.models`) is cut at block boundaries into ``world_size × stages_per_rank``
stages of as-equal block counts (:mod:`perfkit.measuring.training.pipeline_stages`); the first stage also
runs the stem, the last the head and the loss. Every rank builds the whole model from the seed
(the same weights as one process) and keeps its stages. Looped schedules put stages r, r + p, ...
on rank r; the V schedule (ZBVZeroBubble) stages r and 2p − 1 − r. Which combinations cannot run
(microbatches < stages for 1F1B, a batch that does not split, ...) is decided before any rank
starts (:func:`perfkit.measuring.training.pipeline_stages.skip_reason`): a ``skipped`` row, never a hang.

Every step draws global batch ``step`` exactly as the other parallelisms do
(:func:`perfkit.measuring.training.step.batch_seed`), the schedule splits it into ``n_microbatches``
equal microbatches, and the loss of each microbatch is its mean; the schedule divides the
gradients by the microbatch count (``scale_grads``), so the gradient is the global-batch mean, as
in one process, up to the order of the additions. The step's loss is the mean of the microbatch
losses (= the global-batch mean: equal microbatches), sent from the last stage's rank to every
rank. AdamW (per-parameter, so per stage) steps each rank's parameters. The convnet's BatchNorm
normalizes over a microbatch, not the batch (as in any pipeline): its trajectory is not the
single process's.

The schedule runs with ``return_outputs=False``: torch's default keeps every microbatch's
output on the last stage and concatenates them after the step, memory and time a training loop
does not spend. The saved activations are measured on the last warm-up step (the first also
runs torch's shape inference), :class:`perfkit.measuring.training.activations.SavedActivationMeter`.

Timing (per step, every rank): the batch fetch (``data_time_samples_s``, outside the step, as
elsewhere), a barrier, the schedule's step, a barrier, the optimizer step. The step time is the
slowest rank's barrier-to-optimizer-done; the pipeline window is the span between the two
barriers; inside it each rank records the wall interval of every stage forward and backward
computation (on CUDA, events around them). The bubble is computed from those by
:func:`perfkit.analyse.pipeline_bubble.row_columns` (the definition is there).

``stage_delay_s`` (tests): every stage forward and every full backward sleeps that long first
(a split zero-bubble backward: half in its input part, half in its weight part), so the stage
cost is known and the bubble's shape shows through the noise of a shared CPU.
"""

from __future__ import annotations

import math
import time

import torch

from perfkit.core import precision as precision_policy
from perfkit.core.errors import ConfigurationSkipped
from perfkit.measuring.training import activations
from perfkit.measuring.training import memory_model
from perfkit.measuring.ops import trace_capture
from perfkit.measuring.workloads import catalog
from perfkit.measuring.training import pipeline_stages as ps
from perfkit.measuring.training.config import TrainConfig, check_supported, pipeline_input_reason, workload_spec
from perfkit.measuring.training.step import batch_seed, peak_mem_bytes, rank_device, rank_facts, recorded, synchronize

__all__ = ["pipeline_rank"]


def pipeline_rank(config: dict) -> dict:
    """:func:`perfkit.run.launch.launch` target: one rank of ``TrainConfig(**config)`` with
    parallelism ``pp``; returns what :func:`perfkit.measuring.training.step.train_rank` returns, plus
    the rank's ``stages``, ``stage_params``, and per timed step its compute ``intervals`` and
    ``window_samples_s``."""
    cfg = TrainConfig(**config)
    if cfg.parallelism != "pp":
        raise ConfigurationSkipped(f"pipeline_rank runs parallelism 'pp', got {cfg.parallelism!r}")
    check_supported(cfg)
    return recorded(cfg, torch.distributed.get_rank(), lambda: _pipeline_run(cfg))


def _pipeline_run(cfg: TrainConfig) -> dict:
    import torch.distributed as dist
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    rank = dist.get_rank()
    device = rank_device(cfg)
    work = catalog.build(workload_spec(cfg), device=device)
    timeline = ps.Timeline(device)
    autocast = torch.bfloat16 if cfg.precision == "bf16" else None
    n_stages = cfg.world_size * cfg.stages_per_rank
    bounds, stage_cls = ps.stage_bounds(len(work.block_names), n_stages), ps.timed_stage_class()
    stage_module = work.stage or ps.StageModule  # perfkit's models, or the workload's own split
    stages, mine = [], ps.rank_stage_indices(cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, rank)
    for index in mine:
        module = stage_module(work.model, *bounds[index], first=index == 0,
                                last=index == n_stages - 1, autocast=autocast)
        stages.append(stage_cls(module, index, n_stages, device, timeline=timeline,
                                delay_s=cfg.stage_delay_s))
    schedule_cls = get_schedule_class(cfg.pp_schedule)
    single = issubclass(schedule_cls, PipelineScheduleSingle)
    # The loss in fp32 whatever the compute dtype; the mean per microbatch, as scale_grads expects.
    loss_fn = lambda out, target: work.loss_fn(out.float(), target)  # noqa: E731
    schedule = schedule_cls(stages[0] if single else stages, n_microbatches=cfg.n_microbatches,
                            loss_fn=loss_fn)
    held = torch.nn.ModuleList(s.submod for s in stages)
    optimizer = torch.optim.AdamW(held.parameters(), lr=cfg.lr)
    has_first, has_last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses, step_s, data_s, window_s, timelines, saved_peak = [], [], [], [], [], math.nan
    profiler = trace_capture.StepProfiler(
        trace_capture.ProfileSettings(active=cfg.profile_active_steps) if cfg.profile else None,
        trace_capture.rank_trace_path(cfg.trace_dir, rank), device=device.type, skip_steps=cfg.warmup_steps)
    with precision_policy.math_mode(cfg.precision), profiler:
        for step in range(cfg.steps):
            t_data = time.perf_counter()
            with trace_capture.data_wait_span():
                inputs, target = work.make_batch(cfg.batch_size, seed=batch_seed(cfg, step), device=device)
                if step == 0 and (reason := pipeline_input_reason(cfg.model, inputs)):
                    raise ConfigurationSkipped(reason)
                if cfg.data_delay_s:
                    time.sleep(cfg.data_delay_s)
            t_fetched = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            mb_losses: list[torch.Tensor] = []
            synchronize(device)
            dist.barrier()
            t0 = time.perf_counter()
            timeline.start()
            # The saved activations, measured on the last warm-up step (the first infers shapes).
            with activations.step_meter(cfg, step, held.parameters()) as meter:
                # return_outputs=False: the last stage need not keep every microbatch's output
                # and concatenate them after the step (a training loop does not use them).
                schedule.step(*((inputs,) if has_first else ()), target=target if has_last else None,
                              losses=mb_losses, return_outputs=False)
            if meter is not None:
                saved_peak = float(meter.peak_bytes)
            synchronize(device)
            dist.barrier()
            intervals, window = timeline.stop()
            optimizer.step()
            synchronize(device)
            elapsed = time.perf_counter() - t0
            losses.append(torch.stack(mb_losses).detach().float().mean() if has_last
                          else torch.zeros((), device=device))
            if step >= cfg.warmup_steps:
                step_s.append(elapsed)
                data_s.append(t_fetched - t_data)
                window_s.append(window)
                timelines.append(intervals)
            profiler.step()
    # Every rank reports the step losses of the rank holding the last stage (as a single process).
    losses_t = torch.stack(losses)
    dist.broadcast(losses_t, src=ps.rank_of_stage(cfg.pp_schedule, cfg.world_size, n_stages - 1))
    peak, peak_kind = peak_mem_bytes(device)
    state = memory_model.measured_model_state(held, optimizer)
    return {"rank": rank, "losses": losses_t.tolist(), "step_time_samples_s": step_s,
            "data_time_samples_s": data_s, "trace_path": str(profiler.path) if profiler.path else None,
            "trace_reason": profiler.reason, "peak_mem_bytes": peak, "peak_mem_kind": peak_kind,
            "counted_flop": None, "collective_calls": None, "param_bytes": state.param_bytes,
            "grad_bytes": state.grad_bytes, "optim_state_bytes": state.optim_state_bytes,
            "activation_bytes_measured": saved_peak,
            "uncounted_ops": [], "grad_scale": float("nan"), **rank_facts(work, device),
            "stages": mine, "stage_params": sum(q.numel() for q in held.parameters()),
            "intervals": timelines, "window_samples_s": window_s}
