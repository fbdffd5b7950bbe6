"""The models of the training workloads: plain ``nn.Module``s, no data, no FLOP formulas.

Every model runs its layers as ``model.blocks`` (an ``nn.ModuleList``) between a stem and a head,
because the training step (:mod:`perfkit.measuring.training.step`) needs that shape: FSDP2 shards each
block as one unit (:func:`perfkit.measuring.training.parallel.apply_fsdp`),
``model.activation_checkpointing = True`` recomputes each block's activations in backward, and the
mlp and transformer say how tensor parallel splits them with ``model.tp_plan()``
(:func:`perfkit.measuring.training.parallel.apply_tp`). Their configurations are in
:mod:`perfkit.measuring.workloads.configs`, their synthetic tasks and analytic FLOP in
:mod:`perfkit.measuring.workloads.synthetic`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from perfkit.measuring.workloads.configs import ConvNetConfig, MLPConfig, TransformerConfig

__all__ = ["MLP", "GPT", "ConvNet"]


class _BlockModel(nn.Module):
    """A stem, ``blocks`` run in order (each optionally checkpointed), a head.

    ``forward_stem`` and ``forward_head`` use only the submodules named in ``STEM`` and ``HEAD``,
    so a pipeline stage (:class:`perfkit.measuring.training.pipeline_stages.StageModule`) that holds those
    under the same names runs the model's own code around its share of the blocks."""

    STEM: tuple[str, ...] = ()
    HEAD: tuple[str, ...] = ()
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (non-reentrant
    ``torch.utils.checkpoint``; it composes with DDP, FSDP2 and torch.compile)."""

    def forward(self, x):
        return self.forward_head(self._run_blocks(self.forward_stem(x)))

    def forward_stem(self, x):
        return x

    def forward_head(self, x):
        return x

    def _run_blocks(self, x):
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class _Dense(nn.Module):
    """One Linear layer of the mlp, ReLU after it unless it is the last."""

    def __init__(self, n_in: int, n_out: int, bias: bool, relu: bool):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, bias=bias)
        self.relu = relu

    def forward(self, x):
        y = self.linear(x)
        return F.relu(y) if self.relu else y


class MLP(_BlockModel):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        widths = [cfg.in_features] + [cfg.hidden_features] * (cfg.depth - 1) + [cfg.out_features]
        self.blocks = nn.ModuleList(_Dense(a, b, cfg.bias, i < cfg.depth - 1)
                                    for i, (a, b) in enumerate(zip(widths, widths[1:])))

    def tp_plan(self) -> dict[str, str]:
        # Megatron pairs: layer 2i split by output features, layer 2i+1 by input features, so
        # the ReLU between them runs on the local shard and each pair ends in one all-reduce. An
        # odd last layer stays replicated.
        plan = {}
        for i in range(0, len(self.blocks) - 1, 2):
            plan[f"blocks.{i}.linear"] = "colwise"
            plan[f"blocks.{i + 1}.linear"] = "rowwise"
        return plan


class _Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        # Separate named projections (not one fused qkv) so tensor parallel plans can target them.
        self.q_proj = nn.Linear(d, d, bias=cfg.bias)
        self.k_proj = nn.Linear(d, d, bias=cfg.bias)
        self.v_proj = nn.Linear(d, d, bias=cfg.bias)
        self.out_proj = nn.Linear(d, d, bias=cfg.bias)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 rather than n_heads: under tensor parallel a rank holds only its share of the heads.
        q, k, v = (p(x).view(b, t, -1, x.shape[-1] // self.n_heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class _MLPBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    #: Megatron-LM's split (Shoeybi et al. 2019, section 3): q/k/v by output features (whole
    #: heads per rank), out_proj by input features; fc1 by output, fc2 by input features.
    TP_PLAN = {"attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
               "attn.out_proj": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise"}

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = _Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = _MLPBlock(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(_BlockModel):
    STEM, HEAD = ("tok_emb", "pos_emb"), ("ln_f", "lm_head")

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward_stem(self, tokens):
        return self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1], device=tokens.device))

    def forward_head(self, x):
        return self.lm_head(self.ln_f(x))

    def tp_plan(self) -> dict[str, str]:
        # Embeddings, norms and the lm head stay replicated.
        return {f"blocks.{i}.{path}": style for i in range(len(self.blocks))
                for path, style in _Block.TP_PLAN.items()}


class _BasicBlock(nn.Module):
    """ResNet's BasicBlock (He et al. 2016): two 3×3 convs, projection shortcut on shape change."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ConvNet(_BlockModel):
    """Stem conv, BasicBlocks, global average pool and a linear head. No ``tp_plan``: tensor
    parallel of convolutions is not a Megatron column/row split."""

    STEM, HEAD = ("stem",), ("head",)

    def __init__(self, cfg: ConvNetConfig):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, cfg.widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(cfg.widths[0]),
            nn.ReLU(),
        )
        blocks, c_in = [], cfg.widths[0]
        for stage, width in enumerate(cfg.widths):
            for i in range(cfg.blocks_per_stage):
                blocks.append(_BasicBlock(c_in, width, 2 if stage > 0 and i == 0 else 1))
                c_in = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, cfg.n_classes)

    def forward_stem(self, x):
        return self.stem(x)

    def forward_head(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
