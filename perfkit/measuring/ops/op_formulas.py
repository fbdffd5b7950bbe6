"""FLOP and minimum bytes of one aten op call: the rules :class:`perfkit.measuring.ops.counting.OpCounter` applies.

:func:`op_rule` gives an op call's family, FLOP and (for gathers) its bytes; :func:`distinct_bytes`
the minimum traffic of a set of tensors. Pure functions of the op and its arguments' metadata
(shapes, strides, dtypes, storages), never of tensor values.

Conventions (stated here because every number depends on them):

- FLOP: matmul, convolution and attention use ``torch.utils.flop_counter`` (2·M·N·K per GEMM,
  bias/beta additions not counted, causal attention not halved); the CPU fused-attention ops
  reuse its ``sdpa_flop_count``/``sdpa_backward_flop_count``. Elementwise: each arithmetic
  operation and each transcendental (exp, log, erf, tanh, sigmoid, sqrt...) is 1 FLOP per
  output element; composite activations count their formula (gelu erf form
  0.5·x·(1+erf(x/√2)) = 5, tanh form 0.5·x·(1+tanh(√(2/π)(x+0.044715x³))) = 9, silu
  x·sigmoid(x) = 2). Normalisation forward: 5 per element when statistics are computed (mean 1,
  variance 2, normalise 2), 2 when given (batch norm in eval), +1 per affine tensor. Softmax
  forward 5 per element (max, sub, exp, sum, div; log_softmax: max, sub, exp, sum, sub);
  backward 4 (y·(dy − Σdy·y); dy − exp(y)·Σdy). Backward of norms and activations without a
  derived count: 2 × forward (the backward-is-twice-forward rule of the 6·N convention).
  Reductions: 1 per input element (var/std 3, vector norm 2, logsumexp 4); a ``_foreach_`` op
  (elementwise or reduction) counts every tensor of its list. Copies, casts,
  gathers, factories and embedding lookup: 0; embedding dense backward: 1 per grad element.
  nll_loss: 1 per target (+1 with class weights); mse_loss and its backward: 3 per element.
- Bytes are the minimum traffic: each distinct memory range of the inputs read once, of the
  outputs written once, at the dtype's element size. Ranges are keyed by storage so a tensor
  and its views (``x`` and ``x.t()``) count once, and broadcast (stride-0) dimensions count
  once. Gathers count what they touch: embedding reads min(#indices, vocab) rows, nll_loss one
  log-probability per target. In-place index writes (``index_copy_``, ``index_put_``: a KV
  cache's new entries) read the values and indices and write as many elements as the values
  hold, not the whole tensor written into. Counting reads metadata only, never tensor values
  (no sync).
"""

from __future__ import annotations

import math

import torch
from torch.utils import flop_counter as _fc
from torch.utils._pytree import tree_flatten

__all__ = ["op_rule", "distinct_bytes", "dtype_name", "tensors_in"]


# ---- rule tables ----------------------------------------------------------------------------
# Keyed by overload-packet name without namespace ("mm"); in-place variants ("add_") and
# _foreach_* list variants resolve to the same rule.

_VIEWS = frozenset("""
view _unsafe_view _reshape_alias reshape t transpose permute expand expand_as squeeze unsqueeze
detach alias as_strided slice select narrow split split_with_sizes unbind chunk diagonal unfold
view_as view_as_real view_as_complex real imag lift_fresh _conj conj _neg_view numpy_T
unsafe_split unsafe_split_with_sizes tensor_split movedim swapaxes swapdims mT mH adjoint
sym_size sym_stride sym_numel sym_storage_offset size stride numel dim storage_offset
is_contiguous sym_is_contiguous is_strides_like_format is_non_overlapping_and_dense
resolve_conj resolve_neg is_same_size _has_compatible_shallow_copy_type
_record_function_enter _record_function_enter_new _record_function_exit
""".split())

# FLOP per output element. Comparisons, selects and clamps are counted as 1 like arithmetic.
_ELEMENTWISE = {name: 1 for name in """
add sub rsub mul div neg abs reciprocal sqrt rsqrt exp exp2 expm1 log log2 log10 log1p sin cos
tan tanh sigmoid erf erfc erfinv pow relu threshold threshold_backward hardtanh
hardtanh_backward leaky_relu leaky_relu_backward clamp clamp_min clamp_max maximum minimum where
masked_fill sign sgn floor ceil round trunc frac remainder fmod eq ne lt le gt ge logical_and
logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not atan2 atan
asin acos sinh cosh asinh acosh atanh nan_to_num isnan isinf isfinite square relu6 xlogy
floor_divide
""".split()}
_ELEMENTWISE.update({
    "gelu": 5, "silu": 2, "softplus": 3, "mish": 5, "hardswish": 4, "hardsigmoid": 3, "elu": 3,
    "addcmul": 2, "addcdiv": 2, "lerp": 2, "sigmoid_backward": 3, "tanh_backward": 3,
    "silu_backward": 4, "softplus_backward": 6, "mish_backward": 10, "elu_backward": 6,
    "hardswish_backward": 8, "hardsigmoid_backward": 6,
})
_GELU_TANH = 9

# Move or create data, no arithmetic: 0 FLOP, bytes by the generic rule.
_COPIES = frozenset("""
copy _to_copy clone contiguous _copy_from _copy_from_and_resize lift_fresh_copy index_select
gather cat stack constant_pad_nd flip roll repeat tril triu index _unsafe_index index_put
_index_put_impl scatter slice_scatter select_scatter as_strided_scatter masked_select
_local_scalar_dense masked_scatter select_backward slice_backward diagonal_backward
unfold_backward index_select_backward index_copy
""".split())
_FACTORIES = frozenset("""
zeros ones full zeros_like ones_like full_like fill zero arange scalar_tensor rand randn
rand_like randn_like randint randint_like normal uniform bernoulli randperm linspace
new_zeros new_ones new_full
""".split())
# Orderings (a mixture of experts' routing: top-k experts per token, tokens sorted by expert):
# comparisons, not arithmetic: 0 FLOP, bytes by the generic rule.
_ORDERINGS = frozenset("topk sort argsort".split())
_ALLOCATIONS = frozenset(
    "empty empty_like empty_strided new_empty new_empty_strided resize".split())

_REDUCTIONS = {name: 1 for name in """
sum mean amax amin max min argmax argmin prod nansum any all cumsum cumprod count_nonzero histc bincount
""".split()}
_REDUCTIONS.update({"var": 3, "std": 3, "var_mean": 3, "std_mean": 3,
                    "linalg_vector_norm": 2, "norm": 2, "logsumexp": 4})

_SOFTMAX = {"_softmax": 5, "_log_softmax": 5, "_safe_softmax": 5,
            "_softmax_backward_data": 4, "_log_softmax_backward_data": 4}

_CPU_SDPA = {"_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_fused_attention_overrideable"}


def tensors_in(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _numel(tree) -> int:
    return sum(t.numel() for t in tensors_in(tree))


def _first_numel(tree) -> int:
    ts = tensors_in(tree)
    return ts[0].numel() if ts else 0


# name: (index of the input, of the weight, of the bias; "w": present iff the weight is).
_NORMS = {
    "native_layer_norm": (0, 2, 3), "native_layer_norm_backward": (1, 5, 6),
    "native_group_norm": (0, 1, 2), "native_group_norm_backward": (1, 4, "w"),
    "native_batch_norm": (0, 1, 2), "native_batch_norm_backward": (1, 2, "w"),
    "_native_batch_norm_legit": (0, 1, 2), "_native_batch_norm_legit_no_training": (0, 1, 2),
    "cudnn_batch_norm": (0, 1, 2), "cudnn_batch_norm_backward": (0, 2, "w"),
    "miopen_batch_norm": (0, 1, 2), "miopen_batch_norm_backward": (0, 2, "w"),
    "_fused_rms_norm": (0, 2, None), "_fused_rms_norm_backward": (1, 4, None),
}


def _norm_flop(name: str, args) -> int:
    """Normalisation FLOP by the convention of the module docstring."""
    xi, wi, bi = _NORMS[name]
    weight = args[wi] if wi < len(args) else None
    bias = weight if bi == "w" else (args[bi] if bi is not None and bi < len(args) else None)
    affine = (weight is not None) + (bias is not None)
    backward = name.endswith("_backward")
    if name.startswith("_fused_rms_norm"):
        stats = 3  # square, accumulate, scale by rstd
    elif "batch_norm" in name and not backward:
        # Statistics are computed only in training; eval normalises with the running ones.
        training = "no_training" not in name and next(
            (a for a in args[3:] if isinstance(a, bool)), False)
        stats = 5 if training else 2
    else:
        stats = 5
    return args[xi].numel() * (stats + affine) * (2 if backward else 1)


def _sdpa_cpu_flop(name: str, args, out) -> int:
    if name.endswith("_backward"):
        return _fc.sdpa_backward_flop_count(args[0].shape, args[1].shape, args[2].shape,
                                            args[3].shape)
    return _fc.sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape)


def _registry_flop(func, args, kwargs, out) -> int:
    return int(_fc.flop_registry[func._overloadpacket](*args, **kwargs, out_val=out))


def _registry_family(name: str) -> str:
    if "attention" in name:
        return "attention"
    if "conv" in name:
        return "conv"
    return "matmul" if name.endswith("mm") else "other"


def op_rule(func, args, kwargs, out) -> tuple[str, int, tuple[float, float] | None] | None:
    """(family, flop, bytes override or None for the generic rule), or None if unknown."""
    name = func._overloadpacket.__name__
    if name == "convolution_backward":
        return "conv", _conv_backward_flop(args), None
    if name in ("linalg_solve_triangular", "triangular_solve"):
        return "matmul", _solve_triangular_flop(name, args), None
    if func._overloadpacket in _fc.flop_registry:
        return _registry_family(name), _registry_flop(func, args, kwargs, out), None
    base = name.removeprefix("_foreach_") if name.startswith("_foreach_") else name
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
    if base in _VIEWS:
        return "other", 0, (0.0, 0.0)
    if base in _CPU_SDPA or base.removesuffix("_backward") in _CPU_SDPA:
        return "attention", _sdpa_cpu_flop(base, args, out), None
    if base in _ELEMENTWISE or base == "gelu_backward":
        per = _ELEMENTWISE.get(base, 0)
        if base.startswith("gelu"):
            tanh = any(a == "tanh" for a in (*args, *kwargs.values()) if isinstance(a, str))
            per = (_GELU_TANH if tanh else _ELEMENTWISE["gelu"]) * (2 if "backward" in base else 1)
        numel = _numel(args[0]) if name.startswith("_foreach_") else _first_numel(out)
        return "elementwise", per * numel, None
    if name in _SCATTER_IN_PLACE:
        return "other", 0, _scatter_in_place_bytes(name, args)
    if base in ("scatter_add", "index_add"):  # (self, dim, index, source): one add per source element
        return "elementwise", args[3].numel(), None
    if base == "copy":  # copy_(dst, src) overwrites dst without reading it
        return "elementwise", 0, (distinct_bytes(tensors_in(args[1:])), distinct_bytes(tensors_in(out)))
    if base in _COPIES:
        return "elementwise" if base in ("_to_copy", "clone", "contiguous") else "other", 0, None
    if base in _FACTORIES:
        return "other", 0, (0.0, distinct_bytes(tensors_in(out)))
    if base in _ALLOCATIONS:
        return "other", 0, (0.0, 0.0)
    if base in _ORDERINGS:
        return "other", 0, None
    if base in _REDUCTIONS:  # a _foreach_ reduction (gradient clipping's norms) reads every tensor of its list
        numel = _numel(args[0]) if name.startswith("_foreach_") else _first_numel(args)
        return "reduction", _REDUCTIONS[base] * numel, None
    if base in _SOFTMAX:
        return "softmax", _SOFTMAX[base] * _first_numel(out), None
    if base in _NORMS:
        return "norm", _norm_flop(base, args), None
    if base == "embedding":
        weight, indices = args[0], args[1]
        rows = min(indices.numel(), weight.shape[0])
        read = distinct_bytes([indices]) + rows * math.prod(weight.shape[1:]) * weight.element_size()
        return "embedding", 0, (read, distinct_bytes(tensors_in(out)))
    if base == "embedding_dense_backward":
        return "embedding", args[0].numel(), None
    if base in ("nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward",
                "nll_loss2d_backward"):
        return ("loss",) + _nll(base, args, out)
    if base in ("mse_loss", "mse_loss_backward"):
        return "loss", 3 * args[0].numel(), None
    if base in ("_grouped_mm", "_scaled_grouped_mm"):
        return "matmul", _grouped_mm_flop(args[0], args[1]), _grouped_mm_bytes(args, kwargs, out)
    return None


def _conv_backward_flop(args) -> int:
    """``convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``: the input gradient and the weight gradient
    each cost what the forward did, 2·(output elements)·(C_in/groups)·∏kernel (the weight's shape
    holds C_in/groups), for those ``output_mask`` asks for. torch.utils.flop_counter's formula drops
    ``groups``: a depthwise Conv1d(128, 128, 4, groups=128) on (2, 128, 32) counted 9,246,720 in
    backward against 71,680 forward (Mamba's and Gated DeltaNet's short convolutions)."""
    grad_out, x, weight = args[0], args[1], args[2]
    transposed, mask = bool(args[7]), args[10]
    per = 2 * (x.numel() if transposed else grad_out.numel()) * math.prod(weight.shape[1:])
    return per * sum(bool(m) for m in mask[:2])


def _solve_triangular_flop(name: str, args) -> int:
    """A triangular solve of an n×n system for m right-hand sides: n²·m (Golub & Van Loan §3.1:
    n² per column); Gated DeltaNet's chunked form solves one per chunk."""
    a, b = (args[0], args[1]) if name == "linalg_solve_triangular" else (args[1], args[0])
    n = a.shape[-1]
    return int(n * n * b.shape[-1] * math.prod(b.shape[:-2]))


def _grouped_mm_bytes(args, kwargs, out) -> tuple[float, float] | None:
    """Tokens (T, K) by experts (G, K, N) reads the matrices of the groups that have tokens only: a
    mixture of experts' decode step at batch 1 reads its top-k experts, not all G. The groups come
    from ``offs`` (each group's end row); without its values (fake or meta tensors), the generic rule."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if a.dim() != 2 or b.dim() != 3 or not isinstance(offs, torch.Tensor):
        return None
    try:
        ends = [int(v) for v in offs.tolist()]
    except Exception:  # noqa: BLE001 - a fake or meta tensor has shapes, not values
        return None
    used = sum(1 for lo, hi in zip([0, *ends], ends) if hi > lo)
    read = distinct_bytes([a, offs]) + used * math.prod(b.shape[1:]) * b.element_size()
    return float(read), distinct_bytes(tensors_in(out))


def _grouped_mm_flop(a: torch.Tensor, b: torch.Tensor) -> int:
    """``torch._grouped_mm(a, b, offs)``, the experts' GEMMs of a mixture of experts (transformers'
    fused experts, torchtitan): every row of ``a`` meets its group's matrix once, 2 FLOP a multiply-add.
    (2-D, 3-D): tokens (T, K) by experts (G, K, N), 2·T·K·N; (3-D, 3-D): batched, 2·G·M·K·N;
    (2-D, 2-D): the weight gradient, (K, T) by (T, N) split into groups along T, 2·K·T·N; (3-D, 2-D):
    (G, M, K) by (K, ΣN), 2·M·K·ΣN."""
    if a.dim() == 2 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
    if a.dim() == 3 and b.dim() == 3:
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
    if a.dim() == 2 and b.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2 * a.shape[1] * a.shape[2] * b.shape[-1]


# In-place writes of a few rows into a big tensor (a KV cache's new position: HF StaticCache's
# index_copy_, gpt-fast's index_put_): name → index of the values written.
_SCATTER_IN_PLACE = {"index_copy_": 3, "index_put_": 2, "_index_put_impl_": 2}


def _scatter_in_place_bytes(name: str, args) -> tuple[float, float]:
    """Reads the indices and the values, writes as many elements of ``self`` as there are values
    (each written once); the rest of ``self`` is neither read nor written. Accumulating
    ``index_put_`` also reads the elements it adds to."""
    values = args[_SCATTER_IN_PLACE[name]]
    written = max(values.numel(), _indexed_elements(name, args)) * args[0].element_size()
    accumulate = name != "index_copy_" and len(args) > 3 and bool(args[3])
    read = distinct_bytes(tensors_in(args[1:])) + (written if accumulate else 0)
    return float(read), float(written)


def _indexed_elements(name: str, args) -> int:
    """Elements of ``self`` an ``index_put_`` writes (values may broadcast); 0 when metadata
    cannot tell (a boolean mask: its count is in the values of the mask)."""
    if name == "index_copy_":
        return 0
    self_, indices = args[0], list(args[1])
    picked = [i for i in indices if i is not None]
    if not picked or any(i.dtype in (torch.bool, torch.uint8) for i in picked):
        return 0
    rest = [n for d, n in enumerate(self_.shape) if d >= len(indices) or indices[d] is None]
    return math.prod(torch.broadcast_shapes(*(i.shape for i in picked))) * math.prod(rest)


def _nll(name: str, args, out) -> tuple[int, tuple[float, float]]:
    backward = name.endswith("_backward")
    grad, logp, target, weight = (args[0], args[1], args[2], args[3]) if backward else (
        None, args[0], args[1], args[2])
    n = target.numel()
    flop = n * (2 if weight is not None else 1)
    # One log-probability (and class weight) gathered per target; the backward reads no
    # log-probabilities (only their shape) and writes the dense grad_input.
    read = distinct_bytes([target]) + (0 if backward else n * logp.element_size())
    if weight is not None:
        read += n * weight.element_size()
    if backward:
        read += distinct_bytes([grad, args[-1]])
    return flop, (float(read), distinct_bytes(tensors_in(out)))


# ---- bytes ----------------------------------------------------------------------------------

def distinct_bytes(tensors: list[torch.Tensor]) -> float:
    """Distinct bytes touched by ``tensors``: views of one storage merged, stride-0 dims once."""
    ranges: dict[object, list[tuple[int, int, int]]] = {}
    total = 0
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        size = t.element_size()
        unique = math.prod(n for n, st in zip(t.shape, t.stride()) if st != 0) * size
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError, AttributeError):
            total += unique  # no storage to alias (nested, sparse, some subclasses)
            continue
        span = (1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))) * size
        start = t.storage_offset() * size
        ranges.setdefault(key, []).append((start, start + span, unique))
    for spans in ranges.values():
        spans.sort()
        lo, hi, uniq = spans[0]
        for s, e, u in spans[1:]:
            if s < hi:  # overlapping extents: one merged range
                hi, uniq = max(hi, e), uniq + u
            else:
                total += min(hi - lo, uniq)
                lo, hi, uniq = s, e, u
        # A strided slice spans more than it touches; two views of the same bytes touch less
        # than their sum: the smaller of the two is the distinct traffic.
        total += min(hi - lo, uniq)
    return float(total)


def dtype_name(args, kwargs, out) -> str | None:
    inputs = tensors_in((args, kwargs))
    pick = next((t for t in inputs if t.is_floating_point()), None)
    if pick is None:
        pick = inputs[0] if inputs else next(iter(tensors_in(out)), None)
    return None if pick is None else str(pick.dtype).removeprefix("torch.")
