"""Prefill and decode steps of a Hugging Face causal LM through its own KV cache: what
:func:`perfkit.measuring.inference.kv_cache.generate` runs for ``model: "hf:<model_type>"``.

A step has the signature of perfkit's own (``step(tokens, cache, start) -> logits of the last
position``), so the generation loop, its timestamps, the counted prefill and decode steps and the
roofline are the same code for both models. The cache is transformers' own: a ``StaticCache``
(allocated whole before the clock starts, ``max_cache_len`` positions: the shapes a compiled step
keeps) where the family takes one, else a ``DynamicCache`` (which grows by concatenation inside
the timed steps, as ``generate()`` without a static cache does). Without the cache, every step
runs the model over the whole sequence so far (``use_cache=False``). Only the last position's
logits are computed (``logits_to_keep=1``), as perfkit's own decoder computes them.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["is_hf", "HFCachedStep", "HFFullStep", "allocate_cache", "max_positions", "vocab_size",
           "kv_cache_bytes"]


def is_hf(model: nn.Module) -> bool:
    """A transformers model (it has a ``config`` and ``generation_config``-era forward)."""
    return hasattr(model, "config") and hasattr(model, "get_output_embeddings")


def max_positions(model: nn.Module) -> int | None:
    """Positions the model can attend over (None: not limited by its config)."""
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


def vocab_size(model: nn.Module) -> int:
    return int(model.config.vocab_size)


def _kv_heads_and_dim(config) -> tuple[int, int]:
    """Key/value heads (``num_key_value_heads`` under grouped-query attention) and head dim."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return kv_heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_cache_bytes(model: nn.Module, batch_size: int, positions: int, element_bytes: int) -> int:
    """Keys and values of every layer for ``positions`` positions: the key/value heads × head dim
    per position and layer."""
    kv_heads, head_dim = _kv_heads_and_dim(model.config)
    return 2 * model.config.num_hidden_layers * batch_size * positions * kv_heads * head_dim * element_bytes


def allocate_cache(model: nn.Module, batch_size: int, max_len: int, *, static: bool = True):
    """A fresh cache for one generation: a ``StaticCache`` of ``max_len`` positions, allocated now
    (its first use fills it for ``batch_size`` sequences), or a ``DynamicCache``."""
    import transformers

    if static and getattr(model, "_can_compile_fullgraph", False):
        cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
        # Allocate the layers' tensors before the clock starts (StaticCache allocates lazily).
        param = next(model.parameters())
        kv_heads, head_dim = _kv_heads_and_dim(model.config)
        probe = torch.zeros(batch_size, kv_heads, 1, head_dim, dtype=param.dtype, device=param.device)
        for layer in cache.layers:
            if hasattr(layer, "lazy_initialization"):
                layer.lazy_initialization(probe, probe)
        return cache
    return transformers.DynamicCache(config=model.config)


class HFCachedStep(nn.Module):
    """Prefill (``start == 0``, the prompt) or one decode token, through ``cache``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, cache, start: int) -> torch.Tensor:
        t = tokens.shape[1]
        positions = torch.arange(start, start + t, device=tokens.device)
        out = self.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                         position_ids=positions.unsqueeze(0).expand(tokens.shape[0], -1),
                         cache_position=positions, logits_to_keep=1)
        return out.logits[:, -1]


class HFFullStep(nn.Module):
    """No cache: the model over the whole sequence so far, the last position's logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, cache=None, start: int = 0) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False, logits_to_keep=1).logits[:, -1]
