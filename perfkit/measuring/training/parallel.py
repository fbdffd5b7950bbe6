"""Applying a parallelism to a model: DDP, the ZeRO stages, FSDP2 (``fully_shard``), tensor
parallel, and FSDP × TP on a 2-D mesh.

ZeRO stages (Rajbhandari et al. 2020, section 3): ``zero1`` shards the optimizer state (DDP with
``ZeroRedundancyOptimizer`` around AdamW: each rank updates the parameters assigned to it and
broadcasts them), ``zero2`` shards the gradients too (FSDP2 with ``reshard_after_forward=False``:
parameters are gathered once per step and kept until backward ends), ``zero3`` the parameters too
(FSDP2 with resharding: gathered again in backward); ``fsdp`` is ``zero3``'s older name.
``fsdp_tp`` applies tensor parallel over the ``tp`` dimension of a ``(dp, tp)`` mesh, then FSDP2
over its ``dp`` dimension (torchtitan's order).

The training step (:mod:`perfkit.measuring.training.step`) builds the model identically on every rank (same seed)
and then hands it here, so every parallel run starts from the single-process run's weights and the
loss trajectories can be compared. Each function takes plain options so it stays usable outside
the training benchmark.

Models opt into tensor parallelism by listing their projections: ``model.tp_plan()`` returns
``{"submodule.path": "colwise" | "rowwise"}`` (Megatron-LM's split: the first projection of a
pair is split by output features, the second by input features, so each pair needs one
all-reduce in the forward pass; Shoeybi et al. 2019, section 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from perfkit.core import checks
from perfkit.core.errors import BadInputError, ConfigurationSkipped

__all__ = ["DistContext", "dist_context", "check_comm_hook", "wrap_ddp", "apply_fsdp", "apply_tp",
           "apply_fsdp_tp", "make_optimizer", "PARALLELISMS", "FSDP_FAMILY", "DATA_PARALLEL",
           "COMM_HOOKS", "dtype_from_name", "world_mesh"]

PARALLELISMS = ("none", "ddp", "fsdp", "tp", "zero1", "zero2", "zero3", "fsdp_tp", "pp")
#: Parallelisms that shard with FSDP2 (and take its mixed-precision policy).
FSDP_FAMILY = ("fsdp", "zero2", "zero3", "fsdp_tp")
#: Parallelisms that split the global batch over every rank.
DATA_PARALLEL = ("ddp", "fsdp", "zero1", "zero2", "zero3")
COMM_HOOKS = ("none", "fp16", "bf16")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_from_name(name: str | None) -> torch.dtype | None:
    """``"bfloat16"`` -> ``torch.bfloat16``; None stays None."""
    if name is None:
        return None
    if name not in _DTYPES:
        raise BadInputError(f"dtype must be one of {sorted(_DTYPES)} or None, got {name!r}")
    return _DTYPES[name]


@dataclass(kw_only=True, frozen=True)
class DistContext:
    """Where this process sits: its rank, and which slice of the global batch it owns."""

    rank: int
    """Global rank (0 in a single process)."""
    world_size: int
    """Ranks in the job (1 in a single process)."""
    dp_rank: int
    """Index of this rank's slice of the global batch."""
    dp_size: int
    """Number of slices: the world size for DDP, FSDP and the ZeRO stages, ``dp_degree`` for
    FSDP × TP, 1 for tensor parallel (every rank sees the whole batch) and a single process."""

    def __post_init__(self):
        if not (0 <= self.rank < self.world_size and 0 <= self.dp_rank < self.dp_size):
            raise BadInputError(f"inconsistent ranks: {self}")


def dist_context(parallelism: str, tp_degree: int = 1) -> DistContext:
    """The context of this process, from the initialized process group (if any). Under
    ``fsdp_tp`` rank r sits at (r // tp_degree, r % tp_degree) of the (dp, tp) mesh
    (``init_device_mesh`` is row-major), so its batch slice is r // tp_degree."""
    checks.one_of("parallelism", parallelism, PARALLELISMS)
    if not dist.is_initialized():
        if parallelism != "none":
            raise BadInputError(f"parallelism {parallelism!r} needs an initialized process group")
        return DistContext(rank=0, world_size=1, dp_rank=0, dp_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if parallelism in DATA_PARALLEL:
        return DistContext(rank=rank, world_size=world_size, dp_rank=rank, dp_size=world_size)
    if parallelism == "fsdp_tp":
        if tp_degree < 1 or world_size % tp_degree:
            raise BadInputError(f"tp_degree {tp_degree} does not divide world size {world_size}")
        return DistContext(rank=rank, world_size=world_size, dp_rank=rank // tp_degree,
                           dp_size=world_size // tp_degree)
    # "tp" shards the model, "pp" its layers, "none" runs the same work everywhere: every rank
    # has the whole batch.
    return DistContext(rank=rank, world_size=world_size, dp_rank=0, dp_size=1)


def check_comm_hook(comm_hook: str, backend: str) -> None:
    """Raise :class:`ConfigurationSkipped` for a DDP compression hook the backend cannot run."""
    checks.one_of("comm_hook", comm_hook, COMM_HOOKS)
    # gloo has no bfloat16 reductions; the hook would fail at the first all-reduce.
    if comm_hook == "bf16" and backend != "nccl":
        raise ConfigurationSkipped(f"bf16 gradient compression needs NCCL, backend is {backend}")


def wrap_ddp(
    model: nn.Module,
    *,
    device: torch.device,
    bucket_cap_mb: float | None = None,
    gradient_as_bucket_view: bool = False,
    static_graph: bool = False,
    comm_hook: str = "none",
) -> nn.Module:
    """``DistributedDataParallel`` with the given bucketing and optional gradient compression."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    check_comm_hook(comm_hook, dist.get_backend())
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
    )
    if comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return ddp


def apply_fsdp(
    model: nn.Module,
    *,
    reshard_after_forward: bool = True,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    mesh=None,
    blocks=None,
    prefetch: int = 1,
) -> nn.Module:
    """FSDP2: ``fully_shard`` each of ``blocks`` (default ``model.blocks``; one all-gather per
    block), then the root (embeddings, head, and all of a model without blocks), over ``mesh``
    (default: a 1-D mesh of every rank). ``reshard_after_forward=False`` is ZeRO-2, True ZeRO-3.
    ``prefetch`` > 1: each block issues the all-gathers of the next ``prefetch`` blocks in forward
    (the previous ones in backward) as soon as its own is copied out (torchtitan's explicit
    prefetch); 1 leaves FSDP2's own overlap of one block."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mesh is None:
        mesh = world_mesh((dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = list(getattr(model, "blocks", ()) if blocks is None else blocks)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    if prefetch > 1:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - prefetch):i][::-1])
    # The root's parameters are needed again right after forward (loss, then backward of the
    # head), so resharding them after forward would only add an all-gather (torchtitan does this).
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return model


def apply_tp(model: nn.Module, *, mesh=None, plan=None) -> nn.Module:
    """Tensor parallel over ``mesh`` (default: a 1-D mesh of every rank), from ``plan``
    (default ``model.tp_plan()``): qualified module name -> ``"colwise"``, ``"rowwise"`` or a
    torch ``ParallelStyle``."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if plan is None and not hasattr(model, "tp_plan"):
        raise BadInputError(f"{type(model).__name__} has no tp_plan(): no tensor-parallel layout")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {path: styles[style]() if isinstance(style, str) else style
            for path, style in (model.tp_plan() if plan is None else plan).items()}
    if mesh is None:
        mesh = world_mesh((dist.get_world_size(),))
    return parallelize_module(model, mesh, plan)


def apply_fsdp_tp(model: nn.Module, *, dp_degree: int, tp_degree: int,
                  reshard_after_forward: bool = True, param_dtype: torch.dtype | None = None,
                  reduce_dtype: torch.dtype | None = None, blocks=None, plan=None,
                  prefetch: int = 1) -> nn.Module:
    """FSDP2 × tensor parallel on a ``(dp, tp)`` mesh: TP inside each group of ``tp_degree``
    consecutive ranks, FSDP2 across the groups. Goes through :func:`apply_tp` and
    :func:`apply_fsdp` by module attribute, so what patches them (the scaling run) applies here."""
    if dp_degree * tp_degree != dist.get_world_size():
        raise BadInputError(f"dp_degree {dp_degree} × tp_degree {tp_degree} != world size "
                            f"{dist.get_world_size()}")
    mesh = world_mesh((dp_degree, tp_degree), names=("dp", "tp"))
    model = apply_tp(model, mesh=mesh["tp"], plan=plan)
    return apply_fsdp(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward,
                      param_dtype=param_dtype, reduce_dtype=reduce_dtype, blocks=blocks, prefetch=prefetch)


def make_optimizer(model: nn.Module, *, parallelism: str, lr: float) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters; under ``zero1`` wrapped in ``ZeroRedundancyOptimizer``,
    which keeps the AdamW state of this rank's share of the parameters only (a greedy partition of
    whole parameters, largest first, to the least-loaded rank) and broadcasts the updated ones."""
    if parallelism != "zero1":
        return torch.optim.AdamW(model.parameters(), lr=lr)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)


def world_mesh(shape: tuple[int, ...], names: tuple[str, ...] | None = None):
    """A device mesh of every rank, ``shape`` row-major. Built outside any fake-tensor mode: the
    mesh is process-group bookkeeping (its rank tensor is read back), never a tensor a step holds,
    so :mod:`perfkit.measuring.training.memory_fit` can wrap a fake model with it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh

    with unset_fake_temporarily():
        return init_device_mesh(_mesh_device_type(), shape, mesh_dim_names=names)


def _mesh_device_type() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"
