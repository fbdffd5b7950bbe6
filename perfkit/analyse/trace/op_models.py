"""FLOP and bytes of one recorded op from its shapes and dtypes: one model per op family.

A trace recorded with shapes (``record_shapes=True``) gives each ``cpu_op`` its ``Input Dims``,
``Input type`` and ``Concrete Inputs`` (scalars such as ``is_causal``). From those alone, never a
device, each model returns the op's FLOP and the minimum bytes it moves (each input read once,
each output written once), as AMD TraceLens's ``PerfModel`` does one class per family; its
conventions are followed where it has one, so the two can be checked shape by shape:

- **GEMM** (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_scaled_mm``, ``_grouped_mm``): 2·M·N·K per
  matrix product, plus M·N for an ``addmm``/``baddbmm`` bias (TraceLens counts the bias add; the
  dispatch counter, ``torch.utils.flop_counter``, does not); bytes A + B + bias + C, C in A's dtype
  (``_scaled_mm``: its ``out_dtype``, else bf16).
- **Attention** (``_scaled_dot_product_{flash,efficient,cudnn}_attention``, their ``_backward``,
  ``_flash_attention_forward/backward``): 2·B·H·Nq·Nkv·(d_qk + d_v) forward, halved when causal
  (flash-attention's ``benchmark_flash_attention.py``, TraceLens); backward 2·B·H·Nq·Nkv·(2·d_qk +
  2·d_v), plus the flash kernels' recomputed Q·Kᵀ (2·B·H·Nq·Nkv·d_qk), halved when causal; bytes
  Q + K + V + O forward, Q + K + V + dO + dQ + dK + dV backward.
- **Convolution** (``convolution``, ``convolution_backward``): 2·N·C_out·∏out·(C_in/groups)·∏kernel
  forward (+ N·C_out·∏out with a bias); backward that per gradient its ``output_mask`` asks for
  (input, weight; the bias gradient N·C_out·∏out); bytes input + weight + bias + output forward,
  dO + input + weight read and the asked gradients written backward.
- **Normalization** (layer, batch, group, RMS norm and their backward): perfkit's dispatch-counter
  convention (:mod:`perfkit.measuring.ops.op_formulas`): 5 FLOP per element for the statistics and
  normalisation (3 for RMS), +1 per affine tensor, backward twice that; bytes input + weight + bias
  + output (backward: dO and input read, dX written).
- **Elementwise**: one FLOP per output element (``gelu`` 5, ``silu`` 2, as the counter); bytes
  every tensor input at its own size and the output at the broadcast shape in the first input's
  dtype (``copy_``: the source read, the destination written; ``to``, ``_to_copy``, ``clone`` and
  ``contiguous`` are composites whose ``copy_`` is counted).
- **Reductions and softmax**: 1 FLOP per input element (softmax 5 forward, 4 backward); bytes the
  input and the output (reduced dims from ``Concrete Inputs``).

An op a model cannot read (missing shapes, an unknown dtype, a shape of the wrong rank) gives
``None`` with the reason; an op no model covers is not placed on the roofline (its kernels are
listed as unexplained by :mod:`perfkit.analyse.trace.ops`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["OpWork", "CATEGORIES", "DTYPE_BYTES", "model_of", "op_work", "dtype_name"]

CATEGORIES = ("GEMM", "attention", "convolution", "normalization", "elementwise", "reduction")

#: Element sizes of the dtypes a Kineto trace names (``Input type``), and perfkit's precision names.
DTYPE_BYTES = {"c10::BFloat16": (2, "bf16"), "c10::Half": (2, "fp16"), "float": (4, "fp32"),
               "double": (8, "fp64"), "c10::Float8_e4m3fn": (1, "fp8"), "c10::Float8_e5m2": (1, "fp8"),
               "c10::Float8_e4m3fnuz": (1, "fp8"), "c10::Float8_e5m2fnuz": (1, "fp8"),
               "long int": (8, "int64"), "int": (4, "int32"), "short int": (2, "int16"),
               "signed char": (1, "int8"), "unsigned char": (1, "uint8"), "bool": (1, "bool"),
               "c10::complex<float>": (8, "complex64")}


@dataclass(frozen=True)
class OpWork:
    """What one op call computes and moves, by its family's model."""

    category: str
    flop: float
    bytes: float
    dtype: str
    """perfkit's name of the op's compute dtype (``bf16``, ``fp32``, ...): which peak applies."""


def dtype_name(kineto_type: str) -> str | None:
    """``c10::BFloat16`` → ``bf16``; None when the trace names a dtype perfkit does not know."""
    hit = DTYPE_BYTES.get(kineto_type)
    return hit[1] if hit else None


def _numel(dims) -> int:
    return math.prod(dims) if dims else 1


def _size(dims, kind: str) -> float:
    return _numel(dims) * DTYPE_BYTES[kind][0]


def _flag(concrete, index: int) -> bool:
    value = concrete[index] if concrete and index < len(concrete) else ""
    return str(value).strip().lower() == "true"


def _ints(text) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", str(text or ""))]


class _Model:
    category = ""

    def work(self, name: str, dims: list, types: list, concrete: list) -> tuple[float, float, str]:
        raise NotImplementedError


class _Gemm(_Model):
    """``mm(A, B)``, ``addmm(bias, A, B)``, ``bmm(A, B)``, ``baddbmm(C, A, B)``, ``_scaled_mm(A, B, ...)``,
    ``_grouped_mm(A, B, offs)``."""

    category = "GEMM"

    def work(self, name, dims, types, concrete):
        if name in ("addmm", "baddbmm"):
            bias, (a, b), (ta, tb) = dims[0], dims[1:3], types[1:3]
            bias_bytes = _size(bias, types[0])
        else:
            (a, b), (ta, tb), bias, bias_bytes = dims[:2], types[:2], None, 0.0
        if name == "_grouped_mm" and len(a) == 2 and len(b) == 3:
            rows, k, n = a[0], a[1], b[2]
            flop, out_dims = 2.0 * rows * k * n, [rows, n]
        elif len(a) == 3 and len(b) == 3:
            batch, m, k, n = a[0], a[1], a[2], b[2]
            flop, out_dims = 2.0 * batch * m * n * k, [batch, m, n]
        elif len(a) == 2 and len(b) == 2:
            m, k, n = a[0], a[1], b[1]
            flop, out_dims = 2.0 * m * n * k, [m, n]
        else:
            raise ValueError(f"operand ranks {len(a)}, {len(b)}")
        if bias is not None:
            flop += _numel(out_dims)  # TraceLens counts the bias add (beta·C), M·N
        out_kind = ta
        if name == "_scaled_mm":
            out_kind = next((t for t in types[2:] if t in DTYPE_BYTES and DTYPE_BYTES[t][1] in ("bf16", "fp16", "fp32")),
                            "c10::BFloat16")
        moved = _size(a, ta) + _size(b, tb) + bias_bytes + _size(out_dims, out_kind)
        return flop, moved, dtype_name(ta)


#: Attention ops: (position of is_causal in Concrete Inputs, layout of q: "bhnd" or "bnhd", backward).
_ATTENTION = {
    "_scaled_dot_product_flash_attention": (4, "bhnd", False),
    "_scaled_dot_product_efficient_attention": (6, "bhnd", False),
    "_scaled_dot_product_cudnn_attention": (6, "bhnd", False),
    "_scaled_dot_product_flash_attention_for_cpu": (4, "bhnd", False),
    "_flash_attention_forward": (6, "bnhd", False),
    "_scaled_dot_product_flash_attention_backward": (8, "bhnd", True),
    "_scaled_dot_product_efficient_attention_backward": (9, "bhnd", True),
    "_scaled_dot_product_cudnn_attention_backward": (11, "bhnd", True),
    "_scaled_dot_product_flash_attention_for_cpu_backward": (6, "bhnd", True),
    "_flash_attention_backward": (9, "bnhd", True),
}


class _Attention(_Model):
    category = "attention"

    def work(self, name, dims, types, concrete):
        causal_at, layout, backward = _ATTENTION[name]
        q, k, v = (dims[1:4] if backward else dims[0:3])
        kind = types[1] if backward else types[0]
        if layout == "bhnd":
            (b, h, nq, dqk), (_, _, nkv, _), dv = q, k, v[3]
        else:
            (b, nq, h, dqk), (_, nkv, _, _), dv = q, k, v[3]
        causal = _flag(concrete, causal_at)
        qk, pv = 2.0 * b * h * nq * nkv * dqk, 2.0 * b * h * nq * nkv * dv
        flop = (2 * qk + 2 * pv + qk) if backward and "flash" in name else (2 * qk + 2 * pv) if backward else qk + pv
        if causal:
            flop /= 2
        q_bytes, kv_bytes = _size(q, kind), _size(k, kind) + _size(v, kind)
        o_bytes = b * h * nq * dv * DTYPE_BYTES[kind][0]
        moved = (2 * (q_bytes + kv_bytes) + o_bytes) if backward else q_bytes + kv_bytes + o_bytes
        return flop, moved, dtype_name(kind)


class _Conv(_Model):
    """``convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)``;
    ``convolution_backward(dO, x, w, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask)``."""

    category = "convolution"

    def work(self, name, dims, types, concrete):
        backward = name == "convolution_backward"
        x, w = (dims[1], dims[2]) if backward else (dims[0], dims[1])
        kind = types[1] if backward else types[0]
        first = 4 if backward else 3
        stride, padding, dilation = (_ints(concrete[first + i]) for i in range(3))
        groups = (_ints(concrete[first + 5]) if len(concrete) > first + 5 else [1] or [1])[0]
        spatial = len(x) - 2
        stride, padding, dilation = ((v or [1]) * spatial if len(v) < spatial else v
                                     for v in (stride, padding or [0], dilation))
        out_sp = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
                  for i in range(spatial)]
        out_dims = [x[0], w[0], *out_sp]
        per_grad = 2.0 * _numel(out_dims) * (x[1] // groups) * _numel(w[2:])
        if backward:
            mask = [s.strip() == "True" for s in str(concrete[10] if len(concrete) > 10 else "").strip("[]").split(",")]
            mask += [True] * (3 - len(mask))
            flop = per_grad * (mask[0] + mask[1]) + (_numel(out_dims) if mask[2] and dims[3] else 0)
            moved = (_size(out_dims, kind) + _size(x, kind) + _size(w, kind)
                     + mask[0] * _size(x, kind) + mask[1] * _size(w, kind))
            return flop, moved, dtype_name(kind)
        bias = dims[2] if len(dims) > 2 else []
        flop = per_grad + (_numel(out_dims) if bias else 0)
        moved = _size(x, kind) + _size(w, kind) + (_size(bias, types[2]) if bias else 0) + _size(out_dims, kind)
        return flop, moved, dtype_name(kind)


#: Norms: (index of the input, of the weight, of the bias or None; FLOP per element of the statistics).
_NORMS = {"native_layer_norm": (0, 2, 3, 5), "native_layer_norm_backward": (1, 5, 6, 5),
          "native_batch_norm": (0, 1, 2, 5), "_native_batch_norm_legit": (0, 1, 2, 5),
          "_native_batch_norm_legit_no_training": (0, 1, 2, 2), "cudnn_batch_norm": (0, 1, 2, 5),
          "miopen_batch_norm": (0, 1, 2, 5), "native_batch_norm_backward": (1, 2, None, 5),
          "cudnn_batch_norm_backward": (0, 2, None, 5), "miopen_batch_norm_backward": (0, 2, None, 5),
          "native_group_norm": (0, 1, 2, 5), "native_group_norm_backward": (1, 4, None, 5),
          "_fused_rms_norm": (0, 2, None, 3), "_fused_rms_norm_backward": (1, 4, None, 3)}


class _Norm(_Model):
    category = "normalization"

    def work(self, name, dims, types, concrete):
        xi, wi, bi, stats = _NORMS[name]
        x, kind = dims[xi], types[xi]
        weight = dims[wi] if wi < len(dims) and dims[wi] else None
        bias = dims[bi] if bi is not None and bi < len(dims) and dims[bi] else None
        affine = (weight is not None) + (bias is not None)
        backward = name.endswith("_backward")
        flop = _numel(x) * (stats + affine) * (2 if backward else 1)
        params = (_size(weight, types[wi]) if weight else 0) + (_size(bias, types[bi]) if bias else 0)
        moved = (3 if backward else 2) * _size(x, kind) + params
        return flop, moved, dtype_name(kind)


_ELEMENTWISE = {name: 1 for name in """
add sub rsub mul div neg abs reciprocal sqrt rsqrt exp exp2 expm1 log log2 log1p sin cos tanh sigmoid
erf pow relu threshold threshold_backward clamp clamp_min clamp_max maximum minimum where masked_fill
sign floor ceil round trunc remainder fmod eq ne lt le gt ge logical_and logical_or logical_not
bitwise_and bitwise_or bitwise_not square hardtanh leaky_relu fill copy addcmul addcdiv lerp mish
silu_backward sigmoid_backward tanh_backward gelu_backward
""".split()}
_ELEMENTWISE.update({"gelu": 5, "silu": 2, "addcmul": 2, "addcdiv": 2, "lerp": 2, "gelu_backward": 10,
                     "silu_backward": 4, "sigmoid_backward": 3, "tanh_backward": 3, "copy": 0, "fill": 0})


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            out[i] = max(out[i], d)
    return out


class _Elementwise(_Model):
    category = "elementwise"

    def work(self, name, dims, types, concrete):
        tensors = [(d, t) for d, t in zip(dims, types) if t in DTYPE_BYTES and (d or t)]
        shaped = [(d, t) for d, t in tensors if isinstance(d, list)]
        if not shaped:
            raise ValueError("no tensor input")
        if name in ("copy", "copy_"):  # copy_(dst, src): the source read, the destination written
            (dst, dst_t), (src, src_t) = shaped[0], shaped[1] if len(shaped) > 1 else shaped[0]
            return 0.0, _size(src, src_t) + _size(dst, dst_t), dtype_name(dst_t)
        out = _broadcast([d for d, _ in shaped])
        flop = _ELEMENTWISE[name] * _numel(out)
        moved = sum(_size(d, t) for d, t in shaped) + _size(out, shaped[0][1])
        return float(flop), moved, dtype_name(shaped[0][1])


_REDUCTIONS = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "argmax": 1, "argmin": 1,
               "prod": 1, "var": 3, "std": 3, "norm": 2, "linalg_vector_norm": 2, "logsumexp": 4,
               "_softmax": 5, "_log_softmax": 5, "_softmax_backward_data": 4, "_log_softmax_backward_data": 4,
               "cumsum": 1}


class _Reduction(_Model):
    category = "reduction"

    def work(self, name, dims, types, concrete):
        x, kind = dims[0], types[0]
        if name.startswith(("_softmax", "_log_softmax")):  # same shape out; backward reads dY and Y
            reads = 2 if name.endswith("_backward_data") else 1
            return float(_REDUCTIONS[name] * _numel(x)), (reads + 1) * _size(x, kind), dtype_name(kind)
        axes = _ints(concrete[1]) if len(concrete) > 1 else []
        kept = [d for i, d in enumerate(x) if axes and i not in {a % len(x) for a in axes}] if x else []
        return float(_REDUCTIONS[name] * _numel(x)), _size(x, kind) + _numel(kept) * DTYPE_BYTES[kind][0], dtype_name(kind)


_MODELS: dict[str, _Model] = {}
for _names, _model in ((("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm"), _Gemm()),
                       (tuple(_ATTENTION), _Attention()), (("convolution", "convolution_backward"), _Conv()),
                       (tuple(_NORMS), _Norm()), (tuple(_ELEMENTWISE) + ("copy_",), _Elementwise()),
                       (tuple(_REDUCTIONS), _Reduction())):
    for _n in _names:
        _MODELS[_n] = _model


def _base(op: str) -> str:
    """``aten::add_`` → ``add``; ``aten::copy_`` → ``copy``."""
    name = op.split("::", 1)[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") and name[:-1] in _MODELS else name


def model_of(op: str) -> str | None:
    """The category of the model that covers ``op`` (an ``aten::`` name), or None."""
    if not op.startswith("aten::"):
        return None
    model = _MODELS.get(_base(op))
    return model.category if model else None


def op_work(op: str, dims, types, concrete) -> tuple[OpWork | None, str | None]:
    """(the op's work, None) or (None, why it has none) from its recorded shapes."""
    model = _MODELS.get(_base(op)) if op.startswith("aten::") else None
    if model is None:
        return None, f"no model for {op}"
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, f"{op}: recorded without shapes (profile with record_shapes=True)"
    try:
        flop, moved, dtype = model.work(_base(op), dims, types, concrete if isinstance(concrete, list) else [])
    except (IndexError, ValueError, TypeError, KeyError, ZeroDivisionError) as err:
        return None, f"{op}: shapes the model cannot read ({type(err).__name__}: {err})"
    if dtype is None:
        return None, f"{op}: dtype {types[0] if types else '?'} unknown to perfkit"
    return OpWork(category=model.category, flop=float(flop), bytes=float(moved), dtype=dtype), None
