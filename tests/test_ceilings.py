"""perfkit.measuring.kernels.ceilings: plateau detection on synthetic curves, the C++ STREAM kernels, the table.

The first test that needs the C++ extension builds it (~20-25 s on 2 cores); later runs load it
from torch's extensions cache in well under a second.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from perfkit.analyse.levels import detect_levels
from perfkit.core.caches import cpu_cache_sizes
from perfkit.measuring.kernels import ceilings
from perfkit.measuring.kernels import stream
from perfkit.measuring.kernels.ceilings import CEILING_COLUMNS, measure_ceilings
from perfkit.measuring.kernels.stream import STREAM_KERNELS, measure_bandwidth_curve
from perfkit.core.errors import BadInputError

KiB, MiB = 1 << 10, 1 << 20
CACHES = {"L1": 96 * KiB, "L2": 4 * MiB, "L3": 300 * MiB}
# (plateau bandwidth in bytes/s, largest working set of the plateau): a machine like this one.
STEPS = [(300e9, 64 * KiB), (150e9, 2 * MiB), (60e9, 200 * MiB), (15e9, math.inf)]


def synthetic_curve(top: int = 4 << 30, noise: float = 0.0, seed: int = 0, steps=STEPS) -> pd.DataFrame:
    """4 points per octave from 16 KiB; between plateaus one octave of log-linear decline
    (real caches fade out gradually: associativity, other data, prefetchers). The default top,
    4 GiB, is past 8x the 304 MiB of CACHES, where a working set is called DRAM."""
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


def test_no_dram_unless_the_sweep_went_past_8x_the_caches():
    # Sweep to 256 MiB < 300 MiB LLC, or to 1 GiB < 8 x 304 MiB: the last plateau is L3, whatever its bandwidth.
    assert detect_levels(synthetic_curve(top=256 * MiB), cache_sizes=CACHES)["level"].tolist() == ["L1", "L2", "L3"]
    assert detect_levels(synthetic_curve(top=1 << 30), cache_sizes=CACHES)["level"].tolist() == ["L1", "L2", "L3"]
    # A flat curve is still split at the caches' capacity C and at 8 C: what lies between is
    # fed by the caches in part and is no level; at 8 C and past it is memory by definition.
    flat = pd.DataFrame({"working_set_bytes": [2 ** k for k in range(24, 34)], "bytes_per_s": [20e9] * 10})
    levels = detect_levels(flat, cache_sizes=CACHES)
    assert levels["level"].tolist() == ["L3", "DRAM"]
    assert levels["working_set_max_bytes"].tolist() == [256 * MiB, 8 << 30]
    assert levels["working_set_min_bytes"].iloc[1] == 4 << 30 and levels.attrs["note"] is None
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
    with pytest.raises(ValueError, match="elements"):
        ext.triad(x, x, torch.zeros(32, dtype=torch.float64), 3.0, 1, 1)
    with pytest.raises(ValueError, match="contiguous"):
        ext.triad(torch.zeros(128, dtype=torch.float64)[::2], x, x, 3.0, 1, 1)
    with pytest.raises(ValueError, match="dtype"):
        ext.triad(x, x.float(), x, 3.0, 1, 1)
    with pytest.raises(ValueError, match="float64 and float32"):
        ext.triad(*(torch.zeros(64, dtype=torch.int32),) * 3, 3.0, 1, 1)
    with pytest.raises(ValueError, match="reps"):
        ext.triad(x, x, x, 3.0, 0, 1)


def test_the_kernels_are_built_once_per_cpu_and_source_and_kept(tmp_path, monkeypatch):
    # A fresh cache: the first load compiles (with $CC), the next process only loads what it left.
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    built = stream.load_stream_extension.__wrapped__()
    (kept,) = (tmp_path / "cache" / "kernels").iterdir()
    assert kept == built.path and kept.suffix == ".so" and stream._host_tag() in kept.name
    # The same compiler name, now one that fails: a rebuild would raise, so the kept library is loaded.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "cc").symlink_to("/bin/false")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    again = stream.load_stream_extension.__wrapped__()
    assert again.path == kept and again.max_threads() >= 1


def test_a_failed_build_raises_and_never_falls_back_to_torch_ops(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path / "cache"))  # nothing built yet
    broken = tmp_path / "cc"
    # It writes part of its output (the last argument) before failing, as a compiler or linker may.
    broken.write_text('#!/bin/sh\nfor a; do out="$a"; done\necho partial > "$out"\n'
                      "echo 'error: unsupported option -fopenmp (no OpenMP)' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(stream.ExtensionBuildError, match="no OpenMP"):
        stream.load_stream_extension.__wrapped__()
    assert not list((tmp_path / "cache" / "kernels").iterdir())  # no partial library is left
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(stream.ExtensionBuildError, match="no C compiler"):
        stream.load_stream_extension.__wrapped__()

    def unbuildable():
        raise stream.ExtensionBuildError("no compiler")

    monkeypatch.setattr(stream, "load_stream_extension", unbuildable)
    with pytest.raises(stream.ExtensionBuildError):
        measure_bandwidth_curve("cpu", max_working_set_bytes=64 * KiB)


@pytest.mark.slow  # a bandwidth curve measured over its sizes: 2.5 s each
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

@pytest.mark.slow
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
    # a sweep short of 8x the caches says why it has no DRAM row
    assert memory["source"].str.contains("no DRAM level").any() and table.attrs["memory_note"]


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
    # Issue 43: every measurement of the search is listed in the row, the leaders' second ones too.
    assert list(fp32["shapes_tried"]) == [f"{r.m}x{r.n}x{r.k} {r.flop_per_s:.4g}" for r in rows.itertuples()]
    assert len(rows) > len(set(zip(rows["m"], rows["n"], rows["k"])))  # the leaders, measured again


# ------------------------------------------------------------------------------ big-L3 server CPUs
# Cache sizes as Linux reports them (sysfs index*/size), per the vendors' sheets:
# - Xeon Platinum 8480+ (Sapphire Rapids), one socket: 56 cores, L1d 48 KiB and L2 2 MiB per core,
#   L3 105 MB shared (intel.com ark 231746: "105 MB Intel Smart Cache").
# - EPYC 9654 (Zen 4 Genoa): 96 cores, L1d 32 KiB and L2 1 MiB per core, L3 32 MiB per 8-core CCD,
#   12 CCDs = 384 MB (amd.com product page: "L3 Cache 384MB").
# - a 2-core EPYC VM with a 32 MiB L3 (the machine of issue 25).
SERVERS = {  # name: (cores, L1d, L2, L3 per instance, cores per L3 instance)
    "sapphire_rapids_8480": (56, "48K", "2048K", "107520K", 56),
    "epyc_9654": (96, "32K", "1024K", "32768K", 8),
    "epyc_vm_32mib_l3": (2, "32K", "1024K", "32768K", 2),
}


def fake_sysfs(root, cores, l1d, l2, l3, per_l3):
    """A sysfs cpu tree (``cpuN/cache/index*``) like Linux's for ``cores`` one-thread cores."""
    for cpu in range(cores):
        first = cpu // per_l3 * per_l3
        l3_cpus = f"{first}-{first + per_l3 - 1}" if per_l3 > 1 else str(first)
        for i, (level, kind, size, shared) in enumerate(((1, "Data", l1d, str(cpu)), (1, "Instruction", "32K", str(cpu)),
                                                         (2, "Unified", l2, str(cpu)), (3, "Unified", l3, l3_cpus))):
            d = root / f"cpu{cpu}" / "cache" / f"index{i}"
            d.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (d / name).write_text(f"{value}\n")
    return root


def server_curve(sizes: dict, bw: dict, top: float, per_octave: int = 4) -> pd.DataFrame:
    """Triad bandwidth vs working set of a machine with these aggregate cache ``sizes``: a plateau
    per level while a level's capacity (its own plus the lower levels', non-inclusive caches) holds
    the working set; past the total capacity C the caches keep a fraction C/ws of the stream
    (adaptive replacement), so the time per byte is (C/ws)/B_LLC + (1 - C/ws)/B_DRAM -- the slow
    approach to DRAM that a 2x-LLC sweep mistakes for a DRAM plateau."""
    cap, total = [], 0
    for name, size in sizes.items():
        total += size
        cap.append((name, total))
    ws = 16 * KiB * 2 ** (np.arange(0, 200) / per_octave)
    ws = ws[ws <= top]
    out = []
    for w in ws:
        name = next((n for n, c in cap if w <= c), None)
        if name is not None:
            out.append(bw[name])
        else:
            hit = total / w
            out.append(1 / (hit / bw[cap[-1][0]] + (1 - hit) / bw["DRAM"]))
    return pd.DataFrame({"working_set_bytes": ws.astype(np.int64), "bytes_per_s": out})


SERVER_BW = {  # aggregate triad bytes/s, the order of magnitude of published STREAM results
    "sapphire_rapids_8480": {"L1": 8e12, "L2": 3e12, "L3": 9e11, "DRAM": 2.4e11},
    "epyc_9654": {"L1": 1.2e13, "L2": 5e12, "L3": 2e12, "DRAM": 3.6e11},
    "epyc_vm_32mib_l3": {"L1": 2e11, "L2": 8e10, "L3": 4e10, "DRAM": 1.2e10},
}


@pytest.mark.parametrize("server", SERVERS)
def test_big_l3_servers_name_dram_only_at_8x_their_caches_and_read_it_right(tmp_path, server):
    cores, *rest = SERVERS[server]
    sizes = cpu_cache_sizes(range(cores), root=str(fake_sysfs(tmp_path, cores, *rest)))
    total = sum(sizes.values())
    curve = server_curve({k: sizes[k] for k in ("L1", "L2", "L3")}, SERVER_BW[server], top=32 * total)
    levels = detect_levels(curve, cache_sizes=sizes).set_index("level")
    assert levels.index.tolist() == ["L1", "L2", "L3", "DRAM"]
    assert levels.loc["DRAM", "working_set_min_bytes"] >= 8 * total
    # at >= 8x the caches at most 1/8 of the bytes come from them: within 1/(1 - 1/8) of DRAM
    assert levels.loc["DRAM", "bytes_per_s"] == pytest.approx(SERVER_BW[server]["DRAM"], rel=0.15)
    for name in ("L1", "L2", "L3"):
        assert levels.loc[name, "bytes_per_s"] == pytest.approx(SERVER_BW[server][name], rel=1e-9)


@pytest.mark.parametrize("server", SERVERS)
def test_a_sweep_that_stops_short_of_8x_names_its_largest_level_l3_and_says_why(tmp_path, server):
    cores, *rest = SERVERS[server]
    sizes = cpu_cache_sizes(range(cores), root=str(fake_sysfs(tmp_path, cores, *rest)))
    curve = server_curve({k: sizes[k] for k in ("L1", "L2", "L3")}, SERVER_BW[server], top=2 * max(sizes.values()))
    levels = detect_levels(curve, cache_sizes=sizes)
    assert levels["level"].tolist() == ["L1", "L2", "L3"]  # the old rule: DRAM past the largest level
    assert "no DRAM level" in levels.attrs["note"] and "8" in levels.attrs["note"]


def test_cache_sizes_of_big_l3_servers_from_a_fake_sysfs(tmp_path):
    spr = cpu_cache_sizes(range(56), root=str(fake_sysfs(tmp_path / "spr", *SERVERS["sapphire_rapids_8480"])))
    # level order, not size order: Sapphire Rapids' 56 L2s (112 MiB) outsize its 105 MB L3
    assert list(spr) == ["L1", "L2", "L3"]
    assert spr == {"L1": 56 * 48 * KiB, "L2": 112 * MiB, "L3": 105 * MiB}
    genoa = cpu_cache_sizes(range(96), root=str(fake_sysfs(tmp_path / "genoa", *SERVERS["epyc_9654"])))
    assert genoa["L3"] == 384 * MiB  # 12 CCD instances, each counted once
    assert cpu_cache_sizes(range(8), root=str(tmp_path / "genoa"))["L3"] == 32 * MiB  # one CCD's share


# ------------------------------------------------------------------------------ sweep sizing

def _no_op_kernels(monkeypatch):
    """STREAM kernels that do nothing, and plenty of free memory: the sweep's plan, not the machine."""
    class Ext:
        def first_touch(self, x, v, threads):
            pass

        def bind(self, kernel, a, b, c, s, reps, threads):
            return lambda: None

    monkeypatch.setattr(stream, "load_stream_extension", lambda: Ext())
    monkeypatch.setattr(stream, "free_memory_bytes", lambda device: 64 << 30)


@pytest.mark.slow
def test_the_sweep_reaches_8x_the_caches_the_os_reports(tmp_path, monkeypatch):
    import perfkit.core.cpu_share as cpu_share

    root = fake_sysfs(tmp_path, *SERVERS["epyc_vm_32mib_l3"])
    monkeypatch.setattr(cpu_share, "SYS_CPU", root)
    monkeypatch.setattr(stream, "affinity_cpus", lambda: (0, 1))
    _no_op_kernels(monkeypatch)
    total = 2 * 32 * KiB + 2 * MiB + 32 * MiB
    curve = measure_bandwidth_curve("cpu", quick=True, threads=2, min_run_time_s=1e-4)
    past = curve.loc[curve["working_set_bytes"] >= 8 * total, "working_set_bytes"]
    assert len(past) >= 3  # a DRAM plateau needs points (old: the sweep stopped at 2x the LLC, 64 MiB)
    assert curve["working_set_bytes"].max() <= 4 * 8 * total  # and not far beyond


@pytest.mark.parametrize("server, free, want", [
    ("sapphire_rapids_8480", 1 << 40, 4 << 30),   # 8 x 219.6 MiB = 1.7 GiB -> 2 GiB, one octave more
    ("epyc_9654", 1 << 40, 8 << 30),              # 8 x 483 MiB = 3.8 GiB -> 4 GiB, one octave more
    ("epyc_9654", 8 << 30, 2 << 30),              # capped at a quarter of free memory
])
def test_sweep_top_from_sysfs_sizes_of_big_l3_servers(tmp_path, server, free, want):
    from perfkit.core.caches import sweep_top_bytes

    cores, *rest = SERVERS[server]
    sizes = cpu_cache_sizes(range(cores), root=str(fake_sysfs(tmp_path, cores, *rest)))
    assert sweep_top_bytes(sizes, octaves_past=1, fallback_llc_bytes=256 * MiB, free_bytes=free) == want


@pytest.mark.slow
def test_unreadable_cache_sizes_fall_back_to_the_old_sweep_and_say_so(tmp_path, monkeypatch):
    import perfkit.core.cpu_share as cpu_share

    monkeypatch.setattr(cpu_share, "SYS_CPU", tmp_path / "no-sysfs")
    monkeypatch.setattr(stream, "affinity_cpus", lambda: (0, 1))
    _no_op_kernels(monkeypatch)
    curve = measure_bandwidth_curve("cpu", quick=True, threads=2, min_run_time_s=1e-4)
    # today's quick sweep: 2x an assumed 256 MiB (to the triad's 24-byte element)
    assert curve["working_set_bytes"].max() == pytest.approx(512 * MiB, abs=24)
    curve["bytes_per_s"] = 1e10
    monkeypatch.setattr(ceilings, "measure_matmul_throughput", lambda *a, **k: pd.DataFrame(
        {"dtype": ["fp32"], "flop_per_s": [1e11], "flop_per_s_iqr": [0.0], "noisy": [False], "searched": [False],
         "m": [64], "n": [64], "k": [64]}))
    memory = measure_ceilings("cpu", dtypes=["fp32"], curve=curve).query("kind == 'memory'")
    assert memory["level"].tolist() == ["P1"]
    assert memory["source"].str.contains("cache sizes unreadable").all()


def test_noisy_points_past_8x_the_caches_still_make_one_dram_plateau():
    # Contention on a shared machine (load 6 on 2 cores): DRAM points alternate by 30-50 %,
    # which segmentation alone splits into single points and drops.
    sizes = {"L1": 64 * KiB, "L2": 2 * MiB, "L3": 32 * MiB}
    curve = server_curve(sizes, SERVER_BW["epyc_vm_32mib_l3"], top=1 << 30, per_octave=2)
    past = curve["working_set_bytes"] >= 8 * sum(sizes.values())
    curve.loc[past, "bytes_per_s"] *= np.resize([1.0, 1.5, 0.7, 1.3], past.sum())
    levels = detect_levels(curve, cache_sizes=sizes).set_index("level")
    assert "DRAM" in levels.index, levels.attrs["note"]
    assert levels.loc["DRAM", "points"] == past.sum()
    assert levels.loc["DRAM", "noisy"]
