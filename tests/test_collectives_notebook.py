"""The collectives notebook through perfkit's executor on real gloo ranks, its plots on recorded
and on synthetic rows, and the collectives sweep template."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

import perfkit
from conftest import NOTEBOOKS, REPO
from perfkit.analyse.commfit import fit_alpha_beta
from perfkit.run.execute import execute_config
from perfkit.run.notebooks import read_notebook
from perfkit.view.plots.collectives import busbw_vs_size, knob_comparison, knobs_label

NOTEBOOK = NOTEBOOKS / "collectives.ipynb"
SPEC = REPO / "templates" / "collectives.yaml"
# Tiny: the point is the plumbing (launch, record, skip, plots), not bandwidth, on 2 shared cores.
TINY = {"ops": ["all_reduce", "all_gather"], "min_bytes": 256, "max_bytes": 4096, "factor": 4,
        "warmup_iters": 1, "iters": 3, "timeout_s": 120.0}


def _execute(tmp_path, name, **params):
    outcome = execute_config(NOTEBOOK, params, config_id=name,
                             output_notebook=tmp_path / "notebooks" / f"{name}.ipynb",
                             results_path=tmp_path / "results" / f"{name}.parquet", timeout_s=300)
    return outcome, perfkit.load(outcome.results_path)


def _hv():
    from perfkit.view.plots import hv_bokeh

    return hv_bokeh()


def _fit_curves(overlay):
    """The dashed α-β curves of a busbw_vs_size overlay."""
    hv = _hv()
    return [e for e in overlay if isinstance(e, hv.Curve)
            and hv.Store.lookup_options("bokeh", e, "style").kwargs.get("line_dash") == "dashed"]


# ------------------------------------------------------------------ the notebook, for real


@pytest.mark.slow
def test_notebook_records_correct_collective_rows_and_its_plots_build(tmp_path):
    outcome, df = _execute(tmp_path, "coll-gloo", **TINY, knobs={"GLOO_SOCKET_IFNAME": "lo"}, knob_check_pass="off")
    assert outcome.status == "ok", (outcome.error_name, outcome.message)
    assert set(df["status"]) == {"ok"}
    assert (df["workload"] == "collectives").all()
    assert set(zip(df["op"], df["inplace"])) == {("all_reduce", True), ("all_gather", False), ("all_gather", True)}
    assert len(df) == 3 * 3  # sizes 256, 1024, 4096
    assert (df["wrong_elements"] == 0).all()
    assert (df["busbw_bytes_per_s"] > 0).all() and (df["algbw_bytes_per_s"] > 0).all()
    assert (df["backend"] == "gloo").all() and (df["world_size"] == 2).all()  # "auto" → gloo on CPU
    assert set(df["knobs"]) == {json.dumps({"GLOO_SOCKET_IFNAME": "lo"})}
    assert (df["knob_check"] == "not_verifiable").all()  # gloo: nothing to check, whatever the pass
    assert (df["knob_check_pass"] == "off").all()  # the row's own value: the parameter reached the config
    assert (df["time_s"] > 0).all() and (df["time_max_over_ranks_s"] >= df["time_s"]).all()
    assert (df["config_id"] == "coll-gloo").all() and df["env_fingerprint_id"].notna().all()

    hv = _hv()
    overlay = busbw_vs_size(df)
    assert isinstance(overlay, hv.Overlay)
    fits = fit_alpha_beta(df)
    assert len(fits) == 3  # one α-β fit per configuration; drawn only where α and β are resolved
    assert len(_fit_curves(overlay)) == (fits["fit_ok"] & fits["alpha_resolved"] & fits["beta_resolved"]).sum()
    hv.render(overlay, backend="bokeh")
    bars = knob_comparison(df)  # one knob setting: one bar per configuration
    assert isinstance(bars, hv.Bars) and len(bars.data) == 3
    assert set(bars.data["setting"]) == {"GLOO_SOCKET_IFNAME=lo"}
    hv.render(bars, backend="bokeh")
    executed = (tmp_path / "notebooks" / "coll-gloo.ipynb").read_text()
    assert "alpha_s" in executed  # the fitted α/β table was shown


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="nccl can run here")
def test_nccl_on_cpu_ends_skipped_with_a_reason(tmp_path):
    outcome, df = _execute(tmp_path, "coll-nccl", **TINY, backend="nccl", knobs={"NCCL_ALGO": "Ring"})
    assert outcome.status == "skipped"
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "skipped" and row["workload"] == "collectives" and row["backend"] == "nccl"
    assert "nccl" in row["reason"] and "GPU" in row["reason"]


@pytest.mark.slow
def test_a_launch_that_times_out_records_timeout(tmp_path):
    # A deadline torchrun cannot meet: run_collectives raises ExecutionFailed(status="timeout").
    outcome, df = _execute(tmp_path, "coll-timeout", **{**TINY, "timeout_s": 0.5})
    assert outcome.status == "timeout"  # the launch's status, not a generic failure
    timeout = df[df["status"] == "timeout"]
    assert len(timeout) == 1 and timeout["workload"].iloc[0] == "collectives"
    assert "no result within 0.5 s" in timeout["reason"].iloc[0]
    assert set(df["status"]) == {"timeout"}  # no extra "failed" row from the executor


# ------------------------------------------------------------------ plots on synthetic rows


def _synthetic(alpha_s, beta, knobs, *, op="all_reduce", backend="gloo", noisy_every=3,
               device_name="Some CPU"):
    """Rows of one configuration on exact t = α + S/β, two ranks (busbw factor 1 for all_reduce)."""
    rows = []
    for i, s in enumerate([1 << k for k in range(10, 22, 2)]):
        t = alpha_s + s / beta
        rows.append({"op": op, "inplace": True, "size_bytes": s, "dtype": "float32", "world_size": 2,
                     "backend": backend, "device": "cpu", "time_s": t, "algbw_bytes_per_s": s / t,
                     "busbw_bytes_per_s": s / t, "noisy": i % noisy_every == 0, "wrong_elements": 0,
                     "knobs": json.dumps(knobs, sort_keys=True), "knob_check": "not_verifiable",
                     "status": "ok", "workload": "collectives", "env_device_name": device_name})
    return rows


def test_busbw_plot_overlays_each_fit_and_ignores_rows_that_are_not_ok():
    hv = _hv()
    rows = _synthetic(20e-6, 2e9, {}) + _synthetic(50e-6, 1e9, {"GLOO_SOCKET_IFNAME": "lo"})
    rows += [{"status": "failed", "reason": "boom", "workload": "collectives"},
             {**rows[0], "status": "timeout", "busbw_bytes_per_s": 1e15}]
    df = pd.DataFrame(rows)
    overlay = busbw_vs_size(df)
    fits = _fit_curves(overlay)
    assert len(fits) == 2
    # The fit recovers the model: at 1 MiB its busbw is S/(α + S/β).
    top = max(fits, key=lambda c: c.data["busbw"].max())
    assert top.data["busbw"].iloc[-1] == pytest.approx((1 << 20) / (20e-6 + (1 << 20) / 2e9) / 1e9, rel=1e-3)
    scatters = [e for e in overlay if isinstance(e, hv.Scatter)]
    assert sum(len(s.data) for s in scatters) == 12  # the failed and timeout rows are not drawn
    assert all(s.data["noisy"].dtype == bool for s in scatters)
    assert "GB/s" in hv.render(overlay, backend="bokeh").yaxis[0].axis_label
    assert not any(isinstance(e, hv.HLine) for e in overlay)  # no known link for a CPU


def test_busbw_plot_draws_a_known_spec_link_for_nccl_and_can_leave_out_the_fit():
    hv = _hv()
    df = pd.DataFrame(_synthetic(10e-6, 100e9, {"NCCL_ALGO": "Ring"}, backend="nccl",
                                 device_name="NVIDIA H100 80GB HBM3"))
    overlay = busbw_vs_size(df)
    links = [e for e in overlay if isinstance(e, hv.HLine)]
    assert len(links) == 1 and links[0].data == pytest.approx(450.0)  # GB/s, spec_link of H100
    hv.render(overlay, backend="bokeh")
    no_fit = busbw_vs_size(df, fits=fit_alpha_beta(df).iloc[0:0])
    assert _fit_curves(no_fit) == []


def test_knob_comparison_gives_peak_busbw_per_setting_and_ratio_to_defaults():
    hv = _hv()
    df = pd.DataFrame(_synthetic(20e-6, 2e9, {}) + _synthetic(20e-6, 1e9, {"GLOO_SOCKET_IFNAME": "lo"})
                      + _synthetic(20e-6, 4e9, {}, op="broadcast"))
    bars = knob_comparison(df)
    data = bars.data.set_index(["configuration", "setting"])
    assert len(data) == 3
    slow = data.loc[("all_reduce in-place gloo×2", "GLOO_SOCKET_IFNAME=lo")]
    fast = data.loc[("all_reduce in-place gloo×2", "defaults")]
    s = 1 << 20  # the peak is at the largest size
    ratio = (20e-6 + s / 2e9) / (20e-6 + s / 1e9)
    assert slow["busbw"] / fast["busbw"] == pytest.approx(ratio)
    assert slow["vs_ref"] == f"{ratio:.2f}× defaults"
    assert data.loc[("broadcast in-place gloo×2", "defaults"), "vs_ref"].startswith("1.00×")
    hv.render(bars, backend="bokeh")


def test_plots_say_so_when_there_is_nothing_to_draw():
    hv = _hv()
    df = pd.DataFrame([{"status": "skipped", "reason": "no GPU", "workload": "collectives"}])
    assert isinstance(busbw_vs_size(df), hv.Div) and isinstance(knob_comparison(df), hv.Div)


def test_knobs_label():
    assert knobs_label("{}") == "defaults"
    assert knobs_label('{"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}') == "NCCL_ALGO=Ring, NCCL_PROTO=LL"


# ------------------------------------------------------------------ the notebook file and the spec


def test_notebook_is_committed_clean_with_a_plain_parameters_cell():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    params = read_notebook(NOTEBOOK).parameters
    assert {"ops", "min_bytes", "max_bytes", "factor", "dtype", "inplace", "backend", "world_size",
            "warmup_iters", "iters", "knobs", "knob_check_pass", "timeout_s"} <= set(params)
    assert all(p.literal for p in params.values())
    assert all("=" not in p.comment for p in params.values())  # papermill's parser breaks on it
    assert params["backend"].default == "auto" and params["world_size"].default == 2
    assert params["max_bytes"].default <= 1 << 20 and params["knobs"].default == {}
    assert params["knob_check_pass"].default == "separate"


def test_sweep_template_validates_in_a_dry_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(SPEC), "--out",
                          str(tmp_path / "sweep"), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("collectives-")]
    assert len(lines) == 3
    assert sum('backend="nccl"' in ln for ln in lines) == 1
    assert sum('backend="gloo"' in ln for ln in lines) == 2
    assert not (tmp_path / "sweep" / "results").exists()
