"""Scaling plots: efficiency and throughput against world size, and the step-time breakdown.

Inputs are the DataFrames :mod:`perfkit.analyse.scaling` returns: :func:`scaling_efficiency` output for
the first two plots, :func:`step_breakdown` output for the third. One line per series
(``series`` columns, by default parallelism and scaling mode); points whose step time is noisy
(IQR/median > 0.1) are drawn hollow.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ._common import LEGEND_BESIDE, OVERLAY_LEGEND, whole, display_scale, hv_bokeh, ok_rows, width_with_legend

__all__ = ["efficiency_vs_world_size", "throughput_vs_world_size", "breakdown_bars",
           "scaling_section", "prediction_section", "prediction_breakdown"]

_BASELINES = {"none": "no wrapper", "wrapper": "wrapper on 1 rank"}
_SERIES = ("parallelism", "scaling_mode")
_COMPONENTS = ("forward + backward", "optimizer", "exposed communication", "straggler idle")
#: Settings that tell a sweep's configurations apart; the ones that vary join the series label.
_SETTINGS = ("model", "precision", "batch", "steps", "threads_per_rank", "compile",
             "activation_checkpointing")
_COLORS = {"forward + backward": "#4c78a8", "optimizer": "#72b7b2", "exposed communication": "#f58518",
           "straggler idle": "#b8b8b8"}


def _label(row, series: Sequence[str]) -> str:
    """The wrapper and mode as they are, any other setting that varies as ``name=value``, whole
    numbers as integers (issue 55: "ddp strong 64.0")."""
    plain = {"parallelism", "mode", "scaling_mode", "precision", "model"}  # their values name themselves
    return " ".join(str(whole(row[c])) if c in plain else f"{c}={whole(row[c])}" for c in series if c in row.index)


def _world_ticks(rows: pd.DataFrame) -> list[int]:
    """World sizes are whole ranks: tick them, never 1.2, 1.4 … 1.8 (issue 55)."""
    return sorted({int(w) for w in rows["world_size"].dropna()})


def _world_lim(rows: pd.DataFrame) -> tuple[float, float]:
    """The world-size axis with room for the first and last points' markers."""
    ticks = _world_ticks(rows)
    pad = max(0.25, 0.06 * (ticks[-1] - ticks[0])) if ticks else 0.5
    return (ticks[0] - pad, ticks[-1] + pad) if ticks else (0.5, 2.5)


def _wrapped(df: pd.DataFrame) -> pd.DataFrame:
    rows = ok_rows(df)
    return rows[rows["parallelism"] != "none"] if "parallelism" in rows else rows


def _noisy(df: pd.DataFrame) -> pd.Series:
    return df["noisy"].fillna(False).astype(bool) if "noisy" in df else pd.Series(False, df.index)


def _points(hv, data: pd.DataFrame, x: str, y: str, vdims: list[str], label: str, hover):
    data = data.sort_values(x)
    curve = hv.Curve(data, x, [y] + vdims, label=label)
    dots = hv.Scatter(data, x, [y] + vdims, label=label).opts(
        tools=["hover"], hover_tooltips=hover, size=9,
        fill_alpha=hv.dim("noisy").categorize({True: 0.0, False: 1.0}, default=1.0))
    return [curve, dots]


def efficiency_vs_world_size(df: pd.DataFrame, *, baselines: Sequence[str] = ("none", "wrapper"),
                             series: Sequence[str] = _SERIES):
    """Scaling efficiency vs world size, one line per series and baseline, ideal 1.0 dashed.

    ``df`` is :func:`perfkit.analyse.scaling.scaling_efficiency` output; ``baselines`` picks the
    ``efficiency_vs_<baseline>`` columns (``none``: the plain module, ``wrapper``: the wrapper
    on one rank, which leaves the wrapper's own cost out)."""
    hv = hv_bokeh()
    rows = _wrapped(df)
    hover = [("series", "@{series}"), ("world size", "@{world_size}"), ("efficiency", "@{efficiency}{0.000}"),
             ("speedup", "@{speedup}{0.000}"), ("step time", "@{step_time_s}{0.000000} s"),
             ("T(1)", "@{baseline_step_time_s}{0.000000} s"), ("noisy", "@{noisy}")]
    vdims = ["series", "speedup", "step_time_s", "baseline_step_time_s", "noisy"]
    elements, tops = [], [1.0]
    for baseline in baselines:
        column = f"efficiency_vs_{baseline}"
        if column not in rows:
            continue
        for _, group in rows[rows[column].notna()].groupby(list(series), sort=True, dropna=False):
            label = f"{_label(group.iloc[0], series)} vs {_BASELINES.get(baseline, baseline)}"
            data = pd.DataFrame({
                "world_size": group["world_size"].astype(int), "efficiency": group[column],
                "series": label, "speedup": group[f"speedup_vs_{baseline}"],
                "step_time_s": group["step_time_s"],
                "baseline_step_time_s": group[f"baseline_{baseline}_step_time_s"],
                "noisy": _noisy(group)})
            tops.append(float(data["efficiency"].max()))
            elements += _points(hv, data, "world_size", "efficiency", vdims, label, hover)
    if not elements:
        return hv.Div("<p>No scaling points with status ok and a baseline.</p>")
    ideal = hv.HLine(1.0).opts(line_dash="dashed", color="gray", line_width=1.5)
    text = hv.Text(float(rows["world_size"].min()), 1.0, " ideal", halign="left",
                   valign="bottom", fontsize=8)
    return hv.Overlay(elements + [ideal, text]).opts(
        hv.opts.Overlay(title="Scaling efficiency (dashed: ideal 1.0; hollow: noisy)",
                        xlabel="world size (ranks)", ylabel="efficiency", ylim=(0, max(tops) * 1.15),
                        xticks=_world_ticks(rows), xlim=_world_lim(rows),
                        width=width_with_legend(elements), height=400, **OVERLAY_LEGEND, show_grid=True))


def throughput_vs_world_size(df: pd.DataFrame, *, baseline: str = "none",
                             series: Sequence[str] = _SERIES):
    """Samples/s vs world size, one line per series, with the ideal linear N·X(1) dashed.

    X(1) is the ``baseline`` one-device throughput (``none`` or ``wrapper``) that
    :func:`perfkit.analyse.scaling.scaling_efficiency` matched: N·X(1) = X(N) / throughput efficiency."""
    hv = hv_bokeh()
    rows = _wrapped(df)
    rows = rows[rows["samples_per_s"].notna()] if "samples_per_s" in rows else rows.iloc[0:0]
    if rows.empty:
        return hv.Div("<p>No scaling points with status ok and a throughput.</p>")
    column = f"throughput_efficiency_vs_{baseline}"
    ideal_all = rows["samples_per_s"] / rows[column] if column in rows else rows["samples_per_s"] * float("nan")
    scale, prefix = display_scale(rows["samples_per_s"].tolist() + ideal_all.dropna().tolist())
    unit = f"{prefix}samples/s"
    hover = [("series", "@{series}"), ("world size", "@{world_size}"),
             ("throughput", f"@{{throughput}}{{0.000}} {unit}"), ("ideal", f"@{{ideal}}{{0.000}} {unit}"),
             ("speedup", "@{speedup}{0.000}"), ("noisy", "@{noisy}")]
    vdims = ["series", "ideal", "speedup", "noisy"]
    elements = []
    for _, group in rows.groupby(list(series), sort=True, dropna=False):
        label = _label(group.iloc[0], series)
        data = pd.DataFrame({
            "world_size": group["world_size"].astype(int),
            "throughput": group["samples_per_s"] / scale, "series": label,
            "ideal": ideal_all[group.index] / scale,
            "speedup": group.get(f"speedup_vs_{baseline}", float("nan")),
            "noisy": _noisy(group)})
        elements += _points(hv, data, "world_size", "throughput", vdims, label, hover)
        ideal = data[data["ideal"].notna()].sort_values("world_size")
        if len(ideal):
            elements.append(hv.Curve(ideal, "world_size", "ideal", label=f"{label} ideal").opts(
                line_dash="dashed", color="gray"))
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title=f"Throughput (dashed: ideal N·X(1), X(1) {_BASELINES.get(baseline, baseline)})",
                        xlabel="world size (ranks)", ylabel=f"throughput ({unit})", width=width_with_legend(elements),
                        xticks=_world_ticks(rows), xlim=_world_lim(rows),
                        height=400, **OVERLAY_LEGEND, show_grid=True))


def breakdown_bars(df: pd.DataFrame, *, series: Sequence[str] = ("parallelism",)):
    """Stacked bars per point (series × world size): forward + backward, optimizer, exposed
    communication, straggler.

    ``df`` is :func:`perfkit.analyse.scaling.step_breakdown` output: compute =
    ``typical_rank_compute_time_s``, of which ``optimizer_time_s`` (the synchronised step's
    optimizer, timed apart) is drawn as optimizer and the rest as forward + backward; straggler
    idle = ``straggler_time_s`` (slowest rank's compute − the other ranks' median), exposed
    communication = ``exposed_comm_time_s`` (step − compute-only step); they stack to the step
    time. A point without per-rank compute times draws its whole ``compute_time_s`` as compute,
    one without an optimizer time all of it as forward + backward. A negative part (noise larger
    than the communication) is drawn as 0; the hover has the values."""
    hv = hv_bokeh()
    rows = ok_rows(df)
    rows = rows[rows["compute_time_s"].notna()] if "compute_time_s" in rows else rows.iloc[0:0]
    if rows.empty:
        return hv.Div("<p>No points with status ok and a compute-only time.</p>")
    rows = rows.sort_values(["world_size", *[c for c in series if c in rows]])
    straggler = rows["straggler_time_s"].fillna(0.0)
    compute = rows["compute_time_s"] - straggler
    optimizer = (rows["optimizer_time_s"].fillna(0.0).clip(upper=compute) if "optimizer_time_s" in rows
                 else pd.Series(0.0, index=rows.index))
    parts = {"forward + backward": compute - optimizer, "optimizer": optimizer,
             "exposed communication": rows["exposed_comm_time_s"],
             "straggler idle": straggler}
    factor, prefix = display_scale(rows["step_time_s"].tolist(), below_one=True)
    unit = f"{prefix}s"
    records = []
    for i, (_, row) in enumerate(rows.iterrows()):
        point = f"N={int(row['world_size'])} {_label(row, series)}"
        for component in _COMPONENTS:
            value = float(parts[component].iloc[i])
            records.append({"point": point, "component": component,
                            "time": max(value, 0.0) / factor, "value_s": value,
                            "step_time_s": float(row["step_time_s"]),
                            "noisy": bool(_noisy(rows).iloc[i])})
    data = pd.DataFrame(records)
    hover = [("point", "@{point}"), ("part", "@{component}"), ("time", f"@{{time}}{{0.000}} {unit}"),
             ("value", "@{value_s}{0.000000} s"), ("step time", "@{step_time_s}{0.000000} s"),
             ("noisy", "@{noisy}")]
    bars = hv.Bars(data, ["point", "component"], ["time", "value_s", "step_time_s", "noisy"])
    return bars.opts(
        stacked=True, tools=["hover"], hover_tooltips=hover, width=width_with_legend(data["component"].unique()),
        height=400,
        cmap=_COLORS, color="component", **LEGEND_BESIDE, show_grid=True,
        title="Step time breakdown (stacks to the step time)", xlabel="point",
        ylabel=f"time ({unit})")


def scaling_section(rows: pd.DataFrame, all_rows: pd.DataFrame | None = None):
    """The report's scaling section: ``rows`` are the ``workload == "scaling"`` rows (ok ones).

    Each configuration is analysed on its own (:func:`perfkit.analyse.scaling.scaling_efficiency` with
    the configuration's ``mode``, and :func:`perfkit.analyse.scaling.step_breakdown`): it carries its own
    baselines, measured in the same launch as its wrapper-on-one-rank point. Settings that vary
    across configurations join the series labels."""
    from perfkit.analyse.scaling import scaling_efficiency, step_breakdown

    hv = hv_bokeh()
    groups = rows.groupby("config_id", sort=True) if "config_id" in rows else [(None, rows)]
    parts = []
    for _, group in groups:
        modes = group["mode"].dropna().unique() if "mode" in group else []
        mode = modes[0] if len(modes) == 1 and modes[0] in ("strong", "weak") else "auto"
        parts.append(step_breakdown(scaling_efficiency(group, mode=mode)))
    if not parts:
        return hv.Div("<p>No scaling rows.</p>")
    df = pd.concat(parts, ignore_index=True)
    varying = [c for c in _SETTINGS if c in df and df[c].astype(str).nunique() > 1]
    # The configuration's own mode, not scaling_mode: that one calls its baselines "baseline".
    series = ["parallelism", "mode" if "mode" in df else "scaling_mode", *varying]
    return hv.Layout([efficiency_vs_world_size(df, series=series),
                      throughput_vs_world_size(df, series=series),
                      breakdown_bars(df, series=series)]).cols(1)


def prediction_section(rows: pd.DataFrame, all_rows: pd.DataFrame | None = None):
    """``perfkit predict --record``'s rows: the predicted step time against world size (dashed,
    one line per layout, base and network; the latest prediction of each point), the measured step
    at the same point beside it where the folder has one (filled markers, the error in the hover)."""
    hv = hv_bokeh()
    rows = ok_rows(rows)
    keys = ["base_config", "network_source", "layout", "world_size"]
    if rows.empty or any(k not in rows for k in keys + ["predicted_step_time_s"]):
        return hv.Div("<p>No predictions.</p>")
    rows = rows.sort_values("predicted_at_unix_s").drop_duplicates(keys, keep="last")
    hover = [("series", "@{series}"), ("world size", "@{world_size}"), ("step", "@{step_ms}{0.000} ms"),
             ("error", "@{error}{+0.0%}"), ("note", "@{note}")]
    elements = []
    for (base, network, layout), group in rows.groupby(keys[:3], sort=True):
        group = group.sort_values("world_size")
        label = f"{layout} from {str(base).split('/')[0]}"
        predicted = pd.DataFrame({"world_size": group["world_size"].astype(int),
                                  "step_ms": group["predicted_step_time_s"] * 1e3, "series": f"predicted {label}",
                                  "error": group.get("prediction_error", float("nan")),
                                  "note": group.get("extrapolation", "").fillna("")})
        elements.append(hv.Curve(predicted, "world_size", ["step_ms", "series", "error", "note"],
                                 label=f"predicted {label}").opts(line_dash="dashed"))
        elements.append(hv.Scatter(predicted, "world_size", ["step_ms", "series", "error", "note"],
                                   label=f"predicted {label}").opts(tools=["hover"], hover_tooltips=hover, size=7,
                                                                    marker="circle", fill_alpha=0.0))
        measured = predicted.assign(step_ms=group["measured_step_time_s"].to_numpy() * 1e3,
                                    series=f"measured {label}").dropna(subset=["step_ms"])
        if len(measured):
            elements.append(hv.Scatter(measured, "world_size", ["step_ms", "series", "error", "note"],
                                       label=f"measured {label}").opts(tools=["hover"], hover_tooltips=hover,
                                                                       size=10, marker="diamond"))
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title="Predicted step time (dashed, hollow: perfkit predict; diamonds: measured at the same point)",
                        xlabel="world size (ranks)", ylabel="step time (ms)", logx=True, xticks=_world_ticks(rows),
                        width=width_with_legend(elements), height=400, **OVERLAY_LEGEND, show_grid=True))


def prediction_breakdown(rows: pd.DataFrame):
    """Each predicted point's step stacked (compute, exposed communication, a pipeline's bubble), one
    bar per layout and world size; the hover has the total communication (overlapped or not), the
    measured step where the folder has one, and what the point extrapolates."""
    hv = hv_bokeh()
    rows = ok_rows(rows)
    if rows.empty or "predicted_step_time_s" not in rows:
        return hv.Div("<p>No predictions.</p>")
    rows = rows.sort_values(["layout", "world_size"])
    records = []
    for _, row in rows.iterrows():
        point = f"{row['layout']} N={int(row['world_size'])}"
        bubble = float(row.get("predicted_bubble_time_s") or 0.0)
        parts = {"compute": float(row["predicted_compute_time_s"]) - bubble, "pipeline bubble": bubble,
                 "exposed communication": float(row["predicted_exposed_comm_time_s"])}
        for part, value in parts.items():
            records.append({"point": point, "part": part, "time_ms": max(value, 0.0) * 1e3,
                            "step_ms": float(row["predicted_step_time_s"]) * 1e3,
                            "comm_ms": float(row["predicted_comm_time_s"]) * 1e3,
                            "measured_ms": float(row.get("measured_step_time_s", float("nan"))) * 1e3,
                            "note": "; ".join(str(x) for x in (row.get("extrapolation"), row.get("message_size_flags"))
                                              if isinstance(x, str) and x)})
    data = pd.DataFrame(records)
    hover = [("point", "@{point}"), ("part", "@{part}"), ("time", "@{time_ms}{0.00} ms"), ("step", "@{step_ms}{0.00} ms"),
             ("all communication", "@{comm_ms}{0.00} ms"), ("measured", "@{measured_ms}{0.00} ms"), ("note", "@{note}")]
    bars = hv.Bars(data, ["point", "part"], ["time_ms", "step_ms", "comm_ms", "measured_ms", "note"])
    return bars.opts(stacked=True, tools=["hover"], hover_tooltips=hover, width=width_with_legend(data["part"].unique()),
                     height=400, color="part", cmap={"compute": "#4c9f70", "pipeline bubble": "#bbbbbb",
                                                     "exposed communication": "#e8833a"},
                     **LEGEND_BESIDE, show_grid=True, xrotation=30,
                     title="Predicted step, stacked: compute, exposed communication (hover: all of it, the measured step)",
                     xlabel="layout and world size", ylabel="time (ms)")
