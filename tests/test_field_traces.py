"""Traces as users have them (issue 54): real H100, MI300X and compiled-Triton traces that perfkit did
not record, held to AMD TraceLens's own reports on them (``../shared/reference/field-traces/``,
read in place; skipped with the reason where absent).

- the GPU timeline per window equals TraceLens's ``gpu_timeline.csv`` (recompute split included);
- no figure is ever negative, and HTA's inward rounding is an option, not the default;
- every unique GEMM, SDPA and convolution shape has TraceLens's FLOP and bytes ("MB" = MiB).
"""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from perfkit.analyse.trace.breakdown import temporal_breakdown
from perfkit.analyse.trace.events import read_trace
from perfkit.analyse.trace.ops import trace_ops
from perfkit.analyse.trace.timeline import TIMELINE_COLUMNS, gpu_timeline, main_window

FIELD = Path(__file__).resolve().parents[2] / "shared" / "reference" / "field-traces" / "tracelens"
#: trace → TraceLens's report folder (the field-traces README lists them).
TRACES = {
    "h100/bert": ("h100/gaunernst_bert-small-uncased__1016001.json.gz", "h100/gaunernst_bert-small-uncased__1016001_perf_report_csvs"),
    "h100/vit": ("h100/Falconsai_nsfw_image_detection__1016002.json.gz", "h100/Falconsai_nsfw_image_detection__1016002_perf_report_csvs"),
    "h100/qwen": ("h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "h100/Qwen_Qwen1.5-0.5B-Chat__1016005_perf_report_csvs"),
    "mi300/bert": ("mi300/gaunernst_bert-small-uncased__1016001.json.gz", "mi300/gaunernst_bert-small-uncased__1016001_perf_report_csvs"),
    "mi300/vit": ("mi300/Falconsai_nsfw_image_detection__1016002.json.gz", "mi300/Falconsai_nsfw_image_detection__1016002_perf_report_csvs"),
    "mi300/qwen": ("mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005_perf_report_csvs"),
    "mi300/resnet-train": ("mi300/resnet_act_checkpoint.json.gz", "mi300/resnet_act_checkpoint_recompute_perf_report_csvs"),
    "mi300/compiled": ("torch_compile_triton/trace.json.gz", "torch_compile_triton/trace_perf_report_csvs"),
}
REL, ABS_US = 0.005, 0.01  # goal 0.5 %; 0.01 µs: the traces' resolution (ns, as 3 decimals of µs)


def _path(name: str, which: int = 0) -> Path:
    path = FIELD / TRACES[name][which]
    if not path.exists():
        pytest.skip(f"field trace {TRACES[name][which]} not under {FIELD} (read in place, never copied)")
    return path


@pytest.fixture(scope="module")
def read():
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = read_trace(_path(name), op_args=True)
        return cache[name]
    return get


def _tracelens_timeline(name: str) -> dict:
    """TraceLens's gpu_timeline.csv as {(recompute?, type): seconds}."""
    rows = csv.DictReader(open(_path(name, 1) / "gpu_timeline.csv"))
    return {(r.get("is_recompute", "False") == "True", r["type"]): float(r["time ms"]) / 1e3 for r in rows}


@pytest.mark.parametrize("name", list(TRACES))
def test_the_gpu_timeline_equals_tracelens_in_its_window(name, read):
    ev = read(name)
    ours = gpu_timeline(ev, link="flow")  # TraceLens ties a kernel to its launch through an ac2g flow
    window, _ = main_window(ev, link="flow")
    theirs = _tracelens_timeline(name)
    split = any(recompute for recompute, _ in theirs)
    for (recompute, kind), seconds in theirs.items():
        kernels = ("recompute" if recompute else "normal") if split else "all"
        row = ours[(ours["window"] == window) & (ours["kernels"] == kernels)]
        assert len(row) == 1, (window, kernels, ours[["window", "kernels"]])
        value = float(row[f"{kind}_s"].iloc[0])
        assert value == pytest.approx(seconds, rel=REL, abs=ABS_US * 1e-6), (name, kind, recompute, value, seconds)


def test_a_step_is_the_gpu_work_its_host_launched_not_the_whole_trace(read):
    # Qwen1.5 on an H100: kernels still running from before profiling began fill 14.8 ms more
    # of the trace; the step's own window is its GPU-side annotation, 34,892.42 µs.
    timeline = gpu_timeline(read("h100/qwen")).set_index("window")
    assert timeline.loc["ProfilerStep#6", "total_time_s"] == pytest.approx(34892.421e-6, abs=1e-8)
    assert timeline.loc["trace", "total_time_s"] == pytest.approx(49652.832e-6, abs=1e-8)
    # ROCm's GPU-side step annotations last microseconds: the launches decide (ResNet, MI300X).
    resnet = gpu_timeline(read("mi300/resnet-train"))
    steps = resnet[resnet["window"].str.startswith("ProfilerStep") & (resnet["kernels"] == "all")]
    assert list(steps["window"]) == ["ProfilerStep#15", "ProfilerStep#16", "ProfilerStep#17"]
    assert (steps["total_time_s"] > 0.018).all()


def test_tying_kernels_by_correlation_keeps_the_memsets_rocm_draws_no_flow_for(read):
    ev = read("mi300/resnet-train")
    by_id, by_flow = (gpu_timeline(ev, link=link).set_index(["window", "kernels"]) for link in ("correlation", "flow"))
    extra = by_id.loc[("steps", "all"), "gpu_events"] - by_flow.loc[("steps", "all"), "gpu_events"]
    assert extra == 81  # hipMemsetAsync's memsets: launched in the steps, no ac2g flow drawn
    assert by_id.loc[("steps", "all"), "computation_time_s"] > by_flow.loc[("steps", "all"), "computation_time_s"]


@pytest.mark.parametrize("name", list(TRACES))
def test_no_figure_is_ever_negative_and_the_parts_add_up(name, read):
    ev = read(name)
    timeline = gpu_timeline(ev)
    values = timeline[list(TIMELINE_COLUMNS)].to_numpy()
    assert (values >= 0).all(), timeline
    parts = timeline[["computation_time_s", "exposed_comm_time_s", "exposed_memcpy_time_s", "idle_time_s"]].sum(axis=1)
    assert np.allclose(parts, timeline["total_time_s"], rtol=0, atol=1e-9)
    temporal = temporal_breakdown([ev]).iloc[0]  # HTA's names, exact times (it read -17 µs on Qwen H100)
    assert min(temporal["idle_time(us)"], temporal["compute_time(us)"], temporal["non_compute_time(us)"]) >= 0


def test_times_are_exact_and_hta_rounding_is_an_option(read):
    # bert-small on an MI300X: 60 kernels of 1-5 µs; HTA's inward rounding loses a sixth of them.
    exact = gpu_timeline(read("mi300/bert")).set_index("window").loc["ProfilerStep#6", "computation_time_s"]
    assert exact == pytest.approx(388.3452e-6, rel=1e-4)
    rounded = temporal_breakdown([read_trace(_path("mi300/bert"), round_to_us=True)])["compute_time(us)"].iloc[0]
    assert rounded == 326 and exact * 1e6 / rounded > 1.18


def _tracelens_shapes(name: str, category: str) -> list[dict]:
    path = _path(name, 1) / f"{category}.csv"
    return list(csv.DictReader(open(path))) if path.exists() else []


@pytest.mark.parametrize("name", list(TRACES))
def test_every_gemm_attention_and_conv_shape_has_tracelens_flop_and_bytes(name, read):
    ev = read(name)
    ops = trace_ops(ev, rows=main_window(ev)[1]).shapes
    checked = 0
    for category in ("GEMM", "SDPA_fwd", "CONV_fwd"):
        for row in _tracelens_shapes(name, category):
            dims = json.dumps(ast.literal_eval(row["Input Dims_first"]))
            mine = ops[(ops["op"] == row["name"]) & (ops["input_dims"] == dims)]
            assert len(mine), (category, row["name"], dims)
            flop, moved = float(mine["flop"].iloc[0]), float(mine["bytes"].iloc[0])
            assert flop == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=0.01), (row["name"], dims)
            assert moved == pytest.approx(float(row["Data Moved (MB)_first"]) * 2**20, rel=0.01), (row["name"], dims)
            checked += 1
    assert checked or name == "mi300/resnet-train" and ops["category"].eq("convolution").any()


def test_each_op_s_kernels_and_the_device_roof(read):
    ev = read("h100/qwen")
    ops = trace_ops(ev, rows=main_window(ev)[1])
    assert ops.roof["model"] == "NVIDIA H100 SXM5" and ops.roof["reason"] is None
    mm = ops.shapes[(ops.shapes["op"] == "aten::mm") & (ops.shapes["input_dims"] == "[[8944, 1024], [1024, 2816]]")].iloc[0]
    # TraceLens: 48 calls, 4,055.25 µs of kernel time (each call's cuBLAS GEMM and its memset).
    assert mm["count"] == 48 and mm["kernel_time_s"] == pytest.approx(4055.2524e-6, rel=1e-4)
    assert mm["roof_bound"] == "compute" and 0 < mm["roof_share"] < 1
    assert mm["roof_share"] == pytest.approx(mm["flop_per_s"] / 989.4e12)  # bf16 dense, H100 SXM5
    cats = ops.categories().set_index("category")
    assert cats["kernel_time_s"].sum() == pytest.approx(ops.gpu_time_s)  # every kernel in one line
    unknown = read_trace(_path("mi300/compiled"), op_args=True)
    unknown.device_properties[0]["name"] = "Some Future GPU"
    blind = trace_ops(unknown)
    assert blind.roof["model"] is None and "not in perfkit's spec-sheet table" in blind.roof["reason"]
    assert blind.shapes["roof_share"].isna().all()  # never another device's numbers
    # torch.compile's Triton kernels are launched by no aten op: listed as unexplained, with time.
    triton = trace_ops(read("mi300/compiled")).unexplained
    assert triton["kernel"].str.startswith("triton_").all() and len(triton) == 4


def test_perfkit_trace_shows_the_windows_and_the_roof_table_and_json_has_every_op(capsys):
    from perfkit.cli import main

    path = _path("mi300/qwen")
    assert main(["trace", str(path), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "GPU timeline" in out and "ProfilerStep#6" in out and " trace " in out
    assert "device: AMD Instinct MI300X VF: AMD Instinct MI300X" in out
    for category in ("GEMM", "attention", "elementwise", "unexplained kernels"):
        assert category in out
    assert "aten::_scaled_dot_product_flash_attention" in out and "Kernels no op model explains" in out
    assert main(["trace", str(path), "--json", "--link", "flow"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"timeline", "op_categories", "ops", "op_shapes", "unexplained_kernels", "temporal"} <= set(doc)
    assert sum(o["kernels"] for o in doc["ops"]) + sum(u["kernels"] for u in doc["unexplained_kernels"]) > 1000
    steps = [t for t in doc["timeline"] if t["window"] == "ProfilerStep#6"][0]
    assert steps["computation_time_s"] == pytest.approx(29.743168e-3, rel=1e-5)  # TraceLens, MI300X
    assert doc["traces"][0]["devices"][0]["model"] == "AMD Instinct MI300X"
    assert main(["trace", str(path), "--json", "--hta-rounding", "--window", "trace"]) == 0
    rounded = json.loads(capsys.readouterr().out)
    assert [t["window"] for t in rounded["timeline"]] == ["trace"]
    with pytest.raises(SystemExit) as bad:
        main(["trace", str(path), "--window", "nope"])
    assert bad.value.code == 2


def test_the_same_model_on_two_vendors_compares_op_by_op_as_tracelens(read, capsys):
    """Qwen1.5 on an H100 (control) and an MI300X (test): no GEMM or attention kernel shares a
    name across vendors, every op does. TraceLens's comparison: busy time −2.16 ms (−6.8 %), and
    per GEMM shape the kernel-time difference."""
    from perfkit.analyse.trace.op_diff import op_diff
    from perfkit.cli import main

    sides = []
    for name in ("h100/qwen", "mi300/qwen"):
        ev = read(name)
        window, rows = main_window(ev)
        timeline = gpu_timeline(ev)
        sides.append((trace_ops(ev, rows=rows), timeline[(timeline["window"] == window) & (timeline["kernels"] == "all")].iloc[0]))
    diff = op_diff(sides[0][0], sides[1][0], control_timeline=sides[0][1], test_timeline=sides[1][1])
    reference = FIELD / "compare_test_e2e" / "reference" / "compare_h100_mi300_qwen_csvs"
    theirs = {r["type"]: float(r["time ms__mi300_diff"]) / 1e3 for r in csv.DictReader(open(reference / "gpu_timeline.csv"))}
    busy = diff.timeline.set_index("figure").loc["busy_time"]
    assert busy["diff_s"] == pytest.approx(theirs["busy_time"], rel=0.005) and busy["relative_change"] == pytest.approx(-0.0677, abs=5e-4)
    for row in csv.DictReader(open(reference / "GEMM_intersect_mi300.csv")):
        dims = json.dumps(ast.literal_eval(row["h100::Input Dims_first"]))
        mine = diff.shapes[(diff.shapes["op"] == row["name"]) & (diff.shapes["input_dims"] == dims)]
        assert len(mine) == 1, (row["name"], dims)
        assert mine["diff_time_s"].iloc[0] == pytest.approx(float(row["Kernel Time (µs)_sum__mi300_diff"]) * 1e-6, rel=0.01)
    attention = diff.shapes[diff.shapes["category"] == "attention"].iloc[0]
    assert attention["op"] == "aten::_scaled_dot_product_flash_attention" and attention["diff_time_s"] > 0
    assert list(diff.only_test["op"]) == ["aten::fill_"] and diff.only_control.empty
    assert main(["trace", "--diff", str(_path("h100/qwen")), str(_path("mi300/qwen")), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "ops compared by name, shapes and dtypes" in out and "−2.16 ms (-6.8 %)" in out
    assert "aten::mm" in out.split("The ops that explain most")[1].splitlines()[2]


def test_advise_from_a_trace_alone_names_the_exposed_rccl_time_of_the_resnet_step(capsys, tmp_path):
    from perfkit.cli import main

    resnet = str(_path("mi300/resnet-train"))
    out_json = tmp_path / "advice.json"
    assert main(["advise", resnet, "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "binding: exposed communication (62.1 % of the step" in text
    assert "67.7 % when the recompute is not counted as computation" in text  # TraceLens's 67.8 % (flow-linked)
    findings = json.loads(out_json.read_text())["findings"]
    assert [f["rule"] for f in findings][:1] == ["trace_exposed_comm"]
    assert {"trace_recompute", "trace_ops_below_roof"} <= {f["rule"] for f in findings}
    comm = findings[0]["evidence"]
    assert comm["exposed_comm_time_s"] / comm["total_time_s"] == pytest.approx(findings[0]["cost_share"])
    # bert-small on an H100: 60 kernels of a few µs in a 3.9 ms step: launch-bound.
    assert main(["advise", str(_path("h100/bert"))]) == 0
    assert "binding: host- or launch-bound (92.1 % of the step" in capsys.readouterr().out
    assert main(["advise", resnet, "--verify"]) == 2
    assert "apply to a results folder" in capsys.readouterr().err


def test_the_trace_roofline_has_a_legend_per_family_and_the_device_roofs():
    import holoviews as hv

    from perfkit.view.trace import TraceSet, analyse_set
    from perfkit.view.trace_report import ops_roofline_parts

    result = analyse_set(TraceSet(label="qwen-mi300x", paths=(_path("mi300/qwen"),)))
    table, plot = ops_roofline_parts([result])
    assert "GEMM" in table and "attention" in table and "of roof" in table
    fig = hv.render(plot, backend="bokeh")
    legend = [item.label["value"] for item in fig.legend[0].items]
    assert legend[0] == "HBM 5.3 TB/s" and {"GEMM", "attention", "elementwise"} <= set(legend)
    glyphs = [r for r in fig.renderers if hasattr(r, "glyph")]
    texts = [r.data_source.data.get("text", r.glyph.text) for r in glyphs if hasattr(r.glyph, "text")]
    assert any("bf16 1307 TFLOP/s" in str(t) for t in texts), texts  # the roof each dtype used, labelled
    points = [r.data_source.data for r in glyphs if "tflop_per_s" in r.data_source.data]
    ys = np.concatenate([d["tflop_per_s"] for d in points])
    assert fig.y_range.start <= ys.min() and ys.max() <= fig.y_range.end  # every point inside the frame
