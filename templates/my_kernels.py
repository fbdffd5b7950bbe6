"""A worked example for notebooks/kernels.ipynb: RMSNorm three ways, and what the notebook needs.

- ``rms_norm``: RMSNorm (Zhang & Sennrich 2019) written out in torch ops, the signature of
  ``torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)``;
- ``rms_norm_wrong``: the same with a deliberate defect, the mean of squares over half the count
  (the output √2 too small), which the notebook must report ``correct: False`` in every dtype and
  keep out of ``fast_p``, however fast it is;
- ``rms_norm_triton``: a Triton kernel where Triton is installed (under ``TRITON_INTERPRET=1`` on a
  CPU), one program per row;
- ``rms_norm_inputs(shape, dtype, device)``: the arguments for one point, ``shape`` the named
  dimensions ``{"rows": R, "hidden": H}``;
- ``rms_norm_flops``/``rms_norm_bytes``: the work of one call (4·R·H FLOP: square, sum, scale,
  weight; read x and the weight, write y), for impls the dispatch counter cannot see.
"""

from __future__ import annotations

import torch


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    y = (x.float() * scale).to(x.dtype)
    return y * weight if weight is not None else y


def rms_norm_wrong(x, normalized_shape, weight=None, eps=1e-6):
    half = x.shape[-1] // 2
    scale = torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) / half + eps)
    y = (x.float() * scale).to(x.dtype)
    return y * weight if weight is not None else y


def rms_norm_inputs(shape, dtype, device):
    x = torch.randn(shape["rows"], shape["hidden"], dtype=dtype, device=device)
    weight = torch.randn(shape["hidden"], dtype=dtype, device=device)
    return x, (shape["hidden"],), weight, 1e-6


def rms_norm_flops(shape, dtype):
    return 4 * shape["rows"] * shape["hidden"]


def rms_norm_bytes(shape, dtype):
    size = torch.empty((), dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                                                  "fp64": "float64"}.get(dtype, "float32"))).element_size()
    return (2 * shape["rows"] * shape["hidden"] + shape["hidden"]) * size
