"""The roofline plot on hand-made points and ceilings; the roofline notebook end to end (slow).

Ceilings (measured): fp32 P = 100 GFLOP/s, bf16 P = 400 GFLOP/s, DRAM 10 GB/s, L2 50 GB/s;
theoretical fp32 1000 GFLOP/s. Ops: a GEMM (I = 2·64³ / (3·64²·4) ≈ 10.7 FLOP/B), an add
(I = 1/12), a copy (0 FLOP: not drawable on a log FLOP/s axis).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import NOTEBOOKS, ceiling_row
from perfkit.view.plots._common import hv_bokeh
from perfkit.view.plots.roofline import roofline, roofline_static
from perfkit.analyse.roofline import STEP_OP, roofline_points

G = 1e9
hv = hv_bokeh()


@pytest.fixture
def ceilings() -> pd.DataFrame:
    return pd.DataFrame([
        ceiling_row("compute", "fp32", None, 100 * G),
        ceiling_row("compute", "fp32", None, 90 * G),  # a slower repeat: one roof, the highest
        ceiling_row("compute", "bf16", None, 400 * G),
        ceiling_row("memory", None, "DRAM", 10 * G),
        ceiling_row("memory", None, "L2", 50 * G),
        ceiling_row("compute", "fp32", None, 1000 * G, origin="theoretical"),
    ])


def _ops(n: int = 64, dtype: str = "float32", scale: float = 1.0) -> pd.DataFrame:
    size = 2 if dtype == "bfloat16" else 4
    return pd.DataFrame([
        {"op": "aten.mm.default", "family": "matmul", "flop": 2 * n ** 3,
         "bytes_read": 2 * n * n * size, "bytes_written": n * n * size,
         "input_shapes": ((n, n), (n, n)), "dtype": dtype, "time_s": 1e-4 * scale, "counted": True},
        {"op": "aten.add.Tensor", "family": "elementwise", "flop": n * n,
         "bytes_read": 2 * n * n * size, "bytes_written": n * n * size,
         "input_shapes": ((n, n), (n, n)), "dtype": dtype, "time_s": 2e-5 * scale, "counted": True},
        {"op": "aten.clone.default", "family": "elementwise", "flop": 0,
         "bytes_read": n * n * size, "bytes_written": n * n * size,
         "input_shapes": ((n, n),), "dtype": dtype, "time_s": 1e-5 * scale, "counted": True},
    ])


def _points(ceilings, **sweep) -> pd.DataFrame:
    """roofline_points of one configuration, with its swept parameters as columns."""
    n, dtype = sweep.get("n", 64), sweep.get("dtype", "float32")
    ops = _ops(n, dtype, scale=sweep.get("scale", 1.0))
    pts = roofline_points(ops, ceilings, step_time_s=2e-4 * sweep.get("scale", 1.0))
    return pts.assign(**{k: v for k, v in sweep.items() if k not in ("dtype", "scale")},
                      status="ok")


def _elements(overlay, kind, group):
    return [e for e in overlay if isinstance(e, kind) and e.group == group]


def _renderers(fig):
    return [r for r in fig.renderers if hasattr(r, "data_source")]


def test_renders_with_ceiling_lines_and_points(ceilings):
    pts = pd.concat([_points(ceilings), _points(ceilings, dtype="bfloat16")], ignore_index=True)
    hm = roofline(pts, ceilings)
    assert isinstance(hm, hv.HoloMap) and hm.kdims[0].name == "dtype"
    assert sorted(hm.keys()) == ["bf16", "fp32"]
    fp32, bf16 = hm["fp32"], hm["bf16"]
    # fp32: measured + theoretical compute roofs, DRAM and L2; bf16: its roof and the two levels.
    assert len(_elements(fp32, hv.Curve, "Ceiling")) == 4
    assert len(_elements(bf16, hv.Curve, "Ceiling")) == 3
    # mm and add are drawn, the zero-FLOP clone is not (and the title says so); one step row.
    ops = _elements(fp32, hv.Points, "Ops")
    assert sum(len(p) for p in ops) == 2
    assert {p.label for p in ops} == {"matmul", "elementwise"}
    assert sum(len(p) for p in _elements(fp32, hv.Points, "Step")) == 1
    assert "2 ops without FLOP, time or roof not drawn" in fp32.opts.get().kwargs["title"]
    assert isinstance(hv.render(hm, backend="bokeh"), object)
    static = hv.render(roofline_static(pts, ceilings), backend="bokeh")
    assert len(static.children) == 2  # one panel per precision


def test_roof_lines_follow_the_model(ceilings):
    fp32 = roofline(_points(ceilings), ceilings)["fp32"]
    curves = {c.label: c for c in _elements(fp32, hv.Curve, "Ceiling")}
    dash = {label: c.opts.get().kwargs["line_dash"] for label, c in curves.items()}
    assert dash == {"fp32 measured 100 GFLOP/s": "solid", "fp32 theoretical 1 TFLOP/s": "dotted",
                    "DRAM measured 10 GB/s": "solid", "L2 measured 50 GB/s": "solid"}
    # A memory roof is I × B up to where it meets its origin's compute roof (ridge P / B).
    dram = curves["DRAM measured 10 GB/s"].dframe()
    assert fp32.opts.get().kwargs["ylabel"] == "achieved TFLOP/s"  # scaled to the top roof
    scale = 1e12
    assert np.allclose(dram["y"] * scale, dram["x"] * 10 * G)
    assert dram["x"].iloc[-1] == pytest.approx(100 / 10) and dram["y"].iloc[-1] * scale == pytest.approx(100 * G)
    # The measured compute roof starts at its ridge with the fastest level: 100 / 50 = 2 FLOP/B.
    roof = curves["fp32 measured 100 GFLOP/s"].dframe()
    assert roof["x"].iloc[0] == pytest.approx(2.0) and np.allclose(roof["y"] * scale, 100 * G)


def test_hover_carries_the_op_facts(ceilings):
    fig = hv.render(roofline(_points(ceilings), ceilings)["fp32"], backend="bokeh")
    from bokeh.models import HoverTool

    tooltips = [dict(t.tooltips) for t in fig.select(type=HoverTool) if isinstance(t.tooltips, list)]
    point_tips = next(t for t in tooltips if "op" in t and "shapes" in t)
    for field in ("op", "family", "shapes", "dtype", "time", "intensity", "achieved", "% of roof",
                  "bound", "time share"):
        assert field in point_tips, field
    mm = next(r.data_source.data for r in _renderers(fig)
              if "op" in r.data_source.data and "aten.mm.default" in list(r.data_source.data["op"]))
    i = list(mm["op"]).index("aten.mm.default")
    assert mm["shapes"][i] == "((64, 64), (64, 64))"
    assert mm["dtype"][i] == "float32"
    assert mm["intensity_flop_per_byte"][i] == pytest.approx(2 * 64 ** 3 / (3 * 64 * 64 * 4))
    assert mm["achieved"][i] == pytest.approx(2 * 64 ** 3 / 1e-4 / 1e12)  # TFLOP/s on the axis
    assert 0 < mm["percent_of_roof"][i] <= 100
    assert {"time_s", "time_share", "bound"} <= set(mm)


def test_trajectories_link_an_op_across_a_swept_parameter(ceilings):
    # Larger GEMMs: higher intensity; each configuration also runs faster per FLOP.
    pts = pd.concat([_points(ceilings, n=n, batch_size=n, scale=n / 64 / k)
                     for k, n in enumerate((16, 32, 64), start=1)], ignore_index=True)
    frame = roofline(pts, ceilings, trajectory_by="batch_size")["fp32"]
    paths = {p.data[0]["op"].iloc[0]: p.data[0] for p in _elements(frame, hv.Path, "Trajectory")}
    assert set(paths) == {"aten.mm.default", "aten.add.Tensor", STEP_OP}
    mm = paths["aten.mm.default"]
    assert list(mm["config"]) == ["batch_size=16", "batch_size=32", "batch_size=64"]
    # Vertices sit on the op's points: intensity 2n³ / (12 n²) = n / 6.
    assert np.allclose(mm["x"], [16 / 6, 32 / 6, 64 / 6])
    hv.render(frame, backend="bokeh")


def test_a_precision_sweep_keeps_its_trajectories_in_one_panel(ceilings):
    pts = pd.concat([_points(ceilings, precision="fp32"),
                     _points(ceilings, dtype="bfloat16", precision="bf16")], ignore_index=True)
    hm = roofline(pts, ceilings, trajectory_by="precision")
    assert list(hm.keys()) == ["all"]
    frame = hm["all"]
    paths = _elements(frame, hv.Path, "Trajectory")
    assert len(paths) == 3 and all(len(p.data[0]) == 2 for p in paths)
    # Both precisions' compute roofs are drawn in the one panel.
    labels = {c.label for c in _elements(frame, hv.Curve, "Ceiling")}
    assert {"fp32 measured 100 GFLOP/s", "bf16 measured 400 GFLOP/s"} <= labels
    hv.render(roofline_static(pts, ceilings, trajectory_by="precision"), backend="bokeh")


def test_no_widget_and_no_points(ceilings):
    pts = _points(ceilings)
    assert list(roofline(pts, ceilings, widget_dim=None).keys()) == ["all"]
    empty = roofline(pts.assign(status="failed"), ceilings)
    hv.render(empty, backend="bokeh")  # ceilings alone still draw
    with pytest.raises(ValueError, match="trajectory_by"):
        roofline(pts, ceilings, trajectory_by="nope")


# ---- the measuring helper and the notebook ---------------------------------------------------

def test_placement_origin_prefers_measured(ceilings):
    from perfkit.measuring.ops.roofline_step import placement_origin

    assert placement_origin(ceilings, "fp32") == "measured"
    theoretical_only = ceilings[ceilings["origin"] == "theoretical"]
    assert placement_origin(theoretical_only, "fp32") is None  # no memory roof: nothing to place against


def test_profile_step_counts_and_times_an_mlp_step(ceilings):
    from perfkit.measuring.ops import roofline_step
    from perfkit.measuring.workloads import synthetic as workloads

    work = workloads.build(workloads.make_spec("mlp", in_features=8, hidden_features=16,
                                               out_features=4, depth=2))
    prof = roofline_step.profile_step(work, 4, profile_steps=1, min_run_time_s=0.01)
    assert prof.step_time_s > 0 and len(prof.step.samples_s) >= 3
    assert {"time_match", "flop", "bytes_read"} <= set(prof.ops.columns)
    assert (prof.ops.loc[prof.ops["op"] == "aten.mm.default", "time_match"] == "shapes").all()
    pts = roofline_points(prof.ops, ceilings, step_time_s=prof.step_time_s)
    rows = roofline_step.point_rows(pts, prof)
    step = rows[rows["op"] == STEP_OP].iloc[0]
    assert step["time_iqr_s"] >= 0 and len(step["time_samples_s"]) >= 3
    assert np.allclose(rows["headroom"], 1 - rows["percent_of_roof"] / 100, equal_nan=True)


def _perfkit_run(out, *params, timeout=600):
    args = [a for name, value in params for a in ("-p", name, str(value))]
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(NOTEBOOKS / "roofline.ipynb"),
                           "--out", str(out), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_notebook_records_roofline_rows(tmp_path):
    import perfkit

    run = _perfkit_run(tmp_path, ("batch_size", 4))
    assert run.returncode == 0, run.stderr[-2000:]
    df = perfkit.load(tmp_path)
    rows = df[df["workload"] == "roofline"]
    assert (rows["status"] == "ok").all() and (rows["batch_size"] == 4).all()
    step = rows[rows["op"] == STEP_OP]
    assert len(step) == 1 and step["time_s"].iloc[0] > 0 and step["flop"].iloc[0] > 0
    ops = rows[rows["op"] != STEP_OP]
    for col in ("flop", "bytes", "time_s", "flop_per_s", "bytes_per_s", "intensity_flop_per_byte",
                "attainable_flop_per_s", "percent_of_roof", "bound", "family", "dtype", "headroom"):
        assert col in rows, col
    # percent_of_roof is achieved/attainable × 100: most ops sit under 150 % of their roof (small
    # ops whose data stays in cache can beat the slowest level's roof).
    within = ops["percent_of_roof"].between(0, 150, inclusive="right")
    assert within.mean() >= 0.5, ops[["op", "percent_of_roof"]]
    ceilings = df[df["workload"] == "ceiling"]
    assert {"compute", "memory"} <= set(ceilings["kind"])
    # What the report draws from the stored rows renders.
    hv.render(roofline_static(rows, ceilings), backend="bokeh")


@pytest.mark.slow
def test_notebook_skips_a_precision_the_device_cannot_honour(tmp_path):
    import torch

    import perfkit

    if torch.cuda.is_available():
        pytest.skip("fp16 runs on a GPU; this checks the CPU path")
    run = _perfkit_run(tmp_path, ("precision", "fp16"), ("batch_size", 2))
    assert run.returncode == 0, run.stderr[-2000:]
    df = perfkit.load(tmp_path)
    assert (df["status"] == "skipped").all() and df["reason"].str.contains("fp16").all()


def test_report_section_draws_each_model_with_its_ceilings(ceilings):
    from perfkit.view.plots.roofline import roofline_section

    pts = pd.concat([_points(ceilings, n=n, batch_size=n, model=m, config_id=f"{m}-{n}")
                     for m in ("mlp", "convnet") for n in (16, 32)], ignore_index=True)
    pts["workload"] = "roofline"
    # Each configuration recorded its ceilings; convnet's machine had a faster DRAM.
    faster = ceilings.assign(value=np.where(ceilings["level"] == "DRAM", 20 * G, ceilings["value"]))
    stored = pd.concat([pts, ceilings.assign(workload="ceiling", config_id="mlp-16", status="ok"),
                        faster.assign(workload="ceiling", config_id="convnet-32", status="ok")],
                       ignore_index=True)
    layout = roofline_section(pts, stored)
    assert [o.opts.get().kwargs["title"].split(";")[0] for o in layout] == [
        "Roofline: convnet (fp32)", "Roofline: mlp (fp32)"]
    assert all(_elements(o, hv.Path, "Trajectory") for o in layout)  # batch_size was swept
    convnet, mlp = ({c.label for c in _elements(o, hv.Curve, "Ceiling")} for o in layout)
    assert len(convnet) == len(mlp) == 4
    assert "DRAM measured 20 GB/s" in convnet and "DRAM measured 10 GB/s" in mlp
    hv.render(layout, backend="bokeh")


def test_tables_print_whole_numbers_of_a_float_column_as_integers():
    # An integer column that a missing value made float (workers 2.0 in the report) prints as
    # integers; a real float column keeps its decimals; missing cells are empty.
    import pandas as pd

    from perfkit.view.plots._common import display_text

    frame = pd.DataFrame({"workers": [2.0, None, 0.0], "samples/s": [1.5, 2.0, None], "fmt": ["mmap", None, "lmdb"]})
    text = display_text(frame)
    assert text["workers"].tolist() == ["2", "", "0"]
    assert text["samples/s"].tolist() == ["1.5", "2.0", ""]
    assert text["fmt"].tolist() == ["mmap", "", "lmdb"]


def test_the_h200_roofline_has_a_legend_labels_apart_and_tooltips_of_real_fields():
    """Issue 55, on the real H200 folder: no legend (over HoloViews' 25-entry legend_limit once
    trajectories were drawn), "fp32 spec 67" printed over "fp32 measured 53.9", and tooltips
    "time share: 1.158e-5share{0.0%}" (HoloViews rewrote @time_share to @{time_s}hare)."""
    import re
    from pathlib import Path

    from bokeh.models import HoverTool, Legend
    from bokeh.plotting import figure

    import perfkit
    from perfkit.view.plots.roofline import roofline_section

    folder = Path(__file__).resolve().parents[2] / "shared" / "reference" / "gpu-h200"
    if not folder.is_dir():
        pytest.skip(f"the H200 reference folder is not at {folder} (read in place)")
    rows = perfkit.load(folder)
    model = hv.render(roofline_section(rows[rows["workload"] == "roofline"], rows), backend="bokeh")
    fig = next(iter(model.select({"type": figure})))
    legend = [item.label["value"] for lg in fig.select({"type": Legend}) for item in lg.items]
    assert {"matmul", "attention", "step", "fp32 measured 53.9 TFLOP/s"} <= set(legend), legend
    texts = [(r.data_source.data["y"][0], r.glyph.text_baseline) for r in fig.renderers
             if hasattr(r, "glyph") and hasattr(r.glyph, "text")]
    labels = {round(y): where for y, where in texts}
    assert labels[54] == "top" and labels[67] == "bottom", labels  # one under its line, one above
    fields = set().union(*(r.data_source.data.keys() for r in fig.renderers if hasattr(r, "data_source")))
    for tool in fig.select({"type": HoverTool}):
        for _, spec in tool.tooltips or []:
            named = re.findall(r"@\{(\w+)\}", spec)
            assert named and set(named) <= fields and not re.search(r"\}[a-z]", spec), spec
