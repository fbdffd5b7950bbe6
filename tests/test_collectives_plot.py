"""busbw_vs_size draws the α-β model only where it is resolved: a curve that rises and saturates,
S½ marked, α and β with their intervals in the hover; nothing (and the reason) otherwise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfkit.analyse.commfit import fit_alpha_beta
from perfkit.view.plots.collectives import busbw_vs_size, fit_summary


def _hv():
    from perfkit.view.plots import hv_bokeh

    return hv_bokeh()


def _rows(alpha, beta, sizes, *, world_size=4, noise=0.05, seed=0, times=None):
    """all_reduce rows as run_collectives makes them (10 samples a size, 5 % noise each)."""
    rng = np.random.default_rng(seed)
    factor = 2 * (world_size - 1) / world_size
    rows = []
    for i, s in enumerate(sizes):
        base = times[i] if times is not None else alpha + s / beta
        draws = base * np.exp(rng.normal(0.0, noise, 10))
        t = float(np.median(draws))
        rows.append({"op": "all_reduce", "inplace": True, "size_bytes": float(s), "dtype": "float32",
                     "world_size": world_size, "backend": "gloo", "device": "cpu", "time_s": t,
                     "time_samples_s": draws.tolist(), "time_median_s": float(np.median(draws)),
                     "algbw_bytes_per_s": s / t,
                     "busbw_bytes_per_s": s / t * factor, "noisy": False, "wrong_elements": 0,
                     "knobs": "{}", "knob_check": "not_verifiable", "status": "ok", "workload": "collectives"})
    return pd.DataFrame(rows)


def _dashed(overlay):
    hv = _hv()
    return [e for e in overlay if isinstance(e, hv.Curve)
            and hv.Store.lookup_options("bokeh", e, "style").kwargs.get("line_dash") == "dashed"]


def _diamonds(overlay):
    hv = _hv()
    return [e for e in overlay if isinstance(e, hv.Points)
            and hv.Store.lookup_options("bokeh", e, "style").kwargs.get("marker") == "diamond"]


def test_resolved_fit_draws_a_busbw_curve_that_rises_and_saturates_with_s_half_marked():
    hv = _hv()
    sizes = 1024 * 4.0 ** np.arange(11)  # 1 KiB .. 1 GiB around S½ = 25 µs × 12 GB/s = 300 kB
    df = _rows(25e-6, 12e9, sizes)
    overlay = busbw_vs_size(df)
    (curve,) = _dashed(overlay)
    busbw = curve.data["busbw"].to_numpy() * 1e9  # the axis is in GB/s
    size = curve.data["size_bytes"].to_numpy()
    assert size.min() == pytest.approx(sizes.min()) and size.max() == pytest.approx(sizes.max())
    assert (np.diff(busbw) > 0).all()  # rises ...
    asymptote = 1.5 * 12e9  # β × 2(n-1)/n for 4 ranks
    assert busbw[0] < 0.01 * asymptote and busbw[-1] == pytest.approx(asymptote, rel=0.05)  # ... and saturates
    assert busbw[-1] / busbw[-2] < 1.01
    (half,) = _diamonds(overlay)
    fit = fit_alpha_beta(df).iloc[0]
    assert half.data["size_bytes"].iloc[0] == pytest.approx(fit["half_bandwidth_bytes"])
    assert half.data["busbw"].iloc[0] * 1e9 == pytest.approx(fit["busbw_asymptote_bytes_per_s"] / 2)
    assert "95 % CI" in curve.data["alpha"].iloc[0] and "95 % CI" in curve.data["beta"].iloc[0]
    hv.render(overlay, backend="bokeh")


def test_the_line_is_the_median_time_with_its_iqr_and_the_means_are_marked_beside_it():
    """Issue 55: the line followed the rows' time_s (nccl-tests' mean), which a preempted
    iteration inflates, while the median marks sat 5-10x higher; and the title promised a model
    it did not always draw."""
    hv = _hv()
    sizes = 1024 * 4.0 ** np.arange(11)
    df = _rows(25e-6, 12e9, sizes)
    df["time_iqr_s"] = df["time_median_s"] * 0.2
    df["time_s"] = df["time_s"] * 3  # as if every mean had absorbed a preemption
    df["algbw_bytes_per_s"] = df["size_bytes"] / df["time_s"]
    df["busbw_bytes_per_s"] = df["algbw_bytes_per_s"] * 1.5
    overlay = busbw_vs_size(df)
    expected = sizes / df["time_median_s"].to_numpy() * 1.5 / 1e9
    (line,) = [e for e in overlay if isinstance(e, hv.Curve) and e not in _dashed(overlay)]
    assert line.data["busbw"].to_numpy() == pytest.approx(expected)
    (means,) = [e for e in overlay if isinstance(e, hv.Points)
                and hv.Store.lookup_options("bokeh", e, "style").kwargs.get("marker") == "x"]
    assert means.data["busbw"].to_numpy() == pytest.approx(expected / 3)
    (bars,) = [e for e in overlay if isinstance(e, hv.ErrorBars)]
    assert (bars.data["low"] > 0).all() and (bars.data["high"] > bars.data["low"]).all()  # the IQR, as busbw
    (curve,) = _dashed(overlay)  # fitted to the medians: it follows the line
    assert curve.data["busbw"].iloc[-1] == pytest.approx(expected[-1], rel=0.05)
    title = hv.Store.lookup_options("bokeh", overlay, "plot").kwargs["title"]
    assert "median time" in title and "α-β model" in title
    unfit = busbw_vs_size(_rows(1e-3, 10e9, 1024 * 4.0 ** np.arange(5)))  # latency-bound: no model drawn
    assert "α-β model" not in hv.Store.lookup_options("bokeh", unfit, "plot").kwargs["title"]
    hv.render(overlay, backend="bokeh")


def test_latency_bound_sweep_draws_no_flat_model_line_and_says_why():
    # The quickstart's shape (issue 20): latency-bound sizes whose busbw rises ~250×; the old fit
    # drew a flat dashed "fit" beside them.
    hv = _hv()
    df = _rows(1e-3, 10e9, 1024 * 4.0 ** np.arange(5))
    overlay = busbw_vs_size(df)
    assert _dashed(overlay) == [] and _diamonds(overlay) == []
    (points,) = [e for e in overlay if isinstance(e, hv.Scatter)]
    assert points.data["beta"].iloc[0].startswith("unresolved, ≥")
    assert "latency-bound" in points.data["verdict"].iloc[0]
    assert "95 % CI" in points.data["alpha"].iloc[0]  # α is resolved and shown with its interval
    hv.render(overlay, backend="bokeh")


def test_a_bad_fit_is_not_drawn():
    sizes = 1024 * 4.0 ** np.arange(8)
    times = np.where(sizes < 1e5, 1e-3, 1e-5) + sizes / 1e11  # a protocol switch inside the range
    df = _rows(0, 1, sizes, times=times)
    overlay = busbw_vs_size(df)
    assert _dashed(overlay) == [] and _diamonds(overlay) == []
    points = [e for e in overlay if isinstance(e, _hv().Scatter)][0]
    assert points.data["verdict"].iloc[0].startswith("bad fit")


def test_fit_summary_shows_bounds_for_unresolved_parameters():
    sizes = (64 << 20) * 2.0 ** np.arange(5)
    summary = fit_summary(fit_alpha_beta(_rows(20e-6, 10e9, sizes)).iloc[0])
    assert summary["alpha"].startswith("unresolved, ≤ ") and "95 % CI" in summary["beta"]
    assert summary["s_half"] == "unknown" and "bandwidth-bound" in summary["verdict"]
