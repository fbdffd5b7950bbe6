"""perfkit.measuring.ceilings: plateau detection on synthetic curves, the C++ STREAM kernels, the table.

The first test that needs the C++ extension builds it (~20-25 s on 2 cores); later runs load it
from torch's extensions cache in well under a second.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from perfkit.analyse.levels import cpu_cache_sizes, detect_levels
from perfkit.measuring import ceilings, stream
from perfkit.measuring.ceilings import CEILING_COLUMNS, measure_ceilings
from perfkit.measuring.stream import STREAM_KERNELS, measure_bandwidth_curve
from perfkit.core.errors import BadInputError

KiB, MiB = 1 << 10, 1 << 20
CACHES = {"L1": 96 * KiB, "L2": 4 * MiB, "L3": 300 * MiB}
# (plateau bandwidth in bytes/s, largest working set of the plateau): a machine like this one.
STEPS = [(300e9, 64 * KiB), (150e9, 2 * MiB), (60e9, 200 * MiB), (15e9, math.inf)]


def synthetic_curve(top: int = 1 << 30, noise: float = 0.0, seed: int = 0, steps=STEPS) -> pd.DataFrame:
    """4 points per octave from 16 KiB; between plateaus one octave of log-linear decline
    (real caches fade out gradually: associativity, other data, prefetchers)."""
    ws = 16 * KiB * 2 ** (np.arange(0, 80) / 4)
    ws = ws[ws <= top]
    logbw = []
    for w in ws:
        for i, (bw, end) in enumerate(steps):
            if w <= end:
                logbw.append(math.log(bw))
                break
            if w <= 2 * end:  # the transition octave after this plateau
                t = math.log2(w / end)
                logbw.append((1 - t) * math.log(bw) + t * math.log(steps[i + 1][0]))
                break
    rng = np.random.default_rng(seed)
    bw = np.exp(np.array(logbw) + rng.normal(0, noise, len(logbw)))
    return pd.DataFrame({"working_set_bytes": ws.astype(np.int64), "bytes_per_s": bw})


# ------------------------------------------------------------------------------ detect_levels

def test_clean_steps_give_four_named_plateaus_with_their_values():
    levels = detect_levels(synthetic_curve(), cache_sizes=CACHES)
    assert levels["level"].tolist() == ["L1", "L2", "L3", "DRAM"]
    assert levels["bytes_per_s"].tolist() == pytest.approx([s[0] for s in STEPS], rel=1e-9)
    assert not levels["noisy"].any()
    # each plateau's span lies inside its level (transition points belong to no plateau)
    dram = levels.set_index("level").loc["DRAM"]
    assert dram["working_set_min_bytes"] > CACHES["L3"]
    assert levels.set_index("level").loc["L1", "working_set_max_bytes"] <= 64 * KiB


@pytest.mark.parametrize("seed", range(5))
def test_noisy_steps_still_give_four_plateaus_near_the_truth(seed):
    levels = detect_levels(synthetic_curve(noise=0.04, seed=seed), cache_sizes=CACHES)
    assert levels["level"].tolist() == ["L1", "L2", "L3", "DRAM"]
    assert levels["bytes_per_s"].tolist() == pytest.approx([s[0] for s in STEPS], rel=0.05)


def test_a_single_outlier_does_not_make_or_split_a_plateau():
    curve = synthetic_curve()
    inside_l2 = curve.index[curve["working_set_bytes"].between(512 * KiB, 1 * MiB)][1]
    curve.loc[inside_l2, "bytes_per_s"] *= 3
    levels = detect_levels(curve, cache_sizes=CACHES)
    assert levels["level"].tolist() == ["L1", "L2", "L3", "DRAM"]
    assert levels.set_index("level").loc["L2", "bytes_per_s"] == pytest.approx(150e9)


def test_two_plateaus_when_the_sweep_stops_inside_l2():
    levels = detect_levels(synthetic_curve(top=3 * MiB), cache_sizes=CACHES)
    assert levels["level"].tolist() == ["L1", "L2"]
    assert levels["bytes_per_s"].tolist() == pytest.approx([300e9, 150e9])


def test_no_dram_unless_the_sweep_went_past_the_llc():
    # Sweep to 256 MiB < 300 MiB LLC: the last plateau is L3, whatever its bandwidth.
    assert detect_levels(synthetic_curve(top=256 * MiB), cache_sizes=CACHES)["level"].tolist() == ["L1", "L2", "L3"]
    # A flat curve across the LLC is still split there: past the LLC is memory by definition.
    flat = pd.DataFrame({"working_set_bytes": [2 ** k for k in range(24, 32)], "bytes_per_s": [20e9] * 8})
    assert detect_levels(flat, cache_sizes=CACHES)["level"].tolist() == ["L3", "DRAM"]
    assert detect_levels(flat, cache_sizes={"L2": 50 * MiB}, memory_name="HBM")["level"].tolist() == ["L2", "HBM"]


def test_unknown_cache_sizes_give_numbered_plateaus_not_guessed_names():
    levels = detect_levels(synthetic_curve(), cache_sizes={})
    assert levels["level"].tolist() == ["P1", "P2", "P3", "P4"]


def test_iqr_comes_from_the_points_when_given_and_flags_noise():
    curve = synthetic_curve(top=3 * MiB)
    curve["bytes_per_s_iqr"] = curve["bytes_per_s"] * 0.2
    levels = detect_levels(curve, cache_sizes=CACHES)
    assert levels["iqr"].tolist() == pytest.approx([60e9, 30e9])
    assert levels["noisy"].all()


def test_detect_levels_rejects_bad_curves():
    with pytest.raises(BadInputError):
        detect_levels(pd.DataFrame({"working_set_bytes": [1, 2]}), cache_sizes=CACHES)
    with pytest.raises(BadInputError):
        detect_levels(pd.DataFrame({"working_set_bytes": [1, 2], "bytes_per_s": [1.0, -1.0]}), cache_sizes=CACHES)
    two_kernels = synthetic_curve(top=1 * MiB)
    two_kernels["kernel"] = np.where(two_kernels.index % 2 == 0, "copy", "triad")
    with pytest.raises(BadInputError):
        detect_levels(two_kernels, cache_sizes=CACHES)


# ------------------------------------------------------------------------------ cache sizes

def test_cpu_cache_sizes_sums_private_caches_and_counts_shared_ones_once(tmp_path):
    def index(cpu, i, level, kind, size, shared):
        d = tmp_path / f"cpu{cpu}" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")

    for cpu in (0, 1):
        index(cpu, 0, 1, "Data", "48K", str(cpu))
        index(cpu, 1, 1, "Instruction", "32K", str(cpu))
        index(cpu, 2, 2, "Unified", "2048K", str(cpu))
        index(cpu, 3, 3, "Unified", "300M", "0-1")
    sizes = cpu_cache_sizes([0, 1], root=str(tmp_path))
    assert sizes == {"L1": 96 * KiB, "L2": 4 * MiB, "L3": 300 * MiB}
    assert cpu_cache_sizes([0], root=str(tmp_path))["L2"] == 2 * MiB


# ------------------------------------------------------------------------------ C++ kernels

@pytest.fixture(scope="module")
def ext():
    return stream.load_stream_extension()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpp_kernels_compute_stream_semantics(ext, dtype, threads):
    n = 10_007  # not a multiple of the chunk size: the tail must be covered
    g = torch.Generator().manual_seed(0)
    a0, b0, c0 = (torch.randn(n, generator=g, dtype=dtype) for _ in range(3))
    s = 3.0
    a, b, c = a0.clone(), b0.clone(), c0.clone()
    ext.triad(a, b, c, s, 3, threads)
    torch.testing.assert_close(a, b0 + s * c0)
    torch.testing.assert_close((b, c), (b0, c0))
    a, b, c = a0.clone(), b0.clone(), c0.clone()
    ext.add(a, b, c, s, 2, threads)
    torch.testing.assert_close(c, a0 + b0)
    a, b, c = a0.clone(), b0.clone(), c0.clone()
    ext.scale(a, b, c, s, 2, threads)
    torch.testing.assert_close(b, s * c0)
    a, b, c = a0.clone(), b0.clone(), c0.clone()
    ext.copy(a, b, c, s, 2, threads)
    assert torch.equal(c, a0)
    ext.first_touch(a, 7.0, threads)
    assert torch.equal(a, torch.full_like(a, 7.0))


def test_cpp_kernels_reject_mismatched_tensors(ext):
    x = torch.zeros(64, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="elements"):
        ext.triad(x, x, torch.zeros(32, dtype=torch.float64), 3.0, 1, 1)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.triad(torch.zeros(128, dtype=torch.float64)[::2], x, x, 3.0, 1, 1)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.triad(x, x.float(), x, 3.0, 1, 1)


def test_a_failed_build_raises_and_never_falls_back_to_torch_ops(monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    def broken(**kwargs):
        raise RuntimeError("Error building extension 'perfkit_stream_kernels': no OpenMP")

    monkeypatch.setattr(cpp_extension, "load", broken)
    with pytest.raises(stream.ExtensionBuildError, match="no OpenMP"):
        stream.load_stream_extension.__wrapped__()

    def unbuildable():
        raise stream.ExtensionBuildError("no compiler")

    monkeypatch.setattr(stream, "load_stream_extension", unbuildable)
    with pytest.raises(stream.ExtensionBuildError):
        measure_bandwidth_curve("cpu", max_working_set_bytes=64 * KiB)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_bandwidth_curve_counts_stream_bytes_and_is_positive(ext, backend):
    curve = measure_bandwidth_curve("cpu", quick=False, backend=backend, min_working_set_bytes=32 * KiB,
                                    max_working_set_bytes=256 * KiB, points_per_octave=1, min_run_time_s=0.01)
    assert set(curve["kernel"]) == set(STREAM_KERNELS)
    assert (curve["backend"] == backend).all()
    words = curve["kernel"].map(STREAM_KERNELS)
    # stream.c convention: bytes = words x elements x 8 per repetition
    assert (curve["bytes"] == words * curve["elements"] * 8 * curve["reps"]).all()
    assert (curve["working_set_bytes"] == words * curve["elements"] * 8).all()
    assert (curve["working_set_bytes"] <= 256 * KiB).all()
    assert np.isfinite(curve["bytes_per_s"]).all() and (curve["bytes_per_s"] > 0).all()
    assert (curve["bytes_per_s_best"] >= curve["bytes_per_s"]).all()
    assert curve["time_samples_s"].map(len).min() >= 3


def test_bandwidth_curve_rejects_bad_choices():
    with pytest.raises(BadInputError):
        measure_bandwidth_curve("cpu", kernels=["daxpy"])
    with pytest.raises(BadInputError):
        measure_bandwidth_curve("cpu", dtype="bf16")
    with pytest.raises(BadInputError):
        measure_bandwidth_curve("cpu", min_working_set_bytes=2 * MiB, max_working_set_bytes=1 * MiB)


# ------------------------------------------------------------------------------ the table

def test_measure_ceilings_returns_the_contract(ext):
    table = measure_ceilings("cpu", quick=True, shapes=[(128, 128, 128), (256, 256, 256)],
                             max_working_set_bytes=8 * MiB)
    assert list(table.columns[: len(CEILING_COLUMNS)]) == list(CEILING_COLUMNS)
    compute, memory = table[table["kind"] == "compute"], table[table["kind"] == "memory"]
    assert compute["dtype"].tolist() == ["fp64", "fp32", "bf16"]
    assert (compute["unit"] == "FLOP/s").all() and compute["level"].isna().all()
    assert len(memory) >= 1 and (memory["unit"] == "bytes/s").all() and memory["dtype"].isna().all()
    assert set(memory["level"]) <= {"L1", "L2", "L3"}  # 8 MiB is not past this machine's LLC
    assert (table["origin"] == "measured").all()
    values = table["value"].astype(float)
    assert np.isfinite(values).all() and (values > 0).all()
    assert (table["iqr"].astype(float) >= 0).all()
    assert table["noisy"].map(type).eq(bool).all()
    assert (memory["working_set_bytes"] > 0).all() and memory["source"].str.contains("OpenMP").all()


def test_unsupported_dtypes_are_refused_with_a_reason():
    assert ceilings.compute_dtypes("cpu")["tf32"] is not None
    with pytest.raises(BadInputError, match="tf32"):
        ceilings.measure_matmul_throughput("cpu", dtypes=["tf32"])
    with pytest.raises(BadInputError, match="unknown dtype"):
        ceilings.measure_matmul_throughput("cpu", dtypes=["fp4"])


def test_matmul_throughput_counts_2mnk():
    rows = ceilings.measure_matmul_throughput("cpu", dtypes=["fp32"], shapes=[(64, 32, 16)], min_run_time_s=0.01)
    row = rows.iloc[0]
    assert row["flop"] == 2 * 64 * 32 * 16
    assert row["flop_per_s"] == pytest.approx(row["flop"] / row["time_s"])


def test_fp32_means_ieee_while_measuring_and_user_settings_come_back():
    from perfkit.core import precision

    mkldnn = torch.backends.mkldnn.matmul
    before = mkldnn.fp32_precision
    mkldnn.fp32_precision = "bf16"  # a user who let oneDNN run fp32 matmuls in bf16
    try:
        with precision.math_mode("fp32"):
            assert mkldnn.fp32_precision == "ieee"
            assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert mkldnn.fp32_precision == "bf16"
    finally:
        mkldnn.fp32_precision = before


def test_without_shapes_the_sizes_are_searched_and_the_ceiling_names_the_winner(monkeypatch):
    # Small bounds keep it cheap; the search itself is tested on made-up surfaces in test_shape_search.
    monkeypatch.setitem(ceilings._SEARCH, ("cpu", True), (64, 256, 1.0))
    monkeypatch.setitem(ceilings._CPU_START_N, "fp32", 128)
    rows = ceilings.measure_matmul_throughput("cpu", dtypes=["fp32"], min_run_time_s=0.01)
    assert rows["searched"].all() and len(rows) >= 3  # the start, and at least two steps from it
    assert {(128, 128, 128), (256, 256, 256)} <= set(zip(rows["m"], rows["n"], rows["k"]))
    monkeypatch.setattr(ceilings, "measure_matmul_throughput", lambda *a, **k: rows)
    table = measure_ceilings("cpu", dtypes=["fp32"], curve=pd.DataFrame(
        {"kernel": ["triad"] * 4, "threads": 1, "backend": "cpp",
         "working_set_bytes": [16 * KiB, 32 * KiB, 64 * KiB, 128 * KiB], "bytes_per_s": [1e11] * 4}))
    fp32 = table[table["kind"] == "compute"].iloc[0]
    best = rows.loc[rows["flop_per_s"].idxmax()]
    assert (fp32["m"], fp32["n"], fp32["k"]) == (best["m"], best["n"], best["k"])
    assert fp32["value"] == best["flop_per_s"]
    assert f"searched shapes (best {best['m']}x{best['n']}x{best['k']})" in fp32["source"]
