"""Data-loading plots: step throughput against workers per format, the step split into compute
and data wait, the DS-Analyzer stall split, and the recommendation table.

Rows are :func:`perfkit.measuring.data.loading.run_loader_benchmark` rows (``workload ==
"dataloader"``); only ``ok`` ones are drawn. One line per series: the format, plus pinning and
whatever other setting varies among the rows (decode cost, batch size, ...). Noisy points (step
time IQR/median > 0.1) are hollow; the recommended setting of each series' group is a star.
"""

from __future__ import annotations

import pandas as pd

from perfkit.analyse import dataloading as analysis

from ._common import whole, LEGEND_BESIDE, OVERLAY_LEGEND, display_text, hv_bokeh, ok_rows, width_with_legend

__all__ = ["throughput_vs_workers", "step_breakdown", "stall_bars", "recommendation_table",
           "dataloading_summary", "dataloading_section"]

_WORKLOAD = "dataloader"
#: Settings that join the series label when they vary among the rows.
_VARYING = ("decode_cost_s", "fetch_delay_s", "batch_size", "sample_bytes", "rows_per_group", "model",
            "step_compute_s", "decode_clock", "prefetch_factor_effective", "persistent_workers",
            "start_method", "resolved_device", *analysis.STORAGE_KEYS)
_PART_COLORS = {"compute": "#4c78a8", "data wait": "#e45756", "ceiling (compute)": "#4c78a8",
                "prep stall": "#f58518", "fetch stall": "#e45756"}


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    if "workload" in df:
        df = df[df["workload"] == _WORKLOAD]
    rows = ok_rows(df)
    return rows[rows["step_time_s"].notna()].copy() if "step_time_s" in rows else rows.iloc[0:0]


#: Settings of the worker processes: they do not exist at num_workers 0 (torch leaves them unset),
#: so their values there say nothing and must not split a line.
_WORKER_ONLY = ("prefetch_factor_effective", "persistent_workers", "start_method")


def _series(df: pd.DataFrame) -> pd.Series:
    """Each row's line: its format (pinned or not) and the settings that vary among the rows, as
    ``name=value`` (whole numbers as integers). A worker-only setting counts where workers ran
    (issue 55: workers 0 and 2 drew on two lines, prefetch_factor_effective none and 2)."""
    label = df["format"].astype(str)
    if "pin_memory_applied" in df:  # the label says "pinned" where the loader pinned
        label = label + df["pin_memory_applied"].map({True: " pinned", False: ""}).fillna("")
    with_workers = df["num_workers"].fillna(0) > 0 if "num_workers" in df else pd.Series(True, index=df.index)
    for col in _VARYING:
        if col not in df:
            continue
        values = df[col].map(lambda v: "none" if v is None or v != v else str(whole(v)))
        if col in _WORKER_ONLY:
            if values[with_workers].nunique() <= 1:
                continue
            values = values.where(with_workers, "-")
        if values.nunique() > 1:
            label = label + f" {col}=" + values
    return label


def _text(values: pd.Series) -> pd.Series:
    # None (a storage condition not asked for) is a value of its own, not a missing one.
    return values.map(lambda v: "none" if v is None or v != v else str(v))


def _empty(what: str):
    return hv_bokeh().Div(f"<p>No data-loading rows with status ok and {what}.</p>")


def throughput_vs_workers(df: pd.DataFrame, metric: str = "step_samples_per_s", *,
                          rec: pd.DataFrame | None = None):
    """Step throughput (``step_samples_per_s``; or loader-only ``samples_per_s``) against
    ``num_workers``, one line per series; hollow: noisy; star: the recommended setting
    (``rec``: :func:`perfkit.analyse.dataloading.recommend` of these rows, computed if None)."""
    hv = hv_bokeh()
    rows = _rows(df)
    if rows.empty or metric not in rows:
        return _empty(metric)
    rows["series"] = _series(rows)
    rows["noisy"] = rows["noisy"].fillna(False).astype(bool) if "noisy" in rows else False
    rows["data_wait_pct"] = 100 * rows["data_wait_share"].astype(float)
    rows["bound"] = rows["bound"].astype(str)
    vdims = ["series", "bound", "data_wait_pct", "noisy"]
    hover = [("series", "@{series}"), ("workers", "@{num_workers}"), ("throughput", f"@{{{metric}}}{{0.0}} samples/s"),
             ("median data wait", "@{data_wait_pct}{0.0} % of the step"), ("bound", "@{bound}"), ("noisy", "@{noisy}")]
    elements = []
    for series, group in rows.groupby("series", sort=True):
        data = group.sort_values("num_workers")[["num_workers", metric, *vdims]]
        elements.append(hv.Curve(data, "num_workers", [metric, *vdims], label=series))
        elements.append(hv.Scatter(data, "num_workers", [metric, *vdims], label=series).opts(
            tools=["hover"], hover_tooltips=hover, size=9,
            fill_alpha=hv.dim("noisy").categorize({True: 0.0, False: 1.0}, default=1.0)))
    if metric == "step_samples_per_s":
        rec = analysis.recommend(rows) if rec is None else rec
        if not rec.empty:
            stars = pd.DataFrame({"num_workers": rec["recommended_num_workers"],
                                  metric: rec[f"recommended_{metric}"]})
            elements.append(hv.Scatter(stars, "num_workers", metric, label="recommended").opts(
                marker="star", size=18, color="gold", line_color="black"))
    what = "step throughput" if metric == "step_samples_per_s" else "loader-only throughput"
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title=f"Data loading: {what} vs workers (hollow: noisy; ★ recommended)",
                        xlabel="num_workers", ylabel="samples/s", width=width_with_legend(elements), height=400,
                        xticks=sorted({int(w) for w in rows["num_workers"]}), xlim=_worker_lim(rows),
                        **OVERLAY_LEGEND, show_grid=True))


def _worker_lim(rows: pd.DataFrame) -> tuple[float, float]:
    """Workers are whole processes, and the first and last counts' markers stay inside the frame."""
    lo, hi = int(rows["num_workers"].min()), int(rows["num_workers"].max())
    pad = max(0.3, 0.06 * (hi - lo))
    return lo - pad, hi + pad


def _label(row) -> str:
    return f"{row['series']} w{int(row['num_workers'])}"


def step_breakdown(df: pd.DataFrame):
    """One stacked bar per row: the mean step split into compute (after ``next()``: copy and
    compute) and data wait (blocked in ``next()``), in ms."""
    hv = hv_bokeh()
    rows = _rows(df)
    if rows.empty or "data_wait_samples_s" not in rows:
        return _empty("per-step samples")
    rows["series"] = _series(rows)
    rows = rows.sort_values(["series", "num_workers"])
    records = []
    for (_, row), (_, part) in zip(rows.iterrows(), analysis.breakdown(rows).iterrows()):
        for name, col in (("compute", "mean_compute_s"), ("data wait", "mean_data_wait_s")):
            records.append({"configuration": _label(row), "part": name, "time_ms": part[col] * 1e3,
                            "share_pct": 100 * part[col] / part["mean_step_time_s"],
                            "bound": str(row.get("bound"))})
    data = pd.DataFrame(records)
    hover = [("configuration", "@{configuration}"), ("part", "@{part}"), ("mean per step", "@{time_ms}{0.00} ms"),
             ("share", "@{share_pct}{0.0} %"), ("bound", "@{bound}")]
    return hv.Bars(data, ["configuration", "part"], ["time_ms", "share_pct", "bound"]).opts(
        stacked=True, tools=["hover"], hover_tooltips=hover, width=width_with_legend(data["part"].unique()),
        height=400, xrotation=30,
        cmap=_PART_COLORS, color="part", **LEGEND_BESIDE, show_grid=True,
        title="Mean step time: compute and data wait", xlabel="configuration", ylabel="time per step (ms)")


def stall_bars(df: pd.DataFrame):
    """DS-Analyzer's split of the cold step per row with stall attribution: the ceiling (compute
    with the data already on the device), the prep stall and the fetch stall (negative
    differences, noise, drawn as 0 and shown signed in the hover)."""
    hv = hv_bokeh()
    rows = _rows(df)
    if rows.empty or "ceiling_step_time_s" not in rows:
        return _empty("stall attribution")
    rows = rows[rows["ceiling_step_time_s"].notna()]
    if rows.empty:
        return _empty("stall attribution")
    rows = rows.copy()
    rows["series"] = _series(rows)
    records = []
    for _, row in rows.sort_values(["series", "num_workers"]).iterrows():
        for name, col in (("ceiling (compute)", "ceiling_step_time_s"), ("prep stall", "prep_stall_s"),
                          ("fetch stall", "fetch_stall_s")):
            value = float(row[col])
            records.append({"configuration": _label(row), "part": name, "time_ms": max(value, 0.0) * 1e3,
                            "signed_ms": value * 1e3})
    data = pd.DataFrame(records)
    hover = [("configuration", "@{configuration}"), ("part", "@{part}"), ("per step", "@{signed_ms}{0.00} ms")]
    return hv.Bars(data, ["configuration", "part"], ["time_ms", "signed_ms"]).opts(
        stacked=True, tools=["hover"], hover_tooltips=hover, width=width_with_legend(data["part"].unique()),
        height=400, xrotation=30,
        cmap=_PART_COLORS, color="part", **LEGEND_BESIDE, show_grid=True,
        title="Stall attribution (DS-Analyzer): ceiling, prep and fetch stall per step",
        xlabel="configuration", ylabel="time per step (ms)")


def recommendation_table(df: pd.DataFrame, *, rec: pd.DataFrame | None = None):
    """The recommendation of every group of rows (:func:`perfkit.analyse.dataloading.recommend`,
    computed if ``rec`` is None)."""
    hv = hv_bokeh()
    rec = analysis.recommend(_rows(df)) if rec is None else rec
    if rec.empty:
        return _empty("a step throughput")
    shown = {"format": "format", "decode_cost_s": "decode s", "batch_size": "batch",
             "recommended_num_workers": "workers", "recommended_pin_memory": "pin_memory",
             "recommended_step_samples_per_s": "samples/s", "fraction_of_best": "of best",
             "recommended_bound": "bound", "best_num_workers": "best workers", "rows_compared": "rows"}
    # The storage conditions that tell groups apart (cold or warm cache, where the data lay).
    storage = {k: k for k in analysis.STORAGE_KEYS if k in rec and _text(rec[k]).nunique() > 1}
    shown = {**dict(list(shown.items())[:3]), **storage, **dict(list(shown.items())[3:])}
    table = rec[[c for c in shown if c in rec]].rename(columns=shown).copy()
    for col in ("samples/s", "of best"):
        if col in table:
            table[col] = table[col].astype(float).round(3)
    # Each column wide enough for its header (issue 55: "pin_memor"), at 7 px a character.
    widths = {c: max(len(str(c)), *(len(str(v)) for v in table[c])) * 8 + 16 for c in table.columns}
    return hv.Table(display_text(table)).opts(
        width=max(760, sum(widths.values())), height=min(60 + 28 * len(table), 400),
        title=f"Recommendation: fewest workers reaching {analysis.RECOMMEND_FRACTION:.0%} of the best step throughput")


def dataloading_summary(df: pd.DataFrame):
    """Recommendation, throughput vs workers, step breakdown and (when measured) the stall split."""
    hv = hv_bokeh()
    rows = _rows(df)
    rec = analysis.recommend(rows)  # once, for the table and the stars
    panels = [recommendation_table(rows, rec=rec), throughput_vs_workers(rows, rec=rec), step_breakdown(rows)]
    if "ceiling_step_time_s" in rows and rows["ceiling_step_time_s"].notna().any():
        panels.append(stall_bars(rows))
    return hv.Layout(panels).cols(1)


def dataloading_section(rows: pd.DataFrame, all_rows: pd.DataFrame | None = None):
    """The report section's build function: ``rows`` are the ok ``dataloader`` rows."""
    return dataloading_summary(rows)
