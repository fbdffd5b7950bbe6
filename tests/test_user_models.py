"""Users' models through perfkit's training step: an entry point written here (tests/_user_models.py),
Hugging Face models built from their configs with random weights, torchvision where it imports.

Real transformers model code (no download), real gloo ranks. Loss tolerance as tests/test_zero.py
(rtol 1e-4: reassociation of sharded reductions only; a wrong batch split moves it by 1e-2 or more).
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys

import pytest

from conftest import REPO
from perfkit.core.errors import BadInputError
from perfkit.measuring.training.batch_search import find_max_batch_size
from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.step import run_training, train_step_benchmark
from perfkit.measuring.workloads import catalog

transformers = pytest.importorskip("transformers", reason="perfkit[hf] (transformers) is not installed")

RTOL = 1e-4
# bf16 autocast: each rank's matmuls round to bf16 over its half of the batch (oneDNN may block
# them differently from the whole batch's), so trajectories agree to bf16's precision, not fp32's
# (measured: 8.6e-4 under ddp, zero3 and pp over 3 steps); a wrong gradient is off by 1e-2 or more.
RTOL_BF16 = 5e-3
ENTRY = {"model": "_user_models:recommender", "batch_size": 16, "steps": 5, "warmup_steps": 1,
         "model_size": {"width": 32, "depth": 3}}
# An entry point that names its stem and head: pp splits it at its blocks.
SEQUENTIAL = {"model": "_user_models:sequential", "batch_size": 16, "steps": 5, "warmup_steps": 1}
LLAMA_SIZE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 512}
LLAMA = {"model": "hf:llama", "model_size": LLAMA_SIZE, "batch_size": 4, "seq_len": 32, "steps": 3}
LLAMA_BF16 = {**LLAMA, "precision": "bf16"}
QWEN2 = {"model": "hf:qwen2", "batch_size": 4, "seq_len": 32, "steps": 3,  # grouped-query attention
         "model_size": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "intermediate_size": 344, "vocab_size": 512}}
GPT2 = {"model": "hf:gpt2", "batch_size": 4, "seq_len": 32, "steps": 3,
        "model_size": {"n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 512}}
RESNET = {"model": "hf:resnet", "batch_size": 4, "steps": 3,
          "model_size": {"image_size": 64, "num_labels": 10, "hidden_sizes": [16, 32], "depths": [1, 1],
                         "embedding_size": 8}}
STATE = ("param_bytes", "grad_bytes", "optim_state_bytes")


def _torchvision_imports() -> bool:
    try:
        import torchvision.models  # noqa: F401
    except Exception:  # noqa: BLE001 - a CUDA build raises RuntimeError against the CPU torch
        return False
    return True


@pytest.mark.parametrize("model, family", [("mlp", "builtin"), ("pkg.mod:fn", "entry"),
                                           ("hf:llama", "hf"), ("torchvision:resnet18", "torchvision")])
def test_a_model_name_says_its_family(model, family):
    assert catalog.family_of(model) == family


@pytest.mark.parametrize("params, says", [
    ({"model": "no_such_package.models:build"}, "module 'no_such_package.models' does not import"),
    ({"model": "_user_models:missing"}, "has no function 'missing'"),
    ({"model": "_user_models:no_model"}, "without ['model']"),
    ({"model": "_user_models:not_a_mapping"}, "returned Linear"),
    ({"model": "_user_models:recommender", "model_size": {"widht": 8}}, "does not take"),
    ({"model": "hf:lama"}, "no model_type 'lama'; close: llama"),
    ({"model": "hf:llama", "model_size": {"hidden_sz": 64}}, "hidden_sz: close hidden_size"),
    ({"model": "hf:gpt2", "seq_len": 4096}, "max_position_embeddings 1024"),
    ({"model": "tranformer"}, "unknown model 'tranformer'"),
])
def test_bad_models_are_refused_with_one_line_before_any_work(params, says):
    with pytest.raises(BadInputError) as err:
        TrainConfig(**params)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_torchvision_model_says_why_where_torchvision_does_not_import():
    if _torchvision_imports():
        with pytest.raises(BadInputError, match="has no model 'resnet_18'; close: resnet18"):
            TrainConfig(model="torchvision:resnet_18")
        return
    with pytest.raises(BadInputError, match="torchvision built for this torch .* does not import here"):
        TrainConfig(model="torchvision:resnet18")


def test_ranks_preload_the_modules_of_hf_models_only_and_each_exists():
    # A CPU launch imports these once before forking its ranks (perfkit.run._rank_fork); a name
    # that does not exist would silently give the saving up, so each must be importable.
    for model_type in ("llama", "bert", "vit", "gpt_neox", "xlm-roberta"):
        modules = catalog.rank_imports(f"hf:{model_type}")
        assert len(modules) == 2, modules
        assert all(importlib.util.find_spec(m) is not None for m in modules), modules
    # A user's entry point may read its rank at import: never imported before the fork.
    assert catalog.rank_imports("mlp") == catalog.rank_imports("tests.models:toy") == ()


def test_every_row_is_fingerprinted_with_the_model_libraries_installed():
    # A new transformers can change the model code, and so the numbers, as a new torch can: its
    # version is in every row's fingerprint (env_transformers), not only in HF rows' own column.
    import pandas as pd

    from perfkit.core import env

    cols = env.fingerprint_columns(pd.DataFrame([{"device": "cpu"}, {"device": "cpu"}]))
    assert (cols["env_transformers"] == transformers.__version__).all()
    installed = importlib.util.find_spec("torchvision") is not None  # imported or not (a CUDA build)
    assert (cols["env_torchvision"].iloc[0] is None) == (not installed)
    assert '"transformers": "%s"' % transformers.__version__ in cols["env_json"].iloc[0]


def test_an_entry_point_trains_in_one_process_with_its_own_flop_and_blocks():
    row = train_step_benchmark(TrainConfig(**ENTRY))
    assert row["status"] == "ok" and row["model_family"] == "entry" and row["loss_fell"]
    assert row["step_model_flop"] == 16 * 6 * (16 * 32 + 3 * 32 * 32 + 32)
    # Counted: the matmuls (less the dense layer's skipped input gradient) and the elementwise ops.
    assert row["step_counted_flop"] == pytest.approx(row["step_model_flop"], rel=0.10)
    assert all(row[k] == row[f"{k}_predicted"] for k in STATE)
    assert math.isnan(row["activation_bytes_predicted"]) and "no activation model" in row["activation_bytes_reason"]
    assert row["activation_bytes_measured"] > 0


def test_an_entry_point_with_dict_inputs_and_its_own_loss_trains():
    row = train_step_benchmark(TrainConfig(model="_user_models:returns_its_loss", batch_size=8, steps=4))
    assert row["status"] == "ok" and row["loss_fell"]
    assert math.isnan(row["mfu"]) and "gives no flop_per_sample" in row["mfu_reason"]
    assert row["step_counted_flop"] > 0


def test_activation_checkpointing_of_an_entry_point_recomputes_its_blocks():
    plain = train_step_benchmark(TrainConfig(**ENTRY))
    ckpt = train_step_benchmark(TrainConfig(**ENTRY, activation_checkpointing=True))
    assert ckpt["losses"] == pytest.approx(plain["losses"], rel=RTOL)
    # The blocks' forward runs twice: their matmul FLOP (2·w² per sample each) again.
    again = ckpt["step_counted_flop"] - plain["step_counted_flop"]
    assert again == pytest.approx(16 * 3 * 2 * 32 * 32, rel=0.05)
    no_blocks = run_training(TrainConfig(model="_user_models:returns_its_loss", batch_size=8, steps=3,
                                         activation_checkpointing=True))
    assert no_blocks["status"] == "skipped" and "names none" in no_blocks["error"]


@pytest.mark.slow  # real transformers model code, seconds each: outside the inner loop
@pytest.mark.parametrize("base, precision", [(LLAMA, "fp32"), (LLAMA, "bf16"), (QWEN2, "fp32"),
                                             (QWEN2, "bf16"), (GPT2, "fp32")])
def test_hf_text_models_count_within_10_percent_of_6n_plus_attention(base, precision):
    row = train_step_benchmark(TrainConfig(**base, precision=precision))
    assert row["status"] == "ok" and row["model_family"] == "hf"
    assert row["transformers_version"] == transformers.__version__
    assert "6N + 12·L·H·Q·T" in row["mfu_convention"]
    assert row["step_counted_flop"] == pytest.approx(row["step_model_flop"], rel=0.10)
    assert row["matmul_dtype_counted"] == ("bfloat16" if precision == "bf16" else "float32")
    assert all(row[k] == row[f"{k}_predicted"] for k in STATE)
    assert row["activation_bytes_measured"] > 0
    if precision == "fp32":
        assert row["mfu"] > 0


def test_hf_llama_analytic_flop_follow_the_config():
    # N = 4 layers × (4·256² attention + 3·256·688 MLP + 2·256 norms) + 256 final norm + 256·512 head.
    n = 4 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) + 256 + 256 * 512
    work = catalog.build(catalog.make("hf:llama", LLAMA_SIZE, seq_len=32), device="meta")
    assert work.n_params_non_embedding == n
    assert work.flop_per_sample == (6 * n + 12 * 4 * 4 * 64 * 32) * 32
    assert work.block_names == tuple(f"model.layers.{i}" for i in range(4))


@pytest.mark.slow  # real transformers model code, seconds each: outside the inner loop
def test_hf_vision_model_trains_with_mfu_nan_and_the_reason():
    row = train_step_benchmark(TrainConfig(**RESNET))
    assert row["status"] == "ok" and row["loss_first"] > 0
    assert math.isnan(row["mfu"]) and "no analytic FLOP model for hf:resnet" in row["mfu_reason"]
    assert row["step_counted_flop"] > 0 and row["counted_flop_utilisation"] > 0


def test_a_setting_a_user_model_cannot_take_is_skipped_with_the_reason():
    pp = run_training(TrainConfig(**GPT2, parallelism="pp", world_size=2, n_microbatches=2))
    assert pp["status"] == "skipped" and "llama-style Hugging Face decoders" in pp["error"]
    assert "hf:gpt2 is none of these" in pp["error"]  # tied embeddings, its own block layout
    entry = run_training(TrainConfig(**ENTRY, parallelism="pp", world_size=2, n_microbatches=2))
    assert entry["status"] == "skipped" and "stem, blocks and head" in entry["error"]
    tupled = run_training(TrainConfig(**SEQUENTIAL, model_size={"tuple_inputs": True}, parallelism="pp",
                                      world_size=2, n_microbatches=2))
    assert tupled["status"] == "skipped" and "gives the inputs as a tuple" in tupled["error"]
    tp = run_training(TrainConfig(**RESNET, parallelism="tp", world_size=2))
    assert tp["status"] == "skipped" and "no tensor-parallel plan" in tp["error"]


@pytest.fixture(scope="module")
def parallel_rows():
    from _training_targets import run_training_shared

    out = {"entry-none": train_step_benchmark(TrainConfig(**ENTRY)),
           "llama-none": train_step_benchmark(TrainConfig(**LLAMA)),
           "qwen2-none": train_step_benchmark(TrainConfig(**QWEN2)),
           "sequential-none": train_step_benchmark(TrainConfig(**SEQUENTIAL)),
           "llamabf16-none": train_step_benchmark(TrainConfig(**LLAMA_BF16))}
    pp = {"n_microbatches": 2}
    runs = {"entry-ddp": (ENTRY, "ddp", {}), "entry-zero2": (ENTRY, "zero2", {}), "entry-zero3": (ENTRY, "zero3", {}),
            "llama-ddp": (LLAMA, "ddp", {}), "llama-zero3": (LLAMA, "zero3", {}), "llama-tp": (LLAMA, "tp", {}),
            "llama-pp": (LLAMA, "pp", pp), "qwen2-zero3": (QWEN2, "zero3", {}), "qwen2-pp": (QWEN2, "pp", pp),
            "sequential-pp": (SEQUENTIAL, "pp", pp), "llamabf16-ddp": (LLAMA_BF16, "ddp", {}),
            "llamabf16-zero3": (LLAMA_BF16, "zero3", {}), "llamabf16-pp": (LLAMA_BF16, "pp", pp)}
    cfgs = [TrainConfig(**base, parallelism=p, world_size=2, **extra) for base, p, extra in runs.values()]
    out.update(zip(runs, run_training_shared(cfgs, 600)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["entry-ddp", "entry-zero2", "entry-zero3", "llama-ddp", "llama-zero3", "llama-tp",
                                  "llama-pp", "qwen2-zero3", "qwen2-pp", "sequential-pp", "llamabf16-ddp",
                                  "llamabf16-zero3", "llamabf16-pp"])
def test_user_models_train_on_two_gloo_ranks_as_in_one_process(parallel_rows, name):
    row, ref = parallel_rows[name], parallel_rows[f"{name.split('-')[0]}-none"]
    assert row["status"] == "ok", row["error"]
    assert row["losses"] == pytest.approx(ref["losses"], rel=RTOL_BF16 if "bf16" in name else RTOL)
    # Measured model state per rank equals the ZeRO accounting of the user's model, exactly.
    assert {k: row[k] for k in STATE} == {k: row[f"{k}_predicted"] for k in STATE}
    if name.endswith(("zero2", "zero3", "pp")):
        assert row["param_bytes"] < ref["param_bytes"] * 0.7  # sharded, or split into stages, over 2 ranks
    if name.endswith("pp"):
        assert row["pp_stages"] == 2 and 0 < row["bubble_fraction"] < 1


@pytest.mark.slow
def test_inputs_a_pipeline_cannot_pass_are_skipped_by_the_ranks_where_the_check_cannot_tell():
    # The check's meta build cannot draw this entry point's batch (its class centres were made on
    # the meta device): the ranks draw the real one and end the configuration skipped, one line.
    row = run_training(TrainConfig(**SEQUENTIAL, model_size={"tuple_inputs": True, "centres_on_cpu": False},
                                   parallelism="pp", world_size=2, n_microbatches=2))
    assert row["status"] == "skipped", row["error"]
    assert row["error"] == ("pp on _user_models:sequential: stages pass one tensor, and its make_batch "
                            "gives the inputs as a tuple")


@pytest.mark.slow
def test_hf_llama_scales_over_ranks_with_its_tokens_and_family_in_the_rows():
    # notebooks/scaling.ipynb's configuration, on a Hugging Face model: FSDP over two ranks (the
    # baselines' launch is the same code at one rank); tokens/s from the workload's tokens per
    # sample (seq_len), not NaN, and the row's family the model's (both were lost between rank and row).
    from perfkit.measuring.training import scaling_run

    cfg = scaling_run.config_from_params(model="hf:llama", model_size=QWEN2["model_size"], seq_len=16,
                                         parallelism="fsdp", world_sizes=[2], batch=8, steps=3)
    rows = scaling_run.run_scaling(cfg)
    assert list(zip(rows["parallelism"], rows["world_size"])) == [("fsdp", 2)]
    assert (rows["status"] == "ok").all(), rows["reason"].tolist()
    assert (rows["model_family"] == "hf").all()
    assert rows["tokens_per_s"].tolist() == pytest.approx((8 * 16 / rows["step_time_s"]).tolist())


@pytest.mark.slow
def test_hf_vision_model_finds_its_oom_edge_under_an_address_space_cap():

    # 128 images of 64×64 fit 256 MiB of headroom with room to spare, 512 do not, 256 mostly do
    # (one run in three ran out here: too near the edge to start from): each probe its own capped
    # process; the search bisects to multiples of 128.
    base = {**RESNET, "steps": 2, "count_flops": False, "batch_size": 128}
    cfg = TrainConfig(**base, address_space_headroom_bytes=256 * 2**20)
    found = find_max_batch_size(cfg, start=128, limit=4096, multiple_of=128, timeout_s=300)
    statuses = {status for _, status in found["probes"]}
    # A probe that ended neither ok nor oom stops the search: its error says why.
    stopped = (found["stopped_by"] or {}).get("error")
    assert stopped is None and "oom" in statuses and "ok" in statuses, (found["probes"], stopped)
    assert 128 <= found["max_batch_size"] < 4096


@pytest.mark.slow
def test_an_oom_in_one_probe_of_the_batch_search_leaves_the_next_probes_unaffected():
    # Issue 43: on the H200 the search's probes ran in the calling process, the first OOM left
    # 134 GiB held there, every later probe ran out too, and the search said 1024 where isolated
    # probes found 1920. The simulated device here fits 1920 samples in a fresh process and keeps
    # what an OOM took (the entry point's module holds it): a probe run where an earlier one ran
    # out would OOM at any batch, and the search would stop at 1024 again.
    import _user_models

    cfg = TrainConfig(model="_user_models:simulated_device", steps=2, warmup_steps=1, count_flops=False,
                      model_size={"capacity_bytes": 1920 * 2**16 + 2**15, "per_sample_bytes": 2**16},
                      batch_size=1024)
    found = find_max_batch_size(cfg, start=1024, limit=8192, multiple_of=128, timeout_s=120)
    # The H200's isolated sequence (../shared/reference/gpu-h200/probes/oom_edge_isolated.json).
    assert found["probes"] == [(1024, "ok"), (2048, "oom"), (1536, "ok"), (1792, "ok"), (1920, "ok")], found
    assert found["max_batch_size"] == 1920 and found["stopped_by"] is None
    assert _user_models._DEVICE_HELD == []  # nothing of a probe's OOM reached this process


@pytest.mark.slow
def test_perfkit_run_refuses_an_unknown_hf_model_with_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", "notebooks/train_step.ipynb",
                           "--out", str(out), "-p", "model", "hf:lama"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no model_type 'lama'; close: llama" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_perfkit_new_model_scaffolds_an_entry_point_whose_sweep_checks(tmp_path, capsys):
    from perfkit.cli import main

    assert main(["new", "mynet", "--model", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "mynet.py").exists() and (tmp_path / "mynet.yaml").exists()
    spec = (tmp_path / "mynet.yaml").read_text()
    assert '"mynet:build"' in spec and str(tmp_path) in spec
    capsys.readouterr()
    # The dry run checks every configuration: the module imports from model_path and builds (meta).
    assert main(["sweep", str(tmp_path / "mynet.yaml"), "--out", str(tmp_path / "runs"), "--dry-run"]) == 0
    assert "9 configurations, 9 to run" in capsys.readouterr().out
    assert main(["new", "my-net", "--model", "--dir", str(tmp_path)]) == 2  # not a module name


def test_a_relative_model_path_means_the_notebooks_folder_to_the_check_as_to_the_kernel(tmp_path, capsys):
    from perfkit.cli import main

    # templates/user_model.yaml names model_path "../templates": from notebooks/, where kernels run.
    assert main(["sweep", str(REPO / "templates" / "user_model.yaml"), "--out", str(tmp_path), "--dry-run"]) == 0
    assert "9 configurations, 9 to run" in capsys.readouterr().out


@pytest.mark.slow  # real transformers model code, seconds each: outside the inner loop
def test_hf_llama_generates_through_its_own_cache_with_perfkits_columns():
    """Issue 27's inference acceptance, on counted work (the timed ratios are the benchmark's,
    benchmarks/inference_latency.py; the suite never times): transformers' StaticCache and the
    no-cache baseline give the same greedy tokens; a decode step moves at most 1.5x the bytes from
    prompt 128 to 512 (the weights dominate); prefill FLOP grow with the prompt; without the cache a
    decode step recomputes the sequence."""
    from perfkit.measuring.inference import generate as inference

    base = dict(model="hf:llama", model_size=LLAMA_SIZE, batch_size=1, new_tokens=8, device="cpu",
                threads=1, timed_runs=1, ceilings="none")
    rows = {name: inference.run_inference(inference.InferenceConfig(**base, **kw))
            for name, kw in {"cache128": dict(prompt_len=128), "cache512": dict(prompt_len=512),
                             "full512": dict(prompt_len=512, kv_cache=False)}.items()}
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["error"])
        assert row["model_family"] == "hf" and row["ttft_s"] > 0 and row["tpot_s"] > 0
    c128, c512, f512 = rows["cache128"], rows["cache512"], rows["full512"]
    assert c512["tokens_digest"] == f512["tokens_digest"]
    assert 1.0 < c512["decode_bytes"] / c128["decode_bytes"] <= 1.5
    assert 2 <= c512["prefill_flop"] / c128["prefill_flop"] <= 6
    assert f512["decode_flop"] / c512["decode_flop"] >= 4
    # Keys and values of 4 layers × 520 positions × 4 kv heads × 64 dims, fp32.
    assert c512["kv_cache_bytes"] == 2 * 4 * 520 * 4 * 64 * 4


def test_inference_refuses_a_model_that_does_not_generate():
    from perfkit.measuring.inference import generate as inference

    with pytest.raises(BadInputError, match="hf:bert is a masked-lm model"):
        inference.InferenceConfig(model="hf:bert")
    with pytest.raises(BadInputError, match="causal LM"):
        inference.InferenceConfig(model="mlp")


def test_an_hf_model_without_the_extra_says_which_to_install(monkeypatch):
    from perfkit.measuring.workloads import hf

    hf._config_class.cache_clear()
    hf.task_of.cache_clear()
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(BadInputError, match=r"need Hugging Face transformers: pip install 'perfkit\[hf\]'"):
        TrainConfig(model="hf:mistral")


MOE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "intermediate_size": 128, "vocab_size": 512, "num_experts_per_tok": 2}


@pytest.mark.slow  # two HF models built and stepped
@pytest.mark.parametrize("model, size", [
    ("hf:mixtral", {**MOE, "num_local_experts": 8}),
    ("hf:qwen2_moe", {**MOE, "num_experts": 8, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128}),
])
def test_a_mixture_of_experts_counts_its_experts_and_states_its_active_parameters(model, size):
    # Issue 46: the analytic FLOP counted every expert (MFU 2.9x too high for mixtral), the counted
    # ones none (aten._grouped_mm uncounted). Now: the routed experts at top-k/E, shared ones whole,
    # and the grouped GEMMs counted; the two agree within 10 %, nothing of the step left uncounted.
    row = train_step_benchmark(TrainConfig(model=model, model_size=size, batch_size=4, seq_len=32, steps=3,
                                           device="cpu"))
    assert row["status"] == "ok" and row["uncounted_ops"] == "", row["uncounted_ops"]
    assert row["step_model_flop"] == pytest.approx(row["step_counted_flop"], rel=0.10)
    assert "top-k/E" in row["mfu_convention"]
    # By hand, mixtral's: PaLM's 6N + 12·L·H·Q·T a token with N less the routed experts' share a
    # token does not use (6 of 8): 2 layers x 8 experts x (gate_up 64->256, down 128->64).
    if model == "hf:mixtral":
        experts = 2 * 8 * (2 * 128 * 64 + 64 * 128)
        per_token = 6 * (row["n_params_non_embedding"] - experts * (1 - 2 / 8)) + 12 * 2 * 4 * 16 * 32
        assert row["step_model_flop"] == pytest.approx(per_token * 32 * 4, rel=1e-9)
        assert (per_token + 6 * experts * (1 - 2 / 8)) / per_token > 2  # every expert counted: the old figure


@pytest.mark.parametrize("size, says", [
    ({"hidden_size": 64, "num_attention_heads": 3}, "transformers refuses this model_size: "
                                                    "StrictDataclassClassValidationError"),
    ({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512, "pad_token_id": 600}, "pad_token_id 600 is past vocab_size 512"),
])
def test_a_model_size_transformers_refuses_is_one_line_before_anything_runs(size, says):
    # Issue 46 item 6: a traceback and exit 1 from inside the kernel; now the pre-run check's one line.
    with pytest.raises(BadInputError, match=re.escape(says)):
        catalog.check(catalog.make("hf:llama", size, seq_len=16))


def test_special_token_ids_past_a_shrunk_vocabulary_are_cleared_and_the_row_says_so():
    # phi3's pad and eos ids (32000) past vocab_size 512: the embedding refused its padding index once
    # the kernel had started. Cleared, and said in the row.
    work = catalog.build(catalog.make("hf:phi3", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                  "vocab_size": 512, "intermediate_size": 128}, seq_len=16),
                         device="meta")
    assert work.config_note.startswith("cleared pad_token_id 32000, eos_token_id 32000: past vocab_size 512")
    row = train_step_benchmark(TrainConfig(model="hf:phi3", batch_size=2, seq_len=16, steps=2, device="cpu",
                                           model_size={"hidden_size": 64, "num_hidden_layers": 2,
                                                       "num_attention_heads": 4, "vocab_size": 512,
                                                       "intermediate_size": 128}))
    assert row["status"] == "ok" and row["model_config_note"] == work.config_note


def test_a_user_model_s_code_is_part_of_the_configuration_id_so_an_edited_one_runs_again(tmp_path):
    """A user's entry point in model_path (or beside the notebook) is part of what a configuration
    measures: editing its module makes a new id, so a resumed sweep runs it again instead of keeping
    the row of the old code. Installed packages' entry points and perfkit's own models do not
    change the id (the environment fingerprint says which torch ran)."""
    import hashlib
    import json as _json

    from pathlib import Path

    from perfkit.run.notebooks import config_id, read_notebook

    spec = read_notebook(Path(__file__).resolve().parents[1] / "notebooks" / "train_step.ipynb")
    (tmp_path / "mine.py").write_text("def build(seed=0):\n    return {}\n")
    params = {"model": "mine:build", "model_path": str(tmp_path)}
    first = config_id(spec, params)
    assert config_id(spec, params) == first
    (tmp_path / "mine.py").write_text("def build(seed=0):\n    return {'changed': True}\n")
    assert config_id(spec, params) != first
    # A package: any of its modules counts (they import each other).
    pkg = tmp_path / "zoo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("from .layers import f\ndef build(seed=0):\n    return {}\n")
    (pkg / "layers.py").write_text("def f():\n    return 1\n")
    params = {"model": "zoo.models:build", "model_path": str(tmp_path)}
    before = config_id(spec, params)
    (pkg / "layers.py").write_text("def f():\n    return 2\n")
    assert config_id(spec, params) != before
    # Nothing local named: the id is what it always was.
    plain = {"model": "transformer", "batch_size": 8}
    blob = _json.dumps({"code": spec.code_sha256, "params": plain}, sort_keys=True, default=str)
    assert config_id(spec, plain) == f"train_step-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"
    kernels = read_notebook(Path(__file__).resolve().parents[1] / "notebooks" / "kernels.ipynb")
    # The kernels notebook's defaults name templates/my_kernels.py: part of every kernels id.
    blob = _json.dumps({"code": kernels.code_sha256, "params": {}}, sort_keys=True, default=str)
    assert config_id(kernels, {}) != f"kernels-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"
