"""ZeRO stages and FSDP × TP with real gloo ranks: loss parity, sharded state, all-gather counts.

The mlp here has four equal 64×64 layers, so ZeroRedundancyOptimizer's partition (whole
parameters, largest first, to the least-loaded rank) is balanced and zero1's optimizer state per
rank is exactly half of DDP's; the transformer's unequal parameters check the unbalanced case
against the memory model. Loss tolerance: as tests/test_training.py (rtol 1e-4: reassociation of
sharded reductions only; a wrong batch split or loss scaling moves it by 1e-2 or more).
"""

from __future__ import annotations

import pytest

from perfkit.measuring.training.config import TrainConfig
from _training_targets import run_training_shared
from perfkit.measuring.training.step import train_step_benchmark

RTOL = 1e-4
TIMEOUT_S = 180.0
MLP = {"model": "mlp", "batch_size": 32, "steps": 5, "warmup_steps": 1,
       "model_size": {"in_features": 64, "hidden_features": 64, "out_features": 64, "depth": 4}}
GPT = {"model": "transformer", "batch_size": 8, "seq_len": 8, "steps": 5, "warmup_steps": 1,
       "model_size": {"vocab_size": 32, "d_model": 32, "n_heads": 4, "n_layers": 2}}
# A vocabulary wide enough that the root (embeddings, head: what apply_fsdp keeps gathered from
# forward through backward) outweighs a block, as GPT-2-small's root (~11 blocks) does.
GPTW = {**GPT, "model_size": {**GPT["model_size"], "vocab_size": 256}}
RUNS = {  # name: (base, parallelism, world_size, extra)
    "ddp": (MLP, "ddp", 2, {}), "zero1": (MLP, "zero1", 2, {}), "zero2": (MLP, "zero2", 2, {}),
    "zero3": (MLP, "zero3", 2, {}), "fsdp_tp": (MLP, "fsdp_tp", 4, {"tp_degree": 2}),
    "zero3-bf16-pure": (MLP, "zero3", 2, {"precision": "bf16-pure"}),
    "gpt-zero1": (GPT, "zero1", 2, {}), "gpt-fsdp_tp": (GPT, "fsdp_tp", 4, {"dp_degree": 2}),
    "gpt-zero2": (GPTW, "zero2", 2, {}), "gpt-zero3": (GPTW, "zero3", 2, {}),
    "gpt-zero3-bf16-params": (GPTW, "zero3", 2, {"fsdp_param_dtype": "bfloat16"}),
}


@pytest.fixture(scope="module")
def rows():
    out = {"none": train_step_benchmark(TrainConfig(**MLP)),
           "gpt-none": train_step_benchmark(TrainConfig(**GPT))}
    # The runs of one world size share one launch (its torchrun start-up), each still whole.
    for world_size in sorted({w for _, _, w, _ in RUNS.values()}):
        names = [n for n, (_, _, w, _) in RUNS.items() if w == world_size]
        cfgs = [TrainConfig(**RUNS[n][0], parallelism=RUNS[n][1], world_size=world_size, **RUNS[n][3]) for n in names]
        for name, row in zip(names, run_training_shared(cfgs, TIMEOUT_S * len(cfgs))):
            assert row["status"] == "ok", (name, row["error"])
            out[name] = row
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, reference", [("zero1", "none"), ("zero2", "none"), ("zero3", "none"),
                                             ("fsdp_tp", "none"), ("gpt-fsdp_tp", "gpt-none")])
def test_loss_follows_the_single_process_trajectory(rows, name, reference):
    row, ref = rows[name], rows[reference]["losses"]
    assert len(row["losses"]) == 5
    assert row["losses"] == pytest.approx(ref, rel=RTOL)
    assert abs(row["losses"][-1] - row["losses"][0]) > 100 * RTOL * abs(row["losses"][0])


@pytest.mark.slow
def test_zero1_holds_a_world_size_th_of_ddps_optimizer_state(rows):
    ddp, zero1 = rows["ddp"], rows["zero1"]
    assert zero1["optim_state_bytes"] == pytest.approx(ddp["optim_state_bytes"] / 2, rel=0.01)
    # Only the optimizer state is sharded: parameters and gradients are DDP's.
    assert (zero1["param_bytes"], zero1["grad_bytes"]) == (ddp["param_bytes"], ddp["grad_bytes"])
    assert ddp["optim_state_bytes"] == rows["none"]["optim_state_bytes"]


@pytest.mark.slow
def test_zero2_gathers_parameters_half_as_often_as_zero3(rows):
    # Counted by the dispatch-level counter (c10d ops) over rank 0's forward and backward of the
    # first step: zero3 gathers each of the 4 blocks in forward and again in backward.
    zero2, zero3 = rows["zero2"], rows["zero3"]
    assert zero3["all_gather_calls_per_step"] == 8
    assert zero2["all_gather_calls_per_step"] == zero3["all_gather_calls_per_step"] / 2
    assert zero2["reduce_scatter_calls_per_step"] == zero3["reduce_scatter_calls_per_step"] == 4
    assert rows["zero1"]["all_gather_calls_per_step"] == 0  # DDP: gradients all-reduced
    assert rows["zero1"]["all_reduce_calls_per_step"] >= 1
    # Both shard gradients and optimizer state; between steps both hold sharded parameters.
    assert zero2["param_bytes"] == zero3["param_bytes"] == rows["ddp"]["param_bytes"] / 2
    assert zero2["param_gather_bytes_predicted"] > zero3["param_gather_bytes_predicted"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["none", "gpt-none", *RUNS])
def test_model_state_per_rank_matches_the_memory_model(rows, name):
    row = rows[name]
    measured = row["param_bytes"] + row["grad_bytes"] + row["optim_state_bytes"]
    assert measured == pytest.approx(row["model_state_bytes_predicted"], rel=0.05)
    for part in ("param_bytes", "grad_bytes", "optim_state_bytes"):
        assert row[part] == pytest.approx(row[f"{part}_predicted"], rel=0.05), part
    assert row["activation_bytes_predicted"] > 0
    # What autograd held saved on the warm-up step (hooks on the real ranks), where measured.
    if row["parallelism"] in ("none", "ddp", "zero1", "zero2", "zero3"):
        assert row["activation_bytes_measured_reason"] is None
        assert row["activation_bytes_measured"] == pytest.approx(row["activation_bytes_predicted"], rel=0.01)
    else:
        assert row["activation_bytes_measured"] != row["activation_bytes_measured"]  # NaN
        assert row["parallelism"] in row["activation_bytes_measured_reason"]


@pytest.mark.slow
def test_fsdp_tp_shards_over_both_mesh_dimensions(rows):
    row, ddp = rows["fsdp_tp"], rows["ddp"]
    assert (row["dp_size"], row["tp_size"]) == (2, 2)
    assert row["param_bytes"] == ddp["param_bytes"] / 4  # every layer is in a TP pair here
    assert "tensor parallel" in row["counted_flop_reason"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero2", "zero3", "zero3-bf16-pure", "gpt-zero2", "gpt-zero3",
                                  "gpt-zero3-bf16-params"])
def test_fsdp_holds_the_gathered_bytes_the_memory_model_predicts(rows, name):
    # Measured on the ranks: the peak, over the warm-up step, of the unsharded parameter storages
    # FSDP2 holds and its all-gathers in flight, sampled at every saved tensor's pack and unpack.
    row = rows[name]
    assert row["param_gather_bytes_measured"] > 0
    assert row["param_gather_bytes_measured"] == pytest.approx(row["param_gather_bytes_predicted"], rel=0.05)


@pytest.mark.slow
def test_fp32_with_bf16_gathers_computes_and_saves_bf16(rows):
    row, fp32 = rows["gpt-zero3-bf16-params"], rows["gpt-zero3"]
    assert (row["compute_dtype"], fp32["compute_dtype"]) == ("bf16", "fp32")
    # What ran: the dtype of the matmul FLOP the counter saw on rank 0.
    assert (row["matmul_dtype_counted"], fp32["matmul_dtype_counted"]) == ("bfloat16", "float32")
    assert row["activation_bytes_measured"] == pytest.approx(row["activation_bytes_predicted"], rel=0.01)
    assert row["activation_bytes_measured"] < 0.65 * fp32["activation_bytes_measured"]  # 16-bit, fp32 norm stats
    assert row["param_gather_bytes_measured"] == pytest.approx(fp32["param_gather_bytes_measured"] / 2, rel=0.05)
