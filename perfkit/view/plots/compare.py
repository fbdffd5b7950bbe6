"""Comparison plots: per matched point of an A/B comparison, how much slower or faster the new
side is, with its confidence interval, coloured by verdict.

Input is the ``points`` frame of :class:`perfkit.analyse.compare.Comparison` (one row per matched
point: ``point``, ``new``, ``metric``, ``lower_is_better``, ``ratio``, ``ci_low``/``ci_high``,
``p_holm``, ``n_base``/``n_new``, ``verdict``, ``why``, ...).

The x axis is the *slowdown factor* s, log scale: s = ratio (new/base) for a lower-is-better metric
(``*_s``), 1/ratio otherwise (``*_per_s``), so right is always worse whatever the metric. Ticks
and hovers name it in the words of :mod:`perfkit.analyse.ab_stats`: s ≥ 1 is "+(s − 1)·100 %"
slower, s < 1 is "−(1/s − 1)·100 %" faster (a speed-up); on the log axis ±x % sit symmetric about
0, and the shaded band [1/(1 + t), 1 + t] is the one the verdict uses for "same". One glyph per
point, its CI as a horizontal bar; points top to bottom in the frame's order, labels on the y axis
(readable from 1 to a few hundred points: the plot grows with them).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ._common import hv_bokeh

__all__ = ["VERDICT_STYLE", "slowdown_frame", "comparison_plot", "comparison_table", "change_words"]

#: Verdict → (colour, marker): the Okabe–Ito colour-blind-safe palette (Okabe & Ito 2008, "Color
#: Universal Design", https://jfly.uni-koeln.de/color/), with a distinct marker as well, so the
#: verdict reads without colour too.
VERDICT_STYLE = {
    "slower": ("#D55E00", "square"),        # vermillion
    "faster": ("#0072B2", "circle"),        # blue
    "same": ("#999999", "diamond"),         # grey
    "inconclusive": ("#CC79A7", "triangle"),  # reddish purple
}
_OTHER_STYLE = ("#000000", "x")  # a verdict this module does not know: drawn, never dropped
_PX_PER_POINT = 18
_MIN_HEIGHT_PX = 240


def change_words(s: float) -> str:
    """A slowdown factor in words: 1.123 → '+12.3 % slower', 0.9 → '−11.1 % faster'."""
    if s is None or not math.isfinite(s) or s <= 0:
        return "unknown"
    if s >= 1:
        return f"+{(s - 1) * 100:.1f} % slower"
    return f"−{(1 / s - 1) * 100:.1f} % faster"


def _tick_label(f: float) -> str:
    if abs(f - 1) < 1e-12:
        return "0"
    if f >= 2:
        return f"×{f:g}"
    if f <= 0.5:
        return f"÷{1 / f:g}"
    return f"+{(f - 1) * 100:g} %" if f > 1 else f"−{(1 / f - 1) * 100:g} %"


def _p_text(p) -> str:
    if p is None or pd.isna(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.2g}"


def slowdown_frame(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with what the plot draws: ``label`` (y-axis text: the point, prefixed with the
    new side's label when several were compared), ``slowdown`` and its CI ``slowdown_low``/
    ``slowdown_high`` (NaN where unknown), ``change`` in words, and display texts. A label that
    several metrics of one point share is suffixed with the metric ("... · tpot_s")."""
    data = points.reset_index(drop=True).copy()
    if data.empty:
        return data.assign(label=pd.Series(dtype=str), slowdown=pd.Series(dtype=float))
    several = "new" in data and data["new"].nunique() > 1
    point = data["point"].astype(str)
    label = (data["new"].astype(str) + ": " + point) if several else point
    if "metric" in data:  # a point judged on several metrics (inference: TTFT, TPOT): one line each
        clash = label.duplicated(keep=False)
        label = label.where(~clash, label + " · " + data["metric"].astype(str))
    data["label"] = label
    lower = data["lower_is_better"].astype(bool) if "lower_is_better" in data else True
    ratio = pd.to_numeric(data["ratio"], errors="coerce")
    lo = pd.to_numeric(data["ci_low"], errors="coerce") if "ci_low" in data else np.nan * ratio
    hi = pd.to_numeric(data["ci_high"], errors="coerce") if "ci_high" in data else np.nan * ratio
    with np.errstate(divide="ignore", invalid="ignore"):
        data["slowdown"] = np.where(lower, ratio, 1 / ratio)
        # 1/x reverses the order: the high end of a throughput ratio is the low end of the slowdown.
        data["slowdown_low"] = np.where(lower, lo, 1 / hi)
        data["slowdown_high"] = np.where(lower, hi, 1 / lo)
    for col in ("slowdown", "slowdown_low", "slowdown_high"):
        data[col] = data[col].where(np.isfinite(data[col]) & (data[col] > 0))
    data["change"] = [change_words(s) for s in data["slowdown"]]
    data["ci_text"] = [f"{a:.4g} – {b:.4g}" if a == a and b == b else "n/a" for a, b in zip(lo, hi)]
    data["p_text"] = [_p_text(p) for p in (data["p_holm"] if "p_holm" in data else [None] * len(data))]
    n_base = data["n_base"] if "n_base" in data else [None] * len(data)
    n_new = data["n_new"] if "n_new" in data else [None] * len(data)
    data["n_text"] = [f"{_int(a)} vs {_int(b)}" for a, b in zip(n_base, n_new)]
    data["verdict"] = data["verdict"].astype(str)
    data["numerics_text"] = [_numerics_text(r) for r in data.to_dict("records")]
    return data


def _numerics_text(point: dict) -> str:
    """"same (fp32, 5 steps)", "differs (…): why", "n/a: why" (points from before numerics: "")."""
    verdict = point.get("numerics")
    if not isinstance(verdict, str):
        return ""
    basis = point.get("numerics_basis") or ""
    head = f"{verdict} ({basis})" if basis else verdict
    return f"{head}: {point.get('numerics_why')}" if verdict != "same" and point.get("numerics_why") else head


def _int(value) -> str:
    return "?" if value is None or pd.isna(value) else str(int(value))


def _ticks(low: float, high: float) -> list[tuple[float, str]]:
    """Factors to mark between ``low`` and ``high`` (> 0), spread evenly on the log axis."""
    steps = (1.05, 1.1, 1.2, 1.5, 2, 3, 5, 10, 30, 100, 1000, 1e4, 1e5, 1e6)
    candidates = [1.0] + [f for s in steps for f in (s, 1 / s)]
    inside = sorted(f for f in candidates if low <= f <= high)
    gap = (math.log(high) - math.log(low)) / 9  # at most ~9 labels across the axis: they never overlap
    chosen = [1.0] if low <= 1 <= high else []
    for f in sorted(inside, key=lambda f: abs(math.log(f))):
        if all(abs(math.log(f) - math.log(c)) >= gap for c in chosen):
            chosen.append(f)
    return [(f, _tick_label(f)) for f in sorted(chosen)]


def comparison_plot(points: pd.DataFrame, *, threshold: float = 0.05):
    """Slowdown of the new side per point (log x), CI bars, ±``threshold`` band, verdict colours.

    ``threshold`` is the comparison's (:attr:`Comparison.threshold`); points without a finite
    ratio cannot be placed and are named in the title (their rows stay in the table)."""
    hv = hv_bokeh()
    data = slowdown_frame(points)
    if data.empty:
        return hv.Div("<p>No matched points to compare.</p>")
    n = len(data)
    data["y"] = float(n - 1) - np.arange(n)  # the frame's first point on top
    drawn = data[data["slowdown"].notna()]
    band = (1 / (1 + threshold), 1 + threshold)
    values = pd.concat([drawn["slowdown"], drawn["slowdown_low"], drawn["slowdown_high"]]).dropna()
    low = min([band[0], *values.tolist()]) / 1.15
    high = max([band[1], *values.tolist()]) * 1.15
    metric = ", ".join(sorted(map(str, data["metric"].dropna().unique()))) if "metric" in data else ""
    hover = [("point", "@{label}"), ("verdict", "@{verdict}"), ("change", "@{change}"),
             ("ratio new/base", "@{ratio}{0.0000}"), ("95 % CI of ratio", "@{ci_text}"),
             ("p after Holm", "@{p_text}"), ("samples", "@{n_text}"), ("why", "@{why}"),
             ("numerics", "@{numerics_text}")]
    vdims = ["y", "label", "verdict", "change", "ratio", "ci_text", "p_text", "n_text", "why", "numerics_text"]
    if "why" not in drawn:
        drawn = drawn.assign(why="")
    elements = [hv.VSpan(*band).opts(color="#bbbbbb", alpha=0.35, line_alpha=0),
                hv.VLine(1.0).opts(color="#555555", line_width=1)]
    known = list(VERDICT_STYLE) + sorted(set(drawn["verdict"]) - set(VERDICT_STYLE))
    for verdict in known:
        group = drawn[drawn["verdict"] == verdict]
        if group.empty:
            continue
        color, marker = VERDICT_STYLE.get(verdict, _OTHER_STYLE)
        label = f"{verdict} ({len(group)})"
        bars = group[group["slowdown_low"].notna() & group["slowdown_high"].notna()]
        bars = bars.assign(y1=bars["y"])[["slowdown_low", "y", "slowdown_high", "y1"]]
        elements.append(hv.Segments(bars, list(bars.columns), label=label).opts(color=color, line_width=2))
        elements.append(hv.Scatter(group[["slowdown"] + vdims], "slowdown", vdims, label=label).opts(
            color=color, marker=marker, size=10, tools=["hover"], hover_tooltips=hover))
    missing = n - len(drawn)
    title = (f"{metric or 'metric'}: new vs base per point (bar: 95 % CI; "
             f"band: ±{threshold * 100:g} %)" + (f"; {missing} without a ratio, not drawn" if missing else ""))
    xlabel = "change of new vs base, log scale: −x % or ÷k faster, +x % or ×k slower"
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title=title, xlabel=xlabel, ylabel="", logx=True, xlim=(low, high),
                        ylim=(-0.7, n - 0.3), xticks=_ticks(low, high),
                        yticks=list(zip(data["y"], data["label"])), width=820,
                        height=max(_MIN_HEIGHT_PX, 130 + _PX_PER_POINT * n), legend_position="top",
                        legend_cols=4,
                        show_grid=True, toolbar="above"))


def comparison_table(points: pd.DataFrame) -> pd.DataFrame:
    """The points in words, one row each, for display (a notebook shows it as an HTML table; the
    report renders it): point, verdict, numerics, change, metric, ratio with its CI, p after Holm,
    samples, why."""
    data = slowdown_frame(points)
    cols = {"label": "point", "verdict": "verdict", "numerics_text": "numerics", "change": "change", "metric": "metric",
            "ratio": "ratio new/base", "ci_text": "95 % CI of ratio", "p_text": "p after Holm",
            "n_text": "samples base vs new", "why": "why"}
    if data.empty:
        return pd.DataFrame(columns=list(cols.values()))
    table = data.assign(why=data["why"] if "why" in data else "",
                        metric=data["metric"] if "metric" in data else "")[list(cols)].rename(columns=cols)
    table["ratio new/base"] = [f"{r:.4g}" if r == r else "n/a" for r in pd.to_numeric(data["ratio"])]
    if "numerics" not in data or not data["numerics"].isin(("same", "differs")).any():
        table = table.drop(columns="numerics")  # rows that record no results (GEMM): nothing to say
    return table
