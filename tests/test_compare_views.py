"""The views of an A/B comparison: the plot (one glyph per point, verdict colours, CI bars, the
threshold band, hovers), the report's Comparison section (only for rows with variants, rendered
offline), and the compare notebook's folder rule."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfkit.core.errors import BadInputError
from perfkit.core.results import RunContext, record
from perfkit.view.plots.compare import VERDICT_STYLE, comparison_plot, comparison_table, slowdown_frame
from perfkit.view.report import COMPARE_DIR_ENV, comparison_base, notebook_compare_dir
from perfkit.view.report_page import build_report, write_report

EVIL = "<script>alert('pwned')</script>"


def _points() -> pd.DataFrame:
    """A points frame as perfkit.analyse.compare builds it: one point per verdict, one of them a
    throughput (higher is better), and one without a ratio."""
    rows = [
        ("gemm.ipynb size=1024", "time_s", True, 1.20, 1.12, 1.29, "slower"),
        ("gemm.ipynb size=512", "time_s", True, 0.80, 0.75, 0.86, "faster"),
        ("train.ipynb batch_size=8", "samples_per_s", False, 1.25, 1.18, 1.33, "faster"),
        ("gemm.ipynb size=64", "time_s", True, 1.01, 0.99, 1.03, "same"),
        ("gemm.ipynb size=32", "time_s", True, 1.10, 0.90, 1.40, "inconclusive"),
        (f"gemm.ipynb dtype={EVIL}", "time_s", True, math.nan, math.nan, math.nan, "inconclusive"),
    ]
    return pd.DataFrame([
        {"point": p, "notebook": p.split()[0], "base": "t1", "new": "t2", "metric": m, "lower_is_better": low,
         "n_base": 12, "n_new": 11, "rounds_base": 3, "rounds_new": 3, "median_base": 1.0, "median_new": r,
         "ratio": r, "ci_low": lo, "ci_high": hi, "p_value": 0.001, "p_holm": 0.004, "verdict": v,
         "why": f"because {v}"} for p, m, low, r, lo, hi, v in rows])


def _bokeh(obj):
    import holoviews as hv

    return hv.render(obj, backend="bokeh")


def _glyphs(fig, kind: str) -> list:
    from bokeh.models import GlyphRenderer

    return [r for r in fig.select({"type": GlyphRenderer}) if type(r.glyph).__name__ == kind]


def test_one_glyph_per_point_coloured_by_verdict():
    points = _points()
    fig = _bokeh(comparison_plot(points))
    markers = _glyphs(fig, "Scatter")
    drawn = [label for r in markers for label in r.data_source.data["label"]]
    assert sorted(drawn) == sorted(points["point"][points["ratio"].notna()])  # each point once
    for r in markers:
        verdicts = set(r.data_source.data["verdict"])
        assert len(verdicts) == 1, verdicts
        color, marker = VERDICT_STYLE[verdicts.pop()]
        assert r.glyph.fill_color == color and r.glyph.marker == marker
    assert len({r.glyph.fill_color for r in markers}) == 4  # four verdicts, four colours
    legend = [item.label["value"] for item in fig.legend[0].items]
    assert "faster (2)" in legend and "slower (1)" in legend and "inconclusive (1)" in legend
    assert "1 without a ratio, not drawn" in fig.title.text


def test_ci_bars_are_the_slowdown_interval_and_the_band_is_the_threshold():
    fig = _bokeh(comparison_plot(_points(), threshold=0.1))
    bars = {}
    for r in _glyphs(fig, "Segment"):
        d = r.data_source.data
        for x0, x1, y in zip(d["slowdown_low"], d["slowdown_high"], d["y"]):
            bars[y] = (x0, x1)
    frame = slowdown_frame(_points())
    y = {label: len(frame) - 1 - i for i, label in enumerate(frame["label"])}
    assert bars[y["gemm.ipynb size=1024"]] == pytest.approx((1.12, 1.29))  # a time: the ratio's CI
    # A throughput 25 % up is a slowdown of 1/1.25, its CI reversed: (1/1.33, 1/1.18).
    assert bars[y["train.ipynb batch_size=8"]] == pytest.approx((1 / 1.33, 1 / 1.18))
    assert y[f"gemm.ipynb dtype={EVIL}"] not in bars
    from bokeh.models import BoxAnnotation

    band = [b for b in fig.select({"type": BoxAnnotation})  # not the box-zoom tool's overlay (NaN)
            if isinstance(b.left, float) and math.isfinite(b.left) and math.isfinite(b.right)]
    assert [(b.left, b.right) for b in band] == [pytest.approx((1 / 1.1, 1.1))]


def test_hover_names_the_point_ratio_ci_p_and_samples():
    from bokeh.models import HoverTool

    fig = _bokeh(comparison_plot(_points()))
    tips = dict(next(t for t in fig.select({"type": HoverTool}) if t.tooltips).tooltips)
    assert {"point", "ratio new/base", "95 % CI of ratio", "p after Holm", "samples", "verdict"} <= set(tips)
    frame = slowdown_frame(_points())
    row = frame[frame["point"] == "gemm.ipynb size=1024"].iloc[0]
    assert row["change"] == "+20.0 % slower" and row["ci_text"] == "1.12 – 1.29"
    assert row["p_text"] == "0.004" and row["n_text"] == "12 vs 11"
    rate = frame[frame["point"] == "train.ipynb batch_size=8"].iloc[0]
    assert rate["change"] == "−25.0 % faster"  # a throughput ratio of 1.25: a speed-up of 1.25
    table = comparison_table(_points())  # the same in a table, every point (drawn or not)
    assert list(table["point"]) == list(_points()["point"])
    assert table.iloc[0][["ratio new/base", "95 % CI of ratio", "p after Holm", "why"]].tolist() == [
        "1.2", "1.12 – 1.29", "0.004", "because slower"]


def test_two_hundred_points_stay_readable_and_several_new_sides_are_told_apart():
    points = pd.concat([_points().iloc[:1]] * 200, ignore_index=True)
    points["point"] = [f"gemm.ipynb size={i}" for i in range(200)]
    points["new"] = ["t2", "t3"] * 100
    fig = _bokeh(comparison_plot(points))
    labels = fig.yaxis[0].major_label_overrides
    assert len(labels) == 200 and "t3: gemm.ipynb size=1" in labels.values()
    assert fig.height >= 200 * 15  # every label gets its own line


def _ab_dir(root: Path, *, variants=("t1", "t2"), slower=0.25, seed=0) -> Path:
    """An A/B folder as a sweep writes it (one results file per configuration, variant and round,
    interleaved), from seeded samples: t2 ``slower`` at size 1024, the same at size 64."""
    rng = np.random.default_rng(seed)
    for round_ in (1, 2, 3):
        for variant in (variants if round_ % 2 else variants[::-1]):
            for size in (64, 1024):
                scale = 1e-3 * size / 64 * (1 + slower if variant == variants[1] and size == 1024 else 1)
                samples = (scale * (1 + 0.01 * rng.standard_normal(10))).tolist()
                cid = f"gemm-{size}-{variant}-r{round_}"
                params = {"sizes": [size], "dtypes": ["fp32"]}
                ctx = RunContext(results_path=root / "results" / f"{cid}.parquet", config_id=cid,
                                 params={**params, "variant": variant, "round": round_, "variant_params": []},
                                 param_names=tuple(params), notebook="gemm.ipynb")
                record([{"workload": "gemm", "size": size, "dtype": "fp32", "time_s": float(np.median(samples)),
                         "time_samples_s": samples}], context=ctx)
    return root


def test_report_of_an_ab_sweep_has_a_comparison_section_offline(tmp_path):
    import perfkit

    folder = _ab_dir(tmp_path / "ab")
    # Advice opens every report (issue 29); the comparison comes right after it.
    assert build_report(perfkit.load(folder)).tags[:2] == ["Advice: what binds each configuration", "Comparison"]
    page = write_report(folder, tmp_path / "report.html").read_text()
    text = page.replace("&lt;", "<").replace("&gt;", ">")
    assert ">Comparison</h2>" in text and 'comparison' in text.split(">Comparison</h2>")[0][-40:] and "Base <b>t1</b>" in text
    assert "1 slower, 1 same" in text  # the verdict counts
    assert "size=1024</td><td>slower</td><td>+25." in text  # the per-point table, in words
    # Offline: no CDN, and nothing that needs JavaScript the page does not carry (hv.Div is a
    # panel model: a standalone bokeh page cannot draw it).
    for needs_network in ("cdn.bokeh.org", "cdn.holoviz.org", "static/extensions", "panel.models"):
        assert needs_network not in page, needs_network


def test_no_comparison_section_without_two_variants(tmp_path):
    import perfkit

    folder = _ab_dir(tmp_path / "ab", variants=("t1", "t1"))
    assert "Comparison" not in build_report(perfkit.load(folder)).tags
    plain = perfkit.load(folder).drop(columns=["variant"])
    assert "Comparison" not in build_report(plain).tags


def test_report_escapes_labels_from_the_data(tmp_path):
    page = write_report(_ab_dir(tmp_path / "ab", variants=("t1", EVIL)), tmp_path / "r.html").read_text()
    # The comparison's text is HTML, the label escaped once.
    assert EVIL not in page and "against &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page


def test_the_base_is_the_variant_that_ran_first_in_round_1(tmp_path):
    import perfkit

    df = perfkit.load(_ab_dir(tmp_path / "ab", variants=("new", "base")))
    assert comparison_base(df) == "new"  # the spec listed it first
    # Round 2 ran the sides in reverse (base first); files read in any order give the same answer.
    assert comparison_base(df.sample(frac=1, random_state=1)) == "new"
    assert comparison_base(df[df["round"] != 1]) == "base"  # no round 1: the earliest row
    late = df.assign(recorded_at=df["recorded_at"] + pd.to_timedelta((df["round"] == 1) * 3600, unit="s"))
    assert comparison_base(late) == "new"  # round 1 recorded after round 2 (resumed, or --workers)
    with pytest.raises(BadInputError, match="A/B sweep"):
        comparison_base(df.drop(columns=["variant"]))


def test_the_compare_notebook_folder_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.delenv(COMPARE_DIR_ENV, raising=False)
    with pytest.raises(BadInputError, match="perfkit sweep templates/ab_threads.yaml --out runs/ab"):
        notebook_compare_dir("")
    with pytest.raises(BadInputError, match="does not exist.*perfkit sweep templates/ab_threads.yaml"):
        notebook_compare_dir(str(tmp_path / "nope"))
    monkeypatch.setenv(COMPARE_DIR_ENV, str(tmp_path))
    assert notebook_compare_dir("") == tmp_path


@pytest.mark.slow
def test_comparison_report_renders_in_a_real_browser(tmp_path):
    from jupyterlab_driver import report_page

    report = write_report(_ab_dir(tmp_path / "ab"), tmp_path / "report.html")
    with report_page(report) as opened:
        page = opened.page
        page.screenshot(path=str(Path(os.environ.get("PERFKIT_SCREENSHOT_DIR", tmp_path)) / "compare-report.png"),
                        full_page=True)
    assert not opened.errors, opened.errors
    assert not opened.failed, opened.failed


def test_two_metrics_of_one_point_are_told_apart_in_the_plot_and_the_table():
    # An inference point judged on TTFT and TPOT is two rows with one point label.
    points = _points().iloc[:2].assign(point="inference.ipynb batch_size=1", notebook="inference.ipynb",
                                       metric=["ttft_s", "tpot_s"])
    frame = slowdown_frame(points)
    assert list(frame["label"]) == ["inference.ipynb batch_size=1 · ttft_s", "inference.ipynb batch_size=1 · tpot_s"]
    fig = _bokeh(comparison_plot(points))
    assert sorted(fig.yaxis[0].major_label_overrides.values()) == sorted(frame["label"])
    table = comparison_table(points)
    assert list(table["metric"]) == ["ttft_s", "tpot_s"]
    assert list(slowdown_frame(_points())["label"]) == list(_points()["point"])  # no clash: labels as they were
