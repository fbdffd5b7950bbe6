"""The training-step notebook through ``perfkit run`` (real papermill kernels), its plots on the
recorded and on synthetic rows, the notebook file, and the sweep template."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

import perfkit
from conftest import NOTEBOOKS, REPO
from perfkit.run.notebooks import read_notebook
from perfkit.view.plots._common import Legend
from perfkit.view.plots.training import (
    activations_vs_batch,
    memory_vs_batch,
    mfu_vs_batch,
    throughput_vs_batch,
    training_section,
    training_summary,
)

NOTEBOOK = NOTEBOOKS / "train_step.ipynb"
SPEC = REPO / "templates" / "train_step.yaml"
METRICS = ("step_time_s", "step_time_iqr_s", "step_time_samples_s", "samples_per_s", "tokens_per_s",
           "peak_mem_bytes", "mfu", "mfu_convention", "counted_flop_utilisation", "loss_first",
           "loss_last")


def _run(tmp_path, *params):
    args = [a for name, value in params for a in ("-p", name, value)]
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(NOTEBOOK), "--out",
                          str(tmp_path), "--timeout-s", "240", *args],
                         capture_output=True, text=True, timeout=300)
    return out, perfkit.load(tmp_path)


def _hv():
    from perfkit.view.plots import hv_bokeh

    return hv_bokeh()


@pytest.mark.slow
def test_notebook_records_an_ok_row_with_the_metrics_and_its_plots_build(tmp_path):
    out, df = _run(tmp_path, ("steps", "3"), ("batch_size", "4"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "ok" and row["workload"] == "train_step"
    assert set(METRICS) <= set(df.columns)
    assert len(row["step_time_samples_s"]) == 2  # 3 steps, 1 warm-up
    assert row["samples_per_s"] == pytest.approx(4 / row["step_time_s"])
    assert row["tokens_per_s"] == pytest.approx(4 * 16 / row["step_time_s"])
    assert math.isfinite(row["loss_first"]) and row["loss_last"] < row["loss_first"]
    if torch.cuda.is_available():
        assert row["mfu_convention"].startswith("PaLM 6N+12LHQT per token")
    else:  # the CPU theoretical fp32 peak
        assert 0 < row["mfu"] < 1 and 0 < row["counted_flop_utilisation"] < 1
        assert "CPU theoretical fp32 peak" in row["mfu_convention"]
    assert row["config_id"] and row["env_fingerprint_id"]
    hv = _hv()
    # The saved activations, measured on the warm-up step, are what the memory model predicts.
    assert row["activation_bytes_measured"] == pytest.approx(row["activation_bytes_predicted"], rel=0.01)
    for plot in (throughput_vs_batch(df), memory_vs_batch(df), mfu_vs_batch(df), activations_vs_batch(df)):
        assert isinstance(plot, hv.Overlay)
        hv.render(plot, backend="bokeh")
    hv.render(training_summary(df), backend="bokeh")
    executed = (tmp_path / "notebooks").glob("*.ipynb").__next__().read_text()
    assert "mfu_convention" in executed  # the metrics table was shown


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="tf32 can run here")
def test_tf32_on_cpu_ends_skipped_with_the_reason(tmp_path):
    out, df = _run(tmp_path, ("precision", "tf32"), ("device", "cpu"))
    assert out.returncode == 0, out.stdout + out.stderr  # skipped is not a failure
    assert out.stdout.startswith("skipped")
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "skipped" and row["workload"] == "train_step"
    assert "tf32" in row["reason"] and row["precision"] == "tf32"


# ------------------------------------------------------------------ plots on synthetic rows


def _synthetic():
    rows = []
    for precision in ("fp32", "bf16"):
        for parallelism, world_size in (("none", 1), ("ddp", 2)):
            for batch in (4, 8, 16):
                known = precision == "fp32"
                rows.append({
                    "workload": "train_step", "status": "ok", "model": "transformer",
                    "batch_size": batch, "precision": precision, "parallelism": parallelism,
                    "world_size": world_size, "samples_per_s": 100.0 * batch * world_size,
                    "step_time_s": 0.01, "step_time_iqr_s": 0.002 if batch == 8 else 0.0001,
                    "noisy": batch == 8, "peak_mem_bytes": 1e8 + 1e6 * batch,
                    "peak_mem_kind": "cpu_max_rss",
                    "mfu": 0.001 * batch if known else math.nan,
                    "counted_flop_utilisation": 0.0011 * batch if known else math.nan,
                    "mfu_convention": "PaLM 6N+12LHQT per token; peak = ...",
                    "mfu_reason": None if known else "no theoretical bf16 peak for this CPU",
                    "activation_bytes_predicted": 2e5 * batch,
                    # Measured where the hooks ran (not under ddp×2 bf16 here: NaN, a reason).
                    "activation_bytes_measured": 2.1e5 * batch if known or parallelism == "none" else math.nan})
    rows.append({**rows[2], "batch_size": 32, "status": "oom", "samples_per_s": None,
                 "error": "RuntimeError: DefaultCPUAllocator: can't allocate memory"})
    rows.append({"workload": "train_step", "status": "skipped", "batch_size": 4,
                 "precision": "tf32", "parallelism": "none", "world_size": 1, "error": "tf32"})
    rows.append({"workload": "gemm", "status": "ok", "batch_size": 4, "samples_per_s": 1e9})
    return pd.DataFrame(rows)


def test_a_model_size_that_varies_is_its_own_line():
    # make demo's pipeline rows at d_model 256 and at the default size drew as one "pp×2" line.
    hv = _hv()
    base = _synthetic()
    rows = base[(base["status"] == "ok") & (base["precision"] == "fp32") & (base["parallelism"] == "ddp")]
    sized = pd.concat([rows.assign(model_size='{"n_layers": 4}'),
                       rows.assign(model_size='{"n_layers": 4, "d_model": 256}', samples_per_s=50.0)])
    overlay = throughput_vs_batch(sized)
    points = [e for e in overlay if isinstance(e, hv.Scatter)]
    # Only what varies names a line (issue 55), the size left at its default said so.
    assert sorted(Legend.shown(overlay, p) for p in points) == ["fp32 d_model=256", "fp32 d_model=default"]
    assert [len(p.data) for p in points] == [3, 3]
    same = throughput_vs_batch(rows.assign(model_size=None))  # one size (the default): no size in the label
    assert [Legend.shown(same, p) for p in same if isinstance(p, hv.Scatter)] == ["fp32"]


def test_throughput_plot_has_a_line_per_precision_and_parallelism_and_marks_the_oom():
    hv = _hv()
    overlay = throughput_vs_batch(_synthetic())
    scatters = [e for e in overlay if isinstance(e, hv.Scatter)]
    points = [s for s in scatters if s.label != "out of memory"]
    assert sorted(Legend.shown(overlay, s) for s in points) == ["bf16 ddp×2", "bf16 none×1", "fp32 ddp×2",
                                                                "fp32 none×1"]
    assert sum(len(s.data) for s in points) == 12  # the oom, skipped and gemm rows: not drawn
    assert all(s.data["noisy"].dtype == bool for s in points)
    (oom,) = [s for s in scatters if s.label == "out of memory"]
    assert list(oom.data["batch_size"]) == [32]
    # Drawn at the height of its series' best throughput (fp32 none: 1600 samples/s → 1.6 k).
    assert oom.data["series"].iloc[0] == "fp32 none×1"
    assert oom.data["throughput"].iloc[0] == pytest.approx(1.6)
    fig = hv.render(overlay, backend="bokeh")
    assert "ksamples/s" in fig.yaxis[0].axis_label
    # The legend a reader sees names each series (elements carry short labels: Legend), a line
    # and its points under one entry that hides both.
    items = {item.label.value: len(item.renderers) for item in fig.legend[0].items}
    assert items == {"bf16 ddp×2": 2, "bf16 none×1": 2, "fp32 ddp×2": 2, "fp32 none×1": 2, "out of memory": 1}


def test_mfu_plot_shows_counted_utilisation_beside_and_says_why_when_unknown():
    hv = _hv()
    df = _synthetic()
    overlay = mfu_vs_batch(df)
    labels = {Legend.shown(overlay, e) for e in overlay}
    assert labels == {"fp32 ddp×2 MFU", "fp32 none×1 MFU", "fp32 ddp×2 counted",
                      "fp32 none×1 counted"}  # bf16 has no known peak on this CPU
    hv.render(overlay, backend="bokeh")
    unknown = mfu_vs_batch(df[df["precision"] != "fp32"])
    assert isinstance(unknown, hv.Div) and "no theoretical bf16 peak" in unknown.data
    memory = memory_vs_batch(df)
    assert "MB" in hv.render(memory, backend="bokeh").yaxis[0].axis_label


def test_a_plot_of_many_series_keeps_its_legend():
    """holoviews drops an overlay's legend past 25 glyphs (``legend_limit``): the quickstart's MFU
    and saved-activation plots (28 and 30) showed their lines with no names at all."""
    hv = _hv()
    base = _synthetic()
    rows = base[(base["status"] == "ok") & (base["precision"] == "fp32")]
    many = pd.concat([rows.assign(model_size=json.dumps({"n_layers": k})) for k in range(1, 5)])
    for plot, entries in ((mfu_vs_batch, 16), (activations_vs_batch, 16)):
        fig = hv.render(plot(many), backend="bokeh")
        assert len(fig.renderers) > 25 and fig.legend and len(fig.legend[0].items) == entries, plot.__name__


def test_activation_plot_draws_measured_where_measured_beside_every_prediction():
    hv = _hv()
    overlay = activations_vs_batch(_synthetic())
    curves = {Legend.shown(overlay, e): e for e in overlay if isinstance(e, hv.Curve)}
    assert set(curves) == {f"{p} {s}×{w} predicted" for p in ("fp32", "bf16") for s, w in (("none", 1), ("ddp", 2))} \
        | {"fp32 none×1 measured", "fp32 ddp×2 measured", "bf16 none×1 measured"}
    measured = curves["fp32 none×1 measured"].dframe()
    assert measured["batch_size"].tolist() == [4, 8, 16]  # the oom row is not drawn
    assert measured["measured"].tolist() == pytest.approx([0.84, 1.68, 3.36])  # MB
    assert "MB" in hv.render(overlay, backend="bokeh").yaxis[0].axis_label


def test_report_section_builds_from_all_rows_and_plots_say_when_empty():
    hv = _hv()
    df = _synthetic()
    ok = df[(df["workload"] == "train_step") & (df["status"] == "ok")]
    layout = training_section(ok, df)
    assert isinstance(layout, hv.Layout) and len(layout) == 4
    hv.render(layout, backend="bokeh")
    nothing = pd.DataFrame([{"workload": "train_step", "status": "skipped", "batch_size": 4}])
    assert all(isinstance(f(nothing), hv.Div)
               for f in (throughput_vs_batch, memory_vs_batch, mfu_vs_batch, activations_vs_batch))


# ------------------------------------------------------------------ the notebook file and the spec


def test_notebook_is_committed_clean_with_a_plain_parameters_cell():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    params = read_notebook(NOTEBOOK).parameters
    assert {"model", "model_size", "batch_size", "seq_len", "precision", "compile", "compile_mode",
            "activation_checkpointing", "parallelism", "world_size", "bucket_cap_mb",
            "gradient_as_bucket_view", "static_graph", "comm_hook", "reshard_after_forward",
            "fsdp_param_dtype", "fsdp_reduce_dtype", "steps", "warmup_steps", "device",
            "timeout_s"} <= set(params)
    assert all(p.literal for p in params.values())
    assert all("=" not in p.comment for p in params.values())  # papermill's parser breaks on it
    assert params["parallelism"].default == "none" and params["world_size"].default == 1
    # Small defaults that still time what perfkit compare needs a side (issue 47: 3 timed steps
    # could only read "inconclusive"): 5 timed steps of a tiny model.
    from perfkit.analyse.ab_stats import MIN_SAMPLES

    timed = params["steps"].default - params["warmup_steps"].default
    assert params["batch_size"].default <= 8 and params["steps"].default <= 6 and timed == MIN_SAMPLES


def test_sweep_template_validates_in_a_dry_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(SPEC), "--out",
                          str(tmp_path / "sweep"), "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("train_step-")]
    assert len(lines) == 18  # batch 3 × precision 3 × (none on 1 rank, ddp on 2)
    assert sum('parallelism="ddp" world_size=2' in ln for ln in lines) == 9
    assert sum('parallelism="none" world_size=1' in ln for ln in lines) == 9
    assert sum('precision="tf32"' in ln for ln in lines) == 6


@pytest.mark.slow
def test_pipeline_parallelism_runs_through_the_notebook(tmp_path):
    out, df = _run(tmp_path, ("parallelism", "pp"), ("world_size", "2"), ("steps", "4"),
                   ("model_size", '{"n_layers": 4}'), ("n_microbatches", "2"), ("pp_schedule", "GPipe"))
    assert out.returncode == 0, out.stdout + out.stderr
    row = df.iloc[0]
    assert row["status"] == "ok" and row["parallelism"] == "pp" and row["pp_schedule"] == "GPipe"
    assert 0 <= row["bubble_fraction"] < 1 and len(row["bubble_fraction_samples"]) == 3
    assert row["bubble_fraction_predicted"] == pytest.approx(1 / 3)  # (p−1)/(m+p−1), p = m = 2
    assert row["param_bytes"] == row["param_bytes_predicted"] and len(row["peak_mem_bytes_per_rank"]) == 2


@pytest.mark.slow  # `perfkit sweep --dry-run` in a process of its own, every configuration validated: 2.5-3 s
@pytest.mark.parametrize("template, n, pp", [("parallelism.yaml", 18, 3), ("pipeline.yaml", 10, 10)])
def test_parallelism_templates_validate_in_a_dry_run(tmp_path, template, n, pp):
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(REPO / "templates" / template),
                          "--out", str(tmp_path / "sweep"), "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("train_step-")]
    assert len(lines) == n and sum('parallelism="pp"' in ln for ln in lines) == pp


def test_every_training_plot_keeps_its_first_and_last_points_inside_the_frame():
    # Issue 55: points at the smallest and largest batch sat on the frame's edge, half cut off.
    hv = _hv()
    df = _synthetic()
    ok = df[(df["workload"] == "train_step") & (df["status"] == "ok")]
    for plot in (throughput_vs_batch(df), memory_vs_batch(df), mfu_vs_batch(df), activations_vs_batch(df)):
        fig = hv.render(plot, backend="bokeh")
        assert fig.x_range.start < ok["batch_size"].min() and fig.x_range.end > ok["batch_size"].max(), fig.title.text
