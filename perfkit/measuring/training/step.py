"""The training-step benchmark: one configuration in, one results row out.

A seeded synthetic task from :mod:`perfkit.measuring.workloads.synthetic` (``mlp`` regression, ``transformer``
next-token prediction, ``convnet`` classification) runs ``steps`` optimizer steps; every step
after ``warmup_steps`` is timed between device synchronizations and kept as a raw sample. The
global batch is the same whatever the parallelism: DDP, FSDP and the ZeRO stages split it across
ranks, tensor parallel gives every rank all of it, FSDP × TP splits it over the ``dp`` ranks of
its mesh, so a parallel run follows the single-process loss trajectory (up to floating-point
reassociation).

The row (``workload = "train_step"``) holds the step time (median, IQR, raw samples), samples/s
and tokens/s, peak memory, the loss trajectory, and MFU beside the counted-FLOP utilisation
(:mod:`perfkit.analyse.mfu`; the convention in ``mfu_convention``), of the peak of the row's
``compute_dtype`` (:attr:`TrainConfig.compute_dtype`; ``matmul_dtype_counted``: what ran). The counted FLOP come from
:class:`perfkit.measuring.ops.counting.OpCounter` around the forward and backward of the first warm-up step
(the optimizer step is left out, as it is from the analytic model FLOP), so counting costs no
timed step and changes no number; under tensor parallel and torch.compile nothing is counted
(NaN, with the reason in ``counted_flop_reason``). The same counted step gives the collectives
its forward and backward issued (``all_gather_calls_per_step``, ``reduce_scatter_calls_per_step``,
``all_reduce_calls_per_step``: c10d ops seen by the dispatch-level counter on rank 0).

Memory per rank (:mod:`perfkit.measuring.training.memory_model`): the parameter, gradient and optimizer-state
bytes each rank holds after the last step (``param_bytes``, ``grad_bytes``, ``optim_state_bytes``,
the max over ranks) beside their ``_predicted`` values, ``model_state_bytes_predicted``, and
``activation_bytes_predicted`` beside ``activation_bytes_measured`` (what autograd held saved on
the last warm-up step; NaN with ``activation_bytes_measured_reason`` where not measured);
``peak_mem_bytes`` is the CUDA allocator's peak on a GPU.

The configuration and the device-support check are in :mod:`perfkit.measuring.training.config`.
Entry points: :func:`train_step_benchmark` (this process), :func:`train_rank` (a
:func:`perfkit.run.launch.launch` target), :func:`run_training` (either, always a row),
and, for notebooks, :func:`raise_for_status`; the OOM-edge search is
:func:`perfkit.measuring.training.batch_search.find_max_batch_size`. A setting the device
cannot honour raises :class:`~perfkit.core.errors.ConfigurationSkipped` before any work
(``run_training``: a ``skipped`` row).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import resource
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import torch

from perfkit.core import precision
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.core.status import OK, SKIPPED, OutOfMemoryError, error_row, raise_for_status  # noqa: F401 - the notebooks call training.raise_for_status
from perfkit.core.timing import SpanTimer
from perfkit.measuring.training import activations
from perfkit.measuring.training import memory_model
from perfkit.measuring.training import memory_fit, parallel
from perfkit.measuring.training.step_row import COLLECTIVES, count_reason, optimizer_columns, row_from_ranks  # noqa: F401 - step's API
from perfkit.measuring.training.step_setup import (autocast_dtype, batch_seed, forward_backward,  # noqa: F401 - batch_seed: step's API
                                                   optimizer_step, prepare, rank_batch)
from perfkit.measuring.ops import memory_snapshot as mem_snapshot
from perfkit.measuring.ops import trace_capture
from perfkit.measuring.workloads import catalog
from perfkit.measuring.workloads.workload import Workload
from perfkit.measuring.training.config import WORKLOAD, TrainConfig, check_supported, config_device

__all__ = ["train_step_benchmark", "train_rank", "run_training", "raise_for_status", "OutOfMemoryError",
           "batch_seed", "rank_device", "rank_facts", "peak_mem_bytes", "synchronize", "row_from_ranks",
           "optimizer_columns"]

# ---- the benchmark -----------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mem_bytes(device: torch.device) -> tuple[int, str]:
    """This process's peak memory and its kind: the CUDA allocator's peak on a GPU, else ru_maxrss."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    # ru_maxrss is in KiB on Linux (bytes on macOS) and covers the process's whole life.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "cpu_max_rss"


def _run(cfg: TrainConfig, ctx: parallel.DistContext) -> dict:
    """Train ``cfg.steps`` steps in this process (one rank of a job, or alone)."""
    from perfkit.measuring.ops.counting import OpCounter, coverage

    device = rank_device(cfg)
    model, work = prepare(cfg, device)
    optimizer = parallel.make_optimizer(model, parallelism=cfg.parallelism, lr=cfg.lr)
    amp_dtype = autocast_dtype(cfg)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    count = count_reason(cfg) is None
    losses, samples_s, data_s, counted, saved_peak, gather_peak = [], [], [], None, math.nan, math.nan
    optimizer_s, optimizer_span = [], SpanTimer(device)
    memory: dict = {}
    profiler = trace_capture.StepProfiler(
        trace_capture.ProfileSettings(active=cfg.profile_active_steps) if cfg.profile else None,
        trace_capture.rank_trace_path(cfg.trace_dir, ctx.rank), device=device.type, skip_steps=cfg.warmup_steps)
    # One precision policy (perfkit.core.precision): fp32 matmuls and cuDNN convolutions IEEE unless
    # cfg.precision is tf32; on ROCm tf32 also sets HIPBLASLT_ALLOW_TF32 for the run.
    with precision.math_mode(cfg.precision), profiler:
        for step in range(cfg.steps):
            t_data = time.perf_counter()
            with trace_capture.data_wait_span():
                inputs, target = rank_batch(cfg, work, step, ctx, device)
                if cfg.data_delay_s:
                    time.sleep(cfg.data_delay_s)
            if step >= cfg.warmup_steps:
                data_s.append(time.perf_counter() - t_data)
            counter = OpCounter() if count and step == 0 else contextlib.nullcontext()
            synchronize(device)
            t0 = time.perf_counter()
            # The whole step's memory, by category and block, on the last warm-up step.
            with memory_fit.tracking(cfg, step, model, optimizer, work) as tracked:
                # Forward and backward: what the analytic model FLOP describe (counted on step 0)
                # and where the saved activations are measured (on the last warm-up step).
                with counter, activations.step_meter(cfg, step, model.parameters(),
                                                     functools.partial(memory_model.fsdp_gathered, model)) as meter:
                    optimizer.zero_grad(set_to_none=True)
                    loss = forward_backward(work, model, inputs, target, device_type=device.type,
                                            amp_dtype=amp_dtype, scaler=scaler)
                with optimizer_span:
                    optimizer_step(optimizer, scaler)
            if tracked is not None:
                memory = {**tracked.result().columns("memory_tracked_"),
                          "memory_ddp_bucket_bytes": memory_fit.ddp_bucket_bytes(model)}
            synchronize(device)
            if step >= cfg.warmup_steps:
                samples_s.append(time.perf_counter() - t0)
                optimizer_s.append(optimizer_span.last_s())
            if isinstance(counter, OpCounter):
                counted = counter.rows  # records, not a DataFrame: a rank does not load pandas
            if meter is not None:
                saved_peak, gather_peak = float(meter.peak_bytes), float(meter.gather_peak_bytes)
            losses.append(loss.detach().float())
            profiler.step()
    losses_t = torch.stack(losses)
    if ctx.dp_size > 1:  # the global-batch loss is the mean of the equal-sized slices' losses
        torch.distributed.all_reduce(losses_t)  # each slice's loss, once per rank that holds it
        losses_t /= ctx.world_size
    peak, peak_kind = peak_mem_bytes(device)
    held = memory_model.measured_model_state(model, optimizer)
    uncounted = [u.op for u in coverage(counted).uncounted] if counted is not None else []
    return {"rank": ctx.rank, "losses": losses_t.tolist(), "step_time_samples_s": samples_s,
            "optimizer_time_samples_s": optimizer_s,
            "data_time_samples_s": data_s, "trace_path": str(profiler.path) if profiler.path else None,
            "trace_reason": profiler.reason,
            "peak_mem_bytes": peak, "peak_mem_kind": peak_kind,
            "counted_flop": sum(int(r["flop"]) for r in counted) if counted is not None else None,
            # what 6N + attention models: the matmuls, attention kernels and convolutions
            "counted_matmul_flop": (sum(int(r["flop"]) for r in counted if r["family"] in _MODELLED_FAMILIES)
                                    if counted is not None else None),
            "collective_calls": _collective_calls(counted), "param_bytes": held.param_bytes,
            "grad_bytes": held.grad_bytes, "optim_state_bytes": held.optim_state_bytes,
            "activation_bytes_measured": saved_peak, "param_gather_bytes_measured": gather_peak,
            "matmul_dtype_counted": _matmul_dtype(counted), "uncounted_ops": uncounted,
            "grad_scale": scaler.get_scale() if scaler else math.nan, "memory": memory,
            **rank_facts(work, device)}


#: The op families the analytic FLOP conventions model (6N's matmuls, attention, convolutions); the
#: rest (elementwise, norms, softmax, the loss) is counted but in no 6N convention.
_MODELLED_FAMILIES = ("matmul", "attention", "conv")


def rank_device(cfg: TrainConfig) -> torch.device:
    """This rank's device (its CUDA device under torchrun), its allocator peak reset."""
    device = torch.device(config_device(cfg))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.reset_peak_memory_stats(device)
    return device


def rank_facts(work: Workload, device: torch.device) -> dict:
    """What a rank reports beside its measurements: the workload's sizes and its device."""
    from perfkit.core.cpu_share import cpu_share
    from perfkit.core.devices import detect

    info = detect(str(device))
    return {"n_params": work.n_params, "n_params_non_embedding": work.n_params_non_embedding,
            "flop_per_sample": work.flop_per_sample, "tokens_per_sample": work.tokens_per_sample,
            "model_family": work.family, "flop_reason": work.flop_reason, "config_note": work.config_note,
            "flop_convention": work.flop_convention,
            "device": device.type, "device_kind": info.kind, "device_name": info.name,
            # The CPU this rank computed on (affinity, cores, threads): the MFU's peak is of these.
            "device_compute_units": info.compute_units,
            "cpu_share": cpu_share().as_dict() if device.type == "cpu" else None}


def _oom_snapshots(cfg: TrainConfig) -> dict:
    """A failed run's link to the snapshots its ranks dumped at the out-of-memory error."""
    if not cfg.memory_snapshot:
        return {}
    found = sorted(Path(cfg.memory_snapshot_dir).glob("rank*-oom.pickle"))
    return {"memory_snapshot_oom_paths": json.dumps([str(p) for p in found])} if found else {}


def _collective_calls(counted: list[dict] | None) -> dict[str, int] | None:
    """Calls per collective kind among the c10d ops of the counted step (None: not counted)."""
    if counted is None:
        return None
    ops = [r["op"] for r in counted if r["op"].startswith("c10d.")]
    return {kind: sum(any(k in op for k in keys) for op in ops) for kind, keys in COLLECTIVES.items()}


def _matmul_dtype(counted: list[dict] | None) -> str | None:
    """The dtype that carried most of the counted matmul FLOP: what the matmuls ran in."""
    flop_by_dtype: dict[str, int] = {}
    for r in counted or ():
        if r["family"] == "matmul":
            flop_by_dtype[r["dtype"]] = flop_by_dtype.get(r["dtype"], 0) + int(r["flop"])
    return str(max(flop_by_dtype, key=flop_by_dtype.get)) if flop_by_dtype else None


def with_trace_dir(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its traces' and memory snapshots' folders set: beside the current
    configuration's results."""
    want_traces = cfg.profile and cfg.trace_dir is None
    want_snapshots = cfg.memory_snapshot and cfg.memory_snapshot_dir is None
    if not (want_traces or want_snapshots):
        return cfg
    # One configuration may run several trainings (a scaling run: one per world size): each its folder.
    run = f"{cfg.model}-{cfg.parallelism}{cfg.world_size}-b{cfg.batch_size}-{cfg.precision}-{uuid.uuid4().hex[:6]}"
    folder = trace_capture.current_trace_dir(run)
    return replace(cfg, trace_dir=str(folder) if want_traces else cfg.trace_dir,
                   memory_snapshot_dir=str(folder / "memory") if want_snapshots else cfg.memory_snapshot_dir)


def recorded(cfg: TrainConfig, rank: int, run) -> dict:
    """``run()``'s rank result, recorded into a memory snapshot when ``cfg.memory_snapshot``
    (from before the model is built, so the parameters have their stacks too) and carrying it."""
    folder = cfg.memory_snapshot_dir if cfg.memory_snapshot else None
    with mem_snapshot.recording(folder, rank, max_entries=cfg.memory_snapshot_max_entries) as path:
        result = run()
    if path is not None:
        result.update(mem_snapshot.rank_columns(path))
    return result


def train_step_benchmark(cfg: TrainConfig) -> dict:
    """Run ``cfg`` in this process (parallelism ``none``) and return its results row."""
    if cfg.parallelism != "none" or cfg.address_space_headroom_bytes is not None:
        raise BadInputError("train_step_benchmark runs one process without a memory cap; "
                            "use run_training for parallel or capped runs")
    check_supported(cfg)
    cfg = with_trace_dir(cfg)
    return row_from_ranks(cfg, [recorded(cfg, 0, lambda: _run(cfg, parallel.dist_context("none")))])


def _cap_address_space(headroom_bytes: int) -> None:
    """RLIMIT_AS at the address space after start-up plus ``headroom_bytes``: the CPU's stand-in for a
    device's memory. Start-up includes the intra-op thread pool, started here first: each of its
    threads reserves a stack and a malloc arena (83 MiB for 2 threads on this project's VM), address
    space that no tensor uses and a device's budget would not count. Counted in the headroom, it put
    the found OOM edge two steps below the one predicted from tensors (20480 against 28672 samples
    of a 1024-wide MLP in 512 MiB); started first, one (24576). Triton, where installed, is start-up
    too: torch imports it during the first step (its libraries: 187 MiB more address space after one
    mlp step here), which put the edge at 12288."""
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401
    torch.ones(512, 512) @ torch.ones(512, 512)
    torch.ones(1 << 20).add_(1)  # an elementwise parallel_for too (its pool may differ from the BLAS one)
    with open("/proc/self/status") as f:
        vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_kib * 1024 + headroom_bytes, hard))


def train_rank(config: dict) -> dict:
    """:func:`perfkit.run.launch.launch` target: one rank of ``TrainConfig(**config)``."""
    cfg = TrainConfig(**config)
    check_supported(cfg)
    rank = int(os.environ.get("RANK", "0"))
    if cfg.address_space_headroom_bytes is None:
        return recorded(cfg, rank, lambda: _run(cfg, parallel.dist_context(cfg.parallelism, cfg.tp_size)))
    _cap_address_space(cfg.address_space_headroom_bytes)
    try:
        return recorded(cfg, rank, lambda: _run(cfg, parallel.dist_context(cfg.parallelism, cfg.tp_size)))
    except RuntimeError as exc:
        # Under the cap oneDNN reports a failed allocation as "could not create a primitive" (its
        # out-of-memory status, as torch's ideep words it): seen between an ok batch and an oom
        # one of the same model, the edge of the batch axis like any other OOM.
        if _ONEDNN_ALLOC in str(exc):
            raise MemoryError(f"{exc} (oneDNN, under the address-space cap: its allocation failed)") from exc
        raise


_ONEDNN_ALLOC = "could not create a primitive"


def run_training(cfg: TrainConfig, timeout_s: float = 600.0, *,
                 isolate: bool | None = None) -> dict:
    """Run ``cfg`` and return one row, whatever happens (``status`` says how it ended).

    Parallel runs, capped runs and ``isolate=True`` go through :func:`perfkit.run.launch.launch`
    (``timeout_s`` enforced, an OOM cannot take the caller down); otherwise the run happens in
    this process, where ``timeout_s`` cannot be enforced.
    """
    base = {**cfg.as_row(), "workload": WORKLOAD, "error": None}
    try:
        check_supported(cfg)
    except ConfigurationSkipped as skipped:
        return {**base, "status": SKIPPED, "error": skipped.reason}
    if isolate is None:
        isolate = cfg.parallelism != "none" or cfg.address_space_headroom_bytes is not None
    cfg = with_trace_dir(cfg)
    if not isolate:
        try:
            return train_step_benchmark(cfg)
        except Exception as error:  # noqa: BLE001 - the row records every ending
            return {**error_row(base, error), **_oom_snapshots(cfg)}
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an OOM, give the next configuration a clean pool
    from perfkit.run.launch import launch

    device = config_device(cfg)
    target = ("perfkit.measuring.training.pipeline:pipeline_rank" if cfg.parallelism == "pp"
              else "perfkit.measuring.training.step:train_rank")
    result = launch(target, cfg.as_dict(), world_size=cfg.world_size,
                    backend="nccl" if device == "cuda" else "gloo", timeout_s=timeout_s,
                    device=device,
                    preload=(target.partition(":")[0], "torch._dynamo", *catalog.rank_imports(cfg.model)))
    if result.status != OK:
        return {**base, "status": result.status, "error": result.error,
                "failed_rank": result.failed_rank, **_oom_snapshots(cfg)}
    return row_from_ranks(cfg, list(result.rank_results))

