"""The memory model: the ZeRO paper's accounting per precision and stage, exact shards, activation
estimates checked against the tensors autograd really saves, and the predicted largest batch.
(Measured model state of real multi-rank runs against the model: tests/test_zero.py.)"""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import REFERENCE
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.measuring.training import activations
from perfkit.measuring.training import memory_model as mm
from perfkit.measuring.workloads import synthetic as workloads
from perfkit.measuring.training.config import TrainConfig, check_supported, workload_spec
from perfkit.measuring.training.batch_search import find_max_batch_size

PSI = 4 * 1024 * 1024  # four 1024×1024 matrices
SQUARE = [(1024, 1024)] * 4


@pytest.mark.parametrize("precision, per_param", [("fp32", 16), ("bf16", 16), ("fp16", 16),
                                                  ("bf16-pure", 8)])
def test_unsharded_adamw_holds_the_zero_papers_bytes_per_parameter(precision, per_param):
    # (2 + 2 + K)·Ψ with K = 12 (Rajbhandari et al. 2020, 3.1) is 16 bytes per parameter; perfkit's
    # autocast keeps fp32 weights as the master copy: 4 + 4 + 8, the same 16. bf16-pure: 2 + 2 + 4.
    state = mm.predict_model_state(SQUARE, precision=precision, parallelism="ddp", dp_size=8)
    assert state.total_bytes == per_param * PSI + 4 * len(SQUARE)  # + AdamW's fp32 step per tensor


def test_each_stage_divides_what_it_shards_by_the_data_parallel_ranks():
    def state(p):
        return mm.predict_model_state(SQUARE, precision="fp32", parallelism=p, dp_size=4)

    ddp = state("ddp")
    assert (ddp.param_bytes, ddp.grad_bytes, ddp.optim_state_bytes) == (4 * PSI, 4 * PSI, 8 * PSI + 16)
    z1 = state("zero1")  # one whole matrix per rank
    assert (z1.param_bytes, z1.grad_bytes, z1.optim_state_bytes) == (4 * PSI, 4 * PSI, 2 * PSI + 4)
    for stage in ("zero2", "zero3", "fsdp", "fsdp_tp"):  # FSDP2 holds shards between steps
        s = state(stage)
        assert (s.param_bytes, s.grad_bytes, s.optim_state_bytes) == (PSI, PSI, 2 * PSI + 16)
    assert state("zero3").param_gather_bytes == 0  # no blocks given: nothing to gather
    assert state("none") == mm.predict_model_state(SQUARE, precision="fp32", parallelism="ddp",
                                                   dp_size=1)


def test_shards_are_the_largest_rank_ones_not_psi_over_n():
    # FSDP2: rank 0 holds ceil(5/2) = 3 of 5 rows; ZeRO-1: whole parameters, largest first to the
    # least-loaded rank, so 16384 alone outweighs 8192 + 2048.
    fsdp = mm.predict_model_state([(5, 3)], precision="fp32", parallelism="zero3", dp_size=2)
    assert fsdp.param_bytes == 4 * 9
    z1 = mm.predict_model_state([(128, 64), (128, 128), (16, 128)], precision="fp32",
                                parallelism="zero1", dp_size=2)
    assert z1.optim_state_bytes == 8 * 16384 + 4


def test_zero2_gathers_every_block_and_zero3_two_at_a_time():
    # FSDP2 gathers into a buffer of the padded whole parameter beside the shard it keeps
    # (measured on real ranks: tests/test_zero.py): 64 × 64 elements per block, not 64 × 32.
    blocks = [[(64, 64)]] * 4
    shapes = [s for b in blocks for s in b]
    kw = dict(precision="fp32", dp_size=2, block_param_shapes=blocks)
    z2 = mm.predict_model_state(shapes, parallelism="zero2", reshard_after_forward=False, **kw)
    z3 = mm.predict_model_state(shapes, parallelism="zero3", **kw)
    assert z2.param_gather_bytes == 4 * 4 * 4096 and z3.param_gather_bytes == 4 * 2 * 4096
    odd = mm.predict_model_state([(5, 3)], precision="fp32", parallelism="zero3", dp_size=2,
                                 block_param_shapes=[[(5, 3)]])
    assert odd.param_gather_bytes == 4 * 6 * 3  # dim 0 padded to 6 rows


def test_the_root_stays_gathered_in_the_gathered_dtype():
    # GPT-2-small: the root (50257 × 768 token embedding and head, 1024 positions) is ≈ 11 blocks.
    cfg = TrainConfig(model="transformer", parallelism="zero3", world_size=8, batch_size=8, seq_len=1024,
                      model_size={"vocab_size": 50257, "d_model": 768, "n_heads": 12, "n_layers": 12})
    model = mm._meta_workload(workload_spec(cfg)).model
    root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks."))
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert 10 < root / block < 12
    padded = lambda m: sum(-(-p.shape[0] // 8) * 8 * p[0].numel() for p in m.parameters())  # noqa: E731
    assert mm.predict_for_config(cfg).param_gather_bytes == 4 * (
        padded(model) - sum(padded(b) for b in model.blocks) + 2 * padded(model.blocks[0]))
    bf16 = TrainConfig(**{**cfg.as_dict(), "fsdp_param_dtype": "bfloat16"})
    assert mm.predict_for_config(bf16).param_gather_bytes == mm.predict_for_config(cfg).param_gather_bytes // 2
    assert mm.predict_for_config(bf16).param_bytes == mm.predict_for_config(cfg).param_bytes  # fp32 shards


def test_tensor_parallel_shapes_follow_the_megatron_plan():
    cfg = TrainConfig(model="transformer", seq_len=8, parallelism="tp", world_size=2, batch_size=2,
                      model_size={"d_model": 32, "n_heads": 4, "vocab_size": 16, "n_layers": 1})
    model = mm._meta_workload(workload_spec(cfg)).model
    shapes = dict(zip((n for n, _ in model.named_parameters()), mm.local_param_shapes(model, 2)))
    assert shapes["blocks.0.attn.q_proj.weight"] == (16, 32)  # colwise: output features split
    assert shapes["blocks.0.attn.out_proj.weight"] == (32, 16)  # rowwise: input features split
    assert shapes["blocks.0.mlp.fc1.weight"] == (64, 32) and shapes["lm_head.weight"] == (16, 32)
    assert shapes["blocks.0.ln1.weight"] == (32,)  # replicated


def _saved_activation_bytes(cfg: TrainConfig) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward."""
    work = workloads.build(workload_spec(cfg))
    params = {p.untyped_storage().data_ptr() for p in work.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    inputs, target = work.make_batch(cfg.batch_size, seed=0)
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    if cfg.precision == "bf16-pure":
        work.model.to(torch.bfloat16)
        params = {p.untyped_storage().data_ptr() for p in work.model.parameters()}
        inputs = inputs.to(torch.bfloat16) if inputs.is_floating_point() else inputs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            out = work.model(inputs)
        loss = work.loss_fn(out.float(), target)
    loss.backward()
    return sum(seen.values())


@pytest.mark.parametrize("cfg", [
    TrainConfig(model="mlp", batch_size=64),
    TrainConfig(model="transformer", batch_size=8, seq_len=32),
    TrainConfig(model="transformer", batch_size=4, seq_len=16,
                model_size={"d_model": 96, "n_heads": 6, "vocab_size": 200, "n_layers": 3}),
    TrainConfig(model="mlp", batch_size=64, precision="bf16"),
    TrainConfig(model="transformer", batch_size=8, seq_len=32, precision="bf16"),
    TrainConfig(model="transformer", batch_size=4, seq_len=16, precision="fp16",
                model_size={"d_model": 96, "n_heads": 6, "vocab_size": 200, "n_layers": 3}),
    TrainConfig(model="transformer", batch_size=8, seq_len=32, precision="bf16-pure"),
], ids=["mlp", "transformer", "transformer-wide-vocab", "mlp-bf16-autocast", "transformer-bf16-autocast",
        "transformer-fp16-autocast", "transformer-bf16-pure"])
def test_activation_estimate_counts_what_autograd_saves(cfg):
    predicted, reason = activations.activation_bytes(cfg)
    assert reason is None
    assert predicted == pytest.approx(_saved_activation_bytes(cfg), rel=0.02)


def test_checkpointing_and_16_bit_activations_shrink_the_estimate():
    base = TrainConfig(model="transformer", batch_size=8, seq_len=32, model_size={"n_layers": 4})
    full = activations.activation_bytes(base)[0]
    assert activations.activation_bytes(TrainConfig(**{**base.as_dict(), "activation_checkpointing": True}))[0] < 0.6 * full
    assert activations.activation_bytes(TrainConfig(**{**base.as_dict(), "precision": "bf16"}))[0] < 0.75 * full
    nan, reason = activations.activation_bytes(TrainConfig(model="convnet"))
    assert math.isnan(nan) and "convnet" in reason


def test_predicted_max_batch_is_the_edge_of_the_budget():
    cfg = TrainConfig(model="mlp", parallelism="zero2", world_size=2, batch_size=2,
                      model_size={"hidden_features": 1024})
    budget = 64 * 2**20
    best = mm.predicted_max_batch(cfg, budget, multiple_of=2)
    state = mm.predict_for_config(cfg)

    def need(batch):
        return mm.predicted_peak_bytes(cfg, batch_per_rank=batch // 2)

    assert need(best) <= budget < need(best + 2)
    # The peak at the start of backward: the model state less the gradients set_to_none freed,
    # FSDP2's gathers, the saved activations and the backward's transient.
    per_rank = best // 2
    assert need(best) == (state.total_bytes - state.grad_bytes + state.param_gather_bytes
                          + activations.activation_bytes(cfg, batch_per_rank=per_rank)[0]
                          + activations.backward_transient_bytes(cfg, batch_per_rank=per_rank))
    assert mm.predicted_max_batch(cfg, mm.optimizer_peak_bytes(cfg) - 1, multiple_of=2) is None  # the optimizer's peak does not fit


@pytest.mark.slow  # a real training step of the search, under a tracked memory budget: 3 s
def test_find_max_batch_size_reports_the_predicted_edge_beside_the_measured_one():
    cfg = TrainConfig(model="mlp", steps=1, warmup_steps=0)
    found = find_max_batch_size(cfg, start=8, limit=8, memory_budget_bytes=2**24)
    assert found["max_batch_size"] == 8 and found["memory_budget_bytes"] == 2**24
    assert found["max_batch_size_predicted_analytic"] == mm.predicted_max_batch(cfg, 2**24)
    assert found["max_batch_size_predicted"] == found["max_batch_size_predicted_analytic"]  # no fake one asked for
    assert found["max_batch_size_predicted_source"] == "analytic model"
    assert found["max_batch_size_predicted"] > 8
    assert found["max_batch_size_predicted_fake"] is None  # the fake-tensor steps are opt-in (predict_fake)


@pytest.mark.parametrize("kwargs, words", [
    ({"parallelism": "zero2", "world_size": 2, "reshard_after_forward": True}, "zero2"),
    ({"parallelism": "zero3", "world_size": 2, "reshard_after_forward": False}, "zero3"),
    ({"parallelism": "fsdp_tp", "world_size": 4}, "tp_degree"),
    ({"parallelism": "fsdp_tp", "world_size": 4, "tp_degree": 3}, "world_size"),
    ({"parallelism": "fsdp_tp", "world_size": 4, "dp_degree": 2, "tp_degree": 4}, "world_size"),
    ({"parallelism": "ddp", "world_size": 2, "dp_degree": 1}, "dp_degree"),
    ({"parallelism": "zero1", "world_size": 4, "batch_size": 6}, "split"),
    ({"parallelism": "fsdp_tp", "world_size": 4, "tp_degree": 2, "batch_size": 3}, "split"),
    ({"parallelism": "ddp", "world_size": 2, "fsdp_param_dtype": "bfloat16"}, "fsdp_param_dtype"),
    ({"parallelism": "zero2", "world_size": 2, "comm_hook": "fp16"}, "comm_hook"),
    ({"model": "convnet", "parallelism": "fsdp_tp", "world_size": 4, "tp_degree": 2}, "tensor-parallel"),
    ({"model": "mlp", "parallelism": "fsdp_tp", "world_size": 4, "tp_degree": 4,
      "model_size": {"hidden_features": 6}}, "divisible"),
    ({"parallelism": "zero4", "world_size": 2}, "parallelism"),
])
def test_impossible_parallel_layouts_are_rejected_before_any_work(kwargs, words):
    with pytest.raises(BadInputError, match=words):
        TrainConfig(**{"batch_size": 8, **kwargs})


def test_layouts_resolve_from_the_parallelism():
    assert (TrainConfig(parallelism="zero1", world_size=2).dp_size, TrainConfig(parallelism="tp", world_size=2).tp_size) == (2, 2)
    cfg = TrainConfig(parallelism="fsdp_tp", world_size=4, dp_degree=2)
    assert (cfg.dp_size, cfg.tp_size, cfg.reshard) == (2, 2, True)
    assert not TrainConfig(parallelism="zero2", world_size=2).reshard
    with pytest.raises(ConfigurationSkipped, match="NCCL"):  # zero1 is DDP: its hooks, its limits
        check_supported(TrainConfig(parallelism="zero1", world_size=2, comm_hook="bf16", device="cpu"))


# Issue 43: the analytic model's peak against the fake-tensor step's (which ran the H200's edge to the
# sample), category by category: it missed the loss's transient (the model's output and the fp32
# gradient pair, 10 bytes a logit) and, for the mlp, a hidden layer's pair of activation gradients,
# and it counted gradients that set_to_none has freed at the start of backward.
_SMALL_GPT = {"n_layers": 1, "d_model": 64, "n_heads": 4, "vocab_size": 512}


@pytest.mark.slow  # twelve fake-tensor steps: the full suite's, not the inner loop's
@pytest.mark.parametrize("model, size, extra, batches", [
    ("transformer", _SMALL_GPT, {"seq_len": 32}, (2, 16)),
    ("mlp", {"hidden_features": 512}, {}, (8, 4096)),
])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-pure"])
def test_the_analytic_peak_and_edge_agree_with_the_fake_tensor_step(model, size, extra, batches, precision):
    from perfkit.measuring.training import memory_edge, memory_fit

    for batch in batches:
        cfg = TrainConfig(model=model, model_size=size, precision=precision, batch_size=batch, steps=2,
                          warmup_steps=1, **extra)
        fake = memory_fit.predict(cfg)
        analytic = mm.predicted_peak_bytes(cfg)
        assert analytic == pytest.approx(fake.peak_bytes, rel=0.10), (batch, fake.at_peak, fake.phase_peak_bytes)
    # The edge both predict for a budget five times the larger batch's peak.
    budget = 5 * fake.peak_bytes
    fake_edge, _ = memory_edge.largest_batch(cfg, fake, budget)
    assert mm.predicted_max_batch(cfg, budget) == pytest.approx(fake_edge, rel=0.10)


def test_the_h200_oom_edge_is_predicted_and_the_row_takes_the_fake_tensor_edge():
    probes = REFERENCE / "gpu-h200" / "probes" / "oom_edge_isolated.json"
    if not probes.exists():
        pytest.skip(f"{probes} is absent (the shared H200 reference data)")
    from perfkit.measuring.training import memory_edge, memory_fit

    found = json.loads(probes.read_text())
    measured, fake, old_analytic = (found["max_batch_size"], found["max_batch_size_predicted_fake"],
                                    found["max_batch_size_predicted"])
    assert (measured, fake, old_analytic) == (1920, 1920, 2816)  # the recorded figures this test stands on
    # The H200's transformer (README: 4 layers, d_model 1024, 16 heads, vocab 8192, seq 256) in bf16.
    cfg = TrainConfig(model="transformer", precision="bf16", batch_size=1024, seq_len=256, device="cuda",
                      model_size={"n_layers": 4, "d_model": 1024, "n_heads": 16, "vocab_size": 8192})
    analytic = mm.predicted_max_batch(cfg, found["memory_budget_bytes"], multiple_of=128)
    assert analytic == pytest.approx(measured, rel=0.10), analytic
    unrounded = mm.predicted_max_batch(cfg, found["memory_budget_bytes"])
    assert measured <= unrounded <= 1.10 * measured, unrounded  # at or above the edge: tensors only
    # What a row and the advice use: the fake-tensor step's edge where there is one.
    assert memory_edge.chosen_edge(fake, old_analytic) == (1920, "fake-tensor step")
    assert memory_edge.chosen_edge(math.nan, analytic) == (analytic, "analytic model")
    assert memory_edge.chosen_edge(None, math.nan)[1] is None
