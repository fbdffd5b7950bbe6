"""The training step: single process in-process, DDP / FSDP2 / TP with real gloo ranks (2).

Loss-trajectory tolerance: the parallel runs see the same global batch and start from the same
weights, so they differ from one process only by floating-point reassociation (a gradient mean
of two half-batch means, TP's partial sums of row-split matmuls), about 1e-7 relative per step in
fp32 (measured: <= 2e-7 over 4 steps). rtol 1e-4 leaves room for that to grow through AdamW while
still failing on a real error: a wrong batch split or a gradient summed instead of averaged moves
the loss by 1e-2 or more from the second step on.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from perfkit.errors import BadInputError, ConfigurationSkipped
from perfkit.training import (
    TrainConfig,
    build_model,
    find_max_batch_size,
    run_training,
    train_step_benchmark,
)

RTOL = 1e-4
TIMEOUT_S = 120.0
# Big enough that each step's loss is a fair sample of the task, small enough for 2 cores.
BASE = {"model": "transformer", "batch_size": 16, "seq_len": 16, "steps": 4, "warmup_steps": 1,
        "lr": 1e-2,
        "model_size": {"vocab": 64, "dim": 32, "n_heads": 4, "n_layers": 2}}
MLP = {"model": "mlp", "batch_size": 32, "steps": 5, "warmup_steps": 1}


@pytest.fixture(scope="module")
def single_process_rows():
    return {
        "transformer": train_step_benchmark(TrainConfig(**BASE)),
        "mlp": train_step_benchmark(TrainConfig(**MLP)),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, parallelism",
    [("transformer", "ddp"), ("transformer", "fsdp"), ("transformer", "tp"), ("mlp", "tp")],
)
def test_parallel_run_follows_the_single_process_loss(single_process_rows, model, parallelism):
    base = BASE if model == "transformer" else MLP
    reference = single_process_rows[model]
    row = run_training(TrainConfig(**base, parallelism=parallelism, world_size=2), TIMEOUT_S)
    assert row["status"] == "ok", row["error"]
    assert len(row["losses"]) == base["steps"]
    assert row["losses"] == pytest.approx(reference["losses"], rel=RTOL)
    # The runs really trained: the trajectory moves by far more than the tolerance.
    assert abs(row["losses"][-1] - row["losses"][0]) > 100 * RTOL * abs(row["losses"][0])
    assert len(row["step_time_samples_s"]) == base["steps"] - base["warmup_steps"]
    assert row["n_params"] == reference["n_params"]  # the full model's count, not a shard's
    assert row["peak_mem_bytes"] > 0 and row["peak_mem_kind"] == "cpu_max_rss"
    assert row["samples_per_s"] == pytest.approx(base["batch_size"] / row["step_time_s"])


@pytest.mark.parametrize("cfg", [BASE, MLP], ids=["transformer", "mlp"])
def test_single_process_loss_is_finite_and_falls(single_process_rows, cfg):
    row = single_process_rows[cfg["model"]]
    assert row["status"] == "ok"
    assert all(math.isfinite(x) for x in row["losses"])
    assert row["loss_first"] == row["losses"][0] and row["loss_last"] == row["losses"][-1]
    assert row["loss_last"] < 0.95 * row["loss_first"]
    assert all(s > 0 for s in row["step_time_samples_s"])
    assert row["step_time_s"] == pytest.approx(statistics.median(row["step_time_samples_s"]))
    if cfg["model"] == "transformer":
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * cfg["seq_len"])
        # Next-token loss starts near ln(vocab): the model begins uninformed.
        assert row["loss_first"] == pytest.approx(math.log(cfg["model_size"]["vocab"]), rel=0.1)
    else:
        assert math.isnan(row["tokens_per_s"])


def test_fp16_autocast_with_grad_scaler_runs_on_cpu(single_process_rows):
    # torch 2.13 autocasts CPU matmuls to float16 and has a CPU GradScaler.
    reference = single_process_rows["mlp"]["losses"]
    row = train_step_benchmark(TrainConfig(**MLP, precision="fp16"))
    assert row["grad_scale"] == 2.0**16  # the scaler ran (and saw no overflow in 5 steps)
    assert all(math.isfinite(x) for x in row["losses"])
    assert row["loss_last"] < 0.9 * row["loss_first"]
    # fp16 matmuls: close to fp32, but not identical (autocast really was on).
    assert row["losses"] == pytest.approx(reference, rel=2e-2)
    assert row["losses"] != reference


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure"])
def test_bf16_runs_close_to_fp32(single_process_rows, precision):
    reference = single_process_rows["mlp"]["losses"]
    row = train_step_benchmark(TrainConfig(**MLP, precision=precision))
    assert row["losses"] != reference
    assert row["losses"] == pytest.approx(reference, rel=5e-2)
    assert math.isnan(row["grad_scale"])


def test_activation_checkpointing_recomputes_the_same_numbers(single_process_rows):
    row = train_step_benchmark(TrainConfig(**BASE, activation_checkpointing=True))
    assert row["losses"] == pytest.approx(single_process_rows["transformer"]["losses"], rel=1e-6)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"precision": "tf32"}, "tf32"),
        ({"precision": "fp8"}, "fp8"),
        ({"parallelism": "ddp", "world_size": 2, "comm_hook": "bf16"}, "NCCL"),
    ],
)
def test_settings_the_cpu_cannot_honour_are_skipped_before_any_work(overrides, words):
    cfg = TrainConfig(**{**MLP, "device": "cpu", **overrides})
    if cfg.parallelism == "none":
        with pytest.raises(ConfigurationSkipped, match=words):
            train_step_benchmark(cfg)
    row = run_training(cfg, TIMEOUT_S)
    assert row["status"] == "skipped"
    assert words in row["error"]
    assert "losses" not in row  # nothing ran


@pytest.mark.slow
def test_ddp_options_with_fp16_compression_hook_on_gloo(single_process_rows):
    # static_graph + activation checkpointing is the combination DDP needs it for.
    row = run_training(TrainConfig(**MLP, parallelism="ddp", world_size=2, comm_hook="fp16",
                                   bucket_cap_mb=1.0, gradient_as_bucket_view=True,
                                   static_graph=True, activation_checkpointing=True), TIMEOUT_S)
    assert row["status"] == "ok", row["error"]
    # Gradients travel in fp16: close to the fp32 trajectory, not equal to it.
    reference = single_process_rows["mlp"]["losses"]
    assert row["losses"] == pytest.approx(reference, rel=1e-2)
    assert row["losses"] != pytest.approx(reference, rel=1e-7)


@pytest.mark.slow
def test_fsdp_mixed_precision_policy_gathers_bf16_parameters(single_process_rows):
    row = run_training(TrainConfig(**MLP, parallelism="fsdp", world_size=2,
                                   fsdp_param_dtype="bfloat16", fsdp_reduce_dtype="float32",
                                   reshard_after_forward=False), TIMEOUT_S)
    assert row["status"] == "ok", row["error"]
    reference = single_process_rows["mlp"]["losses"]
    assert row["losses"] == pytest.approx(reference, rel=2e-2)
    assert row["losses"] != pytest.approx(reference, rel=1e-5)  # bf16 compute really happened


@pytest.mark.slow
def test_capped_memory_and_a_huge_batch_end_as_oom():
    cfg = TrainConfig(**{**MLP, "batch_size": 2**20, "steps": 2}, parallelism="ddp", world_size=2,
                      address_space_headroom_bytes=256 * 2**20)
    row = run_training(cfg, TIMEOUT_S)
    assert row["status"] == "oom", row["error"]
    assert "allocate" in row["error"]
    assert row["failed_rank"] in (0, 1)


@pytest.mark.slow
def test_find_max_batch_size_doubles_then_bisects_to_the_oom_edge():
    cfg = TrainConfig(model="mlp", steps=1, warmup_steps=0,
                      address_space_headroom_bytes=512 * 2**20)
    found = find_max_batch_size(cfg, start=2**15, limit=2**17, multiple_of=2**14,
                                timeout_s=TIMEOUT_S)
    assert found["stopped_by"] is None
    statuses = dict(found["probes"])
    assert set(statuses.values()) == {"ok", "oom"}  # the edge lies inside the searched range
    best = found["max_batch_size"]
    assert statuses[best] == "ok"
    # Consistent edge: every probe above the answer ran out of memory, every one below fit.
    assert all((status == "ok") == (batch <= best) for batch, status in found["probes"])
    # Bisection probed between the last doubling that fit and the first that did not.
    assert any(batch % 2**15 for batch, _ in found["probes"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"parallelism": "ddp", "world_size": 2, "batch_size": 3},  # batch does not split
        {"parallelism": "none", "world_size": 2},
        {"precision": "fp64"},
        {"steps": 2, "warmup_steps": 2},  # nothing left to time
        {"comm_hook": "fp16"},  # a DDP option without DDP
        {"compile_mode": "max-autotune"},  # without compile
        {"model_size": {"dim": 0}},
    ],
)
def test_bad_configurations_are_rejected(kwargs):
    with pytest.raises(BadInputError):
        TrainConfig(**kwargs)


def test_build_model_rejects_unknown_names_and_sizes():
    with pytest.raises(BadInputError):
        build_model("resnet")
    with pytest.raises(BadInputError):
        build_model("mlp", width=3)
    model = build_model("transformer", vocab=16, dim=8, n_heads=2, n_layers=1, max_seq_len=4)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 16)
    assert set(model.tp_plan().values()) == {"colwise", "rowwise"}
