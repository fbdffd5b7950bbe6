"""α-β fit: recover known latency and bandwidth from synthetic sweeps, say what a sweep cannot
resolve (latency-only, bandwidth-only, a model that does not fit), and predict times."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfkit.analyse.commfit import MAX_CI_RATIO, MAX_REL_RMS, busbw_curve, fit_alpha_beta, predict
from perfkit.core.specs import spec_link
from perfkit.core.errors import BadInputError

_SIZES = 1024 * 4.0 ** np.arange(11)  # 1 KiB .. 1 GiB: five decades


def _sweep(alpha, beta, *, op="all_reduce", world_size=2, noise=0.0, seed=0, sizes=_SIZES, **cols):
    """One row per size, its time the model's times one draw of multiplicative noise."""
    rng = np.random.default_rng(seed)
    t = (alpha + sizes / beta) * np.exp(rng.normal(0.0, noise, len(sizes)))
    return pd.DataFrame({"op": op, "world_size": world_size, "size_bytes": sizes, "time_s": t, **cols})


def _sampled(alpha, beta, sizes, *, noise=0.05, samples=10, seed=0, op="all_reduce", world_size=2):
    """Rows as run_collectives makes them: every iteration's time kept, time_s their median."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in sizes:
        draws = (alpha + s / beta) * np.exp(rng.normal(0.0, noise, samples))
        rows.append({"op": op, "world_size": world_size, "size_bytes": float(s),
                     "time_s": float(np.median(draws)), "time_samples_s": draws.tolist()})
    return pd.DataFrame(rows)


def test_exact_data_recovers_alpha_and_beta():
    fit = fit_alpha_beta(_sweep(25e-6, 12e9))
    row = fit.iloc[0]
    assert row["alpha_s"] == pytest.approx(25e-6, rel=1e-9)
    assert row["beta_bytes_per_s"] == pytest.approx(12e9, rel=1e-9)
    assert row["rel_rms_residual"] < 1e-9 and row["fit_ok"]
    assert row["alpha_resolved"] and row["beta_resolved"]
    assert row["n_points"] == 11 and row["n_sizes"] == 11
    assert row["busbw_factor"] == 1.0  # all_reduce on 2 ranks: 2(n-1)/n
    assert row["half_bandwidth_bytes"] == pytest.approx(25e-6 * 12e9)
    # No noise: the confidence intervals collapse onto the estimates.
    assert row["alpha_ci_low_s"] == pytest.approx(25e-6) and row["alpha_ci_high_s"] == pytest.approx(25e-6)
    assert row["beta_ci_low_bytes_per_s"] == pytest.approx(12e9)
    assert math.isnan(row["alpha_upper_s"]) and math.isnan(row["beta_lower_bytes_per_s"])  # only when unresolved


@pytest.mark.parametrize("seed", range(5))
def test_five_percent_noise_both_regimes_recovers_alpha_and_beta_within_five_percent(seed):
    # S½ = α·β = 300 kB; the sizes reach 300× below and 3500× above it.
    fit = fit_alpha_beta(_sampled(25e-6, 12e9, _SIZES, noise=0.05, seed=seed)).iloc[0]
    assert fit["alpha_resolved"] and fit["beta_resolved"] and fit["fit_ok"]
    assert fit["alpha_s"] == pytest.approx(25e-6, rel=0.05)
    assert fit["beta_bytes_per_s"] == pytest.approx(12e9, rel=0.05)
    assert fit["alpha_ci_low_s"] < fit["alpha_s"] < fit["alpha_ci_high_s"]
    assert fit["beta_ci_low_bytes_per_s"] < fit["beta_bytes_per_s"] < fit["beta_ci_high_bytes_per_s"]
    assert fit["alpha_ci_high_s"] / fit["alpha_ci_low_s"] < 1.3  # 10 samples a size pin it well
    assert fit["half_bandwidth_bytes"] == pytest.approx(fit["alpha_s"] * fit["beta_bytes_per_s"])
    assert 0.0 < fit["rel_rms_residual"] < 0.05  # medians of 10 draws: well under the 5 % per draw


@pytest.mark.parametrize("seed", range(3))
def test_one_noisy_time_per_size_still_recovers_both(seed):
    # No raw samples: the confidence intervals come from the fit's residuals.
    fit = fit_alpha_beta(_sweep(25e-6, 12e9, noise=0.03, seed=seed)).iloc[0]
    assert fit["alpha_resolved"] and fit["beta_resolved"]
    assert fit["alpha_s"] == pytest.approx(25e-6, rel=0.1)
    assert fit["beta_bytes_per_s"] == pytest.approx(12e9, rel=0.05)
    assert fit["alpha_ci_low_s"] < 25e-6 < fit["alpha_ci_high_s"]
    assert 0.01 < fit["rel_rms_residual"] < 0.06


def test_relative_weighting_beats_plain_least_squares_on_latency():
    df = _sweep(25e-6, 12e9, noise=0.03, seed=3)
    # Plain least squares is decided by the 1 GiB point's absolute error, much larger than α.
    slope, intercept = np.polyfit(df["size_bytes"], df["time_s"], 1)
    assert abs(intercept - 25e-6) / 25e-6 > 1.0
    assert fit_alpha_beta(df).iloc[0]["alpha_s"] == pytest.approx(25e-6, rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_latency_only_sweep_leaves_beta_unresolved_with_a_lower_bound(seed):
    # α = 1 ms, β = 10 GB/s: S½ = 10 MB, and the sizes stop at 64 KiB, where S/β is 0.7 % of α.
    sizes = 1024 * 4.0 ** np.arange(4)
    df = _sampled(1e-3, 10e9, sizes, noise=0.05, seed=seed)
    fit = fit_alpha_beta(df).iloc[0]
    assert fit["fit_ok"] and fit["alpha_resolved"] and not fit["beta_resolved"]
    smallest = float(np.median(df["time_samples_s"].iloc[0]))
    assert fit["alpha_s"] == pytest.approx(smallest)  # α: the median small-message time
    assert fit["alpha_s"] == pytest.approx(1e-3, rel=0.05)
    assert fit["alpha_ci_low_s"] <= fit["alpha_s"] <= fit["alpha_ci_high_s"]
    for col in ("beta_bytes_per_s", "beta_ci_low_bytes_per_s", "beta_ci_high_bytes_per_s",
                "busbw_asymptote_bytes_per_s", "half_bandwidth_bytes"):
        assert math.isnan(fit[col]), col
    algbw = (df["size_bytes"] / df["time_s"]).max()
    assert algbw <= fit["beta_lower_bytes_per_s"] <= 10e9  # true, and no weaker than what ran
    assert fit["beta_lower_bytes_per_s"] > 3 * algbw  # the flat times say more than max algbw
    assert "latency-bound" in fit["fit_note"]


def test_beta_from_a_slope_inside_the_latency_regime_is_not_resolved_even_without_noise():
    # Exact times pin 1/β precisely, but β describes messages no size here comes near: the
    # model carried 150× past the data is not a measured bandwidth (protocols change on the way).
    fit = fit_alpha_beta(_sweep(1e-3, 10e9, sizes=1024 * 4.0 ** np.arange(4))).iloc[0]
    assert fit["model_time_per_byte_s"] == pytest.approx(1e-10)
    assert fit["alpha_resolved"] and not fit["beta_resolved"] and math.isnan(fit["beta_bytes_per_s"])
    assert fit["beta_lower_bytes_per_s"] == pytest.approx(10e9)  # the interval's end: exact data


@pytest.mark.parametrize("seed", range(3))
def test_bandwidth_only_sweep_leaves_alpha_unresolved_with_an_upper_bound(seed):
    # α = 20 µs, β = 10 GB/s: S½ = 200 kB, and the sizes start at 64 MiB (α is 0.3 % of the time).
    sizes = (64 << 20) * 2.0 ** np.arange(5)
    df = _sampled(20e-6, 10e9, sizes, noise=0.05, seed=seed)
    fit = fit_alpha_beta(df).iloc[0]
    assert fit["fit_ok"] and fit["beta_resolved"] and not fit["alpha_resolved"]
    assert fit["beta_bytes_per_s"] == pytest.approx(10e9, rel=0.05)
    for col in ("alpha_s", "alpha_ci_low_s", "alpha_ci_high_s", "half_bandwidth_bytes"):
        assert math.isnan(fit[col]), col
    assert 20e-6 <= fit["alpha_upper_s"] <= df["time_s"].min()
    assert fit["busbw_asymptote_bytes_per_s"] == pytest.approx(fit["beta_bytes_per_s"])
    assert "bandwidth-bound" in fit["fit_note"]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_slope_the_noise_leaves_undetermined_is_not_resolved(seed):
    # S½ = 100 kB and the sizes reach 256 KiB: the regime is reached, but with 30 % noise on 5
    # samples a size the 95 % interval of β spans more than MAX_CI_RATIO.
    sizes = 1024 * 4.0 ** np.arange(5)
    fit = fit_alpha_beta(_sampled(100e-6, 1e9, sizes, noise=0.3, samples=5, seed=seed)).iloc[0]
    assert fit["fit_ok"] and sizes[-1] >= 2 * fit["model_alpha_s"] / fit["model_time_per_byte_s"]
    assert not fit["beta_resolved"] and math.isnan(fit["beta_bytes_per_s"])
    assert f"spans more than {MAX_CI_RATIO:g}×" in fit["fit_note"]
    assert fit["beta_lower_bytes_per_s"] <= 1e9
    quiet = fit_alpha_beta(_sampled(100e-6, 1e9, sizes, noise=0.05, samples=5, seed=seed)).iloc[0]
    assert quiet["beta_resolved"] and quiet["beta_bytes_per_s"] == pytest.approx(1e9, rel=0.1)


def test_noise_free_bandwidth_only_is_not_clamped_silently():
    sizes = np.array([1e6, 4e6, 16e6, 64e6])
    t = sizes / 5e9 * np.array([0.97, 1.0, 1.01, 1.0])  # no latency; noise makes a free fit want α < 0
    fit = fit_alpha_beta(pd.DataFrame({"size_bytes": sizes, "time_s": t}), by=()).iloc[0]
    assert not fit["alpha_resolved"] and math.isnan(fit["alpha_s"])
    assert 0.0 <= fit["alpha_upper_s"] <= t.min()
    assert fit["beta_resolved"] and fit["beta_bytes_per_s"] == pytest.approx(5e9, rel=0.02)
    assert math.isnan(fit["busbw_factor"])  # no op/world_size, no busbw column: unknown


def test_quickstart_shaped_latency_series_gets_its_latency_not_zero():
    # The quickstart's gloo rows (issue 20): every size costs 1-2.4 ms, the first one the slowest.
    # The old fit clamped α to 0 and drew a flat busbw line beside data rising 500x.
    sizes = 1024 * 4.0 ** np.arange(5)
    t = np.array([2.4e-3, 1.0e-3, 1.1e-3, 1.2e-3, 1.35e-3])
    fit = fit_alpha_beta(pd.DataFrame({"op": "all_reduce", "world_size": 2, "size_bytes": sizes,
                                       "time_s": t})).iloc[0]
    assert 0.5 * t[0] <= fit["alpha_s"] <= 2 * t[0] or not fit["fit_ok"]
    assert not fit["beta_resolved"]
    assert fit["beta_lower_bytes_per_s"] >= (sizes / t).max()


def test_a_series_the_model_does_not_describe_is_flagged_and_resolves_nothing():
    sizes = 1024 * 4.0 ** np.arange(8)
    t = np.where(sizes < 1e5, 1e-3, 1e-5) + sizes / 1e11  # a protocol switch: 100x faster above 100 kB
    fit = fit_alpha_beta(pd.DataFrame({"size_bytes": sizes, "time_s": t}), by=()).iloc[0]
    assert fit["rel_rms_residual"] > MAX_REL_RMS and not fit["fit_ok"]
    assert not fit["alpha_resolved"] and not fit["beta_resolved"]
    assert math.isnan(fit["alpha_s"]) and math.isnan(fit["beta_bytes_per_s"])
    # What stays true whatever the model: α <= every time, β >= every algbw.
    assert fit["alpha_upper_s"] == pytest.approx(t.min())
    assert fit["beta_lower_bytes_per_s"] == pytest.approx((sizes / t).max())
    assert "bad fit" in fit["fit_note"]


def test_intervals_carry_the_spread_of_the_raw_samples():
    # Medians exactly on the model (no residual to resample), each size's samples spread ±30 %.
    df = _sweep(25e-6, 12e9)
    df["time_samples_s"] = [(t * np.array([0.7, 0.85, 1.0, 1.15, 1.3])).tolist() for t in df["time_s"]]
    fit = fit_alpha_beta(df).iloc[0]
    assert fit["alpha_s"] == pytest.approx(25e-6) and fit["rel_rms_residual"] < 1e-9
    assert fit["alpha_ci_high_s"] / fit["alpha_ci_low_s"] > 1.1
    assert fit["beta_ci_high_bytes_per_s"] / fit["beta_ci_low_bytes_per_s"] > 1.1


def test_confidence_intervals_are_seeded():
    df = _sampled(25e-6, 12e9, _SIZES, seed=7)
    a, b = fit_alpha_beta(df, seed=1), fit_alpha_beta(df, seed=1)
    pd.testing.assert_frame_equal(a, b)
    c = fit_alpha_beta(df, seed=2)
    assert c["alpha_ci_low_s"].iloc[0] != a["alpha_ci_low_s"].iloc[0]
    assert c["alpha_s"].iloc[0] == a["alpha_s"].iloc[0]  # the estimate does not depend on the seed


def test_one_row_per_configuration_with_its_busbw_factor():
    df = pd.concat([
        _sweep(30e-6, 8e9, op="all_reduce", world_size=4, knobs='{"NCCL_ALGO": "Ring"}'),
        _sweep(10e-6, 20e9, op="all_gather", world_size=4, knobs='{"NCCL_ALGO": "Ring"}'),
        _sweep(40e-6, 6e9, op="all_reduce", world_size=4, knobs='{"NCCL_ALGO": "Tree"}'),
    ])
    fit = fit_alpha_beta(df).set_index(["op", "knobs"])
    assert len(fit) == 3
    ring = fit.loc[("all_reduce", '{"NCCL_ALGO": "Ring"}')]
    assert ring["beta_bytes_per_s"] == pytest.approx(8e9) and ring["busbw_factor"] == 1.5
    assert ring["busbw_asymptote_bytes_per_s"] == pytest.approx(12e9)
    ag = fit.loc[("all_gather", '{"NCCL_ALGO": "Ring"}')]
    assert ag["busbw_factor"] == 0.75 and ag["alpha_s"] == pytest.approx(10e-6)
    assert fit.loc[("all_reduce", '{"NCCL_ALGO": "Tree"}')]["alpha_s"] == pytest.approx(40e-6)


def test_factor_comes_from_the_rows_bandwidth_columns_when_present():
    df = _sweep(1e-5, 1e9, op="all_reduce", world_size=8)
    df["algbw_bytes_per_s"] = df["size_bytes"] / df["time_s"]
    df["busbw_bytes_per_s"] = df["algbw_bytes_per_s"] * 1.75
    assert fit_alpha_beta(df).iloc[0]["busbw_factor"] == pytest.approx(1.75)


def test_spec_link_known_and_unknown():
    assert spec_link("NVIDIA H100 80GB HBM3") == (450e9, pytest.approx(spec_link("NVIDIA H200")[1]))
    assert spec_link("NVIDIA A100-SXM4-80GB")[0] == 300e9
    value, source = spec_link("AMD EPYC 7763 64-Core Processor")
    assert math.isnan(value) and source is None
    assert math.isnan(spec_link("NVIDIA H100 PCIe")[0])  # no fallback to the SXM number
    df = pd.concat([_sweep(1e-5, 1e11, device="NVIDIA H100 80GB HBM3"),
                    _sweep(1e-5, 1e9, device="cpu")])
    fit = fit_alpha_beta(df, device_col="device").set_index("device")
    assert fit.loc["NVIDIA H100 80GB HBM3", "spec_link_bytes_per_s"] == 450e9
    assert "datasheet" in fit.loc["NVIDIA H100 80GB HBM3", "spec_link_source"]
    assert math.isnan(fit.loc["cpu", "spec_link_bytes_per_s"])
    given = fit_alpha_beta(_sweep(1e-5, 1e9), spec_link_bytes_per_s=25e9).iloc[0]
    assert given["spec_link_bytes_per_s"] == 25e9 and given["spec_link_source"] == "given"
    assert math.isnan(fit_alpha_beta(_sweep(1e-5, 1e9)).iloc[0]["spec_link_bytes_per_s"])


def test_predict_interpolates_inside_the_measured_range_and_labels_extrapolation():
    fit = fit_alpha_beta(_sweep(20e-6, 10e9, sizes=1024 * 4.0 ** np.arange(8)))  # 1 KiB .. 16 MiB
    sizes = [100.0, 3000.0, 5e6, 1e9]
    out = predict(fit, sizes)
    assert out["size_bytes"].tolist() == sizes
    assert out["time_s"].to_numpy() == pytest.approx(20e-6 + np.array(sizes) / 10e9)
    assert out["extrapolated"].tolist() == [True, False, False, True]
    assert out["reason"].isna().all()
    assert (out["op"] == "all_reduce").all()


def test_predict_refuses_to_extrapolate_across_an_unresolved_parameter():
    latency = fit_alpha_beta(_sampled(1e-3, 10e9, 1024 * 4.0 ** np.arange(4)))
    out = predict(latency, [2048.0, 1e9]).set_index("size_bytes")
    assert out.loc[2048.0, "time_s"] == pytest.approx(1e-3, rel=0.05) and not out.loc[2048.0, "extrapolated"]
    assert math.isnan(out.loc[1e9, "time_s"]) and "β unresolved" in out.loc[1e9, "reason"]
    bandwidth = fit_alpha_beta(_sampled(20e-6, 10e9, (64 << 20) * 2.0 ** np.arange(5)))
    out = predict(bandwidth, [1024.0, 2e9]).set_index("size_bytes")
    assert math.isnan(out.loc[1024.0, "time_s"]) and "α unresolved" in out.loc[1024.0, "reason"]
    assert out.loc[2e9, "time_s"] == pytest.approx(2e9 / 10e9, rel=0.05) and out.loc[2e9, "extrapolated"]
    sizes = 1024 * 4.0 ** np.arange(8)
    bad = fit_alpha_beta(pd.DataFrame({"size_bytes": sizes, "time_s": np.where(sizes < 1e5, 1e-3, 1e-5)}), by=())
    out = predict(bad, [4096.0])
    assert math.isnan(out["time_s"].iloc[0]) and "bad fit" in out["reason"].iloc[0]


def test_busbw_curve_evaluates_the_model():
    fit = fit_alpha_beta(_sweep(20e-6, 10e9, op="all_reduce", world_size=4))
    curve = busbw_curve(fit, [1e3, 2e5, 1e10])
    assert curve["size_bytes"].tolist() == [1e3, 2e5, 1e10]
    t = 20e-6 + np.array([1e3, 2e5, 1e10]) / 10e9
    assert curve["time_s"].to_numpy() == pytest.approx(t)
    assert curve["busbw_bytes_per_s"].to_numpy() == pytest.approx(np.array([1e3, 2e5, 1e10]) / t * 1.5)
    assert curve["extrapolated"].tolist() == [True, False, True]  # 1 KiB .. 1 GiB measured
    # At S = α·β, algbw is half of β; far above it, busbw approaches β × factor.
    half = busbw_curve(fit, [20e-6 * 10e9]).iloc[0]
    assert half["algbw_bytes_per_s"] == pytest.approx(5e9)
    assert curve["busbw_bytes_per_s"].iloc[-1] == pytest.approx(15e9, rel=1e-3)
    assert (curve["op"] == "all_reduce").all()
    default = busbw_curve(fit, points=7)
    assert len(default) == 7 and default["size_bytes"].iloc[0] == pytest.approx(1024)
    assert not default["extrapolated"].any()


def test_bad_input():
    with pytest.raises(BadInputError, match="time_s"):
        fit_alpha_beta(pd.DataFrame({"size_bytes": [1.0]}))
    with pytest.raises(BadInputError, match="positive finite"):
        fit_alpha_beta(pd.DataFrame({"size_bytes": [1.0], "time_s": [float("nan")]}))
    with pytest.raises(BadInputError, match="fit_alpha_beta frame"):
        busbw_curve(pd.DataFrame({"alpha_s": [1.0]}))
    with pytest.raises(BadInputError, match="fit_alpha_beta frame"):
        predict(pd.DataFrame({"alpha_s": [1.0]}), [1.0])


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1024.0])
def test_a_size_that_is_not_positive_and_finite_is_refused_by_name(bad):
    # a size the α-β model cannot hold (S/β of no or negative bytes, a NaN that sorts anywhere):
    # refused with the rows named, not a KeyError, nor a fit "resolved" with min_size_bytes < 0
    rows = _sweep(1e-5, 1e9)
    rows.loc[[0, 4], "size_bytes"] = bad
    with pytest.raises(BadInputError, match=r"size_bytes.*positive finite.*2 rows.*\[0, 4\]"):
        fit_alpha_beta(rows)


@pytest.mark.parametrize("bad", [math.nan, -1e-3, 0.0])
def test_a_measured_time_that_is_not_positive_and_finite_is_refused_not_dropped(bad):
    rows = _sweep(1e-5, 1e9)
    rows.loc[3, "time_s"] = bad
    with pytest.raises(BadInputError, match=r"time_s.*positive finite.*1 row.*\[3\]"):
        fit_alpha_beta(rows)
    sampled = _sampled(1e-5, 1e9, _SIZES)
    sampled.at[2, "time_samples_s"] = [*sampled.at[2, "time_samples_s"][:-1], bad]
    with pytest.raises(BadInputError, match=r"time_samples_s.*positive finite.*1 row.*\[2\]"):
        fit_alpha_beta(sampled)


def test_rows_that_did_not_measure_are_left_out_by_their_status():
    # a failed or oom configuration leaves a row without a time: it measured nothing, so it is
    # not part of the fit (and not an error); the same NaN on an ok row is one
    rows = _sweep(1e-5, 1e9, status="ok")
    want = fit_alpha_beta(rows)
    failed = pd.concat([rows, rows.iloc[:2].assign(status="failed", time_s=math.nan, size_bytes=math.nan)],
                       ignore_index=True)
    pd.testing.assert_frame_equal(fit_alpha_beta(failed), want)
    with pytest.raises(BadInputError, match=r"must be positive finite.*\[11, 12\]"):
        fit_alpha_beta(failed.assign(status="ok"))
