"""The training-step benchmark: one configuration in, one results row out.

A seeded synthetic task (regression for ``mlp``, next-token prediction for ``transformer``) runs
``steps`` optimizer steps; every step after ``warmup_steps`` is timed between device
synchronizations and kept as a raw sample. The global batch is the same whatever the parallelism:
DDP and FSDP split it across ranks, tensor parallel gives every rank all of it, so a parallel run
follows the single-process loss trajectory (up to floating-point reassociation).

Entry points: :func:`train_step_benchmark` (this process), :func:`train_rank` (a
:func:`perfkit.launch.launch` target), :func:`run_training` (either, always a row) and
:func:`find_max_batch_size`. A setting the device cannot honour raises
:class:`~perfkit.errors.ConfigurationSkipped` before any work (``run_training``: a ``skipped`` row).
"""

from __future__ import annotations

import contextlib
import math
import resource
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from perfkit import parallel
from perfkit.errors import BadInputError, ConfigurationSkipped
from perfkit.status import OK, OOM, SKIPPED, status_for_error
from perfkit.timing import Measurement

__all__ = ["TrainConfig", "PRECISIONS", "build_model", "check_supported", "train_step_benchmark",
           "train_rank", "run_training", "find_max_batch_size"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-pure", "fp8")
_MODELS = ("mlp", "transformer")


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """One training-step configuration. Every field becomes a column of the results row."""

    model: str = "mlp"
    """``mlp`` or ``transformer`` (see :func:`build_model`)."""
    model_size: Mapping[str, int] = field(default_factory=dict)
    """Size parameters passed to :func:`build_model` (e.g. ``dim``, ``n_layers``)."""
    batch_size: int = 32
    """Global batch in samples (sequences for the transformer), split across data-parallel ranks."""
    seq_len: int = 32
    """Tokens per sequence (transformer only)."""
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
    lr: float = 3e-3
    """AdamW learning rate (high enough that a few steps show the loss fall)."""
    address_space_headroom_bytes: int | None = None
    """Cap each rank's address space (RLIMIT_AS) at its size after start-up plus this many bytes,
    to find an OOM edge on CPU without the kernel's OOM killer; forces separate processes."""

    def __post_init__(self):
        object.__setattr__(self, "model_size", dict(self.model_size))
        _check_choice("model", self.model, _MODELS)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("parallelism", self.parallelism, ("none", "ddp", "fsdp", "tp"))
        _check_choice("device", self.device, ("auto", "cpu", "cuda"))
        _check_choice("comm_hook", self.comm_hook, ("none", "fp16", "bf16"))
        if any(not isinstance(v, int) or v < 1 for v in self.model_size.values()):
            raise BadInputError(f"model_size values must be positive ints, got {self.model_size}")
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

    def as_dict(self) -> dict:
        """JSON-ready fields (what :func:`train_rank` takes)."""
        return asdict(self)

    def as_row(self) -> dict:
        """Fields as results columns; ``model_size`` flattened to ``model_<name>`` columns."""
        row = self.as_dict()
        row.update({f"model_{k}": v for k, v in row.pop("model_size").items()})
        return row


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise BadInputError(f"{name} must be one of {choices}, got {value!r}")


# ---- models (to be merged into perfkit.workloads) ----------------------------------------------


class _Model(nn.Module):
    """Blocks run in sequence (optionally checkpointed); ``tp_plan`` collects the blocks' plans."""

    activation_checkpointing = False

    def _run_blocks(self, x):
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x

    def tp_plan(self) -> dict[str, str]:
        return {f"blocks.{i}.{path}": style for i, block in enumerate(self.blocks)
                for path, style in block.TP_PLAN.items()}


class _MLPBlock(nn.Module):
    TP_PLAN = {"up": "colwise", "down": "rowwise"}

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class _MLP(_Model):
    def __init__(self, d_in: int = 32, dim: int = 64, hidden: int = 256, depth: int = 2,
                 d_out: int = 8):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.inp, self.out = nn.Linear(d_in, dim), nn.Linear(dim, d_out)
        self.blocks = nn.ModuleList(_MLPBlock(dim, hidden) for _ in range(depth))

    def forward(self, x):
        return self.out(self._run_blocks(self.inp(x)))


class _GPTBlock(nn.Module):
    TP_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "o": "rowwise",
               "fc": "colwise", "proj": "rowwise"}

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.head_dim = dim // n_heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.fc, self.proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        # -1 heads: under tensor parallel each rank holds n_heads / world_size of them.
        q, k, v = (proj(h).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class _GPT(_Model):
    def __init__(self, vocab: int = 64, dim: int = 32, n_heads: int = 4, n_layers: int = 2,
                 max_seq_len: int = 128):
        super().__init__()
        if dim % n_heads:
            raise BadInputError(f"dim {dim} is not divisible by n_heads {n_heads}")
        self.vocab, self.max_seq_len, self.n_heads = vocab, max_seq_len, n_heads
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_seq_len, dim)
        self.blocks = nn.ModuleList(_GPTBlock(dim, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln_f(self._run_blocks(x)))


_BUILDERS = {"mlp": _MLP, "transformer": _GPT}


def build_model(name: str, **size) -> nn.Module:
    """``mlp`` (d_in, dim, hidden, depth, d_out: residual GELU blocks, a regression head) or a
    GPT-style ``transformer`` (vocab, dim, n_heads, n_layers, max_seq_len; SDPA causal attention).
    Both expose ``blocks`` (the FSDP units), ``activation_checkpointing`` and ``tp_plan()``."""
    _check_choice("model", name, tuple(_BUILDERS))
    try:
        return _BUILDERS[name](**size)
    except TypeError as error:  # an unknown size name
        raise BadInputError(f"bad size for {name}: {error}") from None


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
        elif cfg.precision in ("tf32", "fp8") and not arch.startswith(("gfx94", "gfx95")):
            raise ConfigurationSkipped(
                f"{cfg.precision} on ROCm needs MI300 (gfx94x) or later, device is {arch}")
        if cfg.precision in ("bf16", "bf16-pure") and not torch.cuda.is_bf16_supported():
            raise ConfigurationSkipped("this GPU has no bfloat16 support")
    if cfg.precision == "fp8":
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            raise ConfigurationSkipped("fp8 training needs torchao (torchao.float8)") from None
    if cfg.parallelism == "ddp":
        parallel.check_comm_hook(cfg.comm_hook, "nccl" if device == "cuda" else "gloo")


# ---- synthetic task ----------------------------------------------------------------------------


def _batch(cfg: TrainConfig, model: nn.Module, step: int, ctx: parallel.DistContext, device):
    """This rank's slice of global batch ``step``: generated whole on CPU from (seed, step), so
    every rank and a single process draw the same global batch."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    lo = cfg.batch_size // ctx.dp_size * ctx.dp_rank
    hi = lo + cfg.batch_size // ctx.dp_size
    if cfg.model == "mlp":
        # Regression onto a fixed random map: y = tanh(x W), W seeded by cfg.seed only.
        w = torch.randn(model.d_in, model.d_out, generator=torch.Generator().manual_seed(cfg.seed))
        x = torch.randn(cfg.batch_size, model.d_in, generator=gen)
        y = torch.tanh(x @ w / math.sqrt(model.d_in))
        return x[lo:hi].to(device), y[lo:hi].to(device)
    # Next-token prediction on arithmetic sequences t_i = (start + i * stride) mod vocab:
    # learnable from the context, so the loss falls within a few steps.
    start = torch.randint(0, model.vocab, (cfg.batch_size, 1), generator=gen)
    stride = torch.randint(1, 4, (cfg.batch_size, 1), generator=gen)
    tokens = (start + stride * torch.arange(cfg.seq_len + 1)) % model.vocab
    return tokens[lo:hi, :-1].to(device), tokens[lo:hi, 1:].to(device)


def _loss(cfg: TrainConfig, out, target):
    if cfg.model == "mlp":
        return F.mse_loss(out.float(), target)
    return F.cross_entropy(out.float().flatten(0, 1), target.flatten())


# ---- the benchmark -----------------------------------------------------------------------------


def _prepare(cfg: TrainConfig, device: torch.device) -> tuple[nn.Module, int]:
    size = dict(cfg.model_size)
    if cfg.model == "transformer":
        size.setdefault("max_seq_len", cfg.seq_len)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank and in one process
    model = build_model(cfg.model, **size).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    model.activation_checkpointing = cfg.activation_checkpointing
    if cfg.precision == "bf16-pure":
        model = model.to(torch.bfloat16)
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
    return model, n_params


@contextlib.contextmanager
def _matmul_precision(precision: str):
    # tf32 is process-global state: set it for this run only, and off otherwise (cuDNN's
    # default lets fp32 convolutions use tf32, which would make "fp32" mean tf32).
    previous = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.backends.cudnn.allow_tf32 = previous[1]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mem_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    # ru_maxrss is in KiB on Linux (bytes on macOS) and covers the process's whole life.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "cpu_max_rss"


def _run(cfg: TrainConfig, ctx: parallel.DistContext) -> dict:
    """Train ``cfg.steps`` steps in this process (one rank of a job, or alone)."""
    device = torch.device(_resolve_device(cfg))
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.reset_peak_memory_stats(device)
    model, n_params = _prepare(cfg, device)
    raw_model = getattr(model, "_orig_mod", model)
    raw_model = getattr(raw_model, "module", raw_model)  # DDP's wrapped module
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    losses, samples_s = [], []
    with _matmul_precision(cfg.precision):
        for step in range(cfg.steps):
            inputs, target = _batch(cfg, raw_model, step, ctx, device)
            if cfg.precision == "bf16-pure" and inputs.is_floating_point():
                inputs = inputs.to(torch.bfloat16)
            _synchronize(device)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = _loss(cfg, model(inputs), target)
            if scaler is not None:  # fp16: scale the loss so small gradients do not flush to 0
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            _synchronize(device)
            if step >= cfg.warmup_steps:
                samples_s.append(time.perf_counter() - t0)
            losses.append(loss.detach().float())
    losses_t = torch.stack(losses)
    if ctx.dp_size > 1:  # the global-batch loss is the mean of the equal-sized slices' losses
        torch.distributed.all_reduce(losses_t)
        losses_t /= ctx.dp_size
    peak, peak_kind = _peak_mem_bytes(device)
    return {"rank": ctx.rank, "losses": losses_t.tolist(), "step_time_samples_s": samples_s,
            "peak_mem_bytes": peak, "peak_mem_kind": peak_kind, "n_params": n_params,
            "device": device.type, "grad_scale": scaler.get_scale() if scaler else math.nan}


def _row(cfg: TrainConfig, rank_results: list[dict]) -> dict:
    """One results row from every rank's result: a step lasts as long as its slowest rank."""
    per_step = [max(times) for times in zip(*(r["step_time_samples_s"] for r in rank_results))]
    timing = Measurement(samples_s=tuple(per_step), warmup_calls=cfg.warmup_steps,
                         label=f"{cfg.model} {cfg.parallelism} step").as_row("step_time")
    first, losses = rank_results[0], rank_results[0]["losses"]
    step_s = timing["step_time_s"]
    tokens = cfg.batch_size * cfg.seq_len if cfg.model == "transformer" else math.nan
    return {
        **cfg.as_row(), "status": OK, "error": None, **timing,
        "samples_per_s": cfg.batch_size / step_s,
        "tokens_per_s": tokens / step_s,
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rank_results),
        "peak_mem_kind": first["peak_mem_kind"], "n_params": first["n_params"],
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "resolved_device": first["device"], "grad_scale": first["grad_scale"],
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
    base = {**cfg.as_row(), "error": None}
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
