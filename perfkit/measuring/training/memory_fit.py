"""Will it fit? A training step's memory per rank by category and by module, measured on the real
step or predicted before any device is used by running the same step on fake tensors.

**The step** is perfkit's own (:mod:`perfkit.measuring.training.step`: built, checkpointed and wrapped by
:func:`~perfkit.measuring.training.step_setup.prepare`, AdamW, autocast, the loss in fp32), in its steady state: the
optimizer's state exists and ``zero_grad(set_to_none=True)`` freed the last gradients. One step is tracked by torch's
``MemTracker`` (``FSDPMemTracker`` under FSDP2; ``torch.distributed._tools``), which follows
every tensor storage the step creates and frees at dispatch and names its category from the
module and optimizer hooks. ``peak_bytes`` is the most live tensor bytes at any moment of the
step; ``at_peak`` splits that moment into :data:`CATEGORIES` (they sum to the peak).

**Predicted** (:func:`predict`): the same step on a ``FakeTensorMode`` model (shapes, dtypes and strides, no
storage: a 7B model costs the host a few hundred MB and tens of seconds), in a ``fake`` process group as rank 0 of
``world_size`` (FSDP2's rank 0 holds the largest shards), so FSDP2's sharding, all-gathers and reshard are its real
code. DDP is not constructed on fake tensors (it checks parameters across ranks); its step is the unwrapped one,
plus the reducer's buckets, held from construction on: the parameters' bytes again (``gradient_as_bucket_view``
makes the gradients those buckets' views). ``zero1`` is that step with the real ``ZeroRedundancyOptimizer`` over
the fake world: rank 0's partition of the optimizer state. Not modelled: ``tp``, ``fsdp_tp``, ``pp``, fp8, compile;
a GPU allocator's caching and rounding (the device holds more than the tensors), the CUDA context, NCCL's buffers.

**The largest batch that fits**: :mod:`perfkit.measuring.training.memory_edge`, from these predictions.

**Per module** (:class:`ModuleMemory`): each module's parameter bytes (as held on this rank) and the bytes its
forward leaves alive (what it saved for backward, and its output); the top ``top`` blocks by their sum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from perfkit.core.errors import BadInputError

__all__ = ["CATEGORIES", "PHASES", "FIT_PARALLELISMS", "ModuleMemory", "StepMemory", "fit_reason", "predict",
           "predict_elsewhere", "step_tracker", "tracking", "row_columns", "ddp_bucket_bytes"]

#: The categories a peak splits into, in the order reports stack them.
CATEGORIES = ("parameters", "gathered_parameters", "gradients", "optimizer_state", "activations",
              "temporaries", "inputs", "communication_buffers", "other")
#: The phases of a step whose peaks are kept apart.
PHASES = ("forward", "backward", "optimizer")
#: MemTracker's / FSDPMemTracker's reference types -> perfkit's categories.
_CATEGORY_OF = {"Parameter": "parameters", "Sharded Param": "parameters", "Buffer": "other",
                "Unsharded Param": "gathered_parameters", "All Gather": "gathered_parameters",
                "Gradient": "gradients", "Sharded Grad": "gradients", "Unsharded Grad": "gradients",
                "Activation": "activations", "Temp": "temporaries", "Inputs": "inputs",
                "Optstate": "optimizer_state", "OptState": "optimizer_state",
                "Reduce Scatter": "communication_buffers", "Other": "other"}
#: The categories that grow with the per-rank batch (at a fixed sequence length).
BATCH_SCALED = ("activations", "temporaries", "inputs")
#: Parallelisms the fake step models.
FIT_PARALLELISMS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True, kw_only=True)
class ModuleMemory:
    """One module's share: ``param_bytes`` held on this rank, ``forward_retained_bytes`` its
    forward left alive (saved for backward, and its output)."""

    name: str
    param_bytes: int
    forward_retained_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.forward_retained_bytes


@dataclass(frozen=True, kw_only=True)
class StepMemory:
    """One rank's tracked training step: its peak and what held it."""

    peak_bytes: int
    """The most live tensor bytes at any moment of the step. Tracked, DDP's buckets count from the
    moment backward first writes each (they were allocated in C++ before the tracker started:
    ``memory_ddp_bucket_bytes`` is the most this can miss); predicted, they count throughout."""
    at_peak: dict[str, int]
    """:data:`CATEGORIES` at the moment of the peak, summing to ``peak_bytes``."""
    modules: tuple[ModuleMemory, ...] = ()
    """The top blocks by parameter plus forward-retained bytes, largest first."""
    phase_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    """The peak within each of :data:`PHASES` (forward with the loss, backward, the optimizer's
    step); the largest is ``peak_bytes``."""
    seconds: float = math.nan
    """Wall time the tracked (or faked) step took, setup included for a prediction."""
    garbage_collected_bytes: int = 0
    """Tensor bytes only Python's cyclic garbage held when the optimizer's step began (collected then)."""

    @property
    def batch_scaled_bytes(self) -> int:
        """The bytes at the peak that grow with the per-rank batch (:data:`BATCH_SCALED`)."""
        return sum(self.at_peak.get(c, 0) for c in BATCH_SCALED)

    def columns(self, prefix: str) -> dict:
        """Row columns: ``{prefix}peak_bytes``, ``{prefix}<category>_bytes`` and the top modules."""
        return {f"{prefix}peak_bytes": self.peak_bytes,
                **{f"{prefix}{c}_bytes": self.at_peak.get(c, 0) for c in CATEGORIES},
                **{f"{prefix}peak_{p}_bytes": self.phase_peak_bytes.get(p, math.nan) for p in PHASES},
                f"{prefix}garbage_collected_bytes": self.garbage_collected_bytes,
                f"{prefix}top_modules": [dataclasses.asdict(m) for m in self.modules]}


def fit_reason(cfg) -> str | None:
    """Why the fake step cannot predict ``cfg`` (a TrainConfig), or None when it can."""
    if cfg.parallelism not in FIT_PARALLELISMS:
        return (f"parallelism {cfg.parallelism!r} is not modelled on fake tensors "
                f"(modelled: {', '.join(FIT_PARALLELISMS)})")
    if cfg.precision == "fp8":
        return "fp8 (torchao's float8 training) is not modelled on fake tensors"
    if cfg.compile:
        return "torch.compile is not modelled: the prediction is of the eager step"
    return None


# ------------------------------------------------------------------------------ the tracker


def _category_bytes(snapshot: dict) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for dev_snap in snapshot.values():
        for kind, nbytes in dev_snap.items():
            name = getattr(kind, "value", kind)
            if name != "Total":
                out[_CATEGORY_OF.get(name, "other")] += int(nbytes)
    return out


def ddp_bucket_bytes(model) -> int:
    """The bytes of DDP's gradient buckets (the reducer's, allocated at construction and held
    for the model's life), from DDP's own logging data; 0 for a model that is not DDP."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return 0
    sizes = model._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(s) for s in str(sizes).split(",") if s.strip())


def _held_bytes(module) -> int:
    """The bytes of ``module``'s parameters this rank holds (a DTensor's local shard)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in module.parameters()]
    return sum(t.numel() * t.element_size() for t in local)


def _modules(tracker, top: int, blocks: dict) -> tuple[ModuleMemory, ...]:
    total = lambda snap: sum(d.get("Total", 0) for d in snap.values())  # noqa: E731
    out = []
    for name, block in blocks.items():
        s = tracker.memory_tracking.get(block)
        if s is None:
            continue
        # MemTracker's states, or FSDPMemTracker's (after its all-gather, before its reshard:
        # the gathered parameters are not what the forward leaves).
        before = s.snapshots.get("Pre-Forward") or s.snapshots.get("After Pre-Forward") or []
        after = s.snapshots.get("Post-Forward") or s.snapshots.get("Before Post-Forward") or []
        if before and after:
            out.append(ModuleMemory(name=name, param_bytes=_held_bytes(block),
                                    forward_retained_bytes=max(0, int(total(after[0]) - total(before[0])))))
    return tuple(sorted(out, key=lambda m: -m.total_bytes)[:top])


def _peak_only(tracker_class):
    """``tracker_class`` keeping the step's overall peak (and its snapshot) and each phase's peak
    after each op, not every active module's local peak: the base walks all tracked modules per op
    (a 32-layer model: ~20 % of a fake step), and perfkit reads no module's local peak. The phase
    is the tracker's own: in the optimizer's step, in backward, else forward (the loss included)."""

    class PeakOnly(tracker_class):
        def _update_peak_stats(self, peak_state) -> None:
            phase = "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else "forward"
            phases = self.__dict__.setdefault("phase_peaks", dict.fromkeys(PHASES, 0))
            for dev, snap in self._curr_mem_snap.items():
                phases[phase] = max(phases[phase], snap["Total"])
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

    return PeakOnly


class _Tracked:
    """The tracker's result after the step: :meth:`result` once the context has exited."""

    def __init__(self, model, optimizer, blocks: dict, top: int):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed._tools.mem_tracker import MemTracker
        from torch.distributed.fsdp import FSDPModule

        self.model, self.blocks, self.top = model, blocks, top
        if isinstance(model, FSDPModule):
            self.tracker = _peak_only(FSDPMemTracker)(model, optimizer)
        else:
            self.tracker = _peak_only(MemTracker)()
            # ZeroRedundancyOptimizer keeps its state in the AdamW it wraps (``.optim``): that one
            # is what MemTracker must see, or its state counts nowhere.
            self.tracker.track_external(model, getattr(optimizer, "optim", optimizer))
        self.t0 = time.perf_counter()
        self.garbage_bytes = 0
        # Cyclic garbage collected as the optimizer's step begins: the peaks do not depend on when the collector
        # runs (FSDP2's cycles held a small llama's root parameters: +13 % optimizer phase, 1 run in 10).
        self.hook = optimizer.register_step_pre_hook(lambda *_: self._collect_garbage())

    def _collect_garbage(self) -> None:
        total = lambda: sum(snap.get("Total", 0) for snap in self.tracker._curr_mem_snap.values())  # noqa: E731
        before = total()
        gc.collect()
        self.garbage_bytes = max(0, before - total())

    def result(self) -> StepMemory:
        at_peak = _category_bytes(self.tracker.get_tracker_snapshot("peak"))
        # The workload's block objects, by the workload's names: a wrapper (DDP, FSDP2) keeps
        # the objects but puts its own name in front of MemTracker's.
        return StepMemory(peak_bytes=sum(at_peak.values()), at_peak=at_peak,
                          phase_peak_bytes=dict(getattr(self.tracker, "phase_peaks", {})),
                          modules=_modules(self.tracker, self.top, self.blocks),
                          seconds=time.perf_counter() - self.t0, garbage_collected_bytes=self.garbage_bytes)


@contextlib.contextmanager
def step_tracker(model, optimizer, work=None, *, top: int = 5):
    """Track one training step (forward, backward, optimizer step) run inside the context; the
    yielded object's ``result()`` is its :class:`StepMemory` once the context has exited, its
    modules ``work``'s blocks (a :class:`~perfkit.measuring.workloads.workload.Workload`; its
    ``block_names`` resolved in its own model, which the wrappers keep)."""
    blocks = dict(zip(work.block_names, work.blocks())) if work is not None else {}
    tracked = _Tracked(model, optimizer, blocks, top)
    try:
        with tracked.tracker:
            yield tracked
    finally:
        tracked.hook.remove()


#: Warm-up steps before the one :func:`tracking` tracks: the optimizer's state exists from the
#: first, and DDP rebuilds its buckets in its second iteration's forward (allocating them anew).
STEPS_BEFORE_TRACKED = 2


@contextlib.contextmanager
def tracking(cfg, step: int, model, optimizer, work):
    """The training loop's hook: :func:`step_tracker` around the last warm-up step (at least the
    third: :data:`STEPS_BEFORE_TRACKED`) when ``cfg.memory_breakdown``, else nothing (None)."""
    if not (cfg.memory_breakdown and step == cfg.warmup_steps - 1):
        yield None
        return
    with step_tracker(model, optimizer, work) as tracked:
        yield tracked


def predict_elsewhere(cfg) -> StepMemory:
    """:func:`predict` in this process, or in a spawned one when this one is a rank of a job."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return predict(cfg)
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(predict, cfg).result()


def row_columns(cfg, rank_results: list[dict]) -> tuple[dict, StepMemory | None]:
    """The row's memory breakdown (``cfg.memory_breakdown``; else no columns): the tracked step of
    the rank with the highest peak (``memory_tracked_*``, every rank's peak in
    ``memory_tracked_peak_bytes_per_rank``) beside the fake-tensor prediction of rank 0
    (``memory_predicted_*``) and their ratio, rank 0's (``memory_predicted_over_tracked``); and
    that prediction (None without one), which :func:`perfkit.measuring.training.memory_edge.edge_columns`
    reuses for the row's predicted OOM edge."""
    if not cfg.memory_breakdown:
        return {}, None
    tracked = [r["memory"] for r in rank_results]
    peaks = [t.get("memory_tracked_peak_bytes", math.nan) for t in tracked]
    top = tracked[max(range(len(peaks)), key=lambda i: -math.inf if math.isnan(peaks[i]) else peaks[i])]
    out = {**top, "memory_tracked_peak_bytes_per_rank": peaks}
    reason = fit_reason(cfg)
    out["memory_predicted_reason"] = reason
    pred = None
    if reason is None:
        pred = predict_elsewhere(cfg)
        out.update(pred.columns("memory_predicted_"))
        out["memory_predicted_over_tracked"] = pred.peak_bytes / peaks[0] if peaks[0] else math.nan
    return out, pred


# ------------------------------------------------------------------------------ the fake step


@contextlib.contextmanager
def _fake_world(world_size: int):
    """A ``fake`` process group with this process as rank 0 of ``world_size``, destroyed after.
    Refuses inside a real process group (a rank of a job): the fit runs in a process of its own."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise BadInputError("the memory fit runs in a process with no process group of its own "
                            "(perfkit fit, or a notebook's kernel), not inside a rank of a job")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _init_optimizer_state(model, optimizer) -> None:
    """The optimizer's state as after its first step (zero gradients, one step, gradients freed)."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def predict(cfg, *, top: int = 5, progress: Callable[[str], None] | None = None) -> StepMemory:
    """The steady-state step of ``cfg`` (a TrainConfig) on rank 0 of its world, on fake tensors:
    nothing is allocated and no device is used (``cfg.device`` names where the tensors would
    live; "auto" is the CPU here). Raises :class:`BadInputError` with :func:`fit_reason`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    reason = fit_reason(cfg)
    if reason:
        raise BadInputError(f"cannot predict this configuration's memory: {reason}")
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    device = torch.device("cuda" if cfg.device in ("cuda", "hip") else "cpu")
    # DDP's step is one process's on its slice of the batch (plus the buckets, below); ZeRO-1's
    # too, its AdamW wrapped in the real ZeroRedundancyOptimizer over the fake world, which keeps
    # the state of this rank's partition of the parameters only.
    ddp_like = cfg.parallelism in ("ddp", "zero1")
    as_run = (dataclasses.replace(cfg, parallelism="none", world_size=1, batch_size=cfg.batch_size // cfg.dp_size)
              if ddp_like else cfg)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    # A kernel that refuses its inputs raises here, and the caller says so in one line; fake_tensor
    # would also log the refusal with its traceback first.
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with _grouped_mm_as_the_cpu_runs_it(device):
            return _predict_faked(cfg, as_run, ddp_like, fake_mode, device, top, say, t0)
    finally:
        quiet.setLevel(level)


@contextlib.contextmanager
def _grouped_mm_as_the_cpu_runs_it(device: torch.device):
    """While a prediction for the CPU runs: ``aten._grouped_mm`` (a mixture of experts' experts) on
    fake tensors as the CPU kernel runs it, in the operands' dtype. torch's meta kernel takes bf16
    operands only (CUDA's rule), so a fake step of an fp32 or autocast MoE failed where the real CPU
    step runs; for CUDA the meta kernel's rule stands (a real CUDA step fails the same way)."""
    from torch._subclasses import fake_impls

    op = torch.ops.aten._grouped_mm.default
    if device.type != "cpu" or op in fake_impls.op_implementations_dict:
        yield
        return

    def grouped_mm(fake_mode, func, a, b, offs=None, bias=None, out_dtype=None):
        from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

        groups = offs.shape[0] if offs is not None else a.shape[0]
        shape = {(2, 3): (a.shape[0], b.shape[-1]), (3, 3): (a.shape[0], a.shape[1], b.shape[-1]),
                 (2, 2): (groups, a.shape[0], b.shape[1]), (3, 2): (a.shape[1], b.shape[1])}[(a.dim(), b.dim())]
        with in_kernel_invocation_manager(fake_mode):
            meta = torch.empty(shape, dtype=out_dtype or a.dtype, device="meta")
        return FakeTensor(fake_mode, meta, a.device)

    fake_impls.op_implementations_dict[op] = grouped_mm
    try:
        yield
    finally:
        fake_impls.op_implementations_dict.pop(op, None)


def _predict_faked(cfg, as_run, ddp_like: bool, fake_mode, device, top: int, say, t0: float) -> StepMemory:
    from perfkit.measuring.training import parallel
    from perfkit.measuring.training import fake_build, step_setup

    with _fake_world(cfg.world_size if ddp_like else as_run.world_size), fake_mode:
        model, work = step_setup.prepare(as_run, device, build=fake_build.fake_builder(fake_mode))
        optimizer = parallel.make_optimizer(model, parallelism=cfg.parallelism if ddp_like else as_run.parallelism,
                                            lr=cfg.lr)
        say(f"built {cfg.model} on fake tensors ({time.perf_counter() - t0:.1f} s)")
        _init_optimizer_state(model, optimizer)
        ctx = parallel.dist_context(as_run.parallelism)
        with step_tracker(model, optimizer, work, top=top) as tracked:
            inputs, target = step_setup.rank_batch(as_run, work, 1, ctx, device)
            optimizer.zero_grad(set_to_none=True)
            # fp16's GradScaler is left out: it reads its inf check back (data-dependent on fake
            # tensors) and holds a scalar per device, no more.
            step_setup.forward_backward(work, model, inputs, target, device_type=device.type,
                                        amp_dtype=step_setup.autocast_dtype(cfg))
            step_setup.optimizer_step(optimizer)
        got = tracked.result()
    at_peak, phases = dict(got.at_peak), dict(got.phase_peak_bytes)
    if ddp_like:
        # The reducer's buckets: one copy of every trainable parameter, in its dtype.
        buckets = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        at_peak["communication_buffers"] += buckets
        if cfg.gradient_as_bucket_view:  # the gradients are views of the buckets
            at_peak["communication_buffers"] -= min(buckets, at_peak["gradients"])
        phases = {p: v + buckets for p, v in phases.items()}  # held through every phase
    say(f"one step tracked ({time.perf_counter() - t0:.1f} s)")
    return StepMemory(peak_bytes=sum(at_peak.values()), at_peak=at_peak, phase_peak_bytes=phases,
                      modules=got.modules, seconds=time.perf_counter() - t0)
