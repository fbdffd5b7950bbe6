"""JupyterLab panels without a browser: the widget objects, driven as a frontend would."""

import time
from pathlib import Path

import pandas as pd
import pytest

from perfkit.view import widgets

TRIVIAL = Path(__file__).parent / "notebooks" / "trivial.ipynb"


def test_parse_grid_text_reads_values_like_the_cli():
    assert widgets.parse_grid_text("1; 2\n4", default=1) == [1, 2, 4]
    assert widgets.parse_grid_text('"fp32"; bf16', default="fp32") == ["fp32", "bf16"]
    assert widgets.parse_grid_text("[64, 128]; [256]", default=[1]) == [[64, 128], [256]]


def test_static_mode_degrades_to_a_table(monkeypatch):
    monkeypatch.setenv("PERFKIT_STATIC", "1")
    table = widgets.sweep_panel(TRIVIAL, "unused")
    assert isinstance(table, pd.DataFrame) and list(table["parameter"]) == ["x", "label"]


@pytest.mark.slow
def test_sweep_panel_runs_a_sweep_with_live_progress(monkeypatch, tmp_path):
    monkeypatch.delenv("PERFKIT_STATIC", raising=False)
    monkeypatch.delenv("PERFKIT_CONTEXT", raising=False)
    panel = widgets.sweep_panel(TRIVIAL, tmp_path)
    fields = {c.description: c for c in panel.children if hasattr(c, "description") and hasattr(c, "value")
              and c.__class__.__name__ == "Text"}
    fields["x"].value = "1; 2"
    button = next(c for c in panel.children if c.__class__.__name__ == "Button")
    bar = next(c for c in panel.children if c.__class__.__name__ == "IntProgress")
    button.click()
    deadline = time.monotonic() + 180
    while (bar.value < 2 or button.disabled) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert bar.value == 2 and bar.max == 2 and bar.description == "2 / 2"
    import perfkit

    df = perfkit.load(tmp_path)
    assert sorted(df["x_seen"]) == [1, 2]


def test_explore_has_a_widget_per_dimension(monkeypatch):
    monkeypatch.delenv("PERFKIT_STATIC", raising=False)
    monkeypatch.delenv("PERFKIT_CONTEXT", raising=False)
    rows = pd.DataFrame({"batch_size": [1, 2, 4] * 4, "samples_per_s": range(12), "status": "ok",
                         "precision": ["fp32"] * 6 + ["bf16"] * 6, "parallelism": (["none"] * 3 + ["ddp"] * 3) * 2})
    import holoviews as hv

    obj = widgets.explore(rows, x="batch_size", y="samples_per_s", by=["precision", "parallelism"])
    assert isinstance(obj, hv.HoloMap) and [d.name for d in obj.kdims] == ["precision", "parallelism"]
    assert len(obj) == 4
    monkeypatch.setenv("PERFKIT_STATIC", "1")
    static = widgets.explore(rows, x="batch_size", y="samples_per_s", by=["precision"])
    hv.render(static, backend="bokeh")  # a plain, renderable layout
    with pytest.raises(perfkit_bad_input()):
        widgets.explore(rows, x="nope", y="samples_per_s")


def perfkit_bad_input():
    from perfkit.core.errors import BadInputError

    return BadInputError


def test_the_explorer_picks_x_y_colour_facet_and_a_filter_with_units_in_its_axes(monkeypatch):
    """Issue 55: the explorer was one dtype dropdown, its axes raw names ("flop_per_s")."""
    import holoviews as hv
    import panel as pn

    from perfkit.view.explorer import axis_label, explorer

    monkeypatch.delenv("PERFKIT_STATIC", raising=False)
    monkeypatch.delenv("PERFKIT_CONTEXT", raising=False)
    rows = pd.DataFrame({"size": [64, 128, 256] * 2, "flop_per_s": [1e9, 4e9, 9e9, 2e9, 8e9, 9e9],
                         "time_s": [1e-3, 2e-3, 4e-3] * 2, "status": "ok", "dtype": ["fp32"] * 3 + ["bf16"] * 3,
                         "env_torch": "2.13"})
    app = explorer(rows)
    assert isinstance(app, pn.Column)
    picks = {w.name: w for w in app.select(pn.widgets.Select)}
    assert list(picks) == ["filter by", "facet", "colour", "x", "y"]
    assert (picks["x"].value, picks["y"].value, picks["colour"].value) == ("size", "flop_per_s", "dtype")
    assert "env_torch" not in picks["x"].options and "dtype" in picks["facet"].options
    plot = app[-1].object()
    fig = hv.render(plot, backend="bokeh")
    assert fig.xaxis[0].axis_label == "size" and fig.yaxis[0].axis_label == "flop (FLOP/s)"
    picks["y"].value = "time_s"
    assert hv.render(app[-1].object(), backend="bokeh").yaxis[0].axis_label == "time (s)"
    picks["filter by"].value = "dtype"
    keep = next(iter(app.select(pn.widgets.MultiChoice)))
    assert keep.options == ["bf16", "fp32"]
    keep.value = ["bf16"]
    shown = app[-1].object()
    assert {len(e.data) for e in shown} == {3}  # the fp32 rows filtered out
    assert axis_label("busbw_bytes_per_s") == "busbw (bytes/s)" and axis_label("peak_mem_bytes") == "peak mem (bytes)"
    monkeypatch.setenv("PERFKIT_STATIC", "1")
    hv.render(explorer(rows), backend="bokeh")  # headless: the default plot
