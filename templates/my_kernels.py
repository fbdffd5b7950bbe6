"""A worked example for notebooks/kernels.ipynb: RMSNorm three ways, and what the notebook needs.

- ``rms_norm``: RMSNorm (Zhang & Sennrich 2019) written out in torch ops, the signature of
  ``torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)``;
- ``rms_norm_wrong``: the same with a deliberate defect, the mean of squares over half the count
  (the output √2 too small), which the notebook must report ``correct: False`` in every dtype and
  keep out of ``fast_p``, however fast it is;
- ``rms_norm_triton``: a Triton kernel (``perfkit[triton]``; on a machine without a GPU it runs in
  Triton's interpreter, ``TRITON_INTERPRET=1``, set here before Triton is imported: correct results,
  the interpreter's times), one program per row; without Triton its points fail, saying so;
- ``rms_norm_inputs(shape, dtype, device)``: the arguments for one point, ``shape`` the named
  dimensions ``{"rows": R, "hidden": H}``;
- ``rms_norm_flops``/``rms_norm_bytes``: the work of one call (4·R·H FLOP: square, sum, scale,
  weight; read x and the weight, write y), for impls the dispatch counter cannot see.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernel on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton
    import triton.language as tl
except ImportError:  # the example's other impls run without it
    triton = None


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    y = (x.float() * scale).to(x.dtype)
    return y * weight if weight is not None else y


def rms_norm_wrong(x, normalized_shape, weight=None, eps=1e-6):
    half = x.shape[-1] // 2
    scale = torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) / half + eps)
    y = (x.float() * scale).to(x.dtype)
    return y * weight if weight is not None else y


if triton is not None:
    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + cols, (x * scale * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(x, normalized_shape, weight=None, eps=1e-6):
    """One Triton program per row (the whole row in one block), fp32 inside."""
    if triton is None:
        raise ImportError("triton is not installed: pip install 'perfkit[triton]' (make test installs it)")
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    x2 = x.contiguous().view(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _rms_norm_kernel[(x2.shape[0],)](x2, weight, y, x2.shape[1], eps, BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view_as(x)


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
