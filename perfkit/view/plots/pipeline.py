"""Pipeline-parallel plots: the bubble fraction against microbatches, one colour per schedule.

Rows are training-step rows with ``parallelism == "pp"`` (:mod:`perfkit.measuring.training.pipeline`), reduced by
:func:`perfkit.analyse.pipeline_bubble.bubble_table`. Measured bubbles are points, joined by a
solid line; the prediction (Narayanan et al., SC'21, section 2.2) is a dashed line, absent where
it has no closed form (the zero-bubble schedules). The hover splits a measured bubble into the
schedule's part and the overhead between stage computations, and gives the row's reason when the
step is too small for the bubble to be the schedule's (:mod:`perfkit.analyse.pipeline_bubble`).
"""

from __future__ import annotations

import pandas as pd

from perfkit.analyse.pipeline_bubble import WORKLOAD_KEYS, bubble_table

from ._common import OVERLAY_LEGEND, hv_bokeh, width_with_legend

__all__ = ["bubble_vs_microbatches"]


def _series(table: pd.DataFrame) -> pd.Series:
    label = table["pp_schedule"].astype(str) + " p=" + table["world_size"].astype(int).astype(str)
    interleaved = table["stages_per_rank"].astype(int) > 1
    label = label.where(~interleaved, label + " v=" + table["stages_per_rank"].astype(int).astype(str))
    # Several workloads (a bubble depends on the microbatch's cost): name each one that differs.
    varying = [c for c in WORKLOAD_KEYS if c in table and table[c].astype(str).nunique() > 1]
    for column in varying:
        label = label + f" {column.removesuffix('_size')}=" + table[column].astype(str)
    return label


def bubble_vs_microbatches(df: pd.DataFrame):
    """Measured (points, solid) and predicted (dashed) bubble fraction vs microbatches per step."""
    hv = hv_bokeh()
    table = bubble_table(df)
    if table.empty:
        return hv.Div("<p>No pipeline rows (parallelism pp) with status ok.</p>")
    table = table.assign(series=_series(table), bubble_pct=100 * table["bubble_fraction"],
                         predicted_pct=100 * table["bubble_fraction_predicted"].astype(float),
                         schedule_pct=100 * table["bubble_schedule_fraction"].astype(float),
                         overhead_pct=100 * table["bubble_overhead_fraction"].astype(float),
                         reason=table["bubble_fraction_reason"].fillna("").astype(str))
    hover = [("schedule", "@{series}"), ("microbatches", "@{n_microbatches}"),
             ("measured bubble", "@{bubble_pct}{0.0} %"), ("predicted", "@{predicted_pct}{0.0} %"),
             ("of it, the schedule's", "@{schedule_pct}{0.0} %"),
             ("of it, overhead (send/recv, per microbatch)", "@{overhead_pct}{0.0} %"),
             ("median step", "@{step_time_s}{0.0000} s"), ("note", "@{reason}")]
    vdims = ["series", "predicted_pct", "schedule_pct", "overhead_pct", "reason", "step_time_s"]
    elements = []
    for series, group in table.groupby("series", sort=True):
        group = group.sort_values("n_microbatches")
        measured = group[["n_microbatches", "bubble_pct", *vdims]]
        elements.append(hv.Curve(measured, "n_microbatches", ["bubble_pct", *vdims], label=series))
        elements.append(hv.Scatter(measured, "n_microbatches", ["bubble_pct", *vdims], label=series).opts(
            tools=["hover"], hover_tooltips=hover, size=8))
        predicted = group[group["predicted_pct"].notna()]
        if not predicted.empty:
            elements.append(hv.Curve(predicted[["n_microbatches", "predicted_pct", "series"]],
                                     "n_microbatches", ["predicted_pct", "series"],
                                     label=f"{series} predicted").opts(line_dash="dashed"))
    return hv.Overlay(elements).opts(
        hv.opts.Curve(ylabel="bubble (% of the pipeline step)"),
        hv.opts.Overlay(title="Pipeline bubble (points: measured; dashed: (p−1)/(v·m+p−1))",
                        xlabel="microbatches per step", ylabel="bubble (% of the pipeline step)",
                        logx=True, width=width_with_legend(elements), height=400, **OVERLAY_LEGEND,
                        show_grid=True))
