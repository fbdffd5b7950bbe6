"""Workloads: parameter counts, analytic FLOP against FlopCounterMode, and that they train."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads.synthetic import ConvNetConfig, MLPConfig, TransformerConfig, build, make_spec

# Small enough that a forward+backward takes milliseconds on one core.
TINY_GPT = TransformerConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, vocab_size=24)
TINY_MLP = MLPConfig(in_features=12, hidden_features=20, depth=3, out_features=5)
TINY_CNN = ConvNetConfig(in_channels=3, image_size=8, widths=(4, 8), blocks_per_stage=1, n_classes=3)


def _counted_flop_per_sample(workload, batch_size=3, *, inputs_require_grad=False):
    """FlopCounterMode's FLOP of one forward+backward, divided by the batch size."""
    x, y = workload.make_batch(batch_size, seed=1)
    if inputs_require_grad:
        x.requires_grad_(True)
    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss_fn(workload.model(x), y).backward()
    return counter.get_total_flops() / batch_size


# --- parameter counts ------------------------------------------------------------------------


def test_mlp_param_count():
    # widths 12 -> 20 -> 20 -> 5, no bias: 12·20 + 20·20 + 20·5 = 240 + 400 + 100 = 740
    w = build(TINY_MLP)
    assert w.n_params == 740 == sum(p.numel() for p in w.model.parameters())
    assert w.n_params_non_embedding == 740
    # with bias: + 20 + 20 + 5 = 785
    wb = build(MLPConfig(in_features=12, hidden_features=20, depth=3, out_features=5, bias=True))
    assert wb.n_params == 785 == sum(p.numel() for p in wb.model.parameters())


def test_transformer_param_count():
    # V=24, d=32, T=16, L=2, mlp 4d=128, no bias (LayerNorm weight only):
    #   token embedding V·d = 768, position embedding T·d = 512
    #   per block: ln1 32 + q,k,v,out 4·32·32 = 4096 + ln2 32 + fc1 32·128 = 4096 + fc2 4096
    #            = 12352; two blocks 24704
    #   ln_f 32, untied lm head d·V = 768
    #   total 768 + 512 + 24704 + 32 + 768 = 26784; non-embedding 26784 - 768 - 512 = 25504
    w = build(TINY_GPT)
    assert w.n_params == 26784 == sum(p.numel() for p in w.model.parameters())
    assert w.n_params_non_embedding == 25504
    assert w.tokens_per_sample == 16
    # with bias: per block + 4·32 (attn) + 2·32 (LN biases) + 128 (fc1) + 32 (fc2) = 352,
    # ln_f bias 32; lm head keeps no bias: 26784 + 2·352 + 32 = 27520
    wb = build(TransformerConfig(n_layers=2, d_model=32, n_heads=4, seq_len=16, vocab_size=24,
                                 bias=True))
    assert wb.n_params == 27520 == sum(p.numel() for p in wb.model.parameters())


def test_transformer_submodules_are_named_linears_for_tensor_parallel():
    model = build(TINY_GPT).model
    for i in range(2):
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"):
            assert isinstance(model.get_submodule(f"blocks.{i}.{name}"), torch.nn.Linear)


def test_models_run_blocks_with_a_checkpointing_switch_and_tp_plans():
    # What the training step needs: FSDP2 units (blocks), recompute, tensor-parallel layouts.
    gpt, mlp, cnn = build(TINY_GPT).model, build(TINY_MLP).model, build(TINY_CNN).model
    assert len(gpt.blocks) == 2 and len(mlp.blocks) == 3 and len(cnn.blocks) == 2
    assert gpt.tp_plan() == {
        f"blocks.{i}.{name}": style for i in range(2)
        for name, style in [("attn.q_proj", "colwise"), ("attn.k_proj", "colwise"),
                            ("attn.v_proj", "colwise"), ("attn.out_proj", "rowwise"),
                            ("mlp.fc1", "colwise"), ("mlp.fc2", "rowwise")]}
    # Megatron pairs: layer 0 by output features, layer 1 by input features; the odd head stays.
    assert mlp.tp_plan() == {"blocks.0.linear": "colwise", "blocks.1.linear": "rowwise"}
    assert not hasattr(cnn, "tp_plan")
    for spec in (TINY_GPT, TINY_MLP, TINY_CNN):
        w = build(spec)
        x, y = w.make_batch(2, seed=0)
        grads = []
        for recompute in (False, True):
            w.model.zero_grad()
            w.model.activation_checkpointing = recompute
            w.loss_fn(w.model(x), y).backward()
            grads.append([p.grad.clone() for p in w.model.parameters()])
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads))
    # Recompute is real: blocks whose backward needs an inner activation (the ReLU output) run
    # their forward again; the last, a bare Linear, needs only its saved input.
    w = build(TINY_MLP)
    w.model.activation_checkpointing = True
    x, y = w.make_batch(3, seed=0)
    counter = FlopCounterMode(display=False)
    with counter:
        w.loss_fn(w.model(x), y).backward()
    recompute = 2 * 3 * (12 * 20 + 20 * 20)
    assert counter.get_total_flops() == 3 * (4440 - 480) + recompute


def test_convnet_param_count():
    # in 3, widths (4, 8), 3 classes, convs without bias, BatchNorm weight+bias (2·C):
    #   stem conv 3·4·9 = 108, bn 8
    #   stage 0 block (4->4, stride 1): conv 4·4·9 = 144, bn 8, conv 144, bn 8 -> 304
    #   stage 1 block (4->8, stride 2): conv 4·8·9 = 288, bn 16, conv 8·8·9 = 576, bn 16,
    #       shortcut 1x1 conv 4·8 = 32, bn 16 -> 944
    #   head 8·3 + 3 = 27
    #   total 108 + 8 + 304 + 944 + 27 = 1391
    w = build(TINY_CNN)
    assert w.n_params == 1391 == sum(p.numel() for p in w.model.parameters())
    assert w.tokens_per_sample is None


# --- analytic FLOP vs FlopCounterMode --------------------------------------------------------


def test_mlp_flop_matches_flop_counter_exactly():
    w = build(TINY_MLP)
    # 6·Σ in·out = 6·(240 + 400 + 100) = 4440
    assert w.flop_per_sample == 4440
    # Inputs requiring grad: every layer pays forward 2 + backward 4 per weight, exactly 6·Σ.
    assert _counted_flop_per_sample(w, inputs_require_grad=True) == 4440
    # A real step: autograd skips the first layer's input gradient, 2·12·20 = 480.
    assert w.flop_per_sample_first_input_grad == 480
    assert _counted_flop_per_sample(w) == 4440 - 480


def test_mlp_bias_is_not_counted_by_either():
    # Bias adds are elementwise: neither the 6·Σ in·out rule nor FlopCounterMode (addmm = 2MNK)
    # counts them, so the numbers are the same as without bias.
    w = build(MLPConfig(in_features=12, hidden_features=20, depth=3, out_features=5, bias=True))
    assert w.flop_per_sample == 4440
    assert _counted_flop_per_sample(w, inputs_require_grad=True) == 4440


def test_convnet_flop_matches_flop_counter():
    w = build(TINY_CNN)
    # Forward per sample, conv = 2·Cin·Cout·k²·Hout·Wout (image 8x8, stage 1 at 4x4):
    #   stem 2·3·4·9·64 = 13824
    #   stage 0: 2 convs of 2·4·4·9·64 = 18432 -> 36864
    #   stage 1: 2·4·8·9·16 = 9216, 2·8·8·9·16 = 18432, shortcut 2·4·8·1·16 = 1024 -> 28672
    #   head 2·8·3 = 48
    #   forward = 13824 + 36864 + 28672 + 48 = 79408; training = 3·79408 = 238224
    assert w.flop_per_sample == 238224
    # Elementwise ops (BatchNorm, ReLU, residual add, pooling) are ignored by both counts, so with
    # inputs requiring grad the counts agree exactly (tolerance 0); a real step skips the stem's
    # input gradient, which costs as much as the stem's forward (13824).
    assert _counted_flop_per_sample(w, inputs_require_grad=True) == 238224
    assert w.flop_per_sample_first_input_grad == 13824
    assert _counted_flop_per_sample(w) == 238224 - 13824


def test_transformer_flop_vs_flop_counter():
    w = build(TINY_GPT)
    # PaLM: per token 6·N + 12·L·H·Q·T, N = 25504 non-embedding, L=2, H=4 heads, Q=8 head dim,
    # T=16: 6·25504 + 12·2·4·8·16 = 153024 + 12288 = 165312; per sample ×16 = 2644992.
    assert w.flop_per_sample == 2644992
    # Why FlopCounterMode differs:
    # 1. N includes the LayerNorm weights (5 LayerNorms × 32 = 160), whose work is elementwise:
    #    6·160·16 = 15360 FLOP per sample that the counter does not see. Embedding lookups are
    #    not matmuls and are outside N, so they agree; the untied lm head is a matmul inside N.
    # 2. Attention: with the math SDPA backend the scores and weighted sum are bmm's the counter
    #    sees: forward 2·(2·T·T·Q)·H per layer, backward twice that, 12·H·Q·T² per layer, as
    #    PaLM's term (both count the full T×T, not halved for the causal mask). So exact:
    with sdpa_kernel(SDPBackend.MATH):
        assert _counted_flop_per_sample(w) == 2644992 - 15360
    # The CPU fused kernel (_scaled_dot_product_flash_attention_for_cpu) has no FLOP formula in
    # FlopCounterMode, so there the counter misses attention too: 2644992 - 15360 - 12288·16.
    assert _counted_flop_per_sample(w) == 2644992 - 15360 - 196608
    # Stated tolerance for the analytic estimate vs the math-backend count: LayerNorm weights,
    # 2·d/(12·d²+...) of N, here 0.6 %.
    with sdpa_kernel(SDPBackend.MATH):
        assert _counted_flop_per_sample(w) == pytest.approx(w.flop_per_sample, rel=0.01)


# --- the tasks train -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [TINY_MLP, TINY_GPT, TINY_CNN], ids=lambda s: s.name)
def test_loss_decreases_in_a_few_steps(spec):
    torch.manual_seed(0)
    w = build(spec)
    # Judged on one held-out batch: per-batch training losses of 32 samples are too noisy.
    x_eval, y_eval = w.make_batch(64, seed=10_000)

    def eval_loss():
        w.model.eval()
        with torch.no_grad():
            loss = w.loss_fn(w.model(x_eval), y_eval).item()
        w.model.train()
        return loss

    before = eval_loss()
    opt = torch.optim.Adam(w.model.parameters(), lr=3e-2)
    for step in range(10):
        x, y = w.make_batch(32, seed=step)  # fresh batches: the task, not a batch, is learned
        loss = w.loss_fn(w.model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # Seen here: mlp 1.07 -> 0.31, transformer 3.26 -> 1.33, convnet 1.19 -> 0.03.
    assert eval_loss() < 0.6 * before


# --- batches and specs -----------------------------------------------------------------------


def test_batches_are_reproducible_and_typed():
    w = build(TINY_GPT)
    x1, y1 = w.make_batch(4, seed=3)
    x2, y2 = w.make_batch(4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 16) and x1.dtype == torch.int64
    # next-token targets: the input shifted by one
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, w.make_batch(4, seed=4)[0])

    xm, ym = build(TINY_MLP).make_batch(4, dtype=torch.float64)
    assert xm.dtype == ym.dtype == torch.float64 and ym.shape == (4, 5)
    xc, yc = build(TINY_CNN).make_batch(4, dtype=torch.bfloat16)
    assert xc.shape == (4, 3, 8, 8) and xc.dtype == torch.bfloat16 and yc.dtype == torch.int64


def test_mlp_teacher_is_fixed_across_batches():
    # Same teacher for two different batches: targets are one linear map of the inputs.
    w = build(TINY_MLP)
    x1, y1 = w.make_batch(20, seed=1)
    x2, y2 = w.make_batch(20, seed=2)
    teacher = torch.linalg.lstsq(x1, y1).solution
    torch.testing.assert_close(x2 @ teacher, y2, rtol=1e-4, atol=1e-4)


def test_build_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build(TINY_MLP)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = build(TINY_MLP)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_bad_specs_raise_bad_input():
    with pytest.raises(BadInputError, match="n_heads=3 must divide d_model=32"):
        TransformerConfig(d_model=32, n_heads=3)
    with pytest.raises(BadInputError, match="depth"):
        MLPConfig(depth=0)
    with pytest.raises(BadInputError, match="widths"):
        ConvNetConfig(widths=())
    with pytest.raises(BadInputError, match="unknown workload 'vit'"):
        make_spec("vit")
    with pytest.raises(BadInputError, match="transformer"):
        make_spec("transformer", n_layer=2)
    assert make_spec("convnet", widths=[4, 8]).widths == (4, 8)
    with pytest.raises(BadInputError, match="batch_size"):
        build(TINY_MLP).make_batch(0)
