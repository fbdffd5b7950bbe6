"""Entry points written for the tests: users' models, not perfkit's (the workload contract of
perfkit.measuring.workloads.user). Imported by name in kernels and ranks (tests/ is on their
PYTHONPATH, as a user's package would be)."""

from __future__ import annotations

import time

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


class BagRecommender(nn.Module):
    """A DLRM-style recommender: dense features, and a bag of categorical ids per sample in the
    standard ``nn.EmbeddingBag`` layout: one flat ``indices`` tensor and the ``offsets`` where each
    sample's bag starts (so ``indices`` is not split along dim 0 by sample)."""

    def __init__(self, n_dense: int, n_ids: int, width: int, depth: int):
        super().__init__()
        self.bags = nn.EmbeddingBag(n_ids, width, mode="sum")
        self.dense = nn.Linear(n_dense, width)
        self.layers = nn.ModuleList(_Residual(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, dense, indices, offsets):
        x = self.dense(dense) + self.bags(indices, offsets)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).squeeze(-1)


def bag_recommender(n_dense: int = 8, n_ids: int = 64, width: int = 16, depth: int = 2, max_bag: int = 5,
                    seed: int = 0, split: bool = True):
    """Bags of 1..max_bag ids per sample; ``split``: give the contract's split_batch (False: the
    rows-on-dim-0 default, which cannot split the flat indices)."""
    def make_batch(batch_size: int, seed_: int):
        # Tensors made here, not when the entry point runs: the pre-run check builds the model on
        # the meta device and can then still draw a batch and check how it splits.
        teacher = torch.randn(n_dense, generator=torch.Generator().manual_seed(seed + 11))
        gen = torch.Generator().manual_seed(seed_)
        dense = torch.randn(batch_size, n_dense, generator=gen)
        lengths = torch.randint(1, max_bag + 1, (batch_size,), generator=gen)
        indices = torch.randint(0, n_ids, (int(lengths.sum()),), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        return (dense, indices, offsets), dense @ teacher + lengths.float()

    def split_batch(batch, lo: int, hi: int):
        (dense, indices, offsets), target = batch
        start = int(offsets[lo])
        end = int(offsets[hi]) if hi < len(offsets) else len(indices)
        return (dense[lo:hi], indices[start:end], offsets[lo:hi] - start), target[lo:hi]

    model = BagRecommender(n_dense, n_ids, width, depth)
    return {"model": model, "make_batch": make_batch, "loss_fn": F.mse_loss, "blocks": list(model.layers),
            "split_batch": split_batch if split else None}


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


class _Sequential(nn.Module):
    """A stem, residual blocks and a head, run in that order: a model pp can split at its blocks."""

    def __init__(self, n_features: int, width: int, depth: int, n_classes: int):
        super().__init__()
        self.embed = nn.Linear(n_features, width)
        self.blocks = nn.ModuleList(_Residual(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.classifier = nn.Linear(width, n_classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.classifier(self.norm(x))


def sequential(n_features: int = 16, width: int = 32, depth: int = 4, n_classes: int = 5, seed: int = 0,
               tuple_inputs: bool = False, centres_on_cpu: bool = True):
    """Declares its stem and head (a name, a module and a name), so pipeline stages split it at its
    blocks; ``tuple_inputs``: its batches' inputs as a 1-tuple, which stages cannot pass.
    ``centres_on_cpu`` False: its class centres are made on the default device, which is the meta
    device when perfkit checks a configuration, so that check cannot draw a batch (the ranks do)."""
    model = _Sequential(n_features, width, depth, n_classes)
    centres = torch.randn(n_classes, n_features, generator=torch.Generator().manual_seed(seed + 11),
                          device="cpu" if centres_on_cpu else None)

    def make_batch(batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, n_classes, (batch_size,), generator=gen)
        x = centres[labels] + 0.3 * torch.randn(batch_size, n_features, generator=gen)
        return ((x,) if tuple_inputs else x), labels

    return {"model": model, "make_batch": make_batch, "loss_fn": F.cross_entropy, "blocks": list(model.blocks),
            "stem": ["embed"], "head": [model.norm, "classifier"]}


#: The simulated device's allocations a failed forward left behind (see ``simulated_device``).
_DEVICE_HELD: list[torch.Tensor] = []


class _OnSimulatedDevice(nn.Module):
    """A linear map whose forward takes ``per_sample_bytes`` a sample from a device of
    ``capacity_bytes``: past it, it raises ``torch.OutOfMemoryError`` as CUDA's allocator does,
    and what it had taken stays held by the process (a module-level reference, as a caching
    allocator's segments or a traceback's frames keep a real OOM's tensors alive)."""

    def __init__(self, width: int, capacity_bytes: int, per_sample_bytes: int):
        super().__init__()
        self.fc = nn.Linear(width, 1)
        self.capacity_bytes, self.per_sample_bytes = capacity_bytes, per_sample_bytes

    def forward(self, x):
        used = sum(t.numel() for t in _DEVICE_HELD)
        need = x.shape[0] * self.per_sample_bytes
        if used + need > self.capacity_bytes:
            _DEVICE_HELD.append(torch.empty(self.capacity_bytes - used, dtype=torch.uint8))
            raise torch.OutOfMemoryError(f"simulated device: tried to allocate {need} bytes, "
                                         f"{self.capacity_bytes - used} free of {self.capacity_bytes}")
        return self.fc(x).squeeze(-1)


def simulated_device(capacity_bytes: int = 2**26, per_sample_bytes: int = 2**16, width: int = 8, seed: int = 0):
    """An entry point whose OOM edge is ``capacity_bytes // per_sample_bytes`` samples in a fresh
    process, and whose OOM poisons the process it happened in (``_OnSimulatedDevice``)."""
    torch.manual_seed(seed)
    model = _OnSimulatedDevice(width, capacity_bytes, per_sample_bytes)

    def make_batch(batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, width, generator=gen), torch.randn(batch_size, generator=gen)

    return {"model": model, "make_batch": make_batch, "loss_fn": F.mse_loss}


class _DeviceWork(torch.autograd.Function):
    """Sleeps ``delay_s`` in forward and twice that in backward: the host idle while a device works,
    as on a GPU (the compute does not compete for the host's cores with communication)."""

    @staticmethod
    def forward(ctx, x, delay_s: float):
        ctx.delay_s = delay_s
        time.sleep(delay_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.delay_s)
        return grad.clone(), None


class _DeviceBlock(nn.Module):
    def __init__(self, width: int, delay_s: float):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.delay_s = delay_s

    def forward(self, x):
        return x + self.fc(_DeviceWork.apply(x, self.delay_s))


class DeviceLike(nn.Module):
    """Blocks whose compute is a sleep (:class:`_DeviceWork`) beside a real linear layer each."""

    def __init__(self, width: int, depth: int, delay_s: float):
        super().__init__()
        self.layers = nn.ModuleList(_DeviceBlock(width, delay_s) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x).squeeze(-1)


def device_like(width: int = 256, depth: int = 4, delay_ms: float = 5.0, seed: int = 0):
    """A model whose step is mostly a simulated device's work: what-if predictions are checked on
    it where real CPU compute would share the cores with the ranks' communication."""
    torch.manual_seed(seed)
    model = DeviceLike(width, depth, delay_ms / 1e3)

    def make_batch(batch_size: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, width, generator=gen), torch.randn(batch_size, generator=gen)

    return {"model": model, "make_batch": make_batch, "loss_fn": F.mse_loss, "blocks": list(model.layers)}


def sequential_with_grad_scaled_on_rank_1(grad_scale: float = 1.0, **size):
    """``sequential`` with every parameter's gradient multiplied by ``grad_scale`` on rank 1 only,
    before DDP's all-reduce: a deliberate defect (0.5: the averaged gradient is 0.75 of the true
    one) that the step time cannot see and the loss trajectory must. 1.0 is the healthy model."""
    import torch.distributed as dist

    built = sequential(**size)
    if grad_scale != 1.0 and dist.is_initialized() and dist.get_rank() == 1:
        for p in built["model"].parameters():
            p.register_hook(lambda g, s=grad_scale: g * s)
    return built
