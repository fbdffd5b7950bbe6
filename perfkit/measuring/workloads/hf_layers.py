"""The layers of a Hugging Face decoder by kind, and what each kind costs: the attention-like FLOP
beyond its weights' matmuls (those are in 6N), and the bytes its cache holds. This year's models
mix kinds: sliding-window and full attention (gemma3, gpt_oss), multi-head latent attention
(deepseek_v3), gated linear attention beside full attention (qwen3_next), Mamba beside attention
(jamba), state-space layers alone (mamba2).

The pattern comes from the config: ``layer_types`` where the family has one (transformers writes
it for the hybrids), else every layer the family's one kind. A ``linear_attention`` entry means the
family's recurrent mixer (Gated DeltaNet in qwen3_next, Mamba in jamba, Mamba-2 in mamba2). A kind
perfkit has no model for is named, never costed as attention: the analytic FLOP and cache bytes
are then NaN with the reason (:attr:`Layers.unmodelled`).

FLOP conventions, forward, per sequence of T tokens (training: ×3, as PaLM's 12·L·H·Q·T is 3 × 4):

- **attention** (Vaswani et al. 2017; PaLM app. B): Q·Kᵀ and A·V, 2·H·T²·(d_qk + d_v), the full
  T×T score matrix (not halved for the causal mask, PaLM's convention).
- **sliding window** (Beltagy et al. 2020, Longformer; gemma3, gpt_oss): each query attends to
  min(T, w) keys: 2·H·T·min(T, w)·(d_qk + d_v).
- **latent attention** (DeepSeek-V2 §2.1, DeepSeek-V3): the same with d_qk = nope + rope head
  dims and d_v = ``v_head_dim``; the latent projections are weights (in 6N).
- **Gated DeltaNet** (Yang et al. 2024, "Gated Delta Networks", chunkwise form), as transformers'
  ``torch_chunk_gated_delta_rule`` runs it: T padded to chunks of C = 64; per chunk and value
  head, K·Kᵀ and Q·Kᵀ (2·C²·d_k each), two unit-triangular solves (C²·d_v, C²·d_k), the intra-chunk
  read (2·C²·d_v) and four state products (2·C·d_k·d_v each).
- **Mamba** (Gu & Dao 2023; jamba): the selective scan's state readout, 2·d_inner·d_state a
  token (its discretisation and update are elementwise; the projections and the depthwise
  convolution are weights).
- **Mamba-2** (Dao & Gu 2024, SSD, chunked), as transformers' ``torch_forward`` runs it: T
  padded to ``chunk_size``; per chunk and head, C·Bᵀ (2·C²·N), the diagonal block (2·C²·P), the
  chunk's states and their read (2·C·N·P each).

Cache bytes, per sequence, at ``positions`` (Pope et al. 2022 for keys and values; the recurrent
states as transformers' cache layers hold them):

- attention: keys and values, kv_heads · (d_k + d_v) a position; a static cache allocates every
  position of its length, a dynamic one holds those seen;
- sliding window: min(positions, w) in a static cache, min(positions, w − 1) in a dynamic one
  (transformers keeps w − 1 between steps);
- latent attention: the compressed latent and the shared rope key, ``kv_lora_rank`` +
  ``qk_rope_head_dim`` a position (DeepSeek-V2's cache, as transformers holds it);
- Gated DeltaNet: a convolution state (2·H_k·d_k + H_v·d_v) × kernel and a recurrent state
  H_v·d_k·d_v, whatever the length;
- Mamba: (d_inner × d_conv) and (d_inner × d_state); Mamba-2: (d_inner + 2·groups·N) × kernel and
  heads · head_dim · N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Layers", "layers_of", "attention_flop", "cache_bytes", "measured_cache_bytes", "KINDS"]

KINDS = ("attention", "sliding_attention", "latent_attention", "gated_deltanet", "mamba", "mamba2")
#: The recurrent mixer a ``linear_attention`` layer is, by model_type.
_LINEAR = {"qwen3_next": "gated_deltanet", "qwen3_5": "gated_deltanet", "qwen3_5_moe": "gated_deltanet",
           "jamba": "mamba", "mamba": "mamba", "mamba2": "mamba2"}
#: transformers' torch_chunk_gated_delta_rule's chunk (its default; the fla kernels use 64 too).
DELTANET_CHUNK = 64


@dataclass(frozen=True)
class Layers:
    """The decoder's layer kinds in order, and the ones perfkit has no model for."""

    kinds: tuple[str, ...]
    unmodelled: str | None = None
    """Why the analytic figures are NaN (which layers, of which kind), or None."""

    def count(self, kind: str) -> int:
        return sum(k == kind for k in self.kinds)

    def summary(self) -> str:
        """``"1 gated_deltanet + 1 attention"``: the pattern, for a row."""
        counts = {k: self.count(k) for k in dict.fromkeys(self.kinds)}
        return " + ".join(f"{n} {k}" for k, n in counts.items())


def layers_of(config) -> Layers:
    """The layer kinds of a decoder's ``config`` (its ``layer_types``, else the family's one kind)."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    model_type = getattr(config, "model_type", "?")
    n = getattr(config, "num_hidden_layers", None)
    types = getattr(config, "layer_types", None)
    if not types:
        if model_type in ("mamba", "mamba2"):
            types = ["linear_attention"] * (n or 0)
        elif getattr(config, "num_attention_heads", None):
            types = ["full_attention"] * (n or 0)
        else:
            return Layers((), f"hf:{model_type}: neither layer_types nor attention heads in its config: "
                              "no analytic model for its layers")
    kinds, unknown = [], {}
    latent = getattr(config, "kv_lora_rank", None) is not None
    for i, t in enumerate(types):
        if t in ("full_attention", "attention"):
            kinds.append("latent_attention" if latent else "attention")
        elif t in ("sliding_attention", "sliding_window"):
            kinds.append("sliding_attention")
        elif t == "linear_attention" and model_type in _LINEAR:
            kinds.append(_LINEAR[model_type])
        else:
            kinds.append(t)
            unknown.setdefault(t, []).append(i)
    reason = None
    if unknown:
        reason = "; ".join(f"{'layers' if len(idx) > 1 else 'layer'} {', '.join(map(str, idx))} "
                           f"{'are' if len(idx) > 1 else 'is'} {t!r} in hf:{model_type}, a kind perfkit has no "
                           f"analytic model for (counted ops still are)" for t, idx in unknown.items())
    return Layers(tuple(kinds), reason)


def _heads(config) -> tuple[int, int, int, int]:
    """(query heads, key/value heads, d_qk, d_v) of an attention layer."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim, head_dim


def attention_flop(config, seq_len: int, layers: Layers | None = None) -> float:
    """Forward FLOP of one sequence of ``seq_len`` tokens beyond the weights' matmuls, summed over
    the layer pattern (the module docstring's conventions); NaN where a kind is unmodelled."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = layers or layers_of(config)
    if layers.unmodelled:
        return math.nan
    t, total = seq_len, 0.0
    for kind in layers.kinds:
        if kind in ("attention", "sliding_attention"):
            heads, _, d_qk, d_v = _heads(config)
            keys = min(t, config.sliding_window) if kind == "sliding_attention" and config.sliding_window else t
            total += 2 * heads * t * keys * (d_qk + d_v)
        elif kind == "latent_attention":
            d_qk = config.qk_nope_head_dim + config.qk_rope_head_dim
            total += 2 * config.num_attention_heads * t * t * (d_qk + config.v_head_dim)
        elif kind == "gated_deltanet":
            c, dk, dv, hv = DELTANET_CHUNK, config.linear_key_head_dim, config.linear_value_head_dim, \
                config.linear_num_value_heads
            chunks = math.ceil(t / c)
            total += hv * chunks * (4 * c * c * dk + c * c * (dv + dk) + 2 * c * c * dv + 8 * c * dk * dv)
        elif kind == "mamba":
            d_inner = int(_mamba_expand(config) * config.hidden_size)
            total += 2 * t * d_inner * _mamba_state(config)
        elif kind == "mamba2":
            c = config.chunk_size
            padded = math.ceil(t / c) * c
            n, p, h = config.state_size, config.head_dim, config.num_heads
            total += h * padded * (2 * c * n + 2 * c * p + 4 * n * p)
    return float(total)


def _mamba_expand(config) -> float:
    return getattr(config, "mamba_expand", None) or getattr(config, "expand", 2)


def _mamba_state(config) -> int:
    return getattr(config, "mamba_d_state", None) or config.state_size


def _mamba_conv(config) -> int:
    return getattr(config, "mamba_d_conv", None) or config.conv_kernel


def cache_bytes(config, batch_size: int, positions: int, element_bytes: int, *, static: bool,
                layers: Layers | None = None) -> tuple[float, float]:
    """(key/value bytes, recurrent-state bytes) a cache holds for ``batch_size`` sequences at
    ``positions`` (a static cache: its length), summed over the layer pattern; NaN where a kind is
    unmodelled."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers = layers or layers_of(config)
    if layers.unmodelled:
        return math.nan, math.nan
    kv = state = 0
    for kind in layers.kinds:
        if kind in ("attention", "sliding_attention"):
            _, kv_heads, d_k, d_v = _heads(config)
            held = positions
            if kind == "sliding_attention" and config.sliding_window:
                held = min(positions, config.sliding_window if static else config.sliding_window - 1)
            kv += held * kv_heads * (d_k + d_v)
        elif kind == "latent_attention":
            kv += positions * (config.kv_lora_rank + config.qk_rope_head_dim)
        elif kind == "gated_deltanet":
            key_dim = config.linear_num_key_heads * config.linear_key_head_dim
            value_dim = config.linear_num_value_heads * config.linear_value_head_dim
            state += (2 * key_dim + value_dim) * config.linear_conv_kernel_dim
            state += config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
        elif kind == "mamba":
            d_inner = int(_mamba_expand(config) * config.hidden_size)
            state += d_inner * _mamba_conv(config) + d_inner * _mamba_state(config)
        elif kind == "mamba2":
            d_inner = int(config.expand * config.hidden_size)
            state += (d_inner + 2 * config.n_groups * config.state_size) * config.conv_kernel
            state += config.num_heads * config.head_dim * config.state_size
    return float(kv * batch_size * element_bytes), float(state * batch_size * element_bytes)


def measured_cache_bytes(cache) -> tuple[int, int]:
    """(key/value bytes, recurrent-state bytes) of the tensors a transformers cache holds now:
    each layer's ``keys``/``values`` and its ``conv_states``/``recurrent_states``; an
    encoder–decoder's self- and cross-attention caches together."""
    if hasattr(cache, "self_attention_cache"):
        a, b = measured_cache_bytes(cache.self_attention_cache), measured_cache_bytes(cache.cross_attention_cache)
        return a[0] + b[0], a[1] + b[1]
    kv = state = 0
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if tensor is not None and hasattr(tensor, "numel"):
                kv += tensor.numel() * tensor.element_size()
        for name in ("conv_states", "recurrent_states"):
            held = getattr(layer, name, None)
            for tensor in (held.values() if isinstance(held, dict) else [held]):
                if tensor is not None and hasattr(tensor, "numel"):
                    state += tensor.numel() * tensor.element_size()
    return kv, state
