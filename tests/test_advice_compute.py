"""The advice rules of how a step computes (issue 29): host/launch-bound from a real trace's idle
time, memory-bound ops and a precision the device beats from real roofline points of a real step,
and the follow-up each proposes (a fusion experiment runs in the training notebook)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, ceiling_row
from perfkit.analyse.advice import advise
from perfkit.analyse.advice.rules import select_rules

G = 1e9
TRACES = REPO.parent / "shared" / "reference" / "traces"


def _trace_row(path: Path, config_id: str, **extra) -> dict:
    from perfkit.analyse.trace.breakdown import trace_summary

    summary = trace_summary([path]).iloc[0]
    return {"status": "ok", "config_id": config_id, "workload": "train_step", "notebook": "train_step.ipynb",
            "trace_idle_share": summary["trace_idle_share"], "trace_top_kernel": summary["trace_top_kernel"],
            "trace_top_kernel_share": summary["trace_top_kernel_share"],
            "trace_short_kernel_share": summary["trace_short_kernel_share"], "batch_size": 8, **extra}


def test_a_launch_bound_rocm_trace_is_host_bound_and_a_busy_one_is_not():
    toy = TRACES / "amd_mi250" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    busy = TRACES / "trace_diff" / "control.json.gz"
    if not (toy.exists() and busy.exists()):
        pytest.skip(f"the reference traces are not at {TRACES}")
    rows = pd.DataFrame([_trace_row(toy, "toy", compile=False), _trace_row(busy, "busy", compile=False),
                         _trace_row(toy, "toy-compiled", compile=True, device="cuda", compile_mode=None)])
    found = {f.config_ids[0]: f for f in advise(rows, select_rules(["host_bound"]))}
    # The MI250 mini-toy's GPU idles 98.5 % of its window (HTA's idle time); the control trace 16 %.
    assert set(found) == {"toy", "toy-compiled"}
    toy_finding = found["toy"]
    assert toy_finding.evidence["trace_idle_share"] == pytest.approx(0.985, abs=0.005)
    assert toy_finding.cost_share == toy_finding.evidence["trace_idle_share"]
    # "Many short kernels": counted straight from the trace file, 10 of its 14 kernels run < 10 µs.
    import gzip

    kernels = [e for e in json.load(gzip.open(toy))["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    short = sum(e["dur"] < 10 for e in kernels) / len(kernels)
    assert (len(kernels), short) == (14, pytest.approx(10 / 14))
    assert toy_finding.evidence["trace_short_kernel_share"] == pytest.approx(short)
    assert "71% of its kernels run under 10 µs" in toy_finding.summary and "launch-bound" in toy_finding.summary
    assert (toy_finding.experiment.parameter, toy_finding.experiment.proposed) == ("compile", True)
    # Already compiled on a GPU: CUDA graphs next.
    assert (found["toy-compiled"].experiment.parameter, found["toy-compiled"].experiment.proposed) == \
        ("compile_mode", "reduce-overhead")


@pytest.fixture(scope="module")
def mlp_step():
    """A real training step of perfkit's MLP, counted and profiled (no ceilings measured)."""
    import torch

    from perfkit.measuring.ops import roofline_step
    from perfkit.measuring.workloads import synthetic

    torch.manual_seed(0)
    work = synthetic.build(synthetic.make_spec("mlp"), device="cpu", dtype=torch.float32)
    return roofline_step.profile_step(work, 64, device="cpu", dtype=torch.float32, profile_steps=1,
                                      min_run_time_s=0.05)


def _roofline_rows(step, ceilings: pd.DataFrame, config_id: str) -> pd.DataFrame:
    from perfkit.analyse import roofline
    from perfkit.measuring.ops import roofline_step

    # Shares of the profiled ops' own time (step_time_s None), not of the timed step: on a loaded
    # machine the step's timing and the profiled ops' drift apart, and this test is of the rules.
    points = roofline.roofline_points(step.ops, ceilings, step_time_s=None, origin="measured")
    rows = roofline_step.point_rows(points, step).assign(
        workload="roofline", model="mlp", batch_size=64, precision="fp32", ceiling_origin="measured",
        notebook="roofline.ipynb", status="ok", config_id=config_id)
    return pd.concat([rows, ceilings.assign(workload="ceiling", status="ok", config_id=config_id,
                                            notebook="roofline.ipynb")], ignore_index=True)


def test_memory_bound_ops_over_half_the_step_get_a_fusion_experiment_in_the_training_notebook(mlp_step):
    # A memory roof so low (1 GB/s) that every op with bytes is under it, then one so high that
    # only the zero-FLOP ops stay memory-bound.
    slow_memory = pd.DataFrame([ceiling_row("compute", "fp32", None, 100 * G),
                                ceiling_row("memory", None, "DRAM", 1 * G)])
    fast_memory = pd.DataFrame([ceiling_row("compute", "fp32", None, 1 * G),
                                ceiling_row("memory", None, "DRAM", 1e6 * G)])
    rows = pd.concat([_roofline_rows(mlp_step, slow_memory, "slow"),
                      _roofline_rows(mlp_step, fast_memory, "fast")], ignore_index=True)
    found = {f.config_ids[0]: f for f in advise(rows, select_rules(["memory_bound_ops"]))}
    assert set(found) == {"slow"}
    finding = found["slow"]
    ops = rows[(rows["config_id"] == "slow") & (rows["workload"] == "roofline") & (rows["op"] != "<step>")]
    memory_share = ops.loc[ops["bound"] != "compute", "time_share"].sum()
    assert finding.cost_share == pytest.approx(memory_share) and memory_share >= 0.5
    e = finding.experiment
    assert (e.notebook, e.parameter, e.current, e.proposed) == ("train_step.ipynb", "compile", False, True)
    assert e.narrow == {"model": "mlp", "batch_size": 64, "precision": "fp32"}


def test_compute_bound_fp32_on_a_device_with_a_4x_bf16_roof_is_told_to_try_bf16(mlp_step):
    def roofs(bf16_over_fp32):
        return pd.DataFrame([ceiling_row("compute", "fp32", None, 1 * G),
                             ceiling_row("compute", "bf16", None, bf16_over_fp32 * G),
                             ceiling_row("compute", "bf16", None, 1e6 * G, origin="spec"),  # another origin
                             ceiling_row("memory", None, "DRAM", 1e6 * G)])
    rows = pd.concat([_roofline_rows(mlp_step, roofs(4.0), "amx"), _roofline_rows(mlp_step, roofs(1.2), "avx2")],
                     ignore_index=True)
    found = {f.config_ids[0]: f for f in advise(rows, select_rules(["precision_below_device"]))}
    assert set(found) == {"amx"}  # 1.2x is no reason to change precision; the spec roof is not compared
    finding = found["amx"]
    assert finding.evidence["roof_ratio"] == pytest.approx(4.0)
    share = finding.evidence["compute_bound_time_share"]
    assert finding.cost_share == pytest.approx(share * 0.75)
    assert (finding.experiment.parameter, finding.experiment.current, finding.experiment.proposed) == \
        ("precision", "fp32", "bf16")
    # Where the device has a tf32 roof that clears the bar too, the smaller change comes first.
    with_tf32 = pd.concat([roofs(4.0), pd.DataFrame([ceiling_row("compute", "tf32", None, 3 * G)])], ignore_index=True)
    (tf32,) = advise(_roofline_rows(mlp_step, with_tf32, "ampere"), select_rules(["precision_below_device"]))
    assert (tf32.experiment.proposed, tf32.evidence["roof_ratio"]) == ("tf32", pytest.approx(3.0))


def test_the_fusion_experiment_is_a_spec_of_the_training_notebook_narrowed_to_the_roofline_s_model(tmp_path):
    from perfkit.analyse.advice import Experiment, Finding
    from perfkit.view.advise_followup import spec_for

    (tmp_path / "notebooks").mkdir()
    executed = {"metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "roofline.ipynb"),
                                           "parameters": {"model": "mlp", "batch_size": 64, "precision": "fp32",
                                                          "measure_ceilings": True}}}}
    (tmp_path / "notebooks" / "c1.ipynb").write_text(json.dumps(executed))
    finding = Finding(rule="memory_bound_ops", constraint="memory-bound ops", point="roofline", config_ids=("c1",),
                      cost_share=0.6, evidence={}, summary="", advice="",
                      experiment=Experiment(notebook="train_step.ipynb", parameter="compile", current=False,
                                            proposed=True, narrow={"model": "mlp", "batch_size": 64,
                                                                   "precision": "fp32"}))
    spec = spec_for(finding, tmp_path, rounds=3)
    assert spec["notebook"] == str(REPO / "notebooks" / "train_step.ipynb")
    assert spec["parameters"] == {"model": "mlp", "batch_size": 64, "precision": "fp32"}  # no roofline parameter
    assert [v["parameters"] for v in spec["variants"]] == [{"compile": False}, {"compile": True}]
    from perfkit.run.sweep.spec import expand, load_spec

    path = tmp_path / "spec.yaml"
    import yaml

    path.write_text(yaml.safe_dump(spec))
    assert len(expand(load_spec(path))) == 6  # 2 variants x 3 rounds: train_step takes every parameter set


@pytest.mark.parametrize("parallelism, parameter, current, proposed", [
    ("ddp", "bucket_cap_mb", [25.0], [100.0]), ("fsdp", "fsdp_prefetch", [1], [2])])
def test_exposed_communication_proposes_a_setting_the_scaling_notebook_takes(tmp_path, parallelism, parameter,
                                                                            current, proposed):
    import yaml

    from perfkit.analyse.advice import advise
    from perfkit.run.sweep.spec import expand, load_spec
    from perfkit.view.advise_followup import spec_for

    # A scaling point whose step (100 ms) is twice its compute-only step: 50 % exposed communication.
    row = {"status": "ok", "config_id": "s1", "workload": "scaling", "notebook": "scaling.ipynb",
           "parallelism": parallelism, "world_size": 2, "step_time_s": 0.1, "compute_time_s": 0.05,
           "rank_compute_time_s": [0.05, 0.05], "bucket_cap_mb": 25.0, "fsdp_prefetch": 1}
    (finding,) = advise(pd.DataFrame([row]), select_rules(["exposed_communication"]))
    e = finding.experiment
    assert (e.parameter, [e.current], [e.proposed]) == (parameter, current, proposed)
    (tmp_path / "notebooks").mkdir()
    params = {"parallelism": parallelism, "world_sizes": [1, 2], "batch": 64}
    executed = {"metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "scaling.ipynb"),
                                           "parameters": params}}}
    (tmp_path / "notebooks" / "s1.ipynb").write_text(json.dumps(executed))
    spec = spec_for(finding, tmp_path, rounds=2)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    configs = expand(load_spec(path))  # the scaling notebook takes the parameter (checked, or exit 2)
    assert sorted(c.params[parameter] for c in configs) == sorted([current[0], proposed[0]] * 2)
    assert {tuple(c.params["world_sizes"]) for c in configs} == {(2,)}  # narrowed to the finding's point


def test_a_batch_at_its_edge_is_told_checkpointing_buys_room_and_the_experiment_changes_both(tmp_path):
    import yaml

    from perfkit.measuring.training import memory_model
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.run.sweep.spec import expand, load_spec
    from perfkit.view.advise_followup import spec_for

    # The memory model's own edges for a transformer against 64 MiB a rank: checkpointing frees
    # the blocks' saved activations, so its edge lies well past the plain one.
    cfg = TrainConfig(model="transformer", batch_size=8, seq_len=64, device="cpu",
                      model_size={"n_layers": 4, "d_model": 64, "n_heads": 4, "vocab_size": 256})
    budget = 64 * 2**20
    edge = memory_model.predicted_max_batch(cfg, budget)
    edge_ac = memory_model._checkpointed_edge(cfg, budget)
    assert edge and edge_ac > 2 * edge, (edge, edge_ac)
    row = {"status": "ok", "config_id": "t1", "workload": "train_step", "notebook": "train_step.ipynb",
           "batch_size": edge, "max_batch_size_predicted": edge, "max_batch_size_predicted_checkpointed": edge_ac,
           "memory_budget_bytes": budget, "activation_checkpointing": False, "dp_size": 1}
    (finding,) = advise(pd.DataFrame([row]), select_rules(["memory_headroom"]))
    e = finding.experiment
    assert (e.parameter, e.current, e.proposed, e.also, e.metric) == (
        "activation_checkpointing", False, True, {"batch_size": 2 * edge}, "samples_per_s")
    # Already checkpointing, or no room bought: nothing.
    assert not advise(pd.DataFrame([{**row, "activation_checkpointing": True}]), select_rules(["memory_headroom"]))
    assert not advise(pd.DataFrame([{**row, "max_batch_size_predicted_checkpointed": edge + 1}]),
                      select_rules(["memory_headroom"]))
    # The experiment: the configuration as it ran against checkpointing at the larger batch.
    (tmp_path / "notebooks").mkdir()
    executed = {"metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "train_step.ipynb"),
                                           "parameters": {"model": "transformer", "batch_size": edge}}}}
    (tmp_path / "notebooks" / "t1.ipynb").write_text(json.dumps(executed))
    spec = spec_for(finding, tmp_path, rounds=1)
    assert [v.get("parameters") for v in spec["variants"]] == [
        {"activation_checkpointing": False}, {"activation_checkpointing": True, "batch_size": 2 * edge}]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    sides = {c.variant.name: c.params for c in expand(load_spec(path))}
    assert sides["current"]["batch_size"] == edge and sides["advised"]["batch_size"] == 2 * edge


def test_a_default_run_with_only_its_own_precision_measured_is_told_by_the_spec_pair_and_the_spec_expands(
        mlp_step, tmp_path):
    # Issue 44: the roofline notebook measures only the run's own precision's roof, so a default run's
    # measured roofs never held a faster one and the rule never fired; the spec sheet (or the
    # theoretical peaks) hold the pair. Its experiment asked roofline.ipynb for tf32, which that
    # notebook refuses: it now runs the training step, which takes every precision.
    import yaml

    from perfkit.run.sweep.spec import expand, load_spec
    from perfkit.view.advise_followup import spec_for

    ceilings = pd.DataFrame([ceiling_row("compute", "fp32", None, 1 * G),
                             ceiling_row("memory", None, "DRAM", 1e6 * G),
                             ceiling_row("compute", "fp32", None, 67 * G, origin="spec"),
                             ceiling_row("compute", "tf32", None, 495 * G, origin="spec")])
    (found,) = advise(_roofline_rows(mlp_step, ceilings, "default"), select_rules(["precision_below_device"]))
    assert found.evidence["roof_origin"] == "spec" and found.evidence["roof_ratio"] == pytest.approx(495 / 67)
    e = found.experiment
    assert (e.notebook, e.parameter, e.current, e.proposed) == ("train_step.ipynb", "precision", "fp32", "tf32")
    (tmp_path / "notebooks").mkdir()
    executed = {"metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "roofline.ipynb"),
                                           "parameters": {"model": "mlp", "batch_size": 64, "precision": "fp32"}}}}
    (tmp_path / "notebooks" / "default.ipynb").write_text(json.dumps(executed))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_for(found, tmp_path, rounds=2)))
    configs = expand(load_spec(path))  # checked against train_step.ipynb's parameters and values
    assert sorted({c.params["precision"] for c in configs}) == ["fp32", "tf32"]
    assert all(c.params["model"] == "mlp" and c.params["batch_size"] == 64 for c in configs)


def test_a_step_idle_on_its_input_is_not_told_to_compile():
    # Issue 44: HTA's idle time includes the wait for the batch; 60 % idle of which 45 % is the data
    # wait leaves 15 % for the host: the input rule's, not host_bound's, to advise on.
    rows = pd.DataFrame([{"status": "ok", "config_id": c, "workload": "train_step", "notebook": "train_step.ipynb",
                          "trace_idle_share": 0.6, "trace_data_wait_share": wait, "trace_short_kernel_share": 0.1,
                          "batch_size": 8, "compile": False} for c, wait in (("input", 0.45), ("host", 0.02))])
    found = {f.config_ids[0]: f for f in advise(rows, select_rules(["host_bound"]))}
    assert set(found) == {"host"}
    assert found["host"].cost_share == pytest.approx(0.58)
    assert found["host"].evidence["trace_data_wait_share"] == 0.02


def test_a_verdict_stands_on_the_step_not_on_the_slowest_point_compare_lists_first():
    # Issue 44: --verify judged compare's points.iloc[0], the slowest of possibly many (a roofline
    # configuration compares every op): a compile that sped the step up read "slower" from one op.
    from perfkit.analyse.compare import _POINT_COLUMNS
    from perfkit.view.advise_followup import judged_point

    def point(label, metric, verdict, ratio, n):
        return {**dict.fromkeys(_POINT_COLUMNS), "point": label, "metric": metric, "verdict": verdict,
                "ratio": ratio, "n_base": n, "n_new": n, "lower_is_better": True}

    points = pd.DataFrame([point("roofline (op=aten::gelu)", "time_s", "slower", 1.3, 3),
                           point("roofline (op=<step>)", "time_s", "faster", 0.7, 3),
                           point("roofline (op=aten::mm)", "time_s", "same", 1.0, 3)])
    assert points.iloc[0]["verdict"] == "slower"  # what the old judgement read
    assert judged_point(points, "time_s")["point"] == "roofline (op=<step>)"
    # Without a step point: the experiment's metric, then the point with the most samples.
    rows = pd.DataFrame([point("a", "samples_per_s", "slower", 0.8, 3), point("b", "samples_per_s", "faster", 1.4, 9),
                         point("c", "tpot_s", "slower", 1.2, 20)])
    assert judged_point(rows, "samples_per_s")["point"] == "b"
    assert judged_point(rows, None)["point"] == "c"
