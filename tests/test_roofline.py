"""Roofline analysis on a hand-made ceiling set and hand-made op tables (no device).

Ceilings (measured): fp32 P = 100 GFLOP/s, bf16 P = 400 GFLOP/s, DRAM 10 GB/s, L2 50 GB/s.
Ridges: fp32/DRAM = 100/10 = 10 FLOP/B, fp32/L2 = 100/50 = 2, bf16/DRAM = 40.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfkit.core.errors import BadInputError
from perfkit.analyse.roofline import (
    POINT_COLUMNS,
    STEP_OP,
    attainable_flop_per_s,
    ceiling_dtype,
    join_counts_with_times,
    ridge_point,
    roofline_points,
)
from conftest import ceiling_row

G = 1e9


@pytest.fixture
def ceilings() -> pd.DataFrame:
    return pd.DataFrame([
        ceiling_row("compute", "fp32", None, 100 * G),
        ceiling_row("compute", "fp32", None, 90 * G),   # a slower repeat: the roof is the max
        ceiling_row("compute", "bf16", None, 400 * G),
        ceiling_row("memory", None, "DRAM", 10 * G),
        ceiling_row("memory", None, "L2", 50 * G),
        ceiling_row("compute", "fp32", None, 1000 * G, origin="spec"),
        ceiling_row("memory", None, "DRAM", 20 * G, origin="spec"),
    ])


def test_ridge_points(ceilings):
    assert ridge_point(ceilings, "fp32", "DRAM") == pytest.approx(10.0)
    assert ridge_point(ceilings, "fp32", "L2") == pytest.approx(2.0)
    assert ridge_point(ceilings, "fp32") == pytest.approx(10.0)  # slowest level by default
    assert ridge_point(ceilings, "bf16") == pytest.approx(40.0)
    # spec: 1000 GFLOP/s over 20 GB/s
    assert ridge_point(ceilings, "fp32", origin="spec") == pytest.approx(50.0)


def test_attainable_scalar_and_array(ceilings):
    # min over levels of min(P, I·B) = min(P, I·B_DRAM): I=2 -> min(100, 2·10) = 20 GFLOP/s.
    assert attainable_flop_per_s(2.0, ceilings, "fp32") == pytest.approx(20 * G)
    assert isinstance(attainable_flop_per_s(2.0, ceilings, "fp32"), float)
    # per level: against L2 at I=2, min(100, 2·50) = 100 GFLOP/s (the L2 ridge).
    assert attainable_flop_per_s(2.0, ceilings, "fp32", level="L2") == pytest.approx(100 * G)
    got = attainable_flop_per_s([0.5, 2.0, 10.0, 20.0], ceilings, "fp32")
    np.testing.assert_allclose(got, [5 * G, 20 * G, 100 * G, 100 * G])
    assert attainable_flop_per_s(20.0, ceilings, "bf16") == pytest.approx(200 * G)


@pytest.mark.parametrize("call", [
    lambda c: attainable_flop_per_s(1.0, c, "fp8"),
    lambda c: attainable_flop_per_s(-1.0, c, "fp32"),
    lambda c: attainable_flop_per_s(1.0, c, "fp32", level="L3"),
    lambda c: ridge_point(c, "fp32", origin="guessed"),
    lambda c: ridge_point(c.drop(columns="unit"), "fp32"),
])
def test_bad_ceiling_queries_raise(ceilings, call):
    with pytest.raises(BadInputError):
        call(ceilings)


def test_ceiling_dtype_mapping():
    assert [ceiling_dtype(d) for d in ("float32", "torch.bfloat16", "float16", "float64",
                                       "float8_e4m3fn", "int64", None)] == [
        "fp32", "bf16", "fp16", "fp64", "fp8", None, None]


def _op(op, flop, read, written, time_s, shapes=((1,),), dtype="float32", counted=True,
        family="matmul"):
    return {"op": op, "family": family, "flop": flop, "bytes_read": read,
            "bytes_written": written, "input_shapes": shapes, "dtype": dtype, "time_s": time_s,
            "counted": counted}


@pytest.fixture
def ops() -> pd.DataFrame:
    return pd.DataFrame([
        # two calls of one GEMM: each 2 GFLOP over 0.1 GB (I = 20 > ridge 10), 0.04 s
        _op("aten.mm.default", 2 * G, 0.05 * G, 0.05 * G, 0.04, shapes=((8, 8), (8, 8))),
        _op("aten.mm.default", 2 * G, 0.05 * G, 0.05 * G, 0.04, shapes=((8, 8), (8, 8))),
        # elementwise: 0.1 GFLOP over 0.4 GB (I = 0.25), 0.08 s
        _op("aten.add.Tensor", 0.1 * G, 0.3 * G, 0.1 * G, 0.08, family="elementwise"),
        # a copy: no FLOP, 1 GB in 0.2 s
        _op("aten.copy_.default", 0, 0.5 * G, 0.5 * G, 0.2, family="elementwise"),
        # a bf16 GEMM: 8 GFLOP over 0.1 GB (I = 80 > bf16 ridge 40), 0.04 s
        _op("aten.mm.default", 8 * G, 0.05 * G, 0.05 * G, 0.04, dtype="bfloat16",
            shapes=((8, 8), (8, 8))),
        # a view and an uncounted op: not points, but their time is in the total
        _op("aten.t.default", 0, 0.0, 0.0, 0.04, family="other"),
        _op("aten.cummax.default", 0, math.nan, math.nan, 0.16, counted=False, family="other"),
    ])


def _point(points, op, dtype="float32"):
    hit = points[(points["op"] == op) & (points["dtype"] == dtype)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_points_aggregate_classify_and_measure(ceilings, ops):
    points = roofline_points(ops, ceilings)
    assert tuple(points.columns) == POINT_COLUMNS
    assert set(points["op"]) == {"aten.mm.default", "aten.add.Tensor", "aten.copy_.default",
                                 STEP_OP}
    total_time = 0.6  # every row of ops, views and uncounted included
    mm = _point(points, "aten.mm.default")
    # 2 calls: 4 GFLOP, 0.2 GB, I = 20, 0.08 s -> 50 GFLOP/s vs roof min(100, 20·10) = 100
    assert (mm["calls"], mm["flop"], mm["bytes"]) == (2, 4 * G, pytest.approx(0.2 * G))
    assert mm["intensity_flop_per_byte"] == pytest.approx(20.0)
    assert mm["flop_per_s"] == pytest.approx(50 * G)
    assert mm["attainable_flop_per_s"] == pytest.approx(100 * G)
    assert mm["percent_of_roof"] == pytest.approx(50.0)
    assert mm["bound"] == "compute" and mm["ceiling_dtype"] == "fp32"
    assert mm["time_share"] == pytest.approx(0.08 / total_time)
    add = _point(points, "aten.add.Tensor")
    # I = 0.25: roof 0.25·10 = 2.5 GFLOP/s; achieved 0.1/0.08 = 1.25 GFLOP/s = 50 %;
    # equivalently 0.4 GB / 0.08 s = 5 GB/s of 10 GB/s.
    assert add["attainable_flop_per_s"] == pytest.approx(2.5 * G)
    assert add["bytes_per_s"] == pytest.approx(5 * G)
    assert add["percent_of_roof"] == pytest.approx(50.0) and add["bound"] == "DRAM"
    copy = _point(points, "aten.copy_.default")
    # zero FLOP: measured against bandwidth, 1 GB / 0.2 s = 5 GB/s = 50 % of DRAM
    assert copy["intensity_flop_per_byte"] == 0.0 and copy["attainable_flop_per_s"] == 0.0
    assert copy["percent_of_roof"] == pytest.approx(50.0) and copy["bound"] == "DRAM"
    bf16 = _point(points, "aten.mm.default", dtype="bfloat16")
    # I = 80 > 40: compute-bound on 400 GFLOP/s; 8 GFLOP / 0.04 s = 200 GFLOP/s = 50 %
    assert bf16["ceiling_dtype"] == "bf16" and bf16["bound"] == "compute"
    assert bf16["percent_of_roof"] == pytest.approx(50.0)


def test_step_row_uses_totals_and_step_time(ceilings, ops):
    points = roofline_points(ops, ceilings, dtype="fp32", step_time_s=1.0)
    step = points[points["op"] == STEP_OP].iloc[0]
    # counted work: 4 + 0.1 + 0 + 8 = 12.1 GFLOP; bytes 0.2 + 0.4 + 1 + 0.1 = 1.7 GB
    assert step["flop"] == pytest.approx(12.1 * G) and step["bytes"] == pytest.approx(1.7 * G)
    assert step["calls"] == len(ops) and step["time_s"] == 1.0 and step["time_share"] == 1.0
    # I = 12.1/1.7 = 7.12 < 10: DRAM-bound, 1.7 GB/s of 10 GB/s = 17 %
    assert step["intensity_flop_per_byte"] == pytest.approx(12.1 / 1.7)
    assert step["bound"] == "DRAM" and step["percent_of_roof"] == pytest.approx(17.0)
    assert step["flop_per_s"] == pytest.approx(12.1 * G)
    # with one dtype for all, the bf16 GEMM is drawn against the fp32 roof
    mm = points[(points["op"] == "aten.mm.default") & (points["dtype"] == "bfloat16")].iloc[0]
    assert mm["ceiling_dtype"] == "fp32" and mm["percent_of_roof"] == pytest.approx(200.0)
    assert mm["time_share"] == pytest.approx(0.04)
    assert points.iloc[-1]["op"] == STEP_OP


def test_per_level_roof_labels_the_level(ceilings, ops):
    points = roofline_points(ops, ceilings, level="L2")
    add = _point(points, "aten.add.Tensor")
    # against L2 (50 GB/s): roof 0.25·50 = 12.5 GFLOP/s; 5 GB/s is 10 %
    assert add["bound"] == "L2" and add["percent_of_roof"] == pytest.approx(10.0)
    assert add["attainable_flop_per_s"] == pytest.approx(12.5 * G)


def test_dtype_without_roof_gives_nan_not_a_fallback(ceilings):
    ops = pd.DataFrame([_op("aten.add.Tensor", 10, 24, 8, 1.0, dtype="int64")])
    point = _point(roofline_points(ops, ceilings), "aten.add.Tensor", dtype="int64")
    assert point["ceiling_dtype"] is None and point["bound"] is None
    assert math.isnan(point["percent_of_roof"]) and math.isnan(point["attainable_flop_per_s"])


@pytest.mark.parametrize("kwargs", [{"dtype": "fp8"}, {"step_time_s": 0.0}, {"level": "L1"}])
def test_points_reject_bad_arguments(ceilings, ops, kwargs):
    with pytest.raises(BadInputError):
        roofline_points(ops, ceilings, **kwargs)


def test_points_reject_a_frame_that_is_not_counts(ceilings):
    with pytest.raises(BadInputError):
        roofline_points(pd.DataFrame({"op": ["x"]}), ceilings)


def test_join_matches_shapes_then_op_name_then_nothing():
    counts = pd.DataFrame([
        _op("aten.mm.default", 1, 1, 1, 9.0, shapes=((4, 8), (8, 16))),
        _op("aten.mm.default", 1, 1, 1, 9.0, shapes=((2, 2), (2, 2))),
        _op("aten.add.Tensor", 1, 1, 1, 9.0, shapes=((4,), ())),  # 0-dim shapes are ignored
        _op("aten.cummax.default", 0, math.nan, math.nan, 9.0, counted=False),
    ])
    times = pd.DataFrame({
        "op": ["aten::mm", "aten::mm", "aten::add"],
        "input_shapes": [((4, 8), (8, 16)), ((1, 1), (1, 1)), ((4,),)],
        "calls": [2, 2, 1], "time_s": [4.0, 2.0, 0.5],
    })
    joined = join_counts_with_times(counts, times)
    assert list(joined["time_match"]) == ["shapes", "op", "shapes", "none"]
    # 4 s over 2 calls; by name: (4 + 2) s over 4 calls; add 0.5 s; cummax not profiled
    assert list(joined["time_s"][:3]) == [2.0, 1.5, 0.5] and math.isnan(joined["time_s"][3])
    assert list(counts["time_s"]) == [9.0] * 4  # the input is not modified


def test_points_and_join_accept_frames_read_back_from_parquet(ceilings, ops, tmp_path):
    # Parquet returns input_shapes as arrays of arrays; grouping and matching still work.
    ops.to_parquet(tmp_path / "ops.parquet")
    back = pd.read_parquet(tmp_path / "ops.parquet")
    points = roofline_points(back, ceilings)
    assert _point(points, "aten.mm.default")["calls"] == 2
    times = pd.DataFrame({"op": ["aten::mm"], "input_shapes": [((8, 8), (8, 8))], "calls": [1],
                          "time_s": [0.5]})
    joined = join_counts_with_times(back, times)
    assert list(joined.loc[joined["op"] == "aten.mm.default", "time_match"]) == ["shapes"] * 3


# ------------------------------------------------------------------------------ one machine, one set of roofs

def test_the_roofline_and_inference_notebooks_read_one_machines_same_memory_roofs(tmp_path, monkeypatch):
    """Both notebooks' roofs (roofline_step.step_ceilings, inference.measure_roofs "fast") on a
    2-core EPYC with a 32 MiB L3: one set of measured memory levels, and none of its working sets
    under 8x the caches called DRAM. The sweep is a recorded-shape curve cut to what each asks for."""
    import perfkit.core.cpu_share as cpu_share
    from perfkit.measuring.kernels import ceilings
    from perfkit.measuring.inference import generate as inference
    from perfkit.measuring.ops import roofline_step
    from perfkit.measuring.kernels import stream
    from test_ceilings import SERVER_BW, SERVERS, fake_sysfs, server_curve

    KiB, MiB = 1 << 10, 1 << 20
    monkeypatch.setattr(cpu_share, "SYS_CPU", fake_sysfs(tmp_path, *SERVERS["epyc_vm_32mib_l3"]))
    monkeypatch.setattr(stream, "affinity_cpus", lambda: (0, 1))
    sizes = {"L1": 64 * KiB, "L2": 2 * MiB, "L3": 32 * MiB}
    machine = server_curve(sizes, SERVER_BW["epyc_vm_32mib_l3"], top=4 << 30, per_octave=2)
    machine = machine.assign(kernel="triad", threads=2, backend="cpp")

    def sweep(device="cpu", *, min_working_set_bytes=None, max_working_set_bytes=None, **kwargs):
        lo = min_working_set_bytes or 16 * KiB
        hi = max_working_set_bytes or 1 << 30  # the default quick sweep here: one octave past 8 x 34 MiB
        return machine[machine["working_set_bytes"].between(lo, hi)].reset_index(drop=True)

    monkeypatch.setattr(stream, "measure_bandwidth_curve", sweep)
    monkeypatch.setattr(ceilings, "measure_bandwidth_curve", sweep)
    monkeypatch.setattr(ceilings, "measure_matmul_throughput", lambda *a, **k: pd.DataFrame(
        {"dtype": ["fp32"], "flop_per_s": [1e11], "flop_per_s_iqr": [0.0], "noisy": [False], "searched": [False],
         "m": [64], "n": [64], "k": [64]}))

    def memory(table):
        rows = table[(table["kind"] == "memory") & (table["origin"] == "measured")]
        return rows[["level", "value", "working_set_min_bytes"]].reset_index(drop=True)

    roofline_roofs = memory(roofline_step.step_ceilings("cpu", "fp32", measure=True))
    inference_roofs = memory(inference.measure_roofs(inference.InferenceConfig(device="cpu", ceilings="fast")))
    pd.testing.assert_frame_equal(roofline_roofs, inference_roofs)
    dram = roofline_roofs[roofline_roofs["level"] == "DRAM"]
    assert len(dram) == 1 and dram["working_set_min_bytes"].iloc[0] >= 8 * sum(sizes.values())
