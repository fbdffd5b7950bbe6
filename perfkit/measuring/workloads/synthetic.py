"""Training workloads on synthetic data: an MLP, a small GPT-style decoder and a small ResNet.

Nothing is downloaded: every batch is generated from a seed, and each task is learnable so the
loss visibly falls within a few optimizer steps (a check that the step really trains):

- ``mlp``: regression onto a fixed random teacher (a linear map fixed by the config's seed).
- ``transformer``: next-token prediction on arithmetic sequences ``x_t = (a + b·t) mod V``
  (start ``a`` and stride ``b`` drawn per sequence), so the next token follows from the last two.
- ``convnet``: classification of images that are a class prototype (fixed by the seed) plus noise.

Analytic FLOP per sample count one training step (forward + backward), matmuls and convolutions
only (bias adds, activations, norms, softmax and pooling are not counted, as
``torch.utils.flop_counter.FlopCounterMode`` does not count them either):

- transformer, per token (PaLM appendix B; nanoGPT ``estimate_mfu``):
  ``6·N + 12·L·H·Q·T`` with N the non-embedding parameters (everything except the token and
  position embedding tables; the lm head is *not* tied, so its matmul is in N), L layers,
  H = n_heads, Q = head dim = d_model / n_heads, T = seq_len. The attention term counts the full
  T×T score matrix (not halved for the causal mask), as PaLM does. Per sample: × seq_len.
- mlp: ``6·Σ in·out`` over the linear layers (2 forward, 4 backward per weight).
- convnet: ``3 ×`` forward FLOP, forward conv ``2·Cin·Cout·k²·Hout·Wout``, head ``2·in·out``.

Convention note: the ``6·N`` / ``3×`` rules count the input gradient of the *first* layer too.
In a real step the inputs do not require grad, so autograd skips that one matmul (the transformer
is unaffected: its first layer's input is the embedding, which does need the gradient).
:attr:`Workload.flop_per_sample_first_input_grad` is that term, so the executed count is
``flop_per_sample - flop_per_sample_first_input_grad``.

The models themselves (``nn.Module``s with ``model.blocks`` between a stem and a head, as the
training step needs) are in :mod:`perfkit.measuring.workloads.models`, their configurations in
:mod:`perfkit.measuring.workloads.configs`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads.configs import (NAMES, ConvNetConfig, MLPConfig, TransformerConfig, WorkloadSpec,
                                                 make_spec)
from perfkit.measuring.workloads.models import GPT, MLP, ConvNet
from perfkit.measuring.workloads.workload import Workload, constructing_on

__all__ = [
    "MLPConfig",
    "TransformerConfig",
    "ConvNetConfig",
    "WorkloadSpec",
    "Workload",
    "build",
    "make_spec",
    "NAMES",
]


# --- analytic FLOP ---------------------------------------------------------------------------


def _conv_out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def _convnet_forward_flop(cfg: ConvNetConfig) -> tuple[int, int]:
    """(forward FLOP per sample, forward FLOP of the stem conv); conv = 2·Cin·Cout·k²·Hout·Wout."""
    def conv(c_in, c_out, k, size, stride, pad):
        out = _conv_out(size, k, stride, pad)
        return 2 * c_in * c_out * k * k * out * out, out

    stem, size = conv(cfg.in_channels, cfg.widths[0], 3, cfg.image_size, 1, 1)
    total, c_in = stem, cfg.widths[0]
    for stage, width in enumerate(cfg.widths):
        for i in range(cfg.blocks_per_stage):
            stride = 2 if stage > 0 and i == 0 else 1
            f1, out = conv(c_in, width, 3, size, stride, 1)
            f2, _ = conv(width, width, 3, out, 1, 1)
            total += f1 + f2
            if stride != 1 or c_in != width:
                total += conv(c_in, width, 1, size, stride, 0)[0]
            c_in, size = width, out
    total += 2 * c_in * cfg.n_classes  # linear head; its bias add is elementwise, not counted
    return total, stem


# --- synthetic tasks -------------------------------------------------------------------------


def _fixed_generator(seed: int) -> torch.Generator:
    # Offset so the task's fixed tensors never share a stream with a batch of the same seed.
    return torch.Generator().manual_seed(1_000_003 + seed)


def _mlp_task(cfg: MLPConfig):
    teacher = torch.randn(cfg.in_features, cfg.out_features, generator=_fixed_generator(cfg.seed))
    teacher /= math.sqrt(cfg.in_features)  # keeps targets O(1)

    def batch(n, gen):
        x = torch.randn(n, cfg.in_features, generator=gen)
        return x, x @ teacher

    return batch


def _transformer_task(cfg: TransformerConfig):
    max_stride = max(1, min(4, cfg.vocab_size - 1))
    t = torch.arange(cfg.seq_len + 1)

    def batch(n, gen):
        start = torch.randint(0, cfg.vocab_size, (n, 1), generator=gen)
        stride = torch.randint(1, max_stride + 1, (n, 1), generator=gen)
        seq = (start + stride * t) % cfg.vocab_size
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    return batch


def _convnet_task(cfg: ConvNetConfig):
    shape = (cfg.n_classes, cfg.in_channels, cfg.image_size, cfg.image_size)
    prototypes = torch.randn(shape, generator=_fixed_generator(cfg.seed))

    def batch(n, gen):
        labels = torch.randint(0, cfg.n_classes, (n,), generator=gen)
        noise = torch.randn((n, *shape[1:]), generator=gen)
        return prototypes[labels] + 0.5 * noise, labels

    return batch


def _cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- build -----------------------------------------------------------------------------------


def build(spec: WorkloadSpec, *, device: str | torch.device = "cpu",
          dtype: torch.dtype = torch.float32) -> Workload:
    """Build the workload of ``spec``: weights initialised from ``spec.seed``, on ``device``."""
    if not isinstance(spec, (MLPConfig, TransformerConfig, ConvNetConfig)):
        raise BadInputError(f"build needs an MLPConfig, TransformerConfig or ConvNetConfig, "
                            f"got {type(spec).__name__}")
    # Seed the init without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model, loss_fn, batch, tokens, first_grad = _build_parts(spec, device)
    n_params = sum(p.numel() for p in model.parameters())
    n_non_emb = n_params
    if isinstance(spec, TransformerConfig):
        n_non_emb -= model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
        L, H, Q, T = spec.n_layers, spec.n_heads, spec.head_dim, spec.seq_len
        flop = (6 * n_non_emb + 12 * L * H * Q * T) * T
    elif isinstance(spec, MLPConfig):
        flop = 6 * sum(m.in_features * m.out_features for m in model.modules()
                       if isinstance(m, nn.Linear))
    else:
        forward, _ = _convnet_forward_flop(spec)
        flop = 3 * forward
    return Workload(
        spec=spec,
        model=model.to(device=device, dtype=dtype),
        loss_fn=loss_fn,
        n_params=n_params,
        n_params_non_embedding=n_non_emb,
        flop_per_sample=flop,
        flop_per_sample_first_input_grad=first_grad,
        tokens_per_sample=tokens,
        block_names=tuple(f"blocks.{i}" for i in range(len(model.blocks))),
        stem_names=model.STEM, head_names=model.HEAD,
        tp_plan=model.tp_plan() if hasattr(model, "tp_plan") else None,
        family="builtin",
        _batch=batch,
    )


def _build_parts(spec, device):
    def on(model_cls):  # the model on the meta device when asked (shapes only), its task on the CPU
        with constructing_on(device):
            return model_cls(spec)

    if isinstance(spec, TransformerConfig):
        return on(GPT), _cross_entropy, _transformer_task(spec), spec.seq_len, 0
    if isinstance(spec, MLPConfig):
        n_out = spec.hidden_features if spec.depth > 1 else spec.out_features
        # First layer's input gradient: one in·out matmul of 2 FLOP per multiply-add.
        return on(MLP), F.mse_loss, _mlp_task(spec), None, 2 * spec.in_features * n_out
    _, stem = _convnet_forward_flop(spec)
    # The stem conv's input gradient costs as much as its forward.
    return on(ConvNet), _cross_entropy, _convnet_task(spec), None, stem
