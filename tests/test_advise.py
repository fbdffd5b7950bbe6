"""``perfkit advise`` (issue 29): the constraint that binds each configuration, from its rows.

The folders here hold rows of real measurements made by the test (GEMMs, a timed function),
recorded as a sweep records them. The constraints that need ranks (pipeline bubble, straggler,
latency-bound collectives, input-bound loading) are checked beside the fixtures that already
launch them: tests/test_pipeline.py, test_scaling_run.py, test_collectives.py, test_dataloading.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

from _advice import advise_json, evidence_is_in_rows, record_as, top
from conftest import REFERENCE, REPO

REFERENCE_H200 = REFERENCE / "gpu-h200"


def advise_json_in_place(folder, *args):
    """``perfkit advise FOLDER --json -`` on a folder that is read only (the shared reference)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["advise", str(folder), "--json", "-", *args]) == 0
    return json.loads(buf.getvalue())["findings"]
from perfkit.analyse.advice.rules import RULES
from perfkit.cli import main

BUILTIN = ["input_bound", "straggler", "exposed_communication", "pipeline_bubble", "memory_headroom",
           "collectives_latency_bound", "gemm_below_ceiling", "host_bound", "launch_bound_generation",
           "memory_bound_ops", "precision_below_device", "precision_slower", "noisy"]


@pytest.fixture(scope="module")
def gemm_folder(tmp_path_factory):
    """A GEMM sweep of a tiny size and one that keeps a core busy: the tiny one runs far below
    the ceiling the large one shows. One thread: two threads spinning against the suite's other
    workers ran a 384 GEMM at 1.2 GFLOP/s here, which is not what these tests are about."""
    import torch

    from perfkit.measuring.kernels.gemm import measure_gemm

    folder = tmp_path_factory.mktemp("gemm")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = measure_gemm([8, 256], ["fp32"], device="cpu", min_run_time_s=0.15)
    finally:
        torch.set_num_threads(threads)
    return record_as(rows, folder, notebook="gemm.ipynb", params={"sizes": [8, 256], "dtypes": ["fp32"]},
                     config_id="gemm-sizes")


def test_the_rules_are_listed_with_their_threshold_and_source(capsys):
    assert main(["advise", "--rules"]) == 0
    out = capsys.readouterr().out
    assert [r.name for r in RULES] == BUILTIN
    for rule in RULES:
        assert f"{rule.name}  (" in out and rule.source in out and rule.source and rule.threshold > 0


def test_a_gemm_far_below_the_ceiling_is_its_binding_constraint_and_the_large_one_has_none(gemm_folder):
    findings = advise_json(gemm_folder)
    # Issue 55: the verdict is the point's (one size of the sweep), named so, beside what the rest reaches.
    f = top([x for x in findings if x["point"].endswith(", GEMM 8×8×8 fp32")])
    assert f["rule"] == "gemm_below_ceiling" and f["evidence"]["m"] == 8 and f["robust"], f
    assert "this point (8×8×8)" in f["summary"] and "the rest of this sweep's fp32 GEMMs reach 100%–100%" in f["summary"]
    assert f["evidence"]["fraction_of_ceiling"] < 0.5 and f["cost_share"] == pytest.approx(
        1 - f["evidence"]["fraction_of_ceiling"])
    assert [x["evidence"]["m"] for x in findings if x["rule"] == "gemm_below_ceiling"] == [8]
    evidence_is_in_rows(f, gemm_folder)
    import perfkit

    rows = perfkit.load(gemm_folder)  # no ceiling rows: the roof is the fastest GEMM of the dtype
    assert f["evidence"]["ceiling_flop_per_s"] == rows["flop_per_s"].max() == rows.loc[rows["m"] == 256, "flop_per_s"].item()


def test_the_h200_advice_judges_each_gemm_size_and_finds_the_host_bound_llama_step():
    """Issue 55, on the real H200 folder: the 1024 GEMM's verdict was the whole sweep's (18 % of
    spec) where 2048 and up reach 65-69 %; the hf:llama step, 57 % idle, got only "rerun"."""
    folder = REFERENCE_H200
    if not folder.is_dir():
        pytest.skip(f"the H200 reference folder is not at {folder} (read in place)")
    findings = advise_json_in_place(folder)
    gemm = [f for f in findings if f["rule"] == "gemm_below_ceiling"]
    assert gemm and all(", GEMM 1024×1024×1024 " in f["point"] for f in gemm), [f["point"] for f in gemm]
    fp16 = next(f for f in gemm if f["point"].endswith("fp16"))
    assert "the rest of this sweep's fp16 GEMMs reach 65%–67%" in fp16["summary"]
    host = [f for f in findings if f["rule"] == "host_bound"]
    assert len(host) == 1 and "hf:llama" in host[0]["point"] and host[0]["rank"] == 1
    assert host[0]["evidence"]["trace_idle_share"] == pytest.approx(0.570149, abs=1e-6) and host[0]["robust"]


def test_json_markdown_and_text_say_the_same_advice(gemm_folder, tmp_path, capsys):
    md = tmp_path / "advice.md"
    assert main(["advise", str(gemm_folder), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert "binding: far below the compute ceiling" in text and "rule: gemm_below_ceiling" in text
    table = md.read_text()
    assert table.startswith("### perfkit advise") and "| far below the compute ceiling |" in table
    assert main(["advise", str(gemm_folder), "--json", "-"]) == 0
    import json

    printed = json.loads(capsys.readouterr().out)
    assert printed["findings"][0]["rule"] == "gemm_below_ceiling" and printed["ok_rows"] == 2


def test_a_folder_of_only_noisy_rows_gets_rerun_advice_not_a_constraint(tmp_path):
    # A real training-style loop whose input stalls at random (a contended file system): 3 steps
    # in 5 wait 4 ms for their batch, the others none, and the step itself jitters by 0-20 ms (so
    # that a loaded host's oversleep, which once took a 0-2 ms jitter under 10 %, cannot hide it:
    # the planned IQR/median is about 0.5). The median
    # step waits far past 5 %, but one step in ten does not wait at all: nothing in these rows
    # can say the pipeline is input-bound rather than unlucky, so the advice is to rerun.
    import torch

    from perfkit.core.timing import Measurement

    rng = random.Random(0)
    a = torch.randn(64, 64)
    data, step = [], []
    for i in range(20):
        t0 = time.perf_counter()
        time.sleep(0.004 if i % 5 < 3 else 0.0)
        t1 = time.perf_counter()
        torch.mm(a, a)
        time.sleep(rng.uniform(0.0, 0.020))
        data.append(t1 - t0)
        step.append(time.perf_counter() - t1)
    m = Measurement(samples_s=tuple(step))
    row = {"workload": "train_step", "data_time_samples_s": data, "data_time_s": Measurement(samples_s=tuple(data)).median_s,
           **m.as_row("step_time")}
    assert row["noisy"], row["step_time_iqr_s"] / row["step_time_s"]
    folder = record_as([row], tmp_path / "noisy", notebook="train_step.ipynb", params={"batch_size": 8},
                       config_id="train_step-noisy")
    findings = advise_json(folder)
    assert [f["rule"] for f in findings] == ["noisy"], findings
    assert findings[0]["evidence"]["noisy_rows"] == 1 and "rerun" in findings[0]["advice"]
    # The input rule alone: its finding is withheld (not robust on noisy rows), not only outranked.
    assert advise_json(folder, "--rule", "input_bound") == []


@pytest.mark.parametrize("args, says", [
    (["advise", "{missing}"], "does not exist"),
    (["advise", "{empty}"], "no results under"),
    (["advise", "{failed}"], "no ok rows to advise on"),
    (["advise", "{empty}", "--rule", "bubbles"], "unknown advice rule 'bubbles'"),
    (["advise"], "give a results folder"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, says):
    (tmp_path / "empty").mkdir()
    record_as([{"workload": "gemm"}], tmp_path / "failed", notebook="gemm.ipynb", params={"sizes": [16]},
              config_id="gemm-failed", status="failed", reason="RuntimeError: it broke")
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "failed": tmp_path / "failed"}
    code = main([a.format(**paths) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow  # a perfkit process with a package of rules on its path
def test_a_package_adds_its_own_rule_by_entry_point(gemm_folder, tmp_path):
    # An installed package, as pip leaves one: a module and its dist-info with entry_points.txt.
    site = tmp_path / "site"
    (site / "teamrules-1.0.dist-info").mkdir(parents=True)
    (site / "teamrules-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: teamrules\nVersion: 1.0\n")
    (site / "teamrules-1.0.dist-info" / "entry_points.txt").write_text(
        "[perfkit.advice_rules]\nsmall = teamrules:RULES\n")
    (site / "teamrules.py").write_text('''
from perfkit.analyse.advice import Finding, Rule

def _check(ok, rule):
    for _, row in ok[ok["m"] < rule.threshold].iterrows():
        yield Finding(rule=rule.name, constraint=rule.constraint, point="gemm", config_ids=(row["config_id"],),
                      cost_share=0.5, evidence={"m": int(row["m"])}, summary="a size our kernels never see",
                      advice="measure m >= 64", source=rule.source, robust=True)  # a size, not a timing

RULES = [Rule("team_min_size", "unrepresentative size", 64, "our team's kernel sizes", _check)]
''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    cli = [sys.executable, "-m", "perfkit.cli", "advise"]
    listed = subprocess.run([*cli, "--rules"], capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0 and "team_min_size  (unrepresentative size; threshold 64)" in listed.stdout
    ran = subprocess.run([*cli, str(gemm_folder), "--rule", "team_min_size"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "binding: unrepresentative size" in ran.stdout and "evidence: m=8" in ran.stdout


@pytest.mark.slow  # three kernels: the configuration, then the experiment's two sides
def test_verify_runs_the_advised_worker_count_and_reports_the_measured_verdict(tmp_path):
    # Issue 29: a loader with zero workers, each sample 10 ms of storage latency (a sleep: it
    # overlaps across workers however busy the cores are), 40 ms of compute a step. The advice is
    # 2 workers; --verify runs current against advised, interleaved, and reports compare's verdict.
    # Two workers deliver a batch every ~20 ms, half the 40 ms step, so their queues stay full and
    # the advised step is the compute's ~40 ms against 80 ms. (At 5 ms a sample and 16 ms of compute,
    # 36 vs ~18 ms with ~6 ms of slack a step, one loaded CI run read "inconclusive": the workers'
    # hand-off of each batch waited on cores the suite's other workers kept busy.)
    import yaml

    import perfkit
    from perfkit.analyse.compare import compare_by
    from perfkit.view.advise_followup import speedup

    out = tmp_path / "loader"
    params = {"num_workers": "[0]", "fetch_delay_s": "0.01", "decode_cost_s": "0.0", "batch_size": "4",
              "step_compute_s": "0.04", "steps": "10", "loader_batches": "0", "stall_attribution": "False",
              "device": "cpu", "cache_dir": repr(str(tmp_path / "datasets"))}
    cli = [sys.executable, "-m", "perfkit.cli"]
    ran = subprocess.run([*cli, "run", str(REPO / "notebooks" / "dataloader.ipynb"), "--out", str(out),
                          *[a for k, v in params.items() for a in ("-p", k, v)]], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # The notebook's own last cell says what binds the rows it recorded.
    executed = json.loads(next((out / "notebooks").glob("*.ipynb")).read_text())
    last = executed["cells"][-1]
    assert "advice_for_this_configuration()" in "".join(last["source"])
    shown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in last["outputs"])
    assert "| input-bound |" in shown, last["outputs"]
    before = len(perfkit.load(out))
    spec = tmp_path / "exp.yaml"
    verified = subprocess.run([*cli, "advise", str(out), "--spec", str(spec), "--verify", "--rounds", "2"],
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    written = yaml.safe_load(spec.read_text())
    assert [v["parameters"] for v in written["variants"]] == [{"num_workers": [0]}, {"num_workers": [2]}]
    assert written["parameters"]["fetch_delay_s"] == 0.01 and written["rounds"] == 2
    rows = perfkit.load(out / "advice" / "1")
    assert sorted(zip(rows["variant"], rows["round"])) == [("advised", 1), ("advised", 2), ("current", 1), ("current", 2)]
    assert len(perfkit.load(out)) == before  # the experiment's rows are not the folder's own
    point = compare_by(rows, by="variant", base="current").points.iloc[0]
    x, lo, hi = speedup(point["ratio"], point["ci_low"], point["ci_high"], point["lower_is_better"])
    numbers = {k: point[k] for k in ("verdict", "why", "metric", "median_base", "median_new", "ratio", "ci_low",
                                     "ci_high", "p_holm", "n_base", "n_new")}
    assert point["verdict"] == "faster" and point["metric"] == "step_time_s" and x > 1.3, numbers
    said = f"advised: num_workers 0 -> 2; measured {x:.2f}x as fast (step_time_s, 95 % CI {lo:.2f}-{hi:.2f}x): faster"
    assert said in verified.stdout, verified.stdout
    # The report's Advice section, first in the page, shows the advice and what testing it measured.
    from perfkit.view.report import sections

    title, parts = sections(perfkit.load(out), results_dir=out)[0]
    import html

    assert title.startswith("Advice") and "input-bound" in parts.items[0] and html.escape(said) in parts.items[0]


def test_the_report_opens_with_each_configurations_binding_constraint(gemm_folder):
    import perfkit
    from perfkit.view.report import sections

    shown = sections(perfkit.load(gemm_folder), results_dir=gemm_folder)
    title, parts = shown[0]
    assert title == "Advice: what binds each configuration" and [t for t, _ in shown][1] == "GEMM throughput"
    table = parts.items[0]
    assert "<td>far below the compute ceiling</td>" in table and "perfkit advise --verify" not in table  # no setting to test


def test_verify_says_so_when_no_advice_has_an_experiment(gemm_folder, capsys):
    # The tiny GEMM's advice is a code change (batch, fuse, grow the shapes): no setting to run.
    assert main(["advise", str(gemm_folder), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "binding: far below the compute ceiling" in out and "nothing to verify" in out
    assert not (gemm_folder / "advice").exists()


@pytest.mark.slow  # a launch: the address-space cap needs its own process
def test_a_batch_far_below_the_predicted_oom_edge_is_told_to_grow_judged_on_throughput(tmp_path):
    from dataclasses import replace

    from perfkit.measuring.training import memory_model
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training

    budget = 1 << 30
    # Wide layers: drawing a batch of the default tiny MLP was over 5 % of its 0.2 ms step (input-bound).
    cfg = TrainConfig(model="mlp", model_size={"hidden_features": 1024, "depth": 4}, batch_size=8, steps=4,
                      warmup_steps=1, device="cpu", address_space_headroom_bytes=budget)
    row = run_training(cfg, 120)
    assert row["status"] == "ok", row.get("error")
    # Issue 43: the row's edge is the fake-tensor step's (the mlp is modelled), the analytic one beside it.
    edge, analytic = row["max_batch_size_predicted"], memory_model.predicted_max_batch(cfg, budget)
    assert row["max_batch_size_predicted_source"] == "fake-tensor step"
    assert (edge, row["max_batch_size_predicted_analytic"]) == (row["max_batch_size_predicted_fake"], analytic)
    assert analytic == pytest.approx(edge, rel=0.10) and row["memory_budget_bytes"] == budget and edge >= 16
    folder = record_as([row], tmp_path / "small-batch", notebook="train_step.ipynb", config_id="train_step-small",
                       params={"model": "mlp", "batch_size": 8})
    # The rule alone: on a loaded host (4 test workers on 2 cores) this tiny step's batch draw has
    # waited 7.4 ms of a 60 ms step, and the input rule then ranked first, rightly, for that run.
    f = top(advise_json(folder, "--rule", "memory_headroom"))
    assert f["rule"] == "memory_headroom" and f["evidence"]["max_batch_size_predicted"] == edge, f
    assert f["evidence"]["max_batch_size_predicted_source"] == "fake-tensor step" and "fake-tensor step" in f["summary"]
    e = f["experiment"]
    assert (e["parameter"], e["current"], e["proposed"], e["metric"]) == ("batch_size", 8, min(edge, 32), "samples_per_s")
    evidence_is_in_rows(f, folder)
    # No budget on a CPU without the cap (RAM is every process's): no edge, so no such advice.
    assert memory_model.memory_budget(replace(cfg, address_space_headroom_bytes=None), "cpu")[0] is None


def test_the_headroom_advice_on_the_h200_rows_takes_the_fake_tensor_edge_and_names_it():
    import math

    from perfkit.analyse.advice import advise
    from perfkit.core.results import load
    from perfkit.measuring.training.memory_edge import chosen_edge

    folder = REFERENCE / "gpu-h200"
    if not folder.exists():
        pytest.skip(f"{folder} is absent (the shared H200 reference data)")
    probe = json.loads((folder / "probes" / "oom_edge_isolated.json").read_text())
    rows = load(folder)
    bf16 = (rows["model"] == "transformer") & (rows["precision"] == "bf16") & (rows["batch_size"] == 128)
    rows = rows[bf16].copy()
    assert len(rows) == 1 and int(rows["max_batch_size_predicted"].iloc[0]) == 2864  # as recorded: analytic
    # The row as it is written now: both predictions (the search's, same model and budget) and the chosen one.
    edge, source = chosen_edge(probe["max_batch_size_predicted_fake"], probe["max_batch_size_predicted"])
    rows = rows.assign(max_batch_size_predicted=edge, max_batch_size_predicted_source=source,
                       max_batch_size_predicted_analytic=float(probe["max_batch_size_predicted"]),
                       memory_budget_bytes=float(probe["memory_budget_bytes"]))
    rule = next(r for r in RULES if r.name == "memory_headroom")
    (found,) = [f for f in advise(rows, [rule]) if f.rule == "memory_headroom"]
    assert found.evidence["max_batch_size_predicted"] == 1920 == probe["max_batch_size"]  # the measured edge
    assert found.evidence["max_batch_size_predicted_source"] == "fake-tensor step"
    assert found.evidence["max_batch_size_predicted_analytic"] == 2816
    assert "(1920, by the fake-tensor step" in found.summary and found.experiment.proposed == 512
    # A row written before the fake edge existed is named as what it is.
    old = advise(rows.drop(columns=["max_batch_size_predicted_source"]), [rule])[0]
    assert "by the analytic model" in old.summary and not math.isnan(old.evidence["max_batch_size_predicted"])


def test_advise_on_the_h200_folder_names_what_a_performance_engineer_would(capsys):
    # Issue 44, on the first real GPU folder (../shared/reference/gpu-h200/, rows read in place).
    folder = REFERENCE / "gpu-h200"
    if not (folder / "results").exists():
        pytest.skip(f"{folder} is absent (the shared H200 reference data)")
    findings = advise_json(folder)
    by_point: dict[str, list[dict]] = {}
    for f in findings:
        by_point.setdefault(f["point"], []).append(f)
    # 1. The decode of hf:llama, 0.65 % of its HBM roof at batch 1: launch/host-bound, first.
    (inference,) = [p for p in by_point if p.startswith("inference")]
    top_inference = by_point[inference][0]
    assert top_inference["rule"] == "launch_bound_generation", by_point[inference]
    assert top_inference["evidence"]["decode_percent_of_roof"] == pytest.approx(0.6526, abs=1e-3)
    assert top_inference["experiment"]["parameter"] == "compile"
    assert top_inference["experiment"]["also"] == {"compile_mode": "reduce-overhead"}
    # 2. No configuration is input-bound: its data time is perfkit's own synthetic batch.
    assert not [f for f in findings if f["rule"] == "input_bound"]
    # 3. Every roof named is the row's own device's, with its origin.
    for f in findings:
        if f["rule"] == "gemm_below_ceiling":
            origin = f["evidence"]["ceiling_origin"]
            assert origin.startswith("NVIDIA H200's ") and ("(measured:" in origin or "(spec:" in origin), origin
            if "bf16" in origin:  # the folder measured a bf16 roof: measured, not the spec sheet's 989.4
                assert "(measured:" in origin and f["evidence"]["ceiling_flop_per_s"] < 800e12
    # 4. The fp8 rows are told why fp8 is slower than a higher precision.
    fp8 = [f for f in findings if f["rule"] == "precision_slower"]
    assert {f["evidence"]["precision"] for f in fp8} == {"fp8"} and len(fp8) == 2
    assert all("eager" in f["summary"] and f["evidence"]["slower_by"] > 3 for f in fp8)
    # 5. Memory headroom: a note, never binding, after every time cost of its point, said once in the text.
    headroom = [f for f in findings if f["rule"] == "memory_headroom"]
    assert headroom and all(f["note"] for f in headroom)
    for f in headroom:
        costs = [g["rank"] for g in by_point[f["point"]] if g["cost_share"] is not None]  # time costs
        assert all(rank < f["rank"] for rank in costs)
    capsys.readouterr()  # advise_json's output
    assert main(["advise", str(folder)]) == 0
    text = capsys.readouterr().out
    assert text.count("memory headroom") == 1 and "note (not a time cost): memory headroom in 10 configurations" in text
    assert "binding: memory headroom" not in text


def test_a_noisy_inference_row_names_its_metric_and_its_row(tmp_path):
    # Issue 47 item 11: an inference folder's noisy finding said metric=None (a TPOT that was noisy
    # was not among the metrics looked at) and not which row.
    rows = [{"workload": "inference", "batch_size": b, "ttft_s": 0.02, "ttft_iqr_s": 0.0002, "tpot_s": 0.01,
             "tpot_iqr_s": iqr, "noisy": iqr > 0.001} for b, iqr in ((1, 0.0001), (4, 0.004))]
    folder = record_as(rows, tmp_path / "inference", notebook="inference.ipynb", params={"batch_sizes": [1, 4]},
                       config_id="inference-noisy")
    (f,) = advise_json(folder, "--rule", "noisy")
    assert (f["evidence"]["metric"], f["evidence"]["row"]) == ("tpot_s", "batch_size=4"), f["evidence"]
    assert "tpot_s of the batch_size=4 row IQR 40%" in f["summary"]


@pytest.mark.slow  # the notebook's value check builds hf:llama's config (transformers' import)
def test_the_launch_bound_experiment_expands_against_the_inference_notebook(tmp_path):
    # Issue 44 item 1: --verify runs the experiment, so its spec must be one the notebook takes.
    import yaml

    from perfkit.analyse.advice import Experiment, Finding
    from perfkit.run.sweep.spec import expand, load_spec
    from perfkit.view.advise_followup import spec_for

    (tmp_path / "notebooks").mkdir()
    params = {"model": "hf:llama", "batch_sizes": [1, 8], "precision": "bf16", "device": "cuda"}
    (tmp_path / "notebooks" / "inf.ipynb").write_text(json.dumps(
        {"metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "inference.ipynb"), "parameters": params}}}))
    finding = Finding(rule="launch_bound_generation", constraint="launch/host-bound generation", point="inference",
                      config_ids=("inf",), cost_share=0.99, evidence={}, summary="", advice="",
                      experiment=Experiment(notebook="inference.ipynb", parameter="compile", current=False,
                                            proposed=True, also={"compile_mode": "reduce-overhead"}, metric="tpot_s"))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_for(finding, tmp_path, rounds=2)))
    configs = expand(load_spec(path))
    advised = [c.params for c in configs if c.params.get("compile")]
    assert advised and all(p["compile_mode"] == "reduce-overhead" and p["model"] == "hf:llama" for p in advised)
    assert any(not c.params.get("compile") for c in configs)
