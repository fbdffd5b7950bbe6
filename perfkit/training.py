"""The training-step benchmark: one configuration in, one results row out.

A seeded synthetic task from :mod:`perfkit.workloads` (``mlp`` regression, ``transformer``
next-token prediction, ``convnet`` classification) runs ``steps`` optimizer steps; every step
after ``warmup_steps`` is timed between device synchronizations and kept as a raw sample. The
global batch is the same whatever the parallelism: DDP and FSDP split it across ranks, tensor
parallel gives every rank all of it, so a parallel run follows the single-process loss
trajectory (up to floating-point reassociation).

The row (``workload = "train_step"``) holds the step time (median, IQR, raw samples), samples/s
and tokens/s, peak memory, the loss trajectory, and MFU beside the counted-FLOP utilisation
(:mod:`perfkit.mfu`; the convention in ``mfu_convention``). The counted FLOP come from
:class:`perfkit.counting.OpCounter` around the forward and backward of the first warm-up step
(the optimizer step is left out, as it is from the analytic model FLOP), so counting costs no
timed step and changes no number; under tensor parallel and torch.compile nothing is counted
(NaN, with the reason in ``counted_flop_reason``).

Entry points: :func:`train_step_benchmark` (this process), :func:`train_rank` (a
:func:`perfkit.launch.launch` target), :func:`run_training` (either, always a row),
:func:`find_max_batch_size` and, for notebooks, :func:`raise_for_status`. A setting the device
cannot honour raises :class:`~perfkit.errors.ConfigurationSkipped` before any work
(``run_training``: a ``skipped`` row).
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from perfkit import mfu, parallel, precision, workloads
from perfkit.errors import BadInputError, ConfigurationSkipped, ExecutionFailed
from perfkit.status import OK, OOM, SKIPPED, status_for_error
from perfkit.timing import Measurement

__all__ = ["TrainConfig", "PRECISIONS", "WORKLOAD", "workload_spec", "check_supported",
           "train_step_benchmark", "train_rank", "run_training", "find_max_batch_size",
           "raise_for_status", "OutOfMemoryError"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-pure", "fp8")
#: The ``workload`` column of every training-step row.
WORKLOAD = "train_step"
# Set from the TrainConfig, never from model_size.
_OWN_SIZE_KEYS = {"seq_len": "seq_len", "seed": "seed"}


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """One training-step configuration. Every field becomes a column of the results row."""

    model: str = "mlp"
    """``mlp``, ``transformer`` or ``convnet`` (:mod:`perfkit.workloads`)."""
    model_size: Mapping[str, object] = field(default_factory=dict)
    """Size fields of the workload's config (:class:`~perfkit.workloads.TransformerConfig`:
    ``n_layers``, ``d_model``, ``n_heads``, ``vocab_size``, ...; :class:`~perfkit.workloads.MLPConfig`:
    ``in_features``, ``hidden_features``, ``depth``, ...); unset fields keep the workload's
    defaults. ``seq_len`` and ``seed`` come from this config."""
    batch_size: int = 32
    """Global batch in samples (sequences for the transformer), split across data-parallel ranks."""
    seq_len: int = 32
    """Tokens per sequence (transformer only; other models ignore it)."""
    precision: str = "fp32"
    """``fp32``, ``tf32`` (CUDA), ``bf16``/``fp16`` (autocast; fp16 with a GradScaler),
    ``bf16-pure`` (bf16 weights and optimizer state) or ``fp8`` (torchao, Ada/Hopper/MI300)."""
    compile: bool = False
    """Wrap the (parallelized) model in ``torch.compile``."""
    compile_mode: str | None = None
    """``torch.compile`` mode (None: the default)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward (non-reentrant checkpoint)."""
    parallelism: str = "none"
    """``none`` (one process), ``ddp``, ``fsdp`` (FSDP2 ``fully_shard``) or ``tp``."""
    world_size: int = 1
    """Ranks; 1 with ``none``."""
    device: str = "auto"
    """``cpu``, ``cuda`` (also ROCm) or ``auto`` (cuda when available)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size in MiB."""
    gradient_as_bucket_view: bool = False
    """DDP: gradients alias the all-reduce buckets (saves one copy and its memory)."""
    static_graph: bool = False
    """DDP: the set of used parameters never changes (allows more overlap)."""
    comm_hook: str = "none"
    """DDP gradient compression: ``none``, ``fp16`` or ``bf16`` (NCCL only)."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered block parameters after forward (all-gather again in backward)."""
    fsdp_param_dtype: str | None = None
    """FSDP2 mixed precision: dtype of the gathered parameters (``bfloat16``, ...)."""
    fsdp_reduce_dtype: str | None = None
    """FSDP2 mixed precision: dtype of the gradient reduce-scatter."""
    steps: int = 5
    """Optimizer steps in all, warm-up included."""
    warmup_steps: int = 1
    """Leading steps left out of the timing (allocator, lazy init, compilation)."""
    seed: int = 0
    """Seeds the weights and the synthetic data; the same on every rank."""
    lr: float = 1e-2
    """AdamW learning rate (high enough that a few steps show the loss fall)."""
    count_flops: bool = True
    """Count the FLOP of the first warm-up step (:class:`perfkit.counting.OpCounter`) for the
    counted-FLOP utilisation; needs ``warmup_steps >= 1`` and no ``compile``."""
    address_space_headroom_bytes: int | None = None
    """Cap each rank's address space (RLIMIT_AS) at its size after start-up plus this many bytes,
    to find an OOM edge on CPU without the kernel's OOM killer; forces separate processes."""

    def __post_init__(self):
        object.__setattr__(self, "model_size", dict(self.model_size))
        _check_choice("model", self.model, workloads.NAMES)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("parallelism", self.parallelism, ("none", "ddp", "fsdp", "tp"))
        _check_choice("device", self.device, ("auto", "cpu", "cuda"))
        _check_choice("comm_hook", self.comm_hook, ("none", "fp16", "bf16"))
        if set(self.model_size) & set(_OWN_SIZE_KEYS):
            raise BadInputError(f"set {sorted(set(self.model_size) & set(_OWN_SIZE_KEYS))} on the "
                                "TrainConfig, not in model_size")
        if min(self.batch_size, self.seq_len, self.world_size, self.steps) < 1:
            raise BadInputError("batch_size, seq_len, world_size and steps must be >= 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise BadInputError(
                f"need 0 <= warmup_steps < steps, got {self.warmup_steps}, {self.steps}")
        if self.parallelism == "none" and self.world_size != 1:
            raise BadInputError("parallelism 'none' runs one process: world_size must be 1")
        if self.parallelism in ("ddp", "fsdp") and self.batch_size % self.world_size:
            raise BadInputError(f"batch_size {self.batch_size} does not split over "
                                f"{self.world_size} data-parallel ranks")
        if self.compile_mode is not None and not self.compile:
            raise BadInputError("compile_mode is set but compile is False")
        if self.comm_hook != "none" and self.parallelism != "ddp":
            raise BadInputError("comm_hook applies to parallelism 'ddp' only")
        if not self.lr > 0 or (self.address_space_headroom_bytes or 1) < 1:
            raise BadInputError("lr and address_space_headroom_bytes must be positive")
        spec = workload_spec(self)  # unknown or bad size names fail here, before any work
        if self.parallelism == "tp":
            _check_tp(spec, self.world_size)

    def as_dict(self) -> dict:
        """JSON-ready fields (what :func:`train_rank` takes)."""
        return asdict(self)

    def as_row(self) -> dict:
        """Fields as results columns; ``model_size`` flattened to ``model_<name>`` columns."""
        row = self.as_dict()
        row.update({f"model_{k}": json.dumps(v) if isinstance(v, (list, tuple)) else v
                    for k, v in row.pop("model_size").items()})
        return row


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise BadInputError(f"{name} must be one of {choices}, got {value!r}")


def workload_spec(cfg: TrainConfig) -> workloads.WorkloadSpec:
    """The :mod:`perfkit.workloads` config ``cfg`` trains: ``model_size`` over the workload's
    defaults, with the config's ``seed`` (and ``seq_len`` for the transformer)."""
    size = {**cfg.model_size, "seed": cfg.seed}
    if cfg.model == "transformer":
        size["seq_len"] = cfg.seq_len
    return workloads.make_spec(cfg.model, **size)


def _check_tp(spec, world_size: int) -> None:
    # Column/row splits must give every rank whole heads and equal shards.
    if isinstance(spec, workloads.TransformerConfig):
        if spec.n_heads % world_size:
            raise BadInputError(f"tensor parallel over {world_size} ranks needs n_heads divisible "
                                f"by it, got {spec.n_heads}")
    elif isinstance(spec, workloads.MLPConfig):
        if spec.depth < 2 or spec.hidden_features % world_size:
            raise BadInputError(f"tensor parallel of the mlp needs depth >= 2 and hidden_features "
                                f"divisible by {world_size}, got {spec.depth}, {spec.hidden_features}")
    else:
        raise BadInputError(f"{spec.name} has no tensor-parallel plan (mlp and transformer have)")


# ---- device support ----------------------------------------------------------------------------


def _resolve_device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def _gpu_arch() -> tuple[str, tuple[int, int] | None]:
    """Device 0's ``(gfx arch name, None)`` on ROCm, ``("cuda", compute capability)`` on CUDA."""
    if torch.version.hip:
        return torch.cuda.get_device_properties(0).gcnArchName, None
    return "cuda", torch.cuda.get_device_capability(0)


def check_supported(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigurationSkipped` when this machine cannot honour ``cfg``; nothing else."""
    device = _resolve_device(cfg)
    if device == "cpu":
        if cfg.precision in ("tf32", "fp8"):
            raise ConfigurationSkipped(f"{cfg.precision} needs GPU tensor cores; the device is CPU")
    else:
        if not torch.cuda.is_available():
            raise ConfigurationSkipped("device 'cuda' requested but no CUDA/ROCm device is visible")
        if cfg.world_size > torch.cuda.device_count():  # one GPU per rank, one node
            raise ConfigurationSkipped(
                f"world_size {cfg.world_size} > {torch.cuda.device_count()} GPUs on this node")
        arch, capability = _gpu_arch()
        if capability is not None:
            sm = f"sm_{capability[0]}{capability[1]}"
            if cfg.precision == "tf32" and capability < (8, 0):  # tf32 arrived with Ampere
                raise ConfigurationSkipped(f"tf32 needs sm_80+, device is {sm}")
            # fp8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards.
            if cfg.precision == "fp8" and capability < (8, 9):
                raise ConfigurationSkipped(f"fp8 needs sm_89+, device is {sm}")
        # ROCm: tf32 needs torch >= 2.7 and MI300+; fp8 an arch with an e4m3 variant.
        elif cfg.precision == "tf32" and (reason := precision.rocm_tf32_reason(arch)):
            raise ConfigurationSkipped(reason)
        elif cfg.precision == "fp8" and (reason := precision.fp8_reason(arch)):
            raise ConfigurationSkipped(reason)
        if cfg.precision in ("bf16", "bf16-pure") and not torch.cuda.is_bf16_supported():
            raise ConfigurationSkipped("this GPU has no bfloat16 support")
    if cfg.precision == "fp8":
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            raise ConfigurationSkipped("fp8 training needs torchao (torchao.float8)") from None
    if cfg.parallelism == "ddp":
        parallel.check_comm_hook(cfg.comm_hook, "nccl" if device == "cuda" else "gloo")


# ---- the benchmark -----------------------------------------------------------------------------


def _batch_seed(cfg: TrainConfig, step: int) -> int:
    # Global batch `step` is one draw from (seed, step), whatever the parallelism.
    return cfg.seed * 2**32 + step


def _batch(cfg: TrainConfig, work: workloads.Workload, step: int, ctx: parallel.DistContext,
           device: torch.device):
    """This rank's slice of global batch ``step``: drawn whole on the CPU, so every rank and a
    single process see the same global batch."""
    inputs, target = work.make_batch(cfg.batch_size, seed=_batch_seed(cfg, step))
    size = cfg.batch_size // ctx.dp_size
    lo = size * ctx.dp_rank
    inputs, target = inputs[lo:lo + size].to(device), target[lo:lo + size].to(device)
    if cfg.precision == "bf16-pure" and inputs.is_floating_point():
        inputs = inputs.to(torch.bfloat16)
    return inputs, target


def _prepare(cfg: TrainConfig, device: torch.device) -> tuple[nn.Module, workloads.Workload]:
    # Weights come from spec.seed: identical on every rank and in one process.
    work = workloads.build(workload_spec(cfg), device=device,
                           dtype=torch.bfloat16 if cfg.precision == "bf16-pure" else torch.float32)
    model = work.model
    model.activation_checkpointing = cfg.activation_checkpointing
    if cfg.precision == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model)
    if cfg.parallelism == "ddp":
        model = parallel.wrap_ddp(model, device=device, bucket_cap_mb=cfg.bucket_cap_mb,
                                  gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                                  static_graph=cfg.static_graph, comm_hook=cfg.comm_hook)
    elif cfg.parallelism == "fsdp":
        model = parallel.apply_fsdp(model, reshard_after_forward=cfg.reshard_after_forward,
                                    param_dtype=parallel.dtype_from_name(cfg.fsdp_param_dtype),
                                    reduce_dtype=parallel.dtype_from_name(cfg.fsdp_reduce_dtype))
    elif cfg.parallelism == "tp":
        model = parallel.apply_tp(model)
    if cfg.compile:
        model = torch.compile(model, mode=cfg.compile_mode)
    return model, work


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mem_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    # ru_maxrss is in KiB on Linux (bytes on macOS) and covers the process's whole life.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "cpu_max_rss"


def _count_reason(cfg: TrainConfig) -> str | None:
    """Why the first step's FLOP are not counted, or None when they are."""
    if not cfg.count_flops:
        return "count_flops is off"
    if cfg.warmup_steps < 1:
        return "no warm-up step to count on (warmup_steps is 0)"
    if cfg.compile:
        # Compiled kernels run below the dispatcher: the counter would see a fraction of the ops.
        return "not counted under torch.compile (fused kernels bypass the dispatch-level counter)"
    if cfg.parallelism == "tp":
        # Above DTensor's dispatch the counter sees sharded-weight matmuls at their global shape
        # and the ops between them at shard shape: neither one rank's count nor the sum is exact.
        return "not counted under tensor parallel (DTensor ops mix global and shard shapes)"
    return None


def _run(cfg: TrainConfig, ctx: parallel.DistContext) -> dict:
    """Train ``cfg.steps`` steps in this process (one rank of a job, or alone)."""
    from perfkit.counting import OpCounter, coverage
    from perfkit.cpu_share import cpu_share
    from perfkit.devices import detect

    device = torch.device(_resolve_device(cfg))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.reset_peak_memory_stats(device)
    info = detect(str(device))
    model, work = _prepare(cfg, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    count = _count_reason(cfg) is None
    losses, samples_s, counted = [], [], None
    # One precision policy (perfkit.precision): fp32 matmuls and cuDNN convolutions IEEE unless
    # cfg.precision is tf32; on ROCm tf32 also sets HIPBLASLT_ALLOW_TF32 for the run.
    with precision.math_mode(cfg.precision):
        for step in range(cfg.steps):
            inputs, target = _batch(cfg, work, step, ctx, device)
            counter = OpCounter() if count and step == 0 else contextlib.nullcontext()
            _synchronize(device)
            t0 = time.perf_counter()
            with counter:  # forward and backward: what the analytic model FLOP describe
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    out = model(inputs)
                # The loss in fp32 whatever the compute dtype.
                loss = work.loss_fn(out.float(), target)
                # fp16: scale the loss so small gradients do not flush to zero.
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            _synchronize(device)
            if step >= cfg.warmup_steps:
                samples_s.append(time.perf_counter() - t0)
            if isinstance(counter, OpCounter):
                counted = counter.frame()
            losses.append(loss.detach().float())
    losses_t = torch.stack(losses)
    if ctx.dp_size > 1:  # the global-batch loss is the mean of the equal-sized slices' losses
        torch.distributed.all_reduce(losses_t)
        losses_t /= ctx.dp_size
    peak, peak_kind = _peak_mem_bytes(device)
    uncounted = [u.op for u in coverage(counted).uncounted] if counted is not None else []
    return {"rank": ctx.rank, "losses": losses_t.tolist(), "step_time_samples_s": samples_s,
            "peak_mem_bytes": peak, "peak_mem_kind": peak_kind, "n_params": work.n_params,
            "n_params_non_embedding": work.n_params_non_embedding,
            "flop_per_sample": work.flop_per_sample, "tokens_per_sample": work.tokens_per_sample,
            "counted_flop": int(counted["flop"].sum()) if counted is not None else None,
            "uncounted_ops": uncounted, "device": device.type, "device_kind": info.kind,
            "device_name": info.name, "grad_scale": scaler.get_scale() if scaler else math.nan,
            # The CPU this rank computed on (affinity, cores, threads): the MFU's peak is of these.
            "device_compute_units": info.compute_units,
            "cpu_share": cpu_share().as_dict() if device.type == "cpu" else None}


def _counted_step_flop(cfg: TrainConfig, rank_results: list[dict]) -> tuple[float, str | None]:
    """FLOP counted in one step over all ranks, or (NaN, why not)."""
    reason = _count_reason(cfg)
    if reason is None:
        # Each rank counted the forward and backward of its slice of the batch (FSDP2 gathers
        # whole parameters for them, so these are plain, unsharded ops).
        return float(sum(r["counted_flop"] for r in rank_results)), None
    return math.nan, reason


def _row(cfg: TrainConfig, rank_results: list[dict]) -> dict:
    """One results row from every rank's result: a step lasts as long as its slowest rank."""
    per_step = [max(times) for times in zip(*(r["step_time_samples_s"] for r in rank_results))]
    timing = Measurement(samples_s=tuple(per_step), warmup_calls=cfg.warmup_steps,
                         label=f"{cfg.model} {cfg.parallelism} step").as_row("step_time")
    first, losses = rank_results[0], rank_results[0]["losses"]
    step_s = timing["step_time_s"]
    tokens = (cfg.batch_size * first["tokens_per_sample"] if first["tokens_per_sample"]
              else math.nan)
    # One GPU per rank (peak × world_size); on a CPU the peak of the physical cores the ranks'
    # affinity and threads gave them (perfkit.mfu).
    peak = mfu.peak_flop_per_s(device_kind=first["device_kind"], device_name=first["device_name"],
                               precision=cfg.precision, devices=cfg.world_size,
                               compute_units=first.get("device_compute_units"),
                               cpu_shares=[r["cpu_share"] for r in rank_results if r.get("cpu_share")])
    model_flop = float(first["flop_per_sample"] * cfg.batch_size)
    counted_flop, counted_reason = _counted_step_flop(cfg, rank_results)
    return {
        **cfg.as_row(), "workload": WORKLOAD, "status": OK, "error": None, **timing,
        "samples_per_s": cfg.batch_size / step_s,
        "tokens_per_s": tokens / step_s,
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rank_results),
        "peak_mem_kind": first["peak_mem_kind"], "n_params": first["n_params"],
        "n_params_non_embedding": first["n_params_non_embedding"],
        "step_model_flop": model_flop,
        "model_flop_per_s": model_flop / step_s,
        "peak_flop_per_s": peak.flop_per_s,
        "peak_source": peak.source,
        "cpu_threads": peak.cpu_threads, "cpu_cores_counted": peak.cpu_cores,
        "mfu": mfu.utilisation(model_flop, step_s, peak),
        "mfu_convention": mfu.mfu_convention(cfg.model, peak),
        "mfu_reason": peak.reason,
        "step_counted_flop": counted_flop,
        "counted_flop_per_s": counted_flop / step_s,
        "counted_flop_utilisation": mfu.utilisation(counted_flop, step_s, peak),
        "counted_flop_reason": counted_reason or peak.reason,
        "uncounted_ops": ", ".join(sorted(set().union(*(r["uncounted_ops"] for r in rank_results)))),
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "loss_fell": bool(losses[-1] < losses[0]),
        "resolved_device": first["device"], "device_name": first["device_name"],
        "grad_scale": first["grad_scale"],
    }


def train_step_benchmark(cfg: TrainConfig) -> dict:
    """Run ``cfg`` in this process (parallelism ``none``) and return its results row."""
    if cfg.parallelism != "none" or cfg.address_space_headroom_bytes is not None:
        raise BadInputError("train_step_benchmark runs one process without a memory cap; "
                            "use run_training for parallel or capped runs")
    check_supported(cfg)
    return _row(cfg, [_run(cfg, parallel.dist_context("none"))])


def _cap_address_space(headroom_bytes: int) -> None:
    with open("/proc/self/status") as f:
        vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_kib * 1024 + headroom_bytes, hard))


def train_rank(config: dict) -> dict:
    """:func:`perfkit.launch.launch` target: one rank of ``TrainConfig(**config)``."""
    cfg = TrainConfig(**config)
    check_supported(cfg)
    if cfg.address_space_headroom_bytes is not None:
        _cap_address_space(cfg.address_space_headroom_bytes)
    return _run(cfg, parallel.dist_context(cfg.parallelism))


def run_training(cfg: TrainConfig, timeout_s: float = 600.0, *,
                 isolate: bool | None = None) -> dict:
    """Run ``cfg`` and return one row, whatever happens (``status`` says how it ended).

    Parallel runs, capped runs and ``isolate=True`` go through :func:`perfkit.launch.launch`
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
    if not isolate:
        try:
            return train_step_benchmark(cfg)
        except ConfigurationSkipped as skipped:
            return {**base, "status": SKIPPED, "error": skipped.reason}
        except Exception as error:  # noqa: BLE001 - the row records every failure
            name = f"{type(error).__module__}.{type(error).__qualname__}"
            status = status_for_error(name, str(error))
            return {**base, "status": status, "error": f"{name}: {error}"}
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # after an OOM, give the next configuration a clean pool
    from perfkit.launch import launch

    device = _resolve_device(cfg)
    result = launch("perfkit.training:train_rank", cfg.as_dict(), world_size=cfg.world_size,
                    backend="nccl" if device == "cuda" else "gloo", timeout_s=timeout_s,
                    device=device)
    if result.status != OK:
        return {**base, "status": result.status, "error": result.error,
                "failed_rank": result.failed_rank}
    return _row(cfg, list(result.rank_results))


def find_max_batch_size(cfg: TrainConfig, *, start: int, limit: int, timeout_s: float = 600.0,
                        multiple_of: int | None = None) -> dict:
    """Largest global batch in [start, limit] that trains without OOM: double from ``start``
    until a run OOMs (or ``limit``), then bisect between the last fit and the first OOM down to
    ``multiple_of`` (default: the data-parallel size). On CPU set
    ``address_space_headroom_bytes``, or the kernel's OOM killer ends the search instead.

    Returns ``max_batch_size`` (None if ``start`` does not fit), ``probes`` (batch size, status)
    and ``stopped_by`` (a row whose status was neither ok nor oom, else None).
    """
    step = multiple_of or (cfg.world_size if cfg.parallelism in ("ddp", "fsdp") else 1)
    if not 1 <= start <= limit or start % step or step < 1:
        raise BadInputError(f"need 1 <= start <= limit and start a multiple of {step}")
    probes: list[tuple[int, str]] = []

    def fits(batch: int) -> bool | dict:
        row = run_training(replace(cfg, batch_size=batch), timeout_s)
        probes.append((batch, row["status"]))
        return True if row["status"] == OK else False if row["status"] == OOM else row

    good, bad, batch = None, None, start
    while True:
        verdict = fits(batch)
        if isinstance(verdict, dict):
            return {"max_batch_size": good, "probes": probes, "stopped_by": verdict}
        if not verdict:
            bad = batch
            break
        good = batch
        if batch >= limit:
            break
        batch = min(batch * 2, limit // step * step)
        if batch <= good:
            break
    while good is not None and bad is not None and bad - good > step:
        mid = (good + bad) // 2 // step * step
        if mid <= good:
            break
        verdict = fits(mid)
        if isinstance(verdict, dict):
            return {"max_batch_size": good, "probes": probes, "stopped_by": verdict}
        good, bad = (mid, bad) if verdict else (good, mid)
    return {"max_batch_size": good, "probes": probes, "stopped_by": None}


class OutOfMemoryError(ExecutionFailed):
    """A training run ended ``oom``; the class name is what makes the notebook runner classify
    the execution as ``oom`` (:func:`perfkit.status.status_for_error`)."""


def raise_for_status(row: Mapping) -> None:
    """For a notebook, after recording ``row``: return if it is ``ok``; otherwise stop the
    notebook the way its status says (skipped: :class:`ConfigurationSkipped`; oom:
    :class:`OutOfMemoryError`; failed, timeout, killed: :class:`ExecutionFailed`)."""
    status, reason = row["status"], row.get("error") or ""
    if status == OK:
        return
    if status == SKIPPED:
        raise ConfigurationSkipped(reason)
    error = OutOfMemoryError if status == OOM else ExecutionFailed
    raise error(status=status, error_name=f"train_step {status}", message=reason)
