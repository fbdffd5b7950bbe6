"""The memory a training configuration needs per rank, predicted from shapes, and measured.

**Model state** (parameters, gradients, optimizer state) follows the ZeRO paper's accounting
(Rajbhandari et al. 2020, section 3.1: mixed-precision Adam holds (2 + 2 + K)·Ψ bytes for Ψ
parameters, K = 12: fp16 parameters and gradients, fp32 master weights, momentum and variance),
generalised to perfkit's precisions, whose autocast keeps the fp32 weights as the only copy:

==================== ======= ====== ======================= ==========================
precision            param   grad   AdamW state             per Ψ (paper: 16)
==================== ======= ====== ======================= ==========================
fp32, tf32, fp8      4       4      8 (exp_avg, exp_avg_sq)  16 (fp8: torchao keeps fp32
bf16, fp16 autocast  4       4      8                        weights, casts per matmul)
bf16-pure            2       2      4 (state in bf16)        8
==================== ======= ====== ======================= ==========================

plus AdamW's ``step``, one fp32 scalar per parameter tensor the optimizer updates. Sharding
(section 5): ZeRO-1 (``zero1``) divides the optimizer state over the data-parallel ranks,
ZeRO-2 the gradients too, ZeRO-3 (``zero3``, ``fsdp``, ``fsdp_tp``) the parameters too. The
prediction is of the exact shards, not Ψ/N: FSDP2 gives rank 0 ``ceil(dim0/N)`` rows of every
parameter (the most of any rank), ZeroRedundancyOptimizer assigns whole parameters, largest
first, to the least-loaded rank (torch's ``_partition_parameters``), and tensor parallel first
splits the planned projections (the workload's ``tp_plan``). What is predicted is what each rank holds
**between steps**. FSDP2 (``zero2``, ``zero3``, ``fsdp``) keeps sharded parameters at rest even
in ZeRO-2 and gathers them during the step: ``param_gather_bytes`` is that transient (zero2:
every block's unsharded parameters from its forward to its backward; zero3: two blocks', the
one computing and the one prefetched), plus the root's (embeddings, norms, head: ``apply_fsdp``
keeps them gathered from forward through backward), each at its padded size and in FSDP2's
``param_dtype`` (16-bit gathers are the compute dtype, :attr:`TrainConfig.compute_dtype`).
Measured (``param_gather_bytes_measured``, :func:`fsdp_gathered`): the peak of FSDP2's
unsharded buffers and in-flight all-gathers over the warm-up step.

**Activations** are :mod:`perfkit.measuring.training.activations`' (predicted from the shapes, and
measured with saved-tensor hooks); :func:`predicted_max_batch` and :func:`row_columns` use them.

**Measured** (:func:`measured_model_state`): the sizes of the tensors a rank holds after the last
step, ``numel · element_size`` of each local shard (DTensor ``to_local()``), for parameters,
``.grad`` and every tensor of the optimizer state (ZeroRedundancyOptimizer: its local optimizer's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from perfkit.core import checks
from perfkit.core.errors import BadInputError
from perfkit.measuring.training import activations

__all__ = ["BYTES_PER_PARAM", "ModelState", "predict_model_state", "local_param_shapes",
           "predict_for_config", "measured_model_state", "fsdp_gathered", "predicted_max_batch", "predicted_peak_bytes",
           "optimizer_peak_bytes", "memory_budget",
           "row_columns"]

#: precision -> bytes per parameter element of (parameter, gradient, AdamW state).
BYTES_PER_PARAM = {"fp32": (4, 4, 8), "tf32": (4, 4, 8), "fp8": (4, 4, 8), "bf16": (4, 4, 8),
                   "fp16": (4, 4, 8), "bf16-pure": (2, 2, 4)}
#: FSDP2 ``param_dtype`` -> bytes per gathered element (the compute dtype's: TrainConfig.compute_dtype).
_GATHER_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_STEP_BYTES = 4  # AdamW's `step`: an fp32 scalar tensor per parameter (not capturable/fused)
#: parallelism -> what it shards over the data-parallel ranks between steps.
_SHARDED = {"none": set(), "ddp": set(), "tp": set(), "zero1": {"optim"},
            "zero2": {"optim", "grad", "param"}, "zero3": {"optim", "grad", "param"},
            "fsdp": {"optim", "grad", "param"}, "fsdp_tp": {"optim", "grad", "param"}, "pp": set()}


@dataclass(kw_only=True, frozen=True)
class ModelState:
    """Bytes of model state on one rank (the rank that holds the most)."""

    param_bytes: int
    grad_bytes: int
    optim_state_bytes: int
    param_gather_bytes: int = 0
    """Predicted only: parameters FSDP2 holds unsharded during a step, beyond the shards."""

    @property
    def total_bytes(self) -> int:
        """Parameters, gradients and optimizer state (what the ZeRO paper calls model states)."""
        return self.param_bytes + self.grad_bytes + self.optim_state_bytes


def _fsdp_shard(shape: Sequence[int], n: int) -> int:
    # FSDP2 chunks dim 0 like torch.chunk: rank 0 gets ceil(dim0 / n) rows, the most of any rank.
    if not shape:
        return 1
    return math.ceil(shape[0] / n) * math.prod(shape[1:])


def _zero1_max_share(numels: Sequence[int], n: int) -> tuple[int, int]:
    """(elements, tensors) of the rank ZeroRedundancyOptimizer gives the most elements."""
    sizes, counts = [0] * n, [0] * n
    for numel in sorted(numels, reverse=True):
        rank = sizes.index(min(sizes))
        sizes[rank] += numel
        counts[rank] += 1
    top = sizes.index(max(sizes))
    return sizes[top], counts[top]


def predict_model_state(param_shapes: Sequence[Sequence[int]], *, precision: str,
                        parallelism: str, dp_size: int, reshard_after_forward: bool = True,
                        block_param_shapes: Sequence[Sequence[Sequence[int]]] = (),
                        root_param_shapes: Sequence[Sequence[int]] = (),
                        gather_bytes: int | None = None) -> ModelState:
    """Model state per rank for parameters of ``param_shapes`` (each as this rank holds it
    before data-parallel sharding, i.e. after tensor parallel). ``block_param_shapes`` (the
    shapes of each block's parameters) and ``root_param_shapes`` (the rest: embeddings, norms,
    head) size FSDP2's transient gathers, at ``gather_bytes`` per element (FSDP2's
    ``param_dtype``; None: the parameters' own)."""
    checks.one_of("precision", precision, sorted(BYTES_PER_PARAM))
    checks.one_of("parallelism", parallelism, sorted(_SHARDED))
    if dp_size < 1:
        raise BadInputError(f"dp_size must be >= 1, got {dp_size}")
    p_bytes, g_bytes, o_bytes = BYTES_PER_PARAM[precision]
    sharded = _SHARDED[parallelism] if dp_size > 1 else set()
    full = [math.prod(s) for s in param_shapes]
    fsdp = [_fsdp_shard(s, dp_size) for s in param_shapes]
    if "optim" in sharded and "param" not in sharded:  # zero1: whole parameters per rank
        optim_elems, optim_tensors = _zero1_max_share(full, dp_size)
    else:
        optim_elems, optim_tensors = sum(fsdp if sharded else full), len(full)
    gather = 0
    if "param" in sharded:
        # FSDP2 gathers each parameter into a buffer of its padded size (dim 0 rounded up to a
        # multiple of the ranks), beside the shard it keeps: the whole buffer is extra.
        padded = lambda shapes: sum(_fsdp_shard(s, dp_size) * dp_size for s in shapes)  # noqa: E731
        blocks = [padded(b) for b in block_param_shapes]
        # apply_fsdp keeps the root gathered from its forward to the end of backward; blocks:
        # all (zero2), or the one computing and the one prefetched (zero3).
        gather = padded(root_param_shapes) + (sum(sorted(blocks)[-2:]) if reshard_after_forward
                                              else sum(blocks))
    return ModelState(
        param_bytes=p_bytes * sum(fsdp if "param" in sharded else full),
        grad_bytes=g_bytes * sum(fsdp if "grad" in sharded else full),
        optim_state_bytes=o_bytes * optim_elems + _STEP_BYTES * optim_tensors,
        param_gather_bytes=(gather_bytes or p_bytes) * gather)


def local_param_shapes(model: nn.Module, tp_size: int, plan=None) -> list[tuple[int, ...]]:
    """Each parameter's shape on one rank after tensor parallel over ``tp_size`` ranks with
    ``plan`` (default ``model.tp_plan()``): colwise splits weight and bias by output features
    (dim 0), rowwise the weight by input features (dim 1) and keeps the bias whole."""
    if tp_size > 1 and plan is None:
        plan = model.tp_plan()
    plan = {k: v for k, v in (plan or {}).items() if isinstance(v, str)} if tp_size > 1 else {}
    shapes = []
    for name, p in model.named_parameters():
        shape = list(p.shape)
        module, _, kind = name.rpartition(".")
        style = plan.get(module)
        if style == "colwise" or (style == "rowwise" and kind == "weight"):
            dim = 0 if style == "colwise" else 1
            shape[dim] //= tp_size
        shapes.append(tuple(shape))
    return shapes


def _meta_workload(spec):
    """The workload of ``spec`` on the meta device: shapes, blocks and plan, no memory, no init."""
    from perfkit.measuring.workloads import catalog

    return catalog.meta(spec)


def predict_for_config(cfg) -> ModelState:
    """:func:`predict_model_state` for a :class:`~perfkit.measuring.training.config.TrainConfig`
    (its model built on the meta device: no memory, no init)."""
    from perfkit.measuring.training.config import workload_spec

    work = _meta_workload(workload_spec(cfg))
    model = work.model
    if cfg.parallelism == "pp":
        return max((predict_model_state(shapes, precision=cfg.precision, parallelism="pp", dp_size=1)
                    for shapes in _pipeline_rank_shapes(cfg, work)), key=lambda m: m.total_bytes)
    local = dict(zip((n for n, _ in model.named_parameters()),
                     local_param_shapes(model, cfg.tp_size, work.tp_plan)))
    # Block shapes after TP: the same plan, by each block's prefix.
    prefixes = [f"{name}." for name in work.block_names]
    blocks = [[shape for n, shape in local.items() if n.startswith(prefix)] for prefix in prefixes]
    root = [shape for name, shape in local.items() if not any(name.startswith(p) for p in prefixes)]
    return predict_model_state(list(local.values()), precision=cfg.precision,
                               parallelism=cfg.parallelism, dp_size=cfg.dp_size,
                               reshard_after_forward=cfg.reshard, block_param_shapes=blocks,
                               root_param_shapes=root, gather_bytes=_GATHER_BYTES.get(cfg.fsdp_param_dtype))


def _pipeline_rank_shapes(cfg, work) -> list[list[tuple[int, ...]]]:
    """Per rank, the shapes of the parameters its pipeline stages hold: their blocks, the stem
    on the first stage's rank, the head on the last's (:mod:`perfkit.measuring.training.pipeline_stages`)."""
    from perfkit.measuring.training import pipeline_stages as ps

    n_stages = cfg.world_size * cfg.stages_per_rank
    blocks = work.blocks()
    bounds = ps.stage_bounds(len(blocks), n_stages)
    part = lambda names: [tuple(p.shape) for n in names for p in work.model.get_submodule(n).parameters()]  # noqa: E731
    out = []
    for rank in range(cfg.world_size):
        shapes = []
        for stage in ps.rank_stage_indices(cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, rank):
            lo, hi = bounds[stage]
            shapes += [tuple(p.shape) for b in blocks[lo:hi] for p in b.parameters()]
            shapes += part(work.stem_names) if stage == 0 else []
            shapes += part(work.head_names) if stage == n_stages - 1 else []
        out.append(shapes)
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _tensor_bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors
               if isinstance(t, torch.Tensor))


def fsdp_gathered(model: nn.Module) -> tuple[int, set[int]]:
    """(bytes, storage pointers) of the parameters FSDP2 holds unsharded in ``model`` now: each
    parameter's all-gather output while allocated (FSDP2 frees it by resizing its storage to 0
    on reshard) and the flat buffer of every all-gather in flight (a prefetch). Reads FSDP2's
    state (``torch.distributed.fsdp._fully_shard``); (0, set()) without FSDP2."""
    held, ptrs = 0, set()
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None)
        if group is None:
            continue
        pending = getattr(group, "_all_gather_result", None)
        buffers = [pending.all_gather_output] if pending is not None else []
        buffers += [t for p in group.fsdp_params for t in getattr(p, "all_gather_outputs", ())]
        for t in buffers:
            storage = t.untyped_storage()
            if storage.nbytes():
                held += storage.nbytes()
                ptrs.add(storage.data_ptr())
    return held, ptrs


def measured_model_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> ModelState:
    """What this rank holds now: parameters, ``.grad`` and optimizer state, local shards only."""
    params = list(model.parameters())
    local_optim = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own AdamW
    state = [v for s in local_optim.state.values() for v in s.values()]
    return ModelState(param_bytes=_tensor_bytes(params),
                      grad_bytes=_tensor_bytes(p.grad for p in params if p.grad is not None),
                      optim_state_bytes=_tensor_bytes(state))


def _grads_held_through_the_step(cfg) -> bool:
    """Whether a rank holds its gradients' bytes from one step into the next: DDP's reducer
    keeps its buckets (the gradients, or their copies) from construction on; elsewhere
    ``zero_grad(set_to_none=True)`` frees them before the forward."""
    return cfg.parallelism in ("ddp", "zero1") and cfg.dp_size > 1


def optimizer_peak_bytes(cfg, state: ModelState | None = None) -> float:
    """The optimizer step's peak per rank: the model state, every gradient in it, and AdamW's
    temporaries for the denominator sqrt(v)/bias_correction + eps: on a GPU its foreach path
    (torch.optim.adamw ``_multi_tensor_adamw``, the default there) makes them for every tensor
    at once (one state tensor's bytes, half of AdamW's two); on a CPU the per-tensor path
    (``_single_tensor_adamw``) makes two of the largest parameter's at a time (the sqrt, then
    the division)."""
    from perfkit.measuring.training.config import config_device, workload_spec

    state = state or predict_for_config(cfg)
    if config_device(cfg) in ("cuda", "hip"):
        temporaries = state.optim_state_bytes / 2
    else:
        work = _meta_workload(workload_spec(cfg))
        shapes = local_param_shapes(work.model, cfg.tp_size, work.tp_plan)
        sharded = "param" in _SHARDED.get(cfg.parallelism, set()) and cfg.dp_size > 1
        largest = max((_fsdp_shard(s, cfg.dp_size) if sharded else math.prod(s) for s in shapes), default=0)
        temporaries = 2 * largest * BYTES_PER_PARAM[cfg.precision][0]
    return float(state.total_bytes + temporaries)


def _backward_start_bytes(cfg, state: ModelState, batch_per_rank: int | None) -> float:
    """The start of backward's bytes: the model state less the gradients not yet made
    (:func:`_grads_held_through_the_step`), FSDP2's gathers, the saved activations and the loss's
    transient (:func:`perfkit.measuring.training.activations.backward_transient_bytes`)."""
    saved, _ = activations.activation_bytes(cfg, batch_per_rank=batch_per_rank)
    transient = activations.backward_transient_bytes(cfg, batch_per_rank=batch_per_rank)
    held = state.total_bytes - (0 if _grads_held_through_the_step(cfg) else state.grad_bytes)
    return held + state.param_gather_bytes + saved + transient


def predicted_peak_bytes(cfg, *, batch_per_rank: int | None = None, state: ModelState | None = None) -> float:
    """A step's predicted peak per rank (not under ``pp``; NaN where the activations have no
    model): the larger of the optimizer step's (:func:`optimizer_peak_bytes`) and the start of
    backward's (:func:`_backward_start_bytes`). Checked against the fake-tensor step
    (``memory_fit.predict``) for the built-in transformer and mlp (``tests/test_memory_model.py``)."""
    state = state or predict_for_config(cfg)
    backward = _backward_start_bytes(cfg, state, batch_per_rank)
    return math.nan if math.isnan(backward) else max(backward, optimizer_peak_bytes(cfg, state))


def predicted_max_batch(cfg, budget_bytes: float, *, multiple_of: int = 1) -> int | None:
    """The largest global batch (a multiple of ``multiple_of``) whose :func:`predicted_peak_bytes`
    fit ``budget_bytes`` per rank (under ``pp``: model state and activations, rank by rank); None
    if none does or the activations have no model."""
    if cfg.parallelism == "pp":
        return _pipeline_max_batch(cfg, budget_bytes, multiple_of)
    state = predict_for_config(cfg)
    fixed = _backward_start_bytes(cfg, state, 0)  # position indices: not per sample
    per_sample = _backward_start_bytes(cfg, state, 1) - fixed
    free = budget_bytes - fixed
    if math.isnan(per_sample) or free < per_sample or optimizer_peak_bytes(cfg, state) > budget_bytes:
        return None
    # Activations grow with the per-rank batch, a dp_size-th of the global one.
    batch = int(free // per_sample) * cfg.dp_size
    return batch // multiple_of * multiple_of or None


def _pipeline_max_batch(cfg, budget_bytes: float, multiple_of: int) -> int | None:
    """:func:`predicted_max_batch` under pp: each rank's own model state and activation peak
    (the ranks differ: the stem and head, and 1F1B's in-flight microbatches p − r), the largest
    microbatch every rank fits, times the microbatch count."""
    from perfkit.measuring.training.config import workload_spec

    if math.isnan(activations.activation_bytes(cfg, batch_per_rank=1)[0]):
        return None
    spec = workload_spec(cfg)
    states = [predict_model_state(shapes, precision=cfg.precision, parallelism="pp", dp_size=1).total_bytes
              for shapes in _pipeline_rank_shapes(cfg, _meta_workload(spec))]

    def fits(microbatch: int) -> bool:
        peaks = activations.pipeline_rank_bytes(cfg, spec, microbatch)
        return all(state + peak <= budget_bytes for state, peak in zip(states, peaks))

    if not fits(1):
        return None
    low, high = 1, 2
    while fits(high):  # every stage's bytes grow with the microbatch: double, then bisect
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    step = math.lcm(cfg.n_microbatches, multiple_of)
    return low * cfg.n_microbatches // step * step or None


def _max_or_nan(values: list[float]) -> float:
    """The largest, or NaN when any rank has none (a missing rank is not a smaller one)."""
    return math.nan if any(v is None or math.isnan(v) for v in values) else float(max(values))


def memory_budget(cfg, device: str) -> tuple[int | None, str]:
    """Each rank's memory budget and where it comes from: ``address_space_headroom_bytes`` when
    set (the CPU's OOM edge), else the GPU's memory (a device per rank); None on a CPU without it
    (the machine's RAM is shared with every process: no per-rank edge to predict)."""
    if cfg.address_space_headroom_bytes:
        return int(cfg.address_space_headroom_bytes), "address_space_headroom_bytes"
    if device in ("cuda", "hip") and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory), "device memory"
    return None, "no per-rank budget on a CPU without address_space_headroom_bytes"


def _checkpointed_edge(cfg, budget) -> float:
    """The largest batch predicted to fit with activation checkpointing switched on (what the
    memory it frees buys); NaN where it is on already, without a budget, or not modelled."""
    if not budget or cfg.activation_checkpointing or cfg.parallelism == "pp":
        return math.nan
    from dataclasses import replace

    try:
        edge = predicted_max_batch(replace(cfg, activation_checkpointing=True), budget, multiple_of=cfg.dp_size)
    except BadInputError:  # a model that cannot be checkpointed
        return math.nan
    return math.nan if edge is None else edge


def row_columns(cfg, rank_results: list[dict], device: str = "cpu") -> dict:
    """Training-row columns: each rank's measured model state (the max over ranks) beside the
    prediction for ``cfg`` (a :class:`~perfkit.measuring.training.config.TrainConfig`), and the
    largest batch the analytic model predicts to fit the rank's :func:`memory_budget`
    (``max_batch_size_predicted_analytic``; the row's ``max_batch_size_predicted`` is the
    fake-tensor step's where it models the configuration: ``memory_edge.edge_columns``)."""
    predicted = predict_for_config(cfg)
    saved, reason = activations.activation_bytes(cfg)
    budget, source = memory_budget(cfg, device)
    edge = predicted_max_batch(cfg, budget, multiple_of=cfg.dp_size) if budget else None
    return {
        "memory_budget_bytes": budget, "memory_budget_source": source,
        "max_batch_size_predicted_analytic": math.nan if edge is None else edge,
        "max_batch_size_predicted_checkpointed": _checkpointed_edge(cfg, budget),
        **{k: max(r[k] for r in rank_results) for k in ("param_bytes", "grad_bytes", "optim_state_bytes")},
        "param_bytes_predicted": predicted.param_bytes, "grad_bytes_predicted": predicted.grad_bytes,
        "optim_state_bytes_predicted": predicted.optim_state_bytes,
        "model_state_bytes_predicted": predicted.total_bytes,
        "param_gather_bytes_predicted": predicted.param_gather_bytes,
        "activation_bytes_predicted": saved, "activation_bytes_reason": reason,
        "activation_bytes_measured": _max_or_nan([r.get("activation_bytes_measured", math.nan)
                                                   for r in rank_results]),
        "activation_bytes_measured_reason": activations.activation_measure_reason(cfg),
        "param_gather_bytes_measured": _max_or_nan([r.get("param_gather_bytes_measured", math.nan)
                                                    for r in rank_results]),
    }
