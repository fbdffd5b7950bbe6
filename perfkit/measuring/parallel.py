"""Applying a parallelism to a model: DDP, FSDP2 (``fully_shard``) or tensor parallel.

The training step (:mod:`perfkit.measuring.training`) builds the model identically on every rank (same seed)
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

from perfkit.core.errors import BadInputError, ConfigurationSkipped

__all__ = ["DistContext", "dist_context", "check_comm_hook", "wrap_ddp", "apply_fsdp", "apply_tp",
           "PARALLELISMS", "COMM_HOOKS", "dtype_from_name"]

PARALLELISMS = ("none", "ddp", "fsdp", "tp")
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
    """Number of slices: the world size for DDP and FSDP, 1 for tensor parallel (every rank
    sees the whole batch) and for a single process."""

    def __post_init__(self):
        if not (0 <= self.rank < self.world_size and 0 <= self.dp_rank < self.dp_size):
            raise BadInputError(f"inconsistent ranks: {self}")


def dist_context(parallelism: str) -> DistContext:
    """The context of this process, from the initialized process group (if any)."""
    if parallelism not in PARALLELISMS:
        raise BadInputError(f"parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
    if not dist.is_initialized():
        if parallelism != "none":
            raise BadInputError(f"parallelism {parallelism!r} needs an initialized process group")
        return DistContext(rank=0, world_size=1, dp_rank=0, dp_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if parallelism in ("ddp", "fsdp"):
        return DistContext(rank=rank, world_size=world_size, dp_rank=rank, dp_size=world_size)
    # "tp" shards the model, "none" runs the same work everywhere: every rank has the whole batch.
    return DistContext(rank=rank, world_size=world_size, dp_rank=0, dp_size=1)


def check_comm_hook(comm_hook: str, backend: str) -> None:
    """Raise :class:`ConfigurationSkipped` for a DDP compression hook the backend cannot run."""
    if comm_hook not in COMM_HOOKS:
        raise BadInputError(f"comm_hook must be one of {COMM_HOOKS}, got {comm_hook!r}")
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
) -> nn.Module:
    """FSDP2: ``fully_shard`` each block of ``model.blocks`` (one all-gather per block), then the
    root (embeddings, head), over a 1-D mesh of every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(_mesh_device_type(), (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in getattr(model, "blocks", ()):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # The root's parameters are needed again right after forward (loss, then backward of the
    # head), so resharding them after forward would only add an all-gather (torchtitan does this).
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
    return model


def apply_tp(model: nn.Module) -> nn.Module:
    """Tensor parallel over a 1-D mesh of every rank, from ``model.tp_plan()``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if not hasattr(model, "tp_plan"):
        raise BadInputError(f"{type(model).__name__} has no tp_plan(): no tensor-parallel layout")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {path: styles[style]() for path, style in model.tp_plan().items()}
    mesh = init_device_mesh(_mesh_device_type(), (dist.get_world_size(),))
    return parallelize_module(model, mesh, plan)


def _mesh_device_type() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"
