"""α-β fit: recover known latency and bandwidth from synthetic sweeps, with and without noise."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfkit.commfit import busbw_curve, fit_alpha_beta, spec_link
from perfkit.errors import BadInputError

_SIZES = 1024 * 4.0 ** np.arange(11)  # 1 KiB .. 1 GiB: five decades


def _sweep(alpha, beta, *, op="all_reduce", world_size=2, noise=0.0, seed=0, sizes=_SIZES, **cols):
    rng = np.random.default_rng(seed)
    t = (alpha + sizes / beta) * np.exp(rng.normal(0.0, noise, len(sizes)))
    return pd.DataFrame({"op": op, "world_size": world_size, "size_bytes": sizes, "time_s": t, **cols})


def test_exact_data_recovers_alpha_and_beta():
    fit = fit_alpha_beta(_sweep(25e-6, 12e9))
    row = fit.iloc[0]
    assert row["alpha_s"] == pytest.approx(25e-6, rel=1e-9)
    assert row["beta_bytes_per_s"] == pytest.approx(12e9, rel=1e-9)
    assert row["rel_rms_residual"] < 1e-9
    assert row["n_points"] == 11 and not row["alpha_clamped"]
    assert row["busbw_factor"] == 1.0  # all_reduce on 2 ranks: 2(n-1)/n
    assert row["half_bandwidth_bytes"] == pytest.approx(25e-6 * 12e9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_data_recovers_alpha_and_beta_at_both_ends(seed):
    fit = fit_alpha_beta(_sweep(25e-6, 12e9, noise=0.03, seed=seed)).iloc[0]
    # 3% noise on every point: relative weighting lets the small sizes pin α and the large β.
    assert fit["alpha_s"] == pytest.approx(25e-6, rel=0.1)
    assert fit["beta_bytes_per_s"] == pytest.approx(12e9, rel=0.05)
    assert 0.01 < fit["rel_rms_residual"] < 0.06


def test_relative_weighting_beats_plain_least_squares_on_latency():
    df = _sweep(25e-6, 12e9, noise=0.03, seed=3)
    # Plain least squares is decided by the 1 GiB point's absolute error, much larger than α.
    slope, intercept = np.polyfit(df["size_bytes"], df["time_s"], 1)
    assert abs(intercept - 25e-6) / 25e-6 > 1.0
    assert fit_alpha_beta(df).iloc[0]["alpha_s"] == pytest.approx(25e-6, rel=0.1)


def test_negative_latency_is_clamped_and_beta_still_recovered():
    sizes = np.array([1e6, 4e6, 16e6, 64e6])
    t = sizes / 5e9 * np.array([0.97, 1.0, 1.01, 1.0])  # no latency; noise makes the fit want α < 0
    fit = fit_alpha_beta(pd.DataFrame({"size_bytes": sizes, "time_s": t}), by=()).iloc[0]
    assert fit["alpha_clamped"] and fit["alpha_s"] == 0.0
    assert fit["beta_bytes_per_s"] == pytest.approx(5e9, rel=0.02)
    assert math.isnan(fit["busbw_factor"])  # no op/world_size, no busbw column: unknown


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


def test_busbw_curve_evaluates_the_model():
    fit = fit_alpha_beta(_sweep(20e-6, 10e9, op="all_reduce", world_size=4))
    curve = busbw_curve(fit, [1e3, 2e5, 1e10])
    assert curve["size_bytes"].tolist() == [1e3, 2e5, 1e10]
    t = 20e-6 + np.array([1e3, 2e5, 1e10]) / 10e9
    assert curve["time_s"].to_numpy() == pytest.approx(t)
    assert curve["busbw_bytes_per_s"].to_numpy() == pytest.approx(np.array([1e3, 2e5, 1e10]) / t * 1.5)
    # At S = α·β, algbw is half of β; far above it, busbw approaches β × factor.
    half = busbw_curve(fit, [20e-6 * 10e9]).iloc[0]
    assert half["algbw_bytes_per_s"] == pytest.approx(5e9)
    assert curve["busbw_bytes_per_s"].iloc[-1] == pytest.approx(15e9, rel=1e-3)
    assert (curve["op"] == "all_reduce").all()
    default = busbw_curve(fit, points=7)
    assert len(default) == 7 and default["size_bytes"].iloc[0] == pytest.approx(1024)


def test_bad_input():
    with pytest.raises(BadInputError, match="time_s"):
        fit_alpha_beta(pd.DataFrame({"size_bytes": [1.0]}))
    with pytest.raises(BadInputError, match="positive finite"):
        fit_alpha_beta(pd.DataFrame({"size_bytes": [1.0], "time_s": [float("nan")]}))
    with pytest.raises(BadInputError, match="fit_alpha_beta frame"):
        busbw_curve(pd.DataFrame({"alpha_s": [1.0]}))
