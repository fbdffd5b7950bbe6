"""Your model in perfkit: an entry point (the workload contract, perfkit.measuring.workloads.user).

Name it in a notebook or a sweep as ``model: "user_model:build"`` with ``model_path`` the folder
holding this file (or that folder on PYTHONPATH). perfkit calls ``build`` with ``model_size``'s
keys as keyword arguments plus ``seed`` (and ``seq_len`` if the signature names it), builds on
the CPU in fp32, then moves the model to the device and precision of the configuration.
Replace the toy model below with yours: import it, build it, describe its batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """One repeated layer: FSDP2 shards each block as a unit, activation checkpointing recomputes
    each, pipeline stages split between them."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, n_features: int, width: int, depth: int, n_classes: int):
        super().__init__()
        self.stem = nn.Linear(n_features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, n_classes)

    def forward(self, features):
        x = self.stem(features)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(n_features: int = 64, width: int = 128, depth: int = 4, n_classes: int = 10, seed: int = 0):
    """What perfkit needs: the model and ``make_batch``; the rest is optional but unlocks more."""
    model = Model(n_features, width, depth, n_classes)
    prototypes = torch.randn(n_classes, n_features, generator=torch.Generator().manual_seed(seed))

    def make_batch(batch_size: int, seed: int):
        # On the CPU, from the seed alone: every rank draws the same global batch and takes its slice.
        gen = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, n_classes, (batch_size,), generator=gen)
        features = prototypes[labels] + 0.5 * torch.randn(batch_size, n_features, generator=gen)
        return features, labels  # inputs: a tensor, a tuple (model(*x)) or a dict (model(**x))

    # Analytic FLOP of one training step per sample (forward 2, backward 4 per multiply-add of
    # every Linear): MFU needs it. Leave it out and MFU is NaN with the reason; the counted FLOP
    # and their utilisation need nothing from you.
    matmul = n_features * width + depth * 8 * width * width + width * n_classes
    return {
        "model": model,
        "make_batch": make_batch,
        "loss_fn": F.cross_entropy,          # absent: the output is the loss, or has .loss
        "blocks": list(model.blocks),        # absent: no per-block FSDP, no checkpointing, no pp
        # forward is head(blocks(stem(x))), one tensor between them: pipeline stages split it at
        # the blocks (absent: no pp).
        "stem": [model.stem],
        "head": [model.head],
        "flop_per_sample": 6 * matmul,
        # Megatron pairs: tensor parallel splits fc1 by output features, fc2 by input features.
        "tp_plan": {f"blocks.{i}.{name}": style for i in range(depth)
                    for name, style in (("fc1", "colwise"), ("fc2", "rowwise"))},
    }
