"""Counted FLOPs and bytes against hand derivations (fp32 = 4 bytes, int64 = 8, bf16 = 2).

Conventions are those of ``perfkit/measuring/ops/op_formulas.py``'s docstring; each test writes its derivation.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from perfkit.measuring.ops.counting import COLUMNS, OpCounter, count_ops, coverage, profile_op_times
from perfkit.core.errors import BadInputError
from perfkit.analyse.roofline import join_counts_with_times

pytestmark = pytest.mark.timeout(60)


def _row(df: pd.DataFrame, op: str, shapes=None) -> pd.Series:
    hits = df[df["op"] == op]
    if shapes is not None:
        hits = hits[hits["input_shapes"] == shapes]
    assert len(hits) == 1, f"expected one {op} {shapes}, got:\n{df[['op', 'input_shapes']]}"
    return hits.iloc[0]


def _check(row: pd.Series, flop: int, read: float, written: float, family: str):
    assert (row["flop"], row["bytes_read"], row["bytes_written"], row["family"]) == (
        flop, read, written, family)
    assert row["counted"]


def _randn(*shape, grad=False, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


def test_columns_and_views_count_nothing():
    x = _randn(4, 8)
    df = count_ops(lambda: x.t().unsqueeze(0))
    assert tuple(df.columns) == COLUMNS
    assert list(df["op"]) == ["aten.t.default", "aten.unsqueeze.default"]
    assert (df["flop"] == 0).all() and (df["bytes_read"] == 0).all()
    assert (df["bytes_written"] == 0).all() and df["counted"].all()
    assert list(df["dtype"]) == ["float32", "float32"]


def test_linear_forward_and_backward():
    # x[B=4,K=8], W[N=16,K], b[N]; linear dispatches t(W) (a view) + addmm(b, x, Wᵀ).
    # addmm: FLOP 2·B·K·N = 1024 (bias add not counted, torch.utils.flop_counter convention);
    #   read (N + B·K + N·K)·4 = (16+32+128)·4 = 704; written B·N·4 = 256.
    # backward with given grad g[B,N]:
    #   grad_x = mm(g, W):  FLOP 2·B·N·K = 1024; read (B·N + N·K)·4 = 768; written B·K·4 = 128
    #   grad_W = mm(gᵀ, x): FLOP 2·N·B·K = 1024; read (B·N + B·K)·4 = 384; written N·K·4 = 512
    #   grad_b = sum(g, 0): FLOP B·N = 64 (1 per input element); read 256; written N·4 = 64
    x, w, b = _randn(4, 8, grad=True), _randn(16, 8, grad=True), _randn(16, grad=True)
    g = torch.randn(4, 16)
    df = count_ops(lambda: F.linear(x, w, b).backward(g))
    _check(_row(df, "aten.addmm.default"), 1024, 704, 256, "matmul")
    _check(_row(df, "aten.mm.default", ((4, 16), (16, 8))), 1024, 768, 128, "matmul")
    _check(_row(df, "aten.mm.default", ((16, 4), (4, 8))), 1024, 384, 512, "matmul")
    _check(_row(df, "aten.sum.dim_IntList"), 64, 256, 64, "reduction")
    assert df["counted"].all()


def test_bmm_and_bf16_element_size():
    # bmm A[2,3,4]·B[2,4,5]: FLOP 2·2·3·4·5 = 240; read (24+40)·4 = 256; written 30·4 = 120.
    a, b = _randn(2, 3, 4), _randn(2, 4, 5)
    _check(_row(count_ops(torch.bmm, a, b), "aten.bmm.default"), 240, 256, 120, "matmul")
    # mm in bf16 [4,8]·[8,16]: FLOP 2·4·8·16 = 1024; read (32+128)·2 = 320; written 64·2 = 128.
    c, d = _randn(4, 8, dtype=torch.bfloat16), _randn(8, 16, dtype=torch.bfloat16)
    row = _row(count_ops(torch.mm, c, d), "aten.mm.default")
    _check(row, 1024, 320, 128, "matmul")
    assert row["dtype"] == "bfloat16"
    # a cast fp32[32] -> bf16 reads 32·4 = 128 and writes 32·2 = 64, no FLOP
    _check(_row(count_ops(lambda: _randn(32).to(torch.bfloat16)), "aten._to_copy.default"),
           0, 128, 64, "elementwise")


def test_conv2d():
    # x[N=2,C=3,8,8] * w[4,3,3,3], padding 1, bias[4] -> y[2,4,8,8].
    # FLOP 2·(N·Cout·Hout·Wout)·(Cin·kh·kw) = 2·(2·4·64)·27 = 27648 (bias not counted);
    # read (384 + 108 + 4)·4 = 1984; written 512·4 = 2048.
    x, w, b = _randn(2, 3, 8, 8), _randn(4, 3, 3, 3), _randn(4)
    df = count_ops(F.conv2d, x, w, b, padding=1)
    _check(_row(df, "aten.convolution.default"), 27648, 1984, 2048, "conv")


def test_conv2d_backward_is_counted():
    # convolution_backward for grad_input and grad_weight: torch's formula, 2 × forward each
    # (27648 per gradient) = 55296; grad_bias is a reduction it does not count.
    x, w = _randn(2, 3, 8, 8, grad=True), _randn(4, 3, 3, 3, grad=True)
    g = torch.randn(2, 4, 8, 8)
    df = count_ops(lambda: F.conv2d(x, w, padding=1).backward(g))
    row = _row(df, "aten.convolution_backward.default")
    assert row["flop"] == 2 * 27648 and row["family"] == "conv" and row["counted"]


def test_layer_norm_forward_and_backward():
    # x[R=4,D=8], weight[D], bias[D]; native_layer_norm: (5 + 2 affine) FLOP per element
    #   = 32·7 = 224; read (32+8+8)·4 = 192; written y 128 + mean R·4 16 + rstd 16 = 160.
    # native_layer_norm_backward: 2 × forward = 448; read g 128 + x 128 + mean 16 + rstd 16
    #   + weight 32 + bias 32 (passed, counted as read by the every-input rule) = 352;
    #   written grad_x 128 + grad_w 32 + grad_b 32 = 192.
    x, w, b = _randn(4, 8, grad=True), _randn(8, grad=True), _randn(8, grad=True)
    g = torch.randn(4, 8)
    df = count_ops(lambda: F.layer_norm(x, (8,), w, b).backward(g))
    _check(_row(df, "aten.native_layer_norm.default"), 224, 192, 160, "norm")
    _check(_row(df, "aten.native_layer_norm_backward.default"), 448, 352, 192, "norm")


def test_group_and_batch_norm():
    # x[2,3,4,4] = 96 elements, affine: group norm 96·(5+2) = 672; batch norm training
    # 96·7 = 672; batch norm eval normalises with running stats: 96·(2+2) = 384.
    x, w, b = _randn(2, 3, 4, 4), _randn(3), _randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    group = count_ops(F.group_norm, x, 3, w, b)
    assert _row(group, "aten.native_group_norm.default")["flop"] == 672
    train = count_ops(F.batch_norm, x, rm, rv, w, b, training=True)
    assert _row(train, "aten.native_batch_norm.default")["flop"] == 672
    evaluate = count_ops(F.batch_norm, x, rm, rv, w, b, training=False)
    assert _row(evaluate, "aten.native_batch_norm.default")["flop"] == 384


def test_softmax_forward_and_backward():
    # x[4,8]: _softmax 5 FLOP per element = 160, read 128, written 128;
    # _softmax_backward_data(g, y): 4 per element = 128, read g + y = 256, written 128.
    x, g = _randn(4, 8, grad=True), torch.randn(4, 8)
    df = count_ops(lambda: F.softmax(x, -1).backward(g))
    _check(_row(df, "aten._softmax.default"), 160, 128, 128, "softmax")
    _check(_row(df, "aten._softmax_backward_data.default"), 128, 256, 128, "softmax")


def test_gelu_both_forms():
    # x[4,8]: erf form 5 FLOP per element = 160; tanh form 9 per element = 288;
    # both read 128 and write 128. gelu_backward: 2 × forward = 320.
    x, g = _randn(4, 8, grad=True), torch.randn(4, 8)
    df = count_ops(lambda: F.gelu(x).backward(g))
    _check(_row(df, "aten.gelu.default"), 160, 128, 128, "elementwise")
    _check(_row(df, "aten.gelu_backward.default"), 320, 256, 128, "elementwise")
    tanh = count_ops(F.gelu, x.detach(), approximate="tanh")
    _check(_row(tanh, "aten.gelu.default"), 288, 128, 128, "elementwise")


def test_add_broadcast_and_same_tensor():
    # x[4,8] + y[4,8]: 1 FLOP per output element = 32; read 256; written 128.
    x, y, b = _randn(4, 8), _randn(4, 8), _randn(8)
    _check(_row(count_ops(torch.add, x, y), "aten.add.Tensor"), 32, 256, 128, "elementwise")
    # x + x reads x once: 128.
    _check(_row(count_ops(torch.add, x, x), "aten.add.Tensor"), 32, 128, 128, "elementwise")
    # b.expand(4,8) has stride 0 on dim 0: its 8 distinct elements are read once:
    # read (32 + 8)·4 = 160.
    df = count_ops(lambda: x + b.expand(4, 8))
    _check(_row(df, "aten.add.Tensor"), 32, 160, 128, "elementwise")


def test_views_of_one_storage_count_once():
    # mm(x, xᵀ), x[4,8]: FLOP 2·4·8·4 = 256; x and x.t() share a storage: read 32·4 = 128
    # (not 256); written 16·4 = 64.
    x = _randn(4, 8)
    _check(_row(count_ops(lambda: torch.mm(x, x.t())), "aten.mm.default"), 256, 128, 64, "matmul")
    # Two overlapping column slices of z[8,8]: z[:, :4] and z[:, 2:6] each touch 32
    # elements; their extents overlap, so the pair counts min(union span, 32+32) elements:
    # span from offset 0 to 7·8+6 = 62 elements -> 62·4 = 248 bytes.
    z = _randn(8, 8)
    row = _row(count_ops(lambda: z[:, :4] + z[:, 2:6]), "aten.add.Tensor")
    assert row["bytes_read"] == 248 and row["bytes_written"] == 32 * 4
    # A strided slice alone reads what it touches (32 elements), not its 60-element span.
    row = _row(count_ops(lambda: z[:, :4] * 2), "aten.mul.Tensor")
    assert row["bytes_read"] == 32 * 4


def test_embedding_forward_and_backward():
    # weight[V=10,D=8], idx int64[2,3] (6 lookups): FLOP 0; read idx 6·8 = 48 + min(6, V) rows
    # · D · 4 = 192 -> 240; written 6·8·4 = 192.
    # embedding_dense_backward: 1 FLOP per grad element = 48; read g 192 + idx 48 = 240;
    # written the dense grad_weight V·D·4 = 320.
    w = _randn(10, 8, grad=True)
    idx = torch.tensor([[1, 2, 3], [4, 5, 1]])
    g = torch.randn(2, 3, 8)
    df = count_ops(lambda: F.embedding(idx, w).backward(g))
    _check(_row(df, "aten.embedding.default"), 0, 240, 192, "embedding")
    _check(_row(df, "aten.embedding_dense_backward.default"), 48, 240, 320, "embedding")
    # 20 lookups into 10 rows read at most the 10 rows: 20·8 + 10·8·4 = 480.
    many = torch.arange(20) % 10
    assert _row(count_ops(F.embedding, many, w.detach()), "aten.embedding.default")[
        "bytes_read"] == 480


def test_sdpa_cpu_dispatches_fused_op():
    # On CPU, F.scaled_dot_product_attention (fp32, no dropout) dispatches
    # _scaled_dot_product_flash_attention_for_cpu (+ _backward), not a bmm/softmax
    # decomposition. q,k,v[B=2,H=3,S=5,D=8], 240 elements each:
    # forward FLOP = QKᵀ 2·(B·H)·S·S·D = 2400 + PV 2400 = 4800 (torch sdpa_flop_count);
    #   read q,k,v 3·240·4 = 2880; written out 960 + logsumexp B·H·S·4 = 120 -> 1080.
    # backward FLOP = 5 GEMMs of 2400 (recompute QKᵀ, dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q) = 12000;
    #   read dO, q, k, v, out 5·960 + logsumexp 120 = 4920; written dq, dk, dv 2880.
    q, k, v = (_randn(2, 3, 5, 8, grad=True) for _ in range(3))
    g = torch.randn(2, 3, 5, 8)
    df = count_ops(lambda: F.scaled_dot_product_attention(q, k, v).backward(g))
    name = "aten._scaled_dot_product_flash_attention_for_cpu"
    _check(_row(df, f"{name}.default"), 4800, 2880, 1080, "attention")
    _check(_row(df, f"{name}_backward.default"), 12000, 4920, 2880, "attention")
    assert not df["op"].str.contains("bmm").any()


def test_cross_entropy_forward_and_backward():
    # logits[N=4,C=10], target int64[4]; cross_entropy = _log_softmax + nll_loss_forward.
    # _log_softmax: 5 per element = 200; read 160; written 160.
    # nll_loss_forward: 1 FLOP per target = 4; read target 4·8 = 32 + one log-prob per target
    #   4·4 = 16 -> 48; written loss 4 + total_weight 4 = 8.
    # nll_loss_backward: 4 FLOP; read grad 4 + target 32 + total_weight 4 = 40 (log-probs not
    #   read); written dense grad_input 40·4 = 160.
    # _log_softmax_backward_data: 4 per element = 160; read grad + output 320; written 160.
    logits, target = _randn(4, 10, grad=True), torch.tensor([1, 2, 3, 4])
    df = count_ops(lambda: F.cross_entropy(logits, target).backward())
    _check(_row(df, "aten._log_softmax.default"), 200, 160, 160, "softmax")
    _check(_row(df, "aten.nll_loss_forward.default"), 4, 48, 8, "loss")
    _check(_row(df, "aten.nll_loss_backward.default"), 4, 40, 160, "loss")
    _check(_row(df, "aten._log_softmax_backward_data.default"), 160, 320, 160, "softmax")
    assert df["counted"].all()


def test_inplace_foreach_writes_self():
    # _foreach_add_([a[4,8], b[16,8]], 1.0): 1 FLOP per element = 160; read 640; written the
    # same 640 bytes (in place; the op returns nothing).
    a, b = _randn(4, 8), _randn(16, 8)
    df = count_ops(torch._foreach_add_, [a, b], 1.0)
    _check(_row(df, "aten._foreach_add_.Scalar"), 160, 640, 640, "elementwise")


def test_a_foreach_reduction_counts_every_tensor_of_its_list():
    # Issue 53: _foreach_norm([1000 elements, 3000 elements]) counted the first tensor only (2000).
    # Vector norm: 2 FLOP per element over all 4000 = 8000; read 16000 bytes; written 2 scalars.
    a, b = _randn(1000), _randn(3000)
    df = count_ops(torch._foreach_norm, [a, b], 2)
    _check(_row(df, "aten._foreach_norm.Scalar"), 8000, 16000, 8, "reduction")
    # What clip_grad_norm_ runs (foreach on CPU too): its norms of all gradients counted.
    params = [torch.nn.Parameter(_randn(1000)), torch.nn.Parameter(_randn(3000))]
    for p in params:
        p.grad = torch.ones_like(p)
    df = count_ops(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True))
    assert df.loc[df["op"].str.startswith("aten._foreach_norm"), "flop"].sum() == 8000


def _fake_clock():
    ticks = iter(range(10_000))
    return lambda: float(next(ticks))


def test_coverage_lists_unknown_ops_with_calls_and_time_share():
    # With a clock that advances 1 s per reading, every op call takes exactly 1 s.
    x = _randn(4, 8)
    with OpCounter(clock=_fake_clock(), synchronize=lambda devices: None) as counter:
        torch.cummax(x, 0)
        torch.cummax(x, 1)
        torch.special.bessel_j0(x)
        torch.add(x, x)
    df = counter.frame()
    assert list(df["time_s"]) == [1.0, 1.0, 1.0, 1.0]
    unknown = df[df["op"] == "aten.cummax.default"]
    assert (~unknown["counted"]).all() and unknown["bytes_read"].isna().all()
    assert (unknown["flop"] == 0).all()
    report = coverage(df)
    assert [(u.op, u.calls, u.time_share) for u in report.uncounted] == [
        ("aten.cummax.default", 2, 0.5), ("aten.special_bessel_j0.default", 1, 0.25)]
    assert report.counted_time_share == 0.25
    assert (report.counted_calls, report.total_calls, report.total_time_s) == (1, 4, 4.0)
    assert list(report.frame()["calls"]) == [2, 1]


def test_synchronize_is_called_around_each_op_with_its_devices():
    seen = []
    with OpCounter(synchronize=seen.append):
        torch.add(_randn(2), _randn(2))
    # randn, randn, add: before and after each
    assert len(seen) == 6 and seen[-1] == {"cpu"}


def test_coverage_and_count_ops_reject_bad_input():
    with pytest.raises(BadInputError):
        coverage(pd.DataFrame({"op": ["x"]}))
    with pytest.raises(BadInputError):
        count_ops("not callable")


def test_profile_times_join_onto_counts():
    a, b = _randn(64, 64), _randn(64, 64)
    times = profile_op_times(torch.mm, a, b, device="cpu")
    mm = times[times["op"] == "aten::mm"]
    assert len(mm) == 1 and mm.iloc[0]["input_shapes"] == ((64, 64), (64, 64))
    assert mm.iloc[0]["calls"] == 1 and mm.iloc[0]["time_s"] > 0
    joined = join_counts_with_times(count_ops(torch.mm, a, b), times)
    row = _row(joined, "aten.mm.default")
    assert row["time_match"] == "shapes" and row["time_s"] == mm.iloc[0]["time_s"]
    assert row["flop"] == 2 * 64**3


def test_profile_rejects_unknown_device():
    with pytest.raises(BadInputError):
        profile_op_times(torch.mm, _randn(2, 2), _randn(2, 2), device="tpu")


def test_unknown_op_bytes_are_nan_not_zero():
    df = count_ops(torch.cummax, _randn(4), 0)
    assert math.isnan(_row(df, "aten.cummax.default")["bytes_written"])


def test_gelu_tanh_backward_doubles_the_tanh_forward():
    # tanh form: 9 FLOP per element forward, gelu_backward 2 × 9 = 18 per element; x[4,8]: 576.
    x, g = _randn(4, 8, grad=True), torch.randn(4, 8)
    df = count_ops(lambda: F.gelu(x, approximate="tanh").backward(g))
    assert _row(df, "aten.gelu_backward.default")["flop"] == 576


def test_a_two_expert_top1_mixture_counts_its_grouped_gemms_by_hand():
    # Issue 46: aten._grouped_mm (transformers' fused experts, torchtitan's MoE) was uncounted, so a
    # mixture of experts' counted FLOP left every expert out. Six tokens routed top-1 to two experts
    # (2 and 4 tokens), K=4 in, N=8 out: each token meets its expert's 4x8 matrix once.
    torch.manual_seed(0)
    tokens = torch.randn(6, 4, requires_grad=True)
    experts = torch.randn(2, 4, 8, requires_grad=True)
    offs = torch.tensor([2, 6], dtype=torch.int32)

    grad = torch.randn(6, 8)  # a dense gradient: _grouped_mm's backward refuses sum()'s expanded one

    def step():
        torch._grouped_mm(tokens, experts, offs=offs).backward(grad)

    rows = count_ops(step)
    grouped = rows[rows["op"].str.contains("grouped_mm")]
    # Forward 2·6·4·8; backward: input gradient (6x8 by each expert's 8x4) 2·6·8·4 and weight
    # gradient (4x6 by 6x8, split by expert) 2·4·6·8.
    assert sorted(grouped["flop"].astype(int)) == [384, 384, 384]
    assert set(grouped["family"]) == {"matmul"}
    assert not coverage(rows).uncounted  # the routing ops of a real MoE are known too (test_user_models)


def test_a_grouped_gemm_reads_the_matrices_of_the_experts_that_have_tokens_only():
    # Issue 46: a mixture of experts' decode step at batch 1 reads its top-k experts, not all of
    # them. Three tokens, four experts of 4x8 (fp32), offs [2, 2, 3, 3]: experts 0 (2 tokens) and
    # 2 (1 token) have tokens, 1 and 3 none.
    tokens = torch.randn(3, 4)
    experts = torch.randn(4, 4, 8)
    offs = torch.tensor([2, 2, 3, 3], dtype=torch.int32)
    rows = count_ops(lambda: torch._grouped_mm(tokens, experts, offs=offs))
    (row,) = rows[rows["op"].str.contains("grouped_mm")].to_dict("records")
    # Read: the tokens (3·4·4 B), offs (4·4 B) and two experts' matrices (2·4·8·4 B); written: 3x8 fp32.
    assert row["bytes_read"] == 48 + 16 + 256 and row["bytes_written"] == 96
