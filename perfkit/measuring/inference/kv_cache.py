"""Greedy generation with GPT's own weights: with a per-layer KV cache, or recomputing everything.

The workloads' :class:`perfkit.measuring.workloads.models.GPT` has no cache (its forward sees the whole
sequence). :class:`CachedGPT` runs the *same modules* (``tok_emb``, ``pos_emb``, each block's
``ln1``, ``attn.{q,k,v,out}_proj``, ``ln2``, ``mlp``, then ``ln_f``, ``lm_head``) in the order
``GPT.forward`` runs them, but keeps each layer's keys and values in a cache preallocated to the
maximum length, ``[batch, heads, max_len, head_dim]`` per layer (HF ``StaticCache``, gpt-fast's
``KVCache``): no reallocation while generating, so memory is fixed before the first token.

- **Prefill** (positions ``0..P-1``): one forward over the prompt; the new keys and values go
  into the cache by ``index_copy_`` along the sequence dimension (HF ``StaticCache.update``);
  causal attention over the prompt; logits of the last position only (the next token needs no
  others; vLLM computes only those).
- **Decode** (position ``t``): one token per sequence; its key and value written at ``t``, its
  query attends to the cache's first ``t + 1`` entries (a slice: the step reads the KV cache
  once, not the whole preallocated length), no mask (everything before is visible).
- **No cache** (``kv_cache=False``): every step is ``GPT.forward`` of the whole sequence so far,
  its last position's logits taken (the comparison the cache exists to beat).

:func:`generate` produces exactly ``new_tokens`` tokens per sequence, greedily (argmax, no
early stop: optimum-benchmark forces ``min_new_tokens = max_new_tokens``), and the time each
token became available on the host (the device synchronized first), from which
:mod:`perfkit.analyse.inference` derives TTFT, TPOT and ITL. :func:`count_steps` counts one
prefill and one decode step (:func:`perfkit.measuring.ops.counting.count_ops`) for the roofline;
:func:`sdpa_context` forces one SDPA backend and :func:`sdpa_backends` says which a device has.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from perfkit.measuring.inference import hf_steps

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SDPA_BACKENDS", "NO_KERNEL", "sdpa_backends", "sdpa_context", "KVCache", "CachedGPT", "allocate_cache",
           "FullGPT", "default_step", "Generation", "generate", "synchronizer", "count_steps"]


#: ``auto`` lets torch choose; the others force one ``torch.nn.attention.SDPBackend``.
SDPA_BACKENDS = {"auto": None, "math": "MATH", "flash": "FLASH_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
_CPU_BACKENDS = ("math", "flash")  # torch's CPU SDPA kernels: the math path and the flash kernel
#: What torch's RuntimeError says when a forced backend has no kernel for the inputs.
NO_KERNEL = ("No viable backend", "No available kernel")


def sdpa_backends(device: str) -> dict[str, str | None]:
    """Each forced SDPA backend → None where ``device`` has a kernel for it, else why not.

    On CUDA/ROCm a backend's kernel also depends on dtype and head size; those are found when it
    runs (torch raises "No viable backend"), and the configuration ends ``skipped`` then.
    """
    out = {name: None for name in SDPA_BACKENDS if name != "auto"}
    if str(device).split(":")[0] == "cpu":
        for name in out:
            if name not in _CPU_BACKENDS:
                out[name] = (f"sdpa_backend {name!r} has no CPU kernel (a CPU has "
                             f"{' and '.join(_CPU_BACKENDS)})")
    return out


def sdpa_context(name: str):
    """The block runs attention with backend ``name`` only (``auto``: torch chooses)."""
    if SDPA_BACKENDS[name] is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])


@dataclass(kw_only=True, frozen=True)
class KVCache:
    """Keys and values of every layer, ``[batch, heads, max_len, head_dim]`` each."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @classmethod
    def allocate(cls, model: nn.Module, batch_size: int, max_len: int) -> KVCache:
        """A zeroed cache for ``model`` (a GPT) on its parameters' device and dtype."""
        weight = model.lm_head.weight
        attn = model.blocks[0].attn
        d_model = attn.q_proj.out_features
        shape = (batch_size, attn.n_heads, max_len, d_model // attn.n_heads)

        def zeros():
            return torch.zeros(shape, device=weight.device, dtype=weight.dtype)

        n = len(model.blocks)
        return cls(keys=tuple(zeros() for _ in range(n)), values=tuple(zeros() for _ in range(n)))


class CachedGPT(nn.Module):
    """A forward over a GPT's own modules that reads and fills a :class:`KVCache`.

    Holds ``model`` (no copy of a parameter), so its outputs are the GPT's: greedy tokens match
    ``GPT.forward`` over the full sequence (up to the rounding of different matmul shapes).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """Logits ``[batch, vocab]`` of the last position of ``tokens`` (``[batch, t]``), which sit
        at positions ``start .. start + t - 1``; their keys and values are written into ``cache``.

        Either a prefill (``start == 0``) or one decode token (``t == 1``): chunked prefill
        would need a mask aligned to the cache's end, which SDPA's ``is_causal`` is not.
        """
        gpt = self.model
        t = tokens.shape[1]
        positions = torch.arange(start, start + t, device=tokens.device)
        x = gpt.tok_emb(tokens) + gpt.pos_emb(positions)
        for block, keys, values in zip(gpt.blocks, cache.keys, cache.values):
            x = x + _cached_attention(block.attn, block.ln1(x), keys, values, positions, start)
            x = x + block.mlp(block.ln2(x))
        return gpt.lm_head(gpt.ln_f(x[:, -1]))


def _cached_attention(attn: nn.Module, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      positions: torch.Tensor, start: int) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = (p(x).view(b, t, attn.n_heads, d // attn.n_heads).transpose(1, 2)
               for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    keys.index_copy_(2, positions, k)
    values.index_copy_(2, positions, v)
    end = start + t
    # Prefill: square causal attention over the prompt. Decode: one query sees all `end` keys;
    # is_causal would align its mask to the top left and hide all but the first key.
    y = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], is_causal=t > 1)
    return attn.out_proj(y.transpose(1, 2).reshape(b, t, d))


class FullGPT(nn.Module):
    """No cache: ``GPT.forward`` over the whole sequence so far, the last position's logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, cache=None, start: int = 0) -> torch.Tensor:
        return self.model(tokens)[:, -1]


def default_step(model: nn.Module, kv_cache: bool, source: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """The eager step of a :func:`generate`: :class:`CachedGPT` or :class:`FullGPT` of perfkit's
    GPT, a Hugging Face causal LM's through its own cache, an encoder–decoder's over the encoder
    input ``source`` (:mod:`perfkit.measuring.inference.hf_steps`)."""
    if hf_steps.is_encoder_decoder(model):
        if source is None:
            raise ValueError(f"{type(model).__name__} is an encoder-decoder: its step needs the encoder's input")
        return hf_steps.HFSeq2SeqStep(model, source)
    if hf_steps.is_hf(model):
        return hf_steps.HFCachedStep(model) if kv_cache else hf_steps.HFFullStep(model)
    return CachedGPT(model) if kv_cache else FullGPT(model)


def allocate_cache(model: nn.Module, batch_size: int, max_len: int):
    """A fresh cache of ``max_len`` positions for one generation, allocated before the clock."""
    if hf_steps.is_hf(model):
        return hf_steps.allocate_cache(model, batch_size, max_len)
    return KVCache.allocate(model, batch_size, max_len)


def _max_positions(model: nn.Module) -> int | None:
    return hf_steps.max_positions(model) if hf_steps.is_hf(model) else model.pos_emb.num_embeddings


def _vocab_size(model: nn.Module) -> int:
    return hf_steps.vocab_size(model) if hf_steps.is_hf(model) else model.lm_head.out_features


@dataclass(kw_only=True, frozen=True)
class Generation:
    """What one :func:`generate` call produced."""

    tokens: torch.Tensor
    """``[batch, new_tokens]`` generated token ids (the prompt excluded)."""
    timestamps_s: tuple[float, ...]
    """Host clock at the start, then when each of the ``new_tokens`` tokens was available
    (``new_tokens + 1`` values, seconds)."""
    margins: torch.Tensor | None = None
    """``[batch, new_tokens]`` top-1 minus top-2 logit at each step (how near a tie the greedy
    choice was), when asked for."""
    top_logits: torch.Tensor | None = None
    """``[batch, new_tokens]`` the top-1 logit at each step (the scale of the margin), with ``margins``."""


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """Waits for ``device``'s queued work (CUDA/ROCm); nothing to wait for on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int, *, kv_cache: bool = True,
             step: Callable | None = None,
             synchronize: Callable[[], None] | None = None, margins: bool = False,
             max_len: int | None = None) -> Generation:
    """Greedily generate exactly ``new_tokens`` tokens after ``prompt`` (``[batch, P]``).

    ``step(tokens, cache, start) -> logits`` replaces the forward (a compiled
    :func:`default_step`); by default the eager one of ``kv_cache``. The
    cache (when used) is allocated before the clock starts, at ``max_len`` positions (default
    ``P + new_tokens``; a larger one keeps a compiled step's shapes across generation lengths).
    Each token's timestamp is taken after ``synchronize`` (default: the prompt's device's).
    """
    batch, prompt_len = prompt.shape
    total = prompt_len + new_tokens
    limit = _max_positions(model)
    if limit is not None and max(total, max_len or 0) > limit:
        raise ValueError(f"{max(total, max_len or 0)} positions (prompt {prompt_len} + {new_tokens} "
                         f"new tokens) exceed the model's {limit}")
    sync = synchronize or synchronizer(prompt.device)
    step = default_step(model, kv_cache) if step is None else step
    cache = allocate_cache(model, batch, max(total, max_len or 0)) if kv_cache else None
    seq = torch.empty(batch, total, dtype=prompt.dtype, device=prompt.device)
    seq[:, :prompt_len] = prompt
    gaps, tops = ([], []) if margins else (None, None)
    sync()
    stamps = [time.perf_counter()]
    for i in range(new_tokens):
        pos = prompt_len + i  # where the token generated now goes
        if kv_cache:
            tokens, start = (seq[:, :pos], 0) if i == 0 else (seq[:, pos - 1:pos], pos - 1)
        else:
            tokens, start = seq[:, :pos], 0
        logits = step(tokens, cache, start)
        seq[:, pos] = logits.argmax(-1)
        if gaps is not None:
            top = logits.float().topk(2, dim=-1).values
            gaps.append(top[:, 0] - top[:, 1])
            tops.append(top[:, 0])
        sync()
        stamps.append(time.perf_counter())
    return Generation(tokens=seq[:, prompt_len:].clone(), timestamps_s=tuple(stamps),
                      margins=torch.stack(gaps, dim=1) if gaps is not None else None,
                      top_logits=torch.stack(tops, dim=1) if tops is not None else None)


def count_steps(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, *,
                kv_cache: bool = True, source: dict[str, torch.Tensor] | None = None) -> dict[str, pd.DataFrame]:
    """``{"prefill": ops, "decode": ops}``: :func:`perfkit.measuring.ops.counting.count_ops` frames of
    the eager prefill and of the decode step producing token ``new_tokens // 2`` (none when
    ``new_tokens`` is 1). With the cache that step reads ``P + new_tokens // 2`` cached
    positions (a fresh cache is filled to them first, uncounted: a growing cache then holds
    as many as a static one); without it, it recomputes that many. An encoder–decoder's
    ``prompt`` is its decoder's start and ``source`` its encoder's input (the prefill counts the
    encoder)."""
    from perfkit.measuring.ops.counting import count_ops

    batch, prompt_len = prompt.shape
    step = default_step(model, kv_cache, source)
    total = prompt_len + new_tokens
    vocab = _vocab_size(model)
    with torch.no_grad():
        out = {"prefill": count_ops(step, prompt, allocate_cache(model, batch, total) if kv_cache else None, 0)}
        if new_tokens > 1:
            pos = prompt_len + new_tokens // 2  # keys the decode step attends to
            seq = torch.randint(0, vocab, (batch, pos), device=prompt.device)
            seq[:, :prompt_len] = prompt
            if kv_cache:
                cache = allocate_cache(model, batch, total)
                step(seq[:, :pos - 1], cache, 0)
                out["decode"] = count_ops(step, seq[:, pos - 1:pos], cache, pos - 1)
            else:
                out["decode"] = count_ops(step, seq, None, 0)
    return out
