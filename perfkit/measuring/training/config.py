"""What a training-step benchmark is asked to run, and whether this machine can run it.

:class:`TrainConfig` (one configuration, every field a column of the row), the workload spec it
trains (:func:`workload_spec`), and :func:`check_supported`, which raises
:class:`~perfkit.core.errors.ConfigurationSkipped` for a setting the device cannot honour before
any work starts. The step itself runs in :mod:`perfkit.measuring.training.step`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from perfkit.analyse import pipeline_bubble
from perfkit.core import checks, precision
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.measuring.ops import memory_snapshot as mem_snapshot
from perfkit.measuring.training import parallel
from perfkit.measuring.training import pipeline_stages
from perfkit.measuring.workloads import catalog
from perfkit.measuring.workloads import synthetic as workloads
from perfkit.measuring.workloads.user import UserModelSpec

__all__ = ["TrainConfig", "user_model_skip_reason", "pipeline_input_reason", "check_params", "compute_dtype_of", "PRECISIONS", "PP_PRECISIONS", "WORKLOAD", "workload_spec", "check_supported", "config_device"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-pure", "fp8")
#: Precisions of the pipeline step (autocast around each stage's forward, no GradScaler).
PP_PRECISIONS = ("fp32", "tf32", "bf16")
#: The ``workload`` column of every training-step row.
WORKLOAD = "train_step"
# Set from the TrainConfig, never from model_size.
_OWN_SIZE_KEYS = {"seq_len": "seq_len", "seed": "seed"}


@dataclass(kw_only=True, frozen=True)
class TrainConfig:
    """One training-step configuration. Every field becomes a column of the results row."""

    model: str = "mlp"
    """perfkit's ``mlp``, ``transformer`` or ``convnet`` (:mod:`perfkit.measuring.workloads.synthetic`),
    a user's entry point ``package.module:function``, ``hf:<model_type>`` (transformers, random
    weights) or ``torchvision:<name>`` (:mod:`perfkit.measuring.workloads.catalog`)."""
    model_path: str | None = None
    """A folder put first on ``sys.path`` before an entry point is imported (None: ``PYTHONPATH``)."""
    model_size: Mapping[str, object] = field(default_factory=dict)
    """Size fields of the workload's config (:class:`~perfkit.measuring.workloads.synthetic.TransformerConfig`:
    ``n_layers``, ``d_model``, ``n_heads``, ``vocab_size``, ...; :class:`~perfkit.measuring.workloads.synthetic.MLPConfig`:
    ``in_features``, ``hidden_features``, ``depth``, ...; a Hugging Face config's fields; an entry
    point's keyword arguments); unset fields keep the workload's defaults. ``seq_len`` and
    ``seed`` come from this config."""
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
    """``none`` (one process), ``ddp``, ``tp``, the ZeRO stages ``zero1`` (DDP +
    ``ZeroRedundancyOptimizer``), ``zero2`` (FSDP2 without resharding after forward), ``zero3``
    (FSDP2; ``fsdp`` is its alias), ``fsdp_tp`` (FSDP2 × TP on a ``(dp, tp)`` mesh)
    (:mod:`perfkit.measuring.training.parallel`) or ``pp`` (pipeline stages over the ranks,
    :mod:`perfkit.measuring.training.pipeline`)."""
    world_size: int = 1
    """Ranks; 1 with ``none``."""
    dp_degree: int | None = None
    """Data-parallel ranks (the batch splits over them). None: what the parallelism implies
    (world_size for ddp/zero*/fsdp, 1 for none/tp, world_size // tp_degree for fsdp_tp; the
    resolved value is :attr:`dp_size`); a value that contradicts it is rejected."""
    tp_degree: int | None = None
    """Tensor-parallel ranks. None: world_size for tp, world_size // dp_degree for fsdp_tp, 1
    otherwise. Under fsdp_tp, dp_degree · tp_degree = world_size."""
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
    reshard_after_forward: bool | None = None
    """FSDP2: free gathered block parameters after forward (all-gather again in backward). None:
    the stage's (True for zero3/fsdp/fsdp_tp, False for zero2); zero2 with True or zero3 with
    False is rejected (``fsdp`` and ``fsdp_tp`` take either). Ignored without FSDP2."""
    fsdp_param_dtype: str | None = None
    """FSDP2 mixed precision: dtype of the gathered parameters (``bfloat16``, ...). 16-bit under
    fp32/tf32 makes the matmuls 16-bit (:attr:`compute_dtype`); refused beside autocast."""
    fsdp_reduce_dtype: str | None = None
    """FSDP2 mixed precision: dtype of the gradient reduce-scatter."""
    fsdp_prefetch: int = 1
    """FSDP2: blocks whose all-gather each block issues ahead of use, in forward and in backward.
    1 is FSDP2's own overlap (the next block); 2 or more prefetch explicitly
    (``set_modules_to_forward_prefetch``/``_backward_``): more overlap, more memory reserved.
    Ignored without FSDP2."""
    steps: int = 5
    """Optimizer steps in all, warm-up included."""
    warmup_steps: int = 1
    """Leading steps left out of the timing (allocator, lazy init, compilation)."""
    seed: int = 0
    """Seeds the weights and the synthetic data; the same on every rank."""
    lr: float = 1e-2
    """AdamW learning rate (high enough that a few steps show the loss fall)."""
    count_flops: bool = True
    """Count the FLOP of the first warm-up step (:class:`perfkit.measuring.ops.counting.OpCounter`) for the
    counted-FLOP utilisation; needs ``warmup_steps >= 1`` and no ``compile``."""
    address_space_headroom_bytes: int | None = None
    """Cap each rank's address space (RLIMIT_AS) at its size after start-up plus this many bytes,
    to find an OOM edge on CPU without the kernel's OOM killer; forces separate processes."""
    data_delay_s: float = 0.0
    """Seconds each batch fetch waits on top of drawing the batch: an input pipeline this slow.
    The fetch is outside the timed step and inside the trace's ``data_wait`` span."""
    memory_breakdown: bool = False
    """Track the last warm-up step's memory per rank by category and by block
    (:mod:`perfkit.measuring.training.memory_fit`), and predict it on fake tensors beside it:
    ``memory_tracked_*`` and ``memory_predicted_*`` columns. Needs ``warmup_steps >= 3``: the
    tracker slows the step it tracks, so it tracks one that is not timed, in the steady state
    (optimizer state made by the first step, DDP's buckets rebuilt by the second)."""
    memory_snapshot: bool = False
    """CUDA/ROCm: record every allocation with its Python stack from before the model is built
    (:mod:`perfkit.measuring.ops.memory_snapshot`), dump ``rank<r>.pickle`` at the end and
    ``rank<r>-oom.pickle`` at an out-of-memory error into ``memory_snapshot_dir``; the row links
    them and carries the peak and the stacks holding the most at it. CPU: the row is ``skipped``
    (the CPU has no caching allocator to record)."""
    memory_snapshot_max_entries: int = 100_000
    """The snapshot's ring of alloc/free events (older ones are overwritten; several KB each)."""
    memory_snapshot_dir: str | None = None
    """Where the snapshots go; None: beside the configuration's traces, ``DIR/traces/<config_id>/``."""
    profile: bool = False
    """Record a ``torch.profiler`` trace per rank of ``profile_active_steps`` steps after the
    warm-up (:mod:`perfkit.measuring.ops.trace_capture`); its steps are timed like the others."""
    profile_active_steps: int = 2
    """Steps the trace records (after one profiler warm-up step)."""
    pp_schedule: str = "1F1B"
    """pp: ``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble`` or ``ZBVZeroBubble``
    (torch.distributed.pipelining's schedules). Ignored unless parallelism is ``pp``."""
    n_microbatches: int = 4
    """pp: microbatches m per step; the global batch splits into m equal ones."""
    stages_per_rank: int = 1
    """pp: stages v on each rank: 1 for GPipe and 1F1B, 2 or more for the interleaved schedules,
    2 for ZBVZeroBubble."""
    stage_delay_s: float = 0.0
    """pp, test aid: seconds every stage forward and backward sleeps first (CPU only), so the
    stage cost is known and the bubble's shape shows through a shared CPU's noise."""
    trace_dir: str | None = None
    """Where the traces go (``rank<r>.json.gz``); None: beside the configuration's results,
    ``DIR/traces/<config_id>/``."""

    def __post_init__(self):
        object.__setattr__(self, "model_size", dict(self.model_size))
        catalog.family_of(self.model)  # a name of one of the families, or BadInputError
        checks.one_of("precision", self.precision, PRECISIONS)
        checks.one_of("parallelism", self.parallelism, parallel.PARALLELISMS)
        checks.one_of("device", self.device, ("auto", "cpu", "cuda"))
        checks.one_of("comm_hook", self.comm_hook, ("none", "fp16", "bf16"))
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
        self._check_reshard()
        if self.batch_size % self.dp_size:
            raise BadInputError(f"batch_size {self.batch_size} does not split over "
                                f"{self.dp_size} data-parallel ranks")
        if self.compile_mode is not None and not self.compile:
            raise BadInputError("compile_mode is set but compile is False")
        if self.comm_hook != "none" and self.parallelism not in ("ddp", "zero1"):
            raise BadInputError("comm_hook applies to the DDP parallelisms 'ddp' and 'zero1' only")
        if ((self.fsdp_param_dtype or self.fsdp_reduce_dtype)
                and self.parallelism not in parallel.FSDP_FAMILY):
            raise BadInputError(f"fsdp_param_dtype/fsdp_reduce_dtype apply to {parallel.FSDP_FAMILY} only")
        compute_dtype_of(self.precision, self.fsdp_param_dtype)  # refuses two dtype choices at once
        if not self.lr > 0 or (self.address_space_headroom_bytes or 1) < 1:
            raise BadInputError("lr and address_space_headroom_bytes must be positive")
        if not self.data_delay_s >= 0:
            raise BadInputError(f"data_delay_s must be ≥ 0 seconds, got {self.data_delay_s!r}")
        if self.profile and self.steps - self.warmup_steps < 1 + self.profile_active_steps:
            raise BadInputError(f"profile needs steps ≥ warmup_steps + 1 + profile_active_steps "
                                f"({self.warmup_steps} + 1 + {self.profile_active_steps}), got steps={self.steps}")
        checks.integer_at_least("fsdp_prefetch", self.fsdp_prefetch, 1)
        if self.memory_snapshot_max_entries < 1:
            raise BadInputError(f"memory_snapshot_max_entries must be ≥ 1, got {self.memory_snapshot_max_entries}")
        if self.memory_breakdown and self.warmup_steps < 3:
            raise BadInputError(f"memory_breakdown tracks the last warm-up step, in the steady state (the "
                                f"optimizer's state made, DDP's buckets rebuilt): set warmup_steps ≥ 3, "
                                f"got {self.warmup_steps}")
        if self.parallelism == "pp":
            self._check_pp()
        elif self.stage_delay_s:
            raise BadInputError("stage_delay_s applies to parallelism 'pp' only")
        spec = workload_spec(self)  # unknown or bad size names fail here, before any work
        catalog.check(spec)  # a user's model: imports, builds (on the meta device), has what it needs
        if isinstance(spec, UserModelSpec) and spec.family == "entry" and self.dp_size > 1:
            catalog.meta(spec).check_split(self.batch_size, self.dp_size)  # its batch splits over the ranks
        if self.parallelism in ("tp", "fsdp_tp") and not isinstance(spec, UserModelSpec):
            _check_tp(spec, self.tp_size)

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: ``dp_degree``, or what the parallelism implies."""
        return self._layout()[0]

    @property
    def tp_size(self) -> int:
        """Tensor-parallel ranks: ``tp_degree``, or what the parallelism implies."""
        return self._layout()[1]

    @property
    def reshard(self) -> bool:
        """FSDP2's ``reshard_after_forward``: as set, else the stage's (False for zero2 only)."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.parallelism != "zero2"

    @property
    def compute_dtype(self) -> str:
        """The dtype the step's matmuls run in (:func:`compute_dtype_of`): MFU's peak, the
        activation model, FSDP2's gather bytes and the ``compute_dtype`` column all use it."""
        return compute_dtype_of(self.precision, self.fsdp_param_dtype)

    def _layout(self) -> tuple[int, int]:
        """(dp, tp) ranks; raises BadInputError when dp_degree/tp_degree contradict the parallelism."""
        p, n, dp, tp = self.parallelism, self.world_size, self.dp_degree, self.tp_degree
        for name, value in (("dp_degree", dp), ("tp_degree", tp)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise BadInputError(f"{name} must be a positive int or None, got {value!r}")
        if p == "fsdp_tp":
            if dp is None and tp is None:
                raise BadInputError("fsdp_tp needs tp_degree (or dp_degree): how the world_size "
                                    "ranks form the (dp, tp) mesh")
            dp = dp if dp is not None else n // tp
            tp = tp if tp is not None else n // dp
            if dp * tp != n:
                raise BadInputError(f"fsdp_tp: dp_degree {dp} × tp_degree {tp} must equal world_size {n}")
            return dp, tp
        implied = {"none": (1, 1), "tp": (1, n), "pp": (1, 1)}.get(p, (n, 1))
        if (dp is not None and dp != implied[0]) or (tp is not None and tp != implied[1]):
            raise BadInputError(f"parallelism {p!r} on {n} ranks means dp_degree {implied[0]}, "
                                f"tp_degree {implied[1]}; got {dp}, {tp} (set them with fsdp_tp)")
        return implied

    def _check_reshard(self) -> None:
        p, raf = self.parallelism, self.reshard_after_forward
        if (p, raf) in (("zero2", True), ("zero3", False)):
            raise BadInputError(f"{p} means reshard_after_forward={not raf}; leave it None "
                                "(fsdp and fsdp_tp take either)")

    def _check_pp(self) -> None:
        checks.one_of("pp_schedule", self.pp_schedule, tuple(pipeline_bubble.SCHEDULES))
        for name in ("n_microbatches", "stages_per_rank"):
            checks.integer_at_least(name, getattr(self, name), 1)
        pipeline_bubble.check_schedule(self.pp_schedule, self.stages_per_rank)  # v it can hold
        checks.seconds_at_least_zero("stage_delay_s", self.stage_delay_s)
        # What the pipeline step (perfkit.measuring.training.pipeline) does not do: each a clear refusal.
        unsupported = {"precision": self.precision not in PP_PRECISIONS, "compile": self.compile,
                       "activation_checkpointing": self.activation_checkpointing,
                       "address_space_headroom_bytes": self.address_space_headroom_bytes is not None}
        if bad := [name for name, set_ in unsupported.items() if set_]:
            raise BadInputError(f"parallelism 'pp' runs precision {PP_PRECISIONS} without "
                                f"{', '.join(k for k in unsupported if k != 'precision')}; "
                                f"unset {', '.join(bad)} (precision is {self.precision!r})")

    def as_dict(self) -> dict:
        """JSON-ready fields (what :func:`train_rank` takes)."""
        return asdict(self)

    def as_row(self) -> dict:
        """Fields as results columns; ``model_size`` flattened to ``model_<name>`` columns."""
        row = self.as_dict()
        row.update({f"model_{k}": json.dumps(v) if isinstance(v, (list, tuple)) else v
                    for k, v in row.pop("model_size").items()})
        row["compute_dtype"] = self.compute_dtype
        return row


def compute_dtype_of(precision_name: str, fsdp_param_dtype: str | None) -> str:
    """The matmul dtype of a step of ``precision_name`` with FSDP2's ``fsdp_param_dtype``, as a
    :data:`~perfkit.core.specs.PRECISION_PEAK_KEY` name (``fp32``, ``tf32``, ``bf16``, ``fp16``,
    ``fp8``); :class:`BadInputError` where two knobs each pick it.

    FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` gathers the weights in that dtype and casts
    each sharded module's floating-point forward inputs to it (``cast_forward_inputs``), so fp32
    and tf32 steps with 16-bit gathers compute in 16 bits, as torchtitan trains (fp32 shards,
    bf16 compute; the fp32 matmul mode then has no matmul left to act on). fp8 stays fp8: torchao
    casts each Linear's operands itself, whatever the gathered dtype. Refused: 16-bit gathers
    under bf16/fp16 autocast (autocast re-casts every gathered weight, so two knobs fight over
    the matmul dtype and over which copies are saved: choose precision fp32 with
    fsdp_param_dtype, or autocast alone), and bf16-pure gathered in another dtype (it would not
    be bf16-pure).
    """
    own = {"bf16-pure": "bf16"}.get(precision_name, precision_name)
    parallel.dtype_from_name(fsdp_param_dtype)  # a dtype perfkit knows, or BadInputError
    gathered = {"bfloat16": "bf16", "float16": "fp16"}.get(fsdp_param_dtype)
    if precision_name == "bf16-pure" and fsdp_param_dtype not in (None, "bfloat16"):
        raise BadInputError(f"precision bf16-pure with fsdp_param_dtype {fsdp_param_dtype!r}: "
                            "bf16-pure gathers its bf16 weights as they are; leave fsdp_param_dtype None")
    if precision_name in ("bf16", "fp16") and gathered is not None:
        raise BadInputError(f"precision {precision_name} (autocast) with fsdp_param_dtype "
                            f"{fsdp_param_dtype!r}: two knobs pick the matmul dtype; use precision "
                            f"fp32 with fsdp_param_dtype {fsdp_param_dtype!r} (FSDP2 mixed "
                            f"precision) or precision {precision_name} alone")
    if precision_name in ("fp32", "tf32") and gathered is not None:
        return gathered
    return own


def check_params(params: Mapping[str, object]) -> None:
    """The value check of notebooks/train_step.ipynb (its metadata ``perfkit.check``): raise
    :class:`BadInputError` when its parameters make no valid :class:`TrainConfig`. Parameters that
    are not fields (``timeout_s``) are left out."""
    from dataclasses import fields

    names = {f.name for f in fields(TrainConfig)}
    TrainConfig(**{k: v for k, v in params.items() if k in names})


def workload_spec(cfg: TrainConfig) -> workloads.WorkloadSpec | UserModelSpec:
    """The spec of the workload ``cfg`` trains (:func:`perfkit.measuring.workloads.catalog.make`):
    ``model_size`` over the workload's defaults, with the config's ``seed`` and ``seq_len`` (the
    transformer's, a text model's)."""
    return catalog.make(cfg.model, cfg.model_size, seed=cfg.seed, seq_len=cfg.seq_len,
                        model_path=cfg.model_path)


def pipeline_input_reason(name: str, inputs) -> str | None:
    """Why a batch's ``inputs`` cannot enter a pipeline's first stage (one tensor), or None."""
    if isinstance(inputs, torch.Tensor):
        return None
    return f"pp on {name}: stages pass one tensor, and its make_batch gives the inputs as a {type(inputs).__name__}"


def user_model_skip_reason(cfg: TrainConfig, spec: UserModelSpec) -> str | None:
    """Why a user's model cannot take ``cfg``'s settings (decided from the model built on the
    meta device, before any rank starts), or None."""
    work = catalog.meta(spec)
    if cfg.parallelism == "pp" and work.stage is None:
        return (f"pp on {spec.name}: perfkit splits its own models, llama-style Hugging Face "
                "decoders (embed_tokens, layers, norm, rotary_emb, an untied lm_head) and entry "
                f"points that name their stem, blocks and head into stages; {spec.name} is none of these")
    if cfg.parallelism == "pp" and work.loss_fn is None:
        return f"pp on {spec.name}: the last stage's output goes to a loss_fn, and the entry point gives none"
    if cfg.parallelism == "pp" and spec.family == "entry":
        try:  # the user's make_batch on the meta build: it may mix meta and CPU tensors and fail
            inputs = work.make_batch(1, seed=cfg.seed)[0]
        except Exception:  # noqa: BLE001 - undecided here; pipeline_rank checks the real batch
            inputs = None
        if inputs is not None and (reason := pipeline_input_reason(spec.name, inputs)):
            return reason
    if cfg.parallelism in ("tp", "fsdp_tp"):
        if not work.tp_plan:
            return f"{spec.name} has no tensor-parallel plan (an entry point's tp_plan, a Hugging Face family's _tp_plan)"
        config = getattr(work.model, "config", None)
        for field_name in ("num_attention_heads", "num_key_value_heads"):
            heads = getattr(config, field_name, None)
            if heads is not None and heads % cfg.tp_size:
                return f"tensor parallel over {cfg.tp_size} ranks needs {field_name} divisible by it, got {heads}"
    if cfg.activation_checkpointing and not work.block_names:
        return f"activation checkpointing wraps the model's blocks, and {spec.name} names none"
    return None


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


def config_device(cfg: TrainConfig) -> str:
    """The device kind ``cfg`` runs on: ``auto`` resolved to ``cuda`` or ``cpu``."""
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
    device = config_device(cfg)
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
    if cfg.memory_snapshot and (reason := mem_snapshot.skip_reason(device)):
        raise ConfigurationSkipped(reason)
    if cfg.precision == "fp8":
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            raise ConfigurationSkipped("fp8 training needs torchao (torchao.float8)") from None
    if cfg.parallelism in ("ddp", "zero1"):
        parallel.check_comm_hook(cfg.comm_hook, "nccl" if device == "cuda" else "gloo")
    spec = workload_spec(cfg)
    if isinstance(spec, UserModelSpec) and (reason := user_model_skip_reason(cfg, spec)):
        raise ConfigurationSkipped(reason)
    if cfg.parallelism == "pp" and (reason := pipeline_stages.skip_reason(
            cfg, blocks=pipeline_stages.n_blocks(workload_spec(cfg)), device=device)):
        raise ConfigurationSkipped(reason)
