"""What an inference run's cache holds: the analytic bytes of its layer pattern
(:mod:`perfkit.measuring.workloads.hf_layers` for a transformers model; keys and values of every
layer for perfkit's own decoder) beside the bytes of the cache's own tensors after the prompt."""

from __future__ import annotations

import torch

from perfkit.measuring.inference import kv_cache as kv
from perfkit.measuring.workloads.user import UserModelSpec

__all__ = ["cache_columns"]


def cache_columns(cfg, model: torch.nn.Module, prompt: torch.Tensor, source, element_bytes: int) -> dict:
    """The cache's columns: ``kv_cache_bytes`` (keys and values of every attention layer for the
    generation's P + N positions, the largest the decode reads) and ``state_bytes`` (the fixed
    recurrent states of linear-attention and state-space layers), by the layer pattern's analytic
    model; for a transformers model also ``kv_cache_kind`` (static, dynamic, the model's own) and the bytes its
    cache's tensors hold after the prompt (``*_measured``), beside the model's figure for that
    moment (``*_after_prompt``): the check that the model is the cache."""
    spec, element = cfg.spec, element_bytes
    positions = cfg.prompt_len + cfg.new_tokens
    if not isinstance(spec, UserModelSpec):
        return {"kv_cache_bytes": 2 * spec.n_layers * cfg.batch_size * positions * spec.d_model * element,
                "state_bytes": 0}
    from perfkit.measuring.inference import hf_steps
    from perfkit.measuring.workloads.hf_layers import measured_cache_bytes

    cache = kv.allocate_cache(model, cfg.batch_size, positions)
    kind = hf_steps.cache_kind(cache)
    static = kind == "static"
    if kind == "encoder-decoder":  # the decoder's 1 + N positions, the encoder's P
        kv_bytes, state = hf_steps.kv_cache_bytes(model, cfg.batch_size, 1 + cfg.new_tokens, element,
                                                  source_positions=cfg.prompt_len)
        after = hf_steps.kv_cache_bytes(model, cfg.batch_size, 1, element, source_positions=cfg.prompt_len)
    else:
        kv_bytes, state = hf_steps.kv_cache_bytes(model, cfg.batch_size, positions, element, static=static)
        after = hf_steps.kv_cache_bytes(model, cfg.batch_size, positions if static else cfg.prompt_len, element,
                                        static=static)
    with torch.no_grad():
        kv.default_step(model, True, source)(prompt, cache, 0)
    held = cache.cache if isinstance(cache, hf_steps.ModelsOwnCache) else cache  # the one the model built
    measured = measured_cache_bytes(held) if held is not None else (0, 0)
    kind = hf_steps.cache_kind(cache)  # a cache the model builds for itself exists from the prompt on
    return {"kv_cache_bytes": kv_bytes, "state_bytes": state, "kv_cache_kind": kind,
            "kv_cache_bytes_after_prompt": after[0], "state_bytes_after_prompt": after[1],
            "kv_cache_bytes_measured": measured[0], "state_bytes_measured": measured[1]}
