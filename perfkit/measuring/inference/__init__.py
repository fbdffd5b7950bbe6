"""Inference: prefill and greedy decode with a per-layer KV cache, TTFT/TPOT/ITL, prefill and
decode on the roofline. May import ``core``, ``analyse``, ``measuring.kernels`` (its roofs),
``measuring.ops`` (counting) and ``measuring.workloads`` (the GPT it decodes)."""
