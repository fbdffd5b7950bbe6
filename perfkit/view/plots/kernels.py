"""Views of a user's kernels against the reference (:mod:`perfkit.analyse.kernels`).

- :func:`perf_report`: one line per impl (and dtype) of achieved TFLOP/s or GB/s against one of the
  shape's dimensions, as ``triton.testing.perf_report`` draws it; an incorrect point is a red cross.
- :func:`speedup_bars`: each impl's speedup over the reference per point, with its CI as a whisker,
  coloured by verdict (incorrect and failed never drawn as faster).
"""

from __future__ import annotations

import pandas as pd

from ._common import OVERLAY_LEGEND, hv_bokeh, width_with_legend

__all__ = ["perf_report", "speedup_bars"]

_VERDICT_COLORS = {"faster": "#2e8540", "same": "#999999", "slower": "#c0392b", "incorrect": "#8e44ad",
                   "failed": "#555555", "reference": "#1f77b4"}


def perf_report(rows: pd.DataFrame, *, x: str | None = None, metric: str = "flop_per_s"):
    """Achieved ``metric`` (``flop_per_s`` as TFLOP/s, ``bytes_per_s`` as GB/s) against the shape
    dimension ``x`` (default: the one that varies most), one line per impl and dtype."""
    hv = hv_bokeh()
    ok = rows[rows["status"] == "ok"].copy()
    dims = [c for c in ok.columns if c.startswith("dim_")]
    if ok.empty or not dims:
        return hv.Div("<p>No ok kernel points to draw.</p>")
    x = x if x is not None else max(dims, key=lambda c: ok[c].nunique())
    if x not in ok:
        x = f"dim_{x}"
    scale, unit = (1e12, "TFLOP/s") if metric == "flop_per_s" else (1e9, "GB/s")
    ok["value"] = ok[metric] / scale
    ok["series"] = ok["impl"] + " " + ok["dtype"]
    ok["shape_text"] = ok["shape"].astype(str)
    ok["state"] = ok["correct"].map({True: "correct", False: "INCORRECT"})
    hover = [("impl", "@{impl}"), ("dtype", "@{dtype}"), ("shape", "@{shape_text}"), (unit, "@{value}{0.000}"),
             ("time", "@{time_s}{0.000000} s"), ("numerics", "@{state}"), ("max abs error", "@{max_abs_error}")]
    vdims = ["value", "impl", "dtype", "shape_text", "time_s", "state", "max_abs_error", "series"]
    elements = []
    for series, group in ok.sort_values(x).groupby("series", sort=True):
        elements.append(hv.Curve(group, x, vdims, label=series))
        good, bad = group[group["correct"].astype(bool)], group[~group["correct"].astype(bool)]
        elements.append(hv.Scatter(good, x, vdims, label=series).opts(size=7, tools=["hover"], hover_tooltips=hover))
        if len(bad):
            elements.append(hv.Scatter(bad, x, vdims, label=f"{series} (incorrect)").opts(
                size=12, marker="x", color="red", tools=["hover"], hover_tooltips=hover))
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title=f"Achieved {unit} against {x.removeprefix('dim_')} (red crosses: outside tolerance)",
                        xlabel=x.removeprefix("dim_"), ylabel=unit, width=width_with_legend(ok["series"].unique()),
                        height=380, show_grid=True, **OVERLAY_LEGEND))


def speedup_bars(table: pd.DataFrame):
    """Speedup over the reference per impl and point (:func:`perfkit.analyse.kernels.speedups`)."""
    hv = hv_bokeh()
    rows = table[table["verdict"].isin(["faster", "same", "slower", "incorrect"])].copy()
    if rows.empty:
        return hv.Div("<p>No impl besides the reference ran ok.</p>")
    rows["point"] = rows["impl"] + " " + rows["dtype"] + " " + rows["shape"].astype(str)
    hover = [("point", "@{point}"), ("speedup", "@{speedup}{0.00}x"), ("CI", "@{speedup_ci_low}{0.00}-@{speedup_ci_high}{0.00}"),
             ("verdict", "@{verdict}")]
    vdims = ["speedup", "verdict", "speedup_ci_low", "speedup_ci_high"]
    bars = hv.Bars(rows, "point", vdims).opts(color="verdict", cmap=_VERDICT_COLORS, tools=["hover"],
                                               hover_tooltips=hover, xrotation=35, show_legend=True)
    errors = hv.ErrorBars([(p, s, s - lo, hi - s) for p, s, lo, hi in
                           zip(rows["point"], rows["speedup"], rows["speedup_ci_low"], rows["speedup_ci_high"])],
                          vdims=["speedup", "yerrneg", "yerrpos"])
    line = hv.HLine(1.0).opts(color="black", line_dash="dashed")
    return (bars * errors * line).opts(
        hv.opts.Overlay(title="Speedup over the reference (whiskers: 95 % CI; incorrect impls are never faster)",
                        ylabel="speedup (x)", xlabel="impl, dtype, shape", width=width_with_legend(rows["verdict"].unique()),
                        height=400, show_grid=True, **OVERLAY_LEGEND))
