"""Entry points written for the tests: users' models, not perfkit's (the workload contract of
perfkit.measuring.workloads.user). Imported by name in kernels and ranks (tests/ is on their
PYTHONPATH, as a user's package would be)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Residual(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + F.gelu(self.fc(x))


class TinyRecommender(nn.Module):
    """Dense features and one categorical id in (a tuple), a score out: an embedding, residual
    layers, a head. Nothing like perfkit's own mlp/transformer/convnet."""

    def __init__(self, n_dense: int, n_ids: int, width: int, depth: int):
        super().__init__()
        self.ids = nn.Embedding(n_ids, width)
        self.dense = nn.Linear(n_dense, width)
        self.layers = nn.ModuleList(_Residual(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, dense, ids):
        x = self.dense(dense) + self.ids(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).squeeze(-1)


def recommender(n_dense: int = 16, n_ids: int = 32, width: int = 32, depth: int = 3, seed: int = 0):
    model = TinyRecommender(n_dense, n_ids, width, depth)
    teacher = torch.randn(n_dense, generator=torch.Generator().manual_seed(seed + 7))

    def make_batch(batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        dense = torch.randn(batch_size, n_dense, generator=gen)
        ids = torch.randint(0, n_ids, (batch_size,), generator=gen)
        return (dense, ids), dense @ teacher + (ids % 3).float()

    # Linear layers: 2 FLOP per multiply-add forward, 4 backward (input and weight gradients);
    # the first layer's input gradient is not skipped here (autograd does skip it).
    matmul = n_dense * width + depth * width * width + width
    return {"model": model, "make_batch": make_batch, "loss_fn": F.mse_loss,
            "blocks": list(model.layers), "flop_per_sample": 6 * matmul}


class _WithLoss(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, features, target):
        return {"loss": F.mse_loss(self.body(features), target)}


def returns_its_loss(width: int = 8, seed: int = 0):
    """Inputs as a dict of keywords, the loss computed by the model (no loss_fn, no blocks)."""
    def make_batch(batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch_size, width, generator=gen)
        return {"features": x, "target": x.flip(-1)}, None

    return {"model": _WithLoss(width), "make_batch": make_batch}


def no_model(seed: int = 0):
    return {"make_batch": lambda n, s: (torch.zeros(n), torch.zeros(n))}


def not_a_mapping(seed: int = 0):
    return nn.Linear(2, 2)
