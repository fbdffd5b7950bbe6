"""The training step across world sizes: rows for :mod:`perfkit.analyse.scaling`.

One launch per world size N (:func:`perfkit.run.launch.launch`, gloo on CPU, nccl on CUDA/ROCm). In
it every rank runs the real training step (:func:`perfkit.measuring.training.step.train_rank`) twice on the same
configuration, one run after the other in the same processes:

1. as configured: the **step time** (per step the slowest rank, as :mod:`perfkit.measuring.training.step` does)
   and each rank's own median step time (``rank_step_time_s``; equal across ranks by
   construction, since every rank waits for the others in the gradient collective);
2. with gradient synchronisation disabled: the **compute-only step** (``compute_time_s``, per
   step the slowest rank, and each rank's own median in ``rank_compute_time_s``, from which
   :func:`perfkit.analyse.scaling.step_breakdown` takes the straggler time; ``compute_time_method`` says
   how). DDP: ``require_backward_grad_sync = False``, the flag
   ``DistributedDataParallel.no_sync()`` sets, so backward launches no all-reduce and the rest of
   the step (optimizer included) is unchanged. FSDP2: ``set_requires_gradient_sync(False)`` and
   ``set_reshard_after_backward(False)`` with ``reshard_after_forward=False`` (its recipe for
   gradient accumulation without communication): no reduce-scatter, and parameters stay gathered
   after the untimed first step, so the timed steps run no collective. Without a reduce-scatter
   the sharded parameters get no gradient, and AdamW skips a parameter without one: the
   optimizer would do nothing, and ``step − compute`` would count its update as communication
   (issue 53: 14 % of what a 1-rank FSDP step called communication). So before each optimizer
   step of this run, every sharded parameter without a gradient gets a zero one of its shape
   and placement (allocated once), and the optimizer does the work it does when synchronised.
   The compute-only run holds the whole model's parameters on every rank, as DDP does.

Both runs time their optimizer step apart (``optimizer_time_s``, from the synchronised run;
``compute_optimizer_time_s`` from the compute-only run, which must match it), so the breakdown
shows the optimizer as a part of compute, never of communication.

Calibration: ``straggler_delay_s`` > 0 makes rank ``straggler_rank`` sleep that long at the start
of every forward (extra compute, in the timed step, in both runs) in every launch with more than
one rank, so the breakdown must report it as straggler time and not as exposed communication. The
world-size-1 baselines stay undisturbed: with one rank there is no one to straggle behind. The
sleep is on the host; on a GPU the device idles for it, as it would behind a slow data loader.

Both one-device baselines of formulas.md (Scaling) run in the world-size-1 launch: the plain
module (parallelism ``none``) and the wrapper on one rank, so their times share one process.

World sizes and batches: ``strong`` keeps the global batch (each of N ranks gets batch/N),
``weak`` keeps the per-device batch (the global batch is batch·N). On CPU each rank gets
``threads_per_rank`` threads (``OMP_NUM_THREADS``), so N ranks use N times the cores of one and a
"device" means a fixed share of the machine; otherwise one rank alone would use every core and
N ranks would split the same cores.

Timings compare only within one launch: T(1) and T(N) come from different launches, as in any
scaling study; on a shared machine read efficiencies with their ``noisy`` flags.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Mapping

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from perfkit.measuring.training import parallel
from perfkit.core import checks
from perfkit.core.cpu_share import thread_env
from perfkit.core.errors import BadInputError, ConfigurationSkipped, ExecutionFailed
from perfkit.core.status import OK, SKIPPED
from perfkit.core.timing import Measurement
from perfkit.measuring.training.config import TrainConfig, check_supported, config_device
from perfkit.measuring.ops.trace_capture import summary_columns
from perfkit.measuring.training.step import optimizer_columns, train_rank, with_trace_dir
from perfkit.measuring.workloads import catalog

if TYPE_CHECKING:  # pandas is imported where rows are built: a rank never pays for it
    import pandas as pd

__all__ = ["ScalingConfig", "run_scaling", "scaling_rank", "raise_if_failed", "WRAPPERS", "config_from_params",
           "check_params"]

#: Data-parallel wrappers whose gradient synchronisation can be switched off.
WRAPPERS = ("ddp", "fsdp")
_MODES = ("strong", "weak")
_COMPUTE_METHOD = {
    "none": "no wrapper: the step itself",
    "ddp": "ddp no_sync: no gradient all-reduce",
    "fsdp": ("fsdp no reduce-scatter, parameters kept gathered: no collective after the first step; "
             "the optimizer updates the shards with zero gradients (its synchronised cost)"),
}


@dataclass(kw_only=True, frozen=True)
class ScalingConfig:
    """A scaling study: one training step at several world sizes."""

    train: TrainConfig
    """The step; its ``parallelism`` (``ddp`` or ``fsdp``) is the wrapper. ``world_size`` and
    ``batch_size`` are set per point from the fields below."""
    world_sizes: tuple[int, ...] = (1, 2)
    """Ranks per point; 1 runs both baselines (no wrapper, and the wrapper on one rank)."""
    mode: str = "strong"
    """``strong`` (fixed global batch) or ``weak`` (fixed per-device batch)."""
    batch_size: int = 32
    """Global batch (strong) or per-device batch (weak), in samples."""
    threads_per_rank: int | None = 1
    """CPU threads per rank (``OMP_NUM_THREADS``); None: the launcher's rule (this process's
    thread share split over the ranks, or torchrun's 1 per rank when there is none)."""
    timeout_s: float = 300.0
    """Deadline of each launch (one per world size)."""
    straggler_rank: int = 0
    """Calibration: the rank that ``straggler_delay_s`` slows down (at world sizes > 1)."""
    straggler_delay_s: float = 0.0
    """Calibration: extra compute time per step on ``straggler_rank``, in seconds; 0 is off."""

    def __post_init__(self):
        object.__setattr__(self, "world_sizes", tuple(self.world_sizes))
        if not isinstance(self.train, TrainConfig):
            raise BadInputError(f"train must be a TrainConfig, got {type(self.train).__name__}")
        if self.train.parallelism not in WRAPPERS:
            raise BadInputError(f"parallelism must be one of {WRAPPERS} (data parallel), got "
                                f"{self.train.parallelism!r}")
        checks.one_of("mode", self.mode, _MODES)
        ws = self.world_sizes
        if not ws or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in ws):
            raise BadInputError(f"world_sizes must be positive ints, got {list(ws)}")
        if len(set(ws)) != len(ws):
            raise BadInputError(f"world_sizes has repeats: {list(ws)}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise BadInputError(f"batch_size must be a positive int, got {self.batch_size!r}")
        if self.mode == "strong" and (bad := [n for n in ws if self.batch_size % n]):
            raise BadInputError(f"global batch {self.batch_size} does not split over "
                                f"world size(s) {bad}")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise BadInputError(f"threads_per_rank must be >= 1, got {self.threads_per_rank}")
        if not self.timeout_s > 0:
            raise BadInputError(f"timeout_s must be positive, got {self.timeout_s}")
        delay, rank = self.straggler_delay_s, self.straggler_rank
        if (isinstance(delay, bool) or not isinstance(delay, (int, float))
                or not 0 <= delay < math.inf):
            raise BadInputError(f"straggler_delay_s must be seconds >= 0, got {delay!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise BadInputError(f"straggler_rank must be an int >= 0, got {rank!r}")
        if delay > 0 and not any(n > 1 and rank < n for n in ws):
            raise BadInputError(f"straggler_rank {rank} is not a rank of any world size > 1 in "
                                f"world_sizes {list(ws)}: lower it or add a larger world size")

    def global_batch(self, world_size: int) -> int:
        return self.batch_size if self.mode == "strong" else self.batch_size * world_size

    def points(self, world_size: int) -> list[TrainConfig]:
        """The configurations of one launch: at world size 1 the plain module first."""
        batch = self.global_batch(world_size)
        wrapped = replace(self.train, world_size=world_size, batch_size=batch)
        if world_size == 1:
            return [replace(wrapped, parallelism="none"), wrapped]
        return [wrapped]


# ---- the ranks ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _gradient_sync_disabled():
    """Make the wrappers that :func:`train_rank` applies skip gradient synchronisation.

    The training step wraps its model through :mod:`perfkit.measuring.training.parallel`; wrapping the wrappers here
    reuses that step unchanged instead of keeping a copy of it. Yields the list of wrappers it
    switched, so a step that no longer goes through :mod:`perfkit.measuring.training.parallel` fails loudly rather
    than reporting a synchronised step as compute.
    """
    switched: list[str] = []
    wrap_ddp, apply_fsdp = parallel.wrap_ddp, parallel.apply_fsdp
    zeros: dict[int, object] = {}

    def gradients_for_the_optimizer(optimizer, args, kwargs):
        # No reduce-scatter, no sharded gradient: without one the optimizer would skip the
        # parameter. A zero gradient of the shard's shape and placement makes it do its work.
        if "fsdp" not in switched:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    if id(p) not in zeros:
                        zeros[id(p)] = torch.zeros_like(p)
                    p.grad = zeros[id(p)]

    def ddp_without_sync(*args, **kwargs):
        model = wrap_ddp(*args, **kwargs)
        model.require_backward_grad_sync = False  # what DistributedDataParallel.no_sync() sets
        switched.append("ddp")
        return model

    def fsdp_without_sync(*args, **kwargs):
        # FSDP2's recipe for steps without communication (gradient accumulation): no gradient
        # reduce-scatter, and parameters that stay gathered after forward and backward, so after
        # the untimed first step's all-gathers a step runs no collective at all. Otherwise every
        # block's all-gather makes the fast ranks wait for the slow one, and a straggler reads as
        # compute on every rank.
        kwargs["reshard_after_forward"] = False
        model = apply_fsdp(*args, **kwargs)
        model.set_requires_gradient_sync(False)
        model.set_reshard_after_backward(False)
        switched.append("fsdp")
        return model

    parallel.wrap_ddp, parallel.apply_fsdp = ddp_without_sync, fsdp_without_sync
    hook = register_optimizer_step_pre_hook(gradients_for_the_optimizer)
    try:
        yield switched
    finally:
        hook.remove()
        parallel.wrap_ddp, parallel.apply_fsdp = wrap_ddp, apply_fsdp


@contextlib.contextmanager
def _straggling(delay_s: float):
    """Make this rank a straggler: the model that :func:`train_rank` wraps sleeps ``delay_s`` at
    the start of every forward, inside the timed step. Yields the list of wrappers it slowed
    down, so a step that no longer wraps through :mod:`perfkit.measuring.training.parallel` fails loudly instead of
    running without the delay."""
    slowed: list[str] = []
    wrap_ddp, apply_fsdp = parallel.wrap_ddp, parallel.apply_fsdp

    def sleep_first(module, args):
        time.sleep(delay_s)

    def slowing(wrap, name):
        def wrapped(*args, **kwargs):
            model = wrap(*args, **kwargs)
            model.register_forward_pre_hook(sleep_first)
            slowed.append(name)
            return model
        return wrapped

    parallel.wrap_ddp, parallel.apply_fsdp = slowing(wrap_ddp, "ddp"), slowing(apply_fsdp, "fsdp")
    try:
        yield slowed
    finally:
        parallel.wrap_ddp, parallel.apply_fsdp = wrap_ddp, apply_fsdp


def _is_straggler(config: dict, point: dict) -> bool:
    import torch.distributed as dist

    return (config.get("straggler_delay_s", 0.0) > 0 and point["world_size"] > 1
            and dist.get_rank() == config["straggler_rank"])


def _rank_summary(result: dict) -> dict:
    keep = ("step_time_samples_s", "optimizer_time_samples_s", "losses", "peak_mem_bytes", "peak_mem_kind", "n_params",
            "tokens_per_sample", "model_family", "device", "trace_path", "trace_reason", "cpu_share")
    return {k: result[k] for k in keep if k in result}


def scaling_rank(config: dict) -> dict:
    """:func:`perfkit.run.launch.launch` target: every point of ``config["points"]`` (TrainConfig
    dicts), each synchronised then without gradient sync (wrapped points only), the
    ``straggler_rank`` slowed by ``straggler_delay_s`` per step where it applies."""
    out = []
    for point in config["points"]:
        straggler = _is_straggler(config, point)
        with (_straggling(config["straggler_delay_s"]) if straggler
              else contextlib.nullcontext([])) as slowed:
            synced = _rank_summary(train_rank(point))
            compute = None
            if point["parallelism"] != "none":
                with _gradient_sync_disabled() as switched:  # traced: the synchronised run only
                    compute = _rank_summary(train_rank({**point, "profile": False}))
                if switched != [point["parallelism"]]:
                    raise RuntimeError(
                        f"the compute-only run of {point['parallelism']} switched {switched}: the "
                        "training step no longer wraps through perfkit.measuring.training.parallel")
        if straggler and slowed != [point["parallelism"]] * 2:
            raise RuntimeError(f"the straggler delay slowed {slowed}, not both runs of "
                               f"{point['parallelism']}: the training step no longer wraps "
                               "through perfkit.measuring.training.parallel")
        out.append({"synced": synced, "compute": compute})
    return {"points": out}


# ---- rows --------------------------------------------------------------------------------------


def _measure(rank_samples: list[list[float]], warmup: int, label: str) -> Measurement:
    # A synchronised step lasts as long as its slowest rank (perfkit.measuring.training.step does the same).
    per_step = [max(times) for times in zip(*rank_samples)]
    return Measurement(samples_s=tuple(per_step), warmup_calls=warmup, label=label)


def _base_row(cfg: ScalingConfig, point: TrainConfig) -> dict:
    per_device = (point.batch_size // point.world_size if point.parallelism in WRAPPERS
                  else point.batch_size)
    return {
        **point.as_row(), "status": OK, "reason": None, "mode": cfg.mode,
        "global_batch_size": point.batch_size, "per_device_batch_size": per_device,
        "threads_per_rank": cfg.threads_per_rank, "straggler_rank": cfg.straggler_rank,
        "straggler_delay_s": cfg.straggler_delay_s,
    }


def _ok_row(cfg: ScalingConfig, point: TrainConfig, ranks: list[dict], wall_s: float) -> dict:
    synced = [r["synced"] for r in ranks]
    # The plain module has no gradient sync: its step is its compute.
    compute = synced if ranks[0]["compute"] is None else [r["compute"] for r in ranks]
    step = _measure([r["step_time_samples_s"] for r in synced], point.warmup_steps,
                    f"{point.model} {point.parallelism} x{point.world_size} step")
    comp = _measure([r["step_time_samples_s"] for r in compute], point.warmup_steps,
                    f"{point.model} {point.parallelism} x{point.world_size} no-sync step")
    per_sample = synced[0].get("tokens_per_sample")  # the workload's: seq_len of a text model
    tokens = point.batch_size * per_sample if per_sample else math.nan
    losses = synced[0]["losses"]
    return {
        **_base_row(cfg, point), **step.as_row("step_time"),
        "samples_per_s": point.batch_size / step.median_s,
        "tokens_per_s": tokens / step.median_s,
        "rank_step_time_s": [statistics.median(r["step_time_samples_s"]) for r in synced],
        # The threads each rank computed with (torch.get_num_threads), what threads_per_rank asked.
        "rank_cpu_threads": ([r["cpu_share"]["threads"] for r in synced]
                             if all(r.get("cpu_share") for r in synced) else None),
        "compute_time_s": comp.median_s, "compute_time_iqr_s": comp.iqr_s,
        "compute_time_samples_s": list(comp.samples_s), "compute_time_noisy": comp.noisy,
        "compute_time_method": _COMPUTE_METHOD[point.parallelism],
        **optimizer_columns(synced),
        "compute_optimizer_time_s": optimizer_columns(compute)["optimizer_time_s"],
        "rank_compute_time_s": [statistics.median(r["step_time_samples_s"]) for r in compute],
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in synced),
        "peak_mem_kind": synced[0].get("peak_mem_kind"), "n_params": synced[0].get("n_params"),
        "model_family": synced[0].get("model_family", "builtin"),
        "loss_first": losses[0], "loss_last": losses[-1],
        "launch_wall_time_s": wall_s,
        "trace_path": synced[0].get("trace_path"), "rank_trace_paths": [r.get("trace_path") for r in synced],
        "trace_reason": synced[0].get("trace_reason"),
        **summary_columns(r.get("trace_path") for r in synced),
    }


def _empty_row(cfg: ScalingConfig, point: TrainConfig, status: str, reason: str) -> dict:
    nan = math.nan
    return {**_base_row(cfg, point), "status": status, "reason": reason, "step_time_s": nan,
            "samples_per_s": nan, "compute_time_s": nan, "rank_step_time_s": None,
            "rank_compute_time_s": None, "rank_cpu_threads": None}


def run_scaling(cfg: ScalingConfig) -> pd.DataFrame:
    """Run ``cfg`` and return one row per (world size, parallelism), whatever happens.

    A world size the machine cannot honour (e.g. more ranks than GPUs) gives ``skipped`` rows; a
    launch that fails gives rows with its status (``failed``, ``oom``, ``timeout``, ``killed``)
    and the error as ``reason``, and the other world sizes still run.
    """
    import pandas as pd
    from perfkit.run.launch import launch

    device = config_device(cfg.train)
    env = thread_env(cfg.threads_per_rank) if cfg.threads_per_rank else None
    rows = []
    for n in cfg.world_sizes:
        points = [with_trace_dir(p) for p in cfg.points(n)]
        try:
            for point in points:
                check_supported(point)
        except ConfigurationSkipped as skipped:
            rows += [_empty_row(cfg, p, SKIPPED, skipped.reason) for p in points]
            continue
        result = launch("perfkit.measuring.training.scaling_run:scaling_rank",
                        {"points": [p.as_dict() for p in points],
                         "straggler_rank": cfg.straggler_rank,
                         "straggler_delay_s": float(cfg.straggler_delay_s)}, world_size=n,
                        backend="nccl" if device == "cuda" else "gloo", timeout_s=cfg.timeout_s,
                        env=env, device=device,
                        preload=(__name__, "torch._dynamo", *catalog.rank_imports(cfg.train.model)))
        if not result.ok:
            reason = f"world_size {n}, rank {result.failed_rank}: {result.error}"
            rows += [_empty_row(cfg, p, result.status, reason) for p in points]
            continue
        for i, point in enumerate(points):
            ranks = [r["points"][i] for r in result.rank_results]
            rows.append(_ok_row(cfg, point, ranks, result.wall_time_s))
    return pd.DataFrame(rows)


def raise_if_failed(rows: pd.DataFrame) -> None:
    """Raise :class:`ExecutionFailed` for the first row that is neither ``ok`` nor ``skipped``
    (after the rows are recorded, so a sweep marks the configuration failed and keeps them)."""
    bad = rows[~rows["status"].isin([OK, SKIPPED])]
    if len(bad):
        first = bad.iloc[0]
        raise ExecutionFailed(status=first["status"], error_name="ScalingLaunchFailed",
                              message=str(first["reason"]))


#: The ScalingConfig fields notebooks/scaling.ipynb sets by its own parameter names (``batch`` is
#: ``batch_size``); its other parameters are TrainConfig fields.
_SCALING_PARAMETERS = {"world_sizes": "world_sizes", "mode": "mode", "batch": "batch_size",
                       "threads_per_rank": "threads_per_rank", "timeout_s": "timeout_s",
                       "straggler_rank": "straggler_rank", "straggler_delay_s": "straggler_delay_s"}


def config_from_params(**params) -> ScalingConfig:
    """The :class:`ScalingConfig` of notebooks/scaling.ipynb's parameters (the notebook builds
    its configuration with this, and :func:`check_params` checks a sweep's values with it)."""
    scaling = {field: params.pop(name) for name, field in _SCALING_PARAMETERS.items() if name in params}
    return ScalingConfig(train=TrainConfig(**params), **scaling)


def check_params(params: Mapping[str, object]) -> None:
    """The value check of notebooks/scaling.ipynb (its metadata ``perfkit.check``): raise
    :class:`BadInputError` when its parameters make no valid :class:`ScalingConfig` (a model
    name that does not resolve, a batch that does not split over a world size, ...)."""
    config_from_params(**dict(params))
