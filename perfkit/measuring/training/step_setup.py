"""What one training step runs, shared by the measured step (:mod:`perfkit.measuring.training.step`)
and its prediction on fake tensors (:mod:`perfkit.measuring.training.memory_fit`): the workload
built, checkpointed, converted and wrapped (:func:`prepare`), this rank's slice of a global
batch (:func:`rank_batch`, drawn from :func:`batch_seed`), and the step itself
(:func:`forward_backward` under :func:`autocast_dtype`, then :func:`optimizer_step`)."""

from __future__ import annotations

import torch
from torch import nn

from perfkit.measuring.training import parallel
from perfkit.measuring.training.config import TrainConfig, workload_spec
from perfkit.measuring.workloads import catalog
from perfkit.measuring.workloads.workload import Workload, call_model, checkpoint_blocks, map_tensors

__all__ = ["batch_seed", "rank_batch", "prepare", "autocast_dtype", "forward_backward", "optimizer_step"]


def batch_seed(cfg: TrainConfig, step: int) -> int:
    """The seed of global batch ``step``: one draw from (seed, step), whatever the parallelism."""
    return cfg.seed * 2**32 + step


def rank_batch(cfg: TrainConfig, work: Workload, step: int, ctx: parallel.DistContext,
           device: torch.device):
    """This rank's slice of global batch ``step``: drawn whole on the CPU, so every rank and a
    single process see the same global batch; then copied, so the rank holds only its slice
    (as a real loader's), not a view keeping the global batch alive on a CPU. Inputs may be a
    tensor, a tuple or a dict of tensors (:mod:`perfkit.measuring.workloads.workload`)."""
    inputs, target = work.make_batch(cfg.batch_size, seed=batch_seed(cfg, step))
    size = cfg.batch_size // ctx.dp_size
    lo = size * ctx.dp_rank
    if ctx.dp_size > 1:  # the entry point's split_batch where it has one (an EmbeddingBag's offsets)
        inputs, target = work.rank_slice(inputs, target, lo, lo + size, cfg.batch_size)
    pure = cfg.precision == "bf16-pure"
    to = lambda t: t.to(device, dtype=torch.bfloat16 if pure and t.is_floating_point() else t.dtype)  # noqa: E731
    return map_tensors(inputs, to), map_tensors(target, lambda t: t.to(device))


def prepare(cfg: TrainConfig, device: torch.device, build=None) -> tuple[nn.Module, Workload]:
    """``cfg``'s workload built on ``device`` (by ``build``, default :func:`catalog.build`; the
    memory fit passes one that builds fake tensors), checkpointed, converted and wrapped."""
    # Weights come from spec.seed: identical on every rank and in one process.
    work = (build or catalog.build)(workload_spec(cfg), device=device,
                                    dtype=torch.bfloat16 if cfg.precision == "bf16-pure" else torch.float32)
    model = work.model
    if cfg.activation_checkpointing:
        checkpoint_blocks(model, work.blocks())
    if cfg.precision == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model)
    if cfg.parallelism in ("ddp", "zero1"):
        model = parallel.wrap_ddp(model, device=device, bucket_cap_mb=cfg.bucket_cap_mb,
                                  gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                                  static_graph=cfg.static_graph, comm_hook=cfg.comm_hook)
    elif cfg.parallelism in ("fsdp", "zero2", "zero3"):
        model = parallel.apply_fsdp(model, reshard_after_forward=cfg.reshard, blocks=work.blocks(),
                                    param_dtype=parallel.dtype_from_name(cfg.fsdp_param_dtype),
                                    reduce_dtype=parallel.dtype_from_name(cfg.fsdp_reduce_dtype),
                                    prefetch=cfg.fsdp_prefetch)
    elif cfg.parallelism == "fsdp_tp":
        model = parallel.apply_fsdp_tp(model, dp_degree=cfg.dp_size, tp_degree=cfg.tp_size,
                                       blocks=work.blocks(), plan=work.tp_plan,
                                       reshard_after_forward=cfg.reshard,
                                       param_dtype=parallel.dtype_from_name(cfg.fsdp_param_dtype),
                                       reduce_dtype=parallel.dtype_from_name(cfg.fsdp_reduce_dtype),
                                       prefetch=cfg.fsdp_prefetch)
    elif cfg.parallelism == "tp":
        model = parallel.apply_tp(model, plan=work.tp_plan)
    if cfg.compile:
        model = torch.compile(model, mode=cfg.compile_mode)
    return model, work


def autocast_dtype(cfg: TrainConfig) -> torch.dtype | None:
    """The dtype the forward runs in under autocast (bf16, fp16), or None: no autocast."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)


def forward_backward(work: Workload, model: nn.Module, inputs, target, *, device_type: str,
                     amp_dtype: torch.dtype | None, scaler=None) -> torch.Tensor:
    """The forward under autocast at ``amp_dtype``, the loss in fp32 whatever the compute dtype,
    and its backward (fp16: the loss scaled by ``scaler`` so small gradients do not flush to
    zero). Returns the loss."""
    with torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
        out = call_model(model, inputs)
    loss = work.loss(out, target)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return loss


def optimizer_step(optimizer: torch.optim.Optimizer, scaler=None) -> None:
    """The optimizer's step, through ``scaler`` under fp16 (it skips a step with inf gradients)."""
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
