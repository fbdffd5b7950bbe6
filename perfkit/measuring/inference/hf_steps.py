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

An **encoder–decoder** (``hf:t5``, ``hf:bart``, ``hf:whisper``: ``config.is_encoder_decoder``)
generates after its decoder's start token: the step is :class:`HFSeq2SeqStep`, holding the
encoder's input (``source``: token ids, or whisper's log-mel features). Its first step (one start
token at position 0) runs the encoder once, then the decoder — so TTFT is encoder + first token,
as transformers' ``generate()`` spends it — and every later step runs the decoder alone over the
kept encoder output. The cache is an ``EncoderDecoderCache`` of two ``DynamicCache``: the
decoder's self-attention keys and values grow by one position per token, the cross-attention
keys and values of the encoder's positions are computed at the first step and read by every one
after. Without the cache, each step runs the decoder over the whole sequence so far (the encoder
output is still kept: ``generate(use_cache=False)`` keeps it too).
"""

from __future__ import annotations

import torch
from torch import nn

from perfkit.core.errors import ConfigurationSkipped

__all__ = ["is_hf", "is_encoder_decoder", "HFCachedStep", "HFFullStep", "HFSeq2SeqStep", "allocate_cache",
           "max_positions", "vocab_size", "kv_cache_bytes", "cache_kind", "cache_keyword", "ModelsOwnCache"]


def is_hf(model: nn.Module) -> bool:
    """A transformers model (it has a ``config`` and ``generation_config``-era forward)."""
    return hasattr(model, "config") and hasattr(model, "get_output_embeddings")


def is_encoder_decoder(model: nn.Module) -> bool:
    """An encoder–decoder (t5, bart, whisper): it generates after a decoder start token."""
    return is_hf(model) and bool(getattr(model.config, "is_encoder_decoder", False))


def max_positions(model: nn.Module) -> int | None:
    """Positions the (decoder of the) model can attend over (None: not limited by its config;
    t5's relative positions)."""
    config = model.config
    decoder = getattr(config, "max_target_positions", None) if is_encoder_decoder(model) else None
    return decoder or getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def vocab_size(model: nn.Module) -> int:
    return int(model.config.vocab_size)


def _decoder_attention(config) -> tuple[int, int, int]:
    """An encoder–decoder's decoder layers, heads and head dim (bart/whisper, t5 spellings)."""
    layers = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
    heads = getattr(config, "decoder_attention_heads", None) or config.num_heads
    return layers, heads, getattr(config, "d_kv", None) or config.d_model // heads


def kv_cache_bytes(model: nn.Module, batch_size: int, positions: int, element_bytes: int,
                   source_positions: int = 0, *, static: bool = True) -> tuple[float, float]:
    """(key/value bytes, recurrent-state bytes) the model's cache holds at ``positions`` (a static
    cache: its length), over its layer pattern (:mod:`perfkit.measuring.workloads.hf_layers`:
    full, sliding-window and latent attention, Gated DeltaNet, Mamba); NaN where a layer kind has
    no model. An encoder–decoder's decoder layers hold ``positions`` of self-attention and
    ``source_positions`` (the encoder's output) of cross-attention."""
    from perfkit.measuring.workloads import hf_layers

    if is_encoder_decoder(model):
        layers, heads, head_dim = _decoder_attention(model.config)
        return float(2 * layers * batch_size * (positions + source_positions) * heads * head_dim * element_bytes), 0.0
    return hf_layers.cache_bytes(model.config, batch_size, positions, element_bytes, static=static)


def cache_keyword(model: nn.Module) -> str:
    """The forward's name for the cache: ``past_key_values``, or ``cache_params`` (mamba, mamba2)."""
    import inspect

    names = inspect.signature(model.forward).parameters
    return "cache_params" if "cache_params" in names and "past_key_values" not in names else "past_key_values"


class ModelsOwnCache:
    """The cache a family's forward builds for itself when given none (``use_cache=True``):
    MiniMax's ``MiniMaxCache`` (it refuses any other), RecurrentGemma's ``DynamicCache`` with the
    recurrent states its ``_setup_cache`` allocates. The prefill creates it; every later step
    passes it back (:class:`HFCachedStep`)."""

    def __init__(self):
        self.cache = None


def cache_kind(cache) -> str:
    """``static``, ``dynamic``, ``encoder-decoder``, or the model's own class (``own:MiniMaxCache``):
    which transformers cache a row used."""
    import transformers

    if isinstance(cache, ModelsOwnCache):
        inner = cache.cache
        return "dynamic" if inner is None or type(inner) is transformers.DynamicCache else f"own:{type(inner).__name__}"
    if isinstance(cache, transformers.EncoderDecoderCache):
        return "encoder-decoder"
    return "static" if isinstance(cache, transformers.StaticCache) else "dynamic"


def allocate_cache(model: nn.Module, batch_size: int, max_len: int, *, static: bool = True):
    """A fresh cache for one generation: transformers' ``StaticCache`` of ``max_len`` positions
    where the family compiles whole (``_can_compile_fullgraph``), its layers allocated now, else
    the one the model builds for itself at the prompt (:class:`ModelsOwnCache`: a ``DynamicCache``
    for most, a class of its own for some). The layers of a static cache are of each layer's kind (sliding, full,
    latent, linear attention: ``config.layer_types``) and take their shapes from the first update,
    so one token through the model allocates them all, with the shapes each layer really has, and
    ``reset()`` zeroes them: the prompt then fills an allocated cache, as a compiled step's does."""
    import transformers

    if is_encoder_decoder(model):
        return transformers.EncoderDecoderCache(transformers.DynamicCache(config=model.config),
                                                transformers.DynamicCache(config=model.config))
    if static and getattr(model, "_can_compile_fullgraph", False):
        cache = transformers.StaticCache(config=model.config, max_cache_len=max_len)
        param = next(model.parameters())
        with torch.no_grad():
            HFCachedStep(model)(torch.zeros(batch_size, 1, dtype=torch.long, device=param.device), cache, 0)
        cache.reset()
        return cache
    return ModelsOwnCache()


class HFCachedStep(nn.Module):
    """Prefill (``start == 0``, the prompt) or one decode token, through ``cache``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.keyword = cache_keyword(model)

    def forward(self, tokens: torch.Tensor, cache, start: int) -> torch.Tensor:
        t = tokens.shape[1]
        positions = torch.arange(start, start + t, device=tokens.device)
        own = cache if isinstance(cache, ModelsOwnCache) else None
        if own is not None:
            cache = own.cache  # None at the prompt: the model builds its own
        if self.keyword == "cache_params":  # a state-space model: no positions, its own state
            out = self.model(input_ids=tokens, cache_params=cache, use_cache=True, logits_to_keep=1)
        else:
            out = self.model(input_ids=tokens, past_key_values=cache, use_cache=True,
                             position_ids=positions.unsqueeze(0).expand(tokens.shape[0], -1),
                             cache_position=positions, logits_to_keep=1)
        if own is not None:
            built = getattr(out, "cache_params" if self.keyword == "cache_params" else "past_key_values", None)
            if built is None:
                raise ConfigurationSkipped(
                    f"{type(self.model).__name__} returns no cache ({type(out).__name__}): transformers keeps its "
                    f"state inside the model, so its decode cannot be stepped token by token here; kv_cache=False "
                    f"measures it without a cache")
            own.cache = built
        return out.logits[:, -1]


class HFFullStep(nn.Module):
    """No cache: the model over the whole sequence so far, the last position's logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, cache=None, start: int = 0) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False, logits_to_keep=1).logits[:, -1]


class HFSeq2SeqStep(nn.Module):
    """An encoder–decoder's step: the encoder over ``source`` when the generation starts (one
    token at position 0), then the decoder through ``cache`` (or over the whole sequence so far,
    ``cache`` None) reading the kept encoder output."""

    def __init__(self, model: nn.Module, source: dict[str, torch.Tensor]):
        super().__init__()
        self.model = model
        self.source = source
        self.encoded = None

    def forward(self, tokens: torch.Tensor, cache, start: int) -> torch.Tensor:
        if self.encoded is None or (start == 0 and (cache is not None or tokens.shape[1] == 1)):
            self.encoded = self.model.get_encoder()(**self.source)
        if cache is None:
            out = self.model(encoder_outputs=self.encoded, decoder_input_ids=tokens, use_cache=False)
        else:
            out = self.model(encoder_outputs=self.encoded, decoder_input_ids=tokens, past_key_values=cache,
                             use_cache=True)
        return out.logits[:, -1]
