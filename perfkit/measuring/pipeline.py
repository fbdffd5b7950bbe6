"""Pipeline-parallel training with ``torch.distributed.pipelining``: one configuration, one row.

The workload's model (:mod:`perfkit.measuring.models`: a stem, ``blocks``, a head) is cut at
block boundaries into ``world_size × stages_per_rank`` stages of as-equal block counts; the
first stage also runs the stem, the last the head and the loss. Every rank builds the whole
model from the seed (the same weights as one process) and keeps its stages. Looped schedules put
stages r, r + p, ... on rank r; the V schedule (ZBVZeroBubble) stages r and 2p − 1 − r.

Every step draws global batch ``step`` exactly as :mod:`perfkit.measuring.training` does, the
schedule splits it into ``n_microbatches`` equal microbatches, and the loss of each microbatch is
its mean; the schedule divides the gradients by the microbatch count (``scale_grads``), so the
gradient is the global-batch mean, as in one process, up to the order of the additions. The
step's loss is the mean of the microbatch losses (= the global-batch mean: equal microbatches).
AdamW (per-parameter, so per stage) steps each rank's parameters. The convnet's BatchNorm
normalizes over a microbatch, not the batch: its trajectory is not the single process's.

Timing (per step, every rank): a barrier, the schedule's step, a barrier, the optimizer step.
The step time is the slowest rank's barrier-to-optimizer-done; the pipeline window is the span
between the two barriers, the same on every rank; inside it each rank records the wall interval
of every stage forward and backward computation (``forward_maybe_with_nosync`` and
``backward_maybe_with_nosync`` of its stages: the submodule forward and the autograd backward;
on CUDA, events around them). The bubble is computed from those by
:func:`perfkit.analyse.pipeline_bubble.measured_bubble_fraction` (the definition is there).

``stage_delay_s`` (tests): every stage forward and every full backward sleeps that long first
(a split zero-bubble backward: half in its input part, half in its weight part), so the stage
cost is known and the bubble's shape shows through the noise of a shared CPU.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from perfkit.analyse import pipeline_bubble
from perfkit.core import precision as precision_policy
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.core.status import OK, SKIPPED
from perfkit.core.timing import Measurement
from perfkit.measuring import pipeline_stages as ps
from perfkit.measuring import workloads
from perfkit.measuring.train_config import WORKLOAD, workload_spec

__all__ = ["PipelineConfig", "PP_SCHEDULES", "skip_reason", "pipeline_rank", "run_pipeline"]

#: ``pp_schedule`` values: torch.distributed.pipelining's schedule names.
PP_SCHEDULES = tuple(pipeline_bubble.SCHEDULES)
_PRECISIONS = ("fp32", "tf32", "bf16")
_OWN_SIZE_KEYS = ("seq_len", "seed")


@dataclass(kw_only=True, frozen=True)
class PipelineConfig:
    """One pipeline-parallel training configuration; every field is a column of the row."""

    model: str = "transformer"
    """``mlp``, ``transformer`` or ``convnet`` (:mod:`perfkit.measuring.workloads`)."""
    model_size: Mapping[str, object] = field(default_factory=dict)
    """Size fields of the workload's config (as :class:`~perfkit.measuring.train_config.TrainConfig`)."""
    batch_size: int = 16
    """Global batch in samples, split into ``n_microbatches`` equal microbatches."""
    seq_len: int = 32
    """Tokens per sequence (transformer only)."""
    precision: str = "fp32"
    """``fp32``, ``tf32`` (CUDA) or ``bf16`` (autocast around each stage's forward)."""
    steps: int = 5
    """Optimizer steps in all, warm-up included."""
    warmup_steps: int = 1
    """Leading steps left out of the timing (the first holds the stages' shape inference)."""
    seed: int = 0
    """Seeds the weights and the synthetic data, the same on every rank."""
    lr: float = 1e-2
    """AdamW learning rate."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``auto``."""
    world_size: int = 2
    """Ranks p, each holding ``stages_per_rank`` stages."""
    pp_schedule: str = "1F1B"
    """``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble`` or ``ZBVZeroBubble``."""
    n_microbatches: int = 4
    """Microbatches m per step."""
    stages_per_rank: int = 1
    """Stages v on each rank: 1 for GPipe and 1F1B, 2 or more for the interleaved schedules,
    2 for ZBVZeroBubble."""
    stage_delay_s: float = 0.0
    """Test aid: seconds every stage forward and backward sleeps first (CPU only)."""

    def __post_init__(self):
        object.__setattr__(self, "model_size", dict(self.model_size))
        for name, value, choices in (("model", self.model, workloads.NAMES),
                                     ("precision", self.precision, _PRECISIONS),
                                     ("device", self.device, ("auto", "cpu", "cuda")),
                                     ("pp_schedule", self.pp_schedule, PP_SCHEDULES)):
            if value not in choices:
                raise BadInputError(f"{name} must be one of {choices}, got {value!r}")
        if set(self.model_size) & set(_OWN_SIZE_KEYS):
            raise BadInputError(f"set {sorted(set(self.model_size) & set(_OWN_SIZE_KEYS))} on the "
                                "PipelineConfig, not in model_size")
        ints = {"batch_size": self.batch_size, "seq_len": self.seq_len, "steps": self.steps,
                "world_size": self.world_size, "n_microbatches": self.n_microbatches,
                "stages_per_rank": self.stages_per_rank}
        for name, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BadInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise BadInputError(f"need 0 <= warmup_steps < steps, got {self.warmup_steps}, {self.steps}")
        if not self.lr > 0:
            raise BadInputError(f"lr must be positive, got {self.lr!r}")
        if not self.stage_delay_s >= 0:
            raise BadInputError(f"stage_delay_s must be >= 0 seconds, got {self.stage_delay_s!r}")
        workload_spec(self)  # unknown or bad size names fail here, before any work

    @property
    def n_stages(self) -> int:
        return self.world_size * self.stages_per_rank

    def as_dict(self) -> dict:
        """JSON-ready fields (what :func:`pipeline_rank` takes)."""
        return asdict(self)

    def as_row(self) -> dict:
        """Fields as columns (``model_size`` flattened to ``model_<name>``), ``parallelism = pp``."""
        row = {**self.as_dict(), "parallelism": "pp"}
        row.update({f"model_{k}": v for k, v in row.pop("model_size").items()})
        return row


def _device_kind(cfg: PipelineConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


#: Schedule -> why it is skipped on gloo, for schedules whose batched send/recv hangs there
#: (PiPPy#944: ``batch_isend_irecv`` had no stable gloo implementation). Empty for torch 2.13:
#: every schedule here finishes on gloo (2 and 3 ranks, 1 to 8 microbatches), after
#: pytorch/pytorch#152938 (``_batch_p2p`` waits on every gloo work) and 2.13's ``_batch_p2p``
#: sending homogeneous batches uncoalesced. tests/test_pipeline.py runs each schedule under a
#: timeout and fails when one hangs: add it here, with the reason, when a torch brings one back.
GLOO_HANGS: dict[str, str] = {}


def skip_reason(cfg: PipelineConfig) -> str | None:
    """Why ``cfg`` cannot run (here, or at all), or None; decided before anything is launched."""
    schedule, p, v, m = cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, cfg.n_microbatches
    if cfg.batch_size % m:
        return f"batch_size {cfg.batch_size} does not split into {m} equal microbatches"
    needed = pipeline_bubble.SCHEDULES[schedule]
    if needed == 1 and v != 1:
        return f"{schedule} runs one stage per rank; stages_per_rank is {v}"
    if needed is None and v < 2:
        return f"{schedule} interleaves several stages per rank; set stages_per_rank >= 2 (got {v})"
    if needed is not None and needed > 1 and v != needed:
        return f"{schedule} needs exactly {needed} stages per rank, got {v}"
    if schedule == "1F1B" and m < p:  # torch's Schedule1F1B refuses it
        return f"1F1B needs n_microbatches >= stages ({p}), got {m}"
    if needed != 1:
        rounds = max(1, m // p)  # torch's interleaved schedules: m must split into rounds of ~p
        if m % rounds:
            return f"{schedule} needs n_microbatches a multiple of max(1, m // p) = {rounds}, got {m}"
    blocks = ps.n_blocks(workload_spec(cfg))
    if blocks < cfg.n_stages:
        return (f"the {cfg.model} has {blocks} blocks, fewer than the {cfg.n_stages} stages "
                f"({p} ranks × {v}); give it more layers")
    device = _device_kind(cfg)
    if device == "cpu":
        if cfg.precision == "tf32":
            return "tf32 needs GPU tensor cores; the device is CPU"
        if schedule in GLOO_HANGS:
            return GLOO_HANGS[schedule]
    else:
        if not torch.cuda.is_available():
            return "device 'cuda' requested but no CUDA/ROCm device is visible"
        if p > torch.cuda.device_count():
            return f"world_size {p} > {torch.cuda.device_count()} GPUs on this node"
        if cfg.stage_delay_s:
            return "stage_delay_s is a host sleep: on a GPU it delays launches, not stage compute"
        if cfg.precision == "bf16" and not torch.cuda.is_bf16_supported():
            return "this GPU has no bfloat16 support"
        if cfg.precision == "tf32" and not torch.version.hip and torch.cuda.get_device_capability(0) < (8, 0):
            return "tf32 needs sm_80+"
        if reason := precision_policy.support_reason(cfg.precision, "cuda:0"):
            return reason
    return None


# ---- one rank ----------------------------------------------------------------------------------


def _batch_seed(cfg: PipelineConfig, step: int) -> int:
    # The draw of perfkit.measuring.training's global batch `step` (its _batch_seed): the same
    # batches as the single-process run, which the loss-parity test compares against.
    return cfg.seed * 2**32 + step


def pipeline_rank(config: dict) -> dict:
    """:func:`perfkit.run.launch.launch` target: one rank of ``PipelineConfig(**config)``."""
    import torch.distributed as dist
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    cfg = PipelineConfig(**config)
    if reason := skip_reason(cfg):
        raise ConfigurationSkipped(reason)
    rank = dist.get_rank()
    cuda = _device_kind(cfg) == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    work = workloads.build(workload_spec(cfg), device=device)
    timeline = ps.Timeline(device)
    autocast = torch.bfloat16 if cfg.precision == "bf16" else None
    bounds, stage_cls = ps.stage_bounds(ps.n_blocks(work.spec), cfg.n_stages), ps.timed_stage_class()
    stages, mine = [], ps.rank_stage_indices(cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, rank)
    for index in mine:
        module = ps.StageModule(work.model, *bounds[index], first=index == 0,
                                last=index == cfg.n_stages - 1, autocast=autocast)
        stages.append(stage_cls(module, index, cfg.n_stages, device, timeline=timeline,
                                delay_s=cfg.stage_delay_s))
    schedule_cls = get_schedule_class(cfg.pp_schedule)
    single = issubclass(schedule_cls, PipelineScheduleSingle)
    # The loss in fp32 whatever the compute dtype; the mean per microbatch, as scale_grads expects.
    loss_fn = lambda out, target: work.loss_fn(out.float(), target)  # noqa: E731
    schedule = schedule_cls(stages[0] if single else stages, n_microbatches=cfg.n_microbatches,
                            loss_fn=loss_fn)
    params = [q for s in stages for q in s.submod.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    has_first, has_last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses, step_s, window_s, timelines = [], [], [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with precision_policy.math_mode(cfg.precision):
        for step in range(cfg.steps):
            inputs, target = work.make_batch(cfg.batch_size, seed=_batch_seed(cfg, step), device=device)
            optimizer.zero_grad(set_to_none=True)
            mb_losses: list[torch.Tensor] = []
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            timeline.start()
            schedule.step(*((inputs,) if has_first else ()), target=target if has_last else None,
                          losses=mb_losses)
            sync()
            dist.barrier()
            intervals, window = timeline.stop()
            optimizer.step()
            sync()
            elapsed = time.perf_counter() - t0
            if has_last:
                losses.append(torch.stack(mb_losses).float().mean().item())
            if step >= cfg.warmup_steps:
                step_s.append(elapsed)
                window_s.append(window)
                timelines.append(intervals)
    # ru_maxrss: KiB on Linux, the process's whole life (as perfkit.measuring.training measures it).
    peak = (torch.cuda.max_memory_allocated(device) if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"rank": rank, "stages": mine, "losses": losses,
            "step_time_samples_s": step_s, "window_samples_s": window_s, "intervals": timelines,
            "n_params": work.n_params, "stage_params": sum(q.numel() for q in params),
            "tokens_per_sample": work.tokens_per_sample, "peak_mem_bytes": peak, "device": device.type}


# ---- the row -----------------------------------------------------------------------------------


def _row(cfg: PipelineConfig, ranks: list[dict]) -> dict:
    per_step = [max(times) for times in zip(*(r["step_time_samples_s"] for r in ranks))]
    timing = Measurement(samples_s=tuple(per_step), warmup_calls=cfg.warmup_steps,
                         label=f"{cfg.model} pp {cfg.pp_schedule} step").as_row("step_time")
    bubbles = [pipeline_bubble.measured_bubble_fraction([r["intervals"][i] for r in ranks],
                                                        [(0.0, r["window_samples_s"][i]) for r in ranks])
               for i in range(len(per_step))]
    per_rank = [statistics.median(pipeline_bubble.rank_bubble_fraction(iv, (0.0, w))
                                  for iv, w in zip(r["intervals"], r["window_samples_s"])) for r in ranks]
    losses = next(r["losses"] for r in ranks if r["losses"])
    first, step_s = ranks[0], timing["step_time_s"]
    tokens = cfg.batch_size * first["tokens_per_sample"] if first["tokens_per_sample"] else math.nan
    return {
        **cfg.as_row(), "workload": WORKLOAD, "status": OK, "error": None, **timing,
        "samples_per_s": cfg.batch_size / step_s, "tokens_per_s": tokens / step_s,
        "pipeline_time_s": statistics.median(max(w) for w in zip(*(r["window_samples_s"] for r in ranks))),
        "bubble_fraction": statistics.median(bubbles),
        "bubble_fraction_samples": bubbles,
        "bubble_fraction_per_rank": per_rank,
        "bubble_fraction_predicted": pipeline_bubble.predicted_bubble_fraction(
            cfg.pp_schedule, cfg.world_size, cfg.n_microbatches, cfg.stages_per_rank),
        "bubble_fraction_predicted_reason": pipeline_bubble.prediction_reason(cfg.pp_schedule),
        "pp_stages": cfg.n_stages,
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "loss_fell": bool(losses[-1] < losses[0]),
        "n_params": first["n_params"],
        "stage_params_per_rank": [r["stage_params"] for r in ranks],
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in ranks),
        "peak_mem_kind": "cuda_max_allocated" if first["device"] == "cuda" else "cpu_max_rss",
        "resolved_device": first["device"],
    }


def run_pipeline(cfg: PipelineConfig, timeout_s: float = 600.0) -> dict:
    """Run ``cfg`` on ``world_size`` ranks and return one row whatever happens: ``status`` ok,
    skipped (the reason in ``error``, decided before launching), failed, oom, timeout, killed."""
    from perfkit.run.launch import launch

    base = {**cfg.as_row(), "workload": WORKLOAD, "error": None,
            "bubble_fraction_predicted": pipeline_bubble.predicted_bubble_fraction(
                cfg.pp_schedule, cfg.world_size, cfg.n_microbatches, cfg.stages_per_rank)}
    if reason := skip_reason(cfg):
        return {**base, "status": SKIPPED, "error": reason}
    device = _device_kind(cfg)
    result = launch("perfkit.measuring.pipeline:pipeline_rank", cfg.as_dict(), world_size=cfg.world_size,
                    backend="nccl" if device == "cuda" else "gloo", timeout_s=timeout_s, device=device)
    if result.status != OK:
        return {**base, "status": result.status, "error": result.error, "failed_rank": result.failed_rank}
    return _row(cfg, list(result.rank_results))
