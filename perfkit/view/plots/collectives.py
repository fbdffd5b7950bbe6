"""Collective plots: busbw against message size with the α-β model, and a comparison across knobs.

Rows are :func:`perfkit.measuring.collectives.benchmark.run_collectives` rows as :func:`perfkit.record` stores them;
only ``status == "ok"`` rows with a positive busbw count. A configuration is one (op, in-place,
dtype, backend, world_size, device, knobs) group, the :data:`perfkit.analyse.commfit.DEFAULT_BY` columns.
busbw follows nccl-tests (``shared/reference/formulas.md``): algbw × 2(n−1)/n for all_reduce.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ._common import LEGEND_BESIDE, OVERLAY_LEGEND, display_scale, format_si, hv_bokeh, mapping_label, ok_rows, whole, width_with_legend

__all__ = ["busbw_vs_size", "knob_comparison", "knobs_label", "fit_summary"]

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_HOLLOW = {True: 0.0, False: 1.0}


def _config_columns(df: pd.DataFrame) -> list[str]:
    from perfkit.analyse.commfit import DEFAULT_BY

    return [c for c in DEFAULT_BY if c in df.columns]


def _collective_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """ok rows of the collectives workload with a positive finite busbw, noisy as a bool."""
    data = ok_rows(rows)
    if "workload" in data:
        data = data[data["workload"].isna() | (data["workload"] == "collectives")]
    need = {"op", "size_bytes", "busbw_bytes_per_s"}
    if data.empty or not need <= set(data.columns):
        return data.iloc[0:0]
    busbw = pd.to_numeric(data["busbw_bytes_per_s"], errors="coerce")
    data = data[busbw.notna() & (busbw > 0) & (busbw < math.inf)].copy()
    data["noisy"] = data["noisy"].fillna(False).astype(bool) if "noisy" in data else False
    if "inplace" in data:
        data["inplace"] = data["inplace"].astype(bool)
    if "knobs" in data:
        data["knobs"] = data["knobs"].fillna("{}").astype(str)
    return data


def knobs_label(knobs: str) -> str:
    """'{"NCCL_ALGO": "Ring"}' → 'NCCL_ALGO=Ring'; an empty setting → 'defaults'."""
    return mapping_label(knobs, empty="defaults")


def _format_time(seconds: float) -> str:
    """Display only: 3.7e-4 → '372 µs'."""
    if seconds != seconds:
        return "unknown"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _with_ci(value: float, low: float, high: float, fmt) -> str:
    """Display only: '25.1 µs (95 % CI 24.3 µs – 26 µs)'."""
    return f"{fmt(value)} (95 % CI {fmt(low)} – {fmt(high)})"


def fit_summary(fit) -> dict[str, str]:
    """Display only: α, β, S½ and the verdict of one :func:`perfkit.analyse.commfit.fit_alpha_beta` row,
    as the plot's hover shows them (an unresolved parameter by its bound)."""
    def bw(x):
        return format_si(x, "B/s")

    if fit["alpha_resolved"]:
        alpha = _with_ci(fit["alpha_s"], fit["alpha_ci_low_s"], fit["alpha_ci_high_s"], _format_time)
    else:
        alpha = f"unresolved, ≤ {_format_time(fit['alpha_upper_s'])}"
    if fit["beta_resolved"]:
        beta = _with_ci(fit["beta_bytes_per_s"], fit["beta_ci_low_bytes_per_s"], fit["beta_ci_high_bytes_per_s"], bw)
    else:
        beta = f"unresolved, ≥ {bw(fit['beta_lower_bytes_per_s'])}"
    half = fit["half_bandwidth_bytes"]
    return {"alpha": alpha, "beta": beta, "s_half": format_si(half, "B") if half == half else "unknown",
            "verdict": f"{fit['fit_note']} (relative RMS residual {fit['rel_rms_residual']:.2f})"}


def _drawable(fit) -> bool:
    """The model is drawn only where it describes the data and both α and β are resolved."""
    return bool(fit["fit_ok"] and fit["alpha_resolved"] and fit["beta_resolved"])


def _labeller(data: pd.DataFrame):
    """A function key-dict → short label naming only what differs between configurations."""
    varying = {c for c in ("dtype", "device", "knobs", "env_device_name", "source_path")
               if c in data and data[c].nunique() > 1}

    def label(key: dict) -> str:
        parts = [str(key.get("op", "?")) + (" in-place" if key.get("inplace") else "")]
        if "backend" in key or "world_size" in key:
            parts.append(f"{key.get('backend', '?')}×{whole(key.get('world_size', '?'))}")
        parts += [str(key[c]) for c in ("dtype", "device", "env_device_name") if c in varying]
        if "source_path" in varying and isinstance(key.get("source_path"), str):
            parts.append(key["source_path"].rsplit("/", 1)[-1])  # an imported file
        if "knobs" in varying:
            parts.append(knobs_label(key["knobs"]))
        return " ".join(parts)

    return label


def _groups(data: pd.DataFrame, by: list[str]):
    if not by:
        yield {}, data
        return
    for key, group in data.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        yield dict(zip(by, key)), group


def _matches(frame: pd.DataFrame, key: dict) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for col, value in key.items():
        if col in frame:
            column = frame[col].astype(bool) if col == "inplace" else frame[col]
            missing = value is None or (isinstance(value, float) and math.isnan(value))
            mask &= column.isna() if missing else (column == value)
    return mask


def _fits_for(data: pd.DataFrame, fits):
    from perfkit.analyse.commfit import fit_alpha_beta

    if fits is not None:
        return fits
    if "time_s" not in data:
        return None
    device_col = "env_device_name" if "env_device_name" in data else None
    return fit_alpha_beta(data, device_col=device_col)


def busbw_vs_size(rows: pd.DataFrame, fits: pd.DataFrame | None = None):
    """busbw vs message size S (log-log), one line per configuration, each with its α-β model.

    ``fits`` is a :func:`perfkit.analyse.commfit.fit_alpha_beta` frame; None fits the ok rows here, an
    empty frame draws no model. The model's busbw (dashed, the configuration's colour) is
    busbw factor × S / (α + S/β) over the measured sizes: it rises with S and saturates at
    β × factor, and a diamond marks S½ = α·β, where it is half that. It is drawn only for a good
    fit with α and β both resolved; otherwise nothing is drawn, and every point's hover says why
    (α or β unresolved with its bound, or a bad fit). α and β with their 95 % intervals are in
    the hover of the points and of the curve. The points are the rows' busbw, from ``time_s``
    (nccl-tests' mean); the model is fitted to each size's median time (:mod:`perfkit.analyse.commfit`),
    which the line and its markers draw (with the IQR as a bar) when the rows carry
    ``time_median_s``: the means are × marks beside them, since preemption on a busy host inflates
    means. A known spec
    link bandwidth of an nccl configuration is drawn as a horizontal line. Noisy points
    (IQR/median > 0.1) are hollow.
    """
    from perfkit.analyse.commfit import busbw_curve

    hv = hv_bokeh()
    data = _collective_rows(rows)
    if data.empty:
        return hv.Div("<p>No collectives rows with status ok and a positive busbw.</p>")
    by = _config_columns(data)
    fits = _fits_for(data, fits)
    links = {}
    if fits is not None and not fits.empty and "spec_link_bytes_per_s" in fits:
        for f in fits.itertuples():
            backend = getattr(f, "backend", "nccl")
            value = f.spec_link_bytes_per_s
            if backend == "nccl" and value == value and math.isfinite(value):
                links[float(value)] = getattr(f, "spec_link_source", None)
    scale, prefix = display_scale(data["busbw_bytes_per_s"].tolist() + list(links))
    unit = f"{prefix}B/s"
    hover = [("configuration", "@{config}"), ("op", "@{op}"), ("size", "@{size}"), ("time", "@{time}"),
             ("median time", "@{median_time}"),
             ("busbw", f"@{{busbw}}{{0.000}} {unit}"), ("algbw", f"@{{algbw}}{{0.000}} {unit}"),
             ("wrong elements", "@{wrong_elements}"), ("knobs", "@{knobs}"), ("knob check", "@{knob_check}"),
             ("noisy", "@{noisy}"), ("α", "@{alpha}"), ("β", "@{beta}"), ("α-β fit", "@{verdict}")]
    vdims = ["busbw", "config", "op", "size", "time", "median_time", "algbw", "wrong_elements", "knobs",
             "knob_check", "noisy", "alpha", "beta", "verdict"]
    model_hover = [("configuration", "@{config}"), ("α", "@{alpha}"), ("β", "@{beta}"), ("S½ = α·β", "@{s_half}"),
                   ("α-β fit", "@{verdict}"), ("size", "@{size}"), ("model busbw", f"@{{busbw}}{{0.000}} {unit}")]
    model_vdims = ["busbw", "config", "alpha", "beta", "s_half", "verdict", "size"]
    no_fit = {"alpha": "no fit", "beta": "no fit", "s_half": "unknown", "verdict": "no fit"}
    label = _labeller(data)
    elements, ys, names = [], [], []
    drew_medians = drew_model = False
    for i, (key, group) in enumerate(_groups(data, by)):
        name, color = label(key), _PALETTE[i % len(_PALETTE)]
        names.append(name)
        group = group.sort_values("size_bytes")
        fit_frame = fits[_matches(fits, key)].iloc[:1] if fits is not None and not fits.empty else None
        fit = fit_frame.iloc[0] if fit_frame is not None and not fit_frame.empty else None
        summary = fit_summary(fit) if fit is not None else no_fit
        points = pd.DataFrame({
            "size_bytes": group["size_bytes"].astype(float),
            "busbw": group["busbw_bytes_per_s"].astype(float) / scale,
            "config": name, "op": group["op"].astype(str),
            "size": [format_si(s, "B") for s in group["size_bytes"]],
            "time": [_format_time(t) for t in group["time_s"]] if "time_s" in group else "unknown",
            "median_time": ([_format_time(t) for t in group["time_median_s"]]
                            if "time_median_s" in group else "unknown"),
            "algbw": (group["algbw_bytes_per_s"].astype(float) / scale
                      if "algbw_bytes_per_s" in group else math.nan),
            "wrong_elements": group["wrong_elements"].astype(str) if "wrong_elements" in group else "unknown",
            "knobs": [knobs_label(k) for k in group["knobs"]] if "knobs" in group else "",
            "knob_check": group["knob_check"].astype(str) if "knob_check" in group else "unknown",
            "noisy": group["noisy"].astype(bool), **summary,
        })
        ys += points["busbw"].tolist()
        shown = points
        if "time_median_s" in group and "algbw_bytes_per_s" in group:
            # The line and its markers are each size's median time as busbw, with the IQR as a
            # bar (issue 55: the line followed the rows' time_s, nccl-tests' mean, which
            # preemption on a busy host inflates, 5-10x off the medians); the means are × marks.
            factor = (group["busbw_bytes_per_s"] / group["algbw_bytes_per_s"]).to_numpy()
            size = group["size_bytes"].to_numpy(dtype=float)
            median = group["time_median_s"].to_numpy(dtype=float)
            shown = points.assign(busbw=size / median * factor / scale)
            if "time_iqr_s" in group:
                half = group["time_iqr_s"].to_numpy(dtype=float) / 2
                fast, slow = np.maximum(median - half, 1e-15), median + half
                bars = pd.DataFrame({"size_bytes": size, "busbw": size / median * factor / scale,
                                     "low": size / median * factor / scale - size / slow * factor / scale,
                                     "high": size / fast * factor / scale - size / median * factor / scale})
                bars = bars[np.isfinite(bars["busbw"]) & (bars["busbw"] > 0)]
                elements.append(hv.ErrorBars(bars, "size_bytes", ["busbw", "low", "high"]).opts(color=color))
            means = points[np.isfinite(points["busbw"]) & (points["busbw"] > 0)]
            elements.append(hv.Points(means, ["size_bytes", "busbw"], vdims[1:], label=f"{name} mean").opts(
                color=color, marker="x", size=7, show_legend=False, tools=["hover"],
                hover_tooltips=[("busbw of the mean time (nccl-tests)" if k == "busbw" else k, v) for k, v in hover]))
            shown = shown[np.isfinite(shown["busbw"]) & (shown["busbw"] > 0)]
            ys += shown["busbw"].tolist()
            drew_medians = True
        line = shown.groupby("size_bytes", as_index=False)["busbw"].median()  # repeats: one line
        elements.append(hv.Curve(line, "size_bytes", "busbw", label=name).opts(color=color))
        elements.append(hv.Scatter(shown, "size_bytes", vdims, label=name).opts(
            color=color, size=8, tools=["hover"], hover_tooltips=[
                ("busbw of the median time" if k == "busbw" and shown is not points else k, v) for k, v in hover],
            fill_alpha=hv.dim("noisy").categorize(_HOLLOW, default=1.0)))
        if fit is not None and _drawable(fit):
            curve = busbw_curve(fit_frame)
            model = pd.DataFrame({"size_bytes": curve["size_bytes"].astype(float),
                                  "busbw": curve["busbw_bytes_per_s"].astype(float) / scale,
                                  "config": name, "size": [format_si(x, "B") for x in curve["size_bytes"]],
                                  **summary})
            elements.append(hv.Curve(model, "size_bytes", model_vdims, label=f"{name} α-β model").opts(
                color=color, line_dash="dashed", line_width=1.5, show_legend=False,
                tools=["hover"], hover_tooltips=model_hover))
            # S½: algbw = β/2, so busbw is half its asymptote there.
            half = pd.DataFrame({"size_bytes": [float(fit["half_bandwidth_bytes"])],
                                 "busbw": [fit["busbw_asymptote_bytes_per_s"] / 2 / scale], "config": name,
                                 "size": format_si(fit["half_bandwidth_bytes"], "B"), **summary})
            elements.append(hv.Points(half, ["size_bytes", "busbw"], model_vdims[1:], label=f"{name} S½").opts(
                color=color, marker="diamond", size=13, line_color="black", show_legend=False,
                tools=["hover"], hover_tooltips=model_hover))
            ys += model["busbw"].tolist()
            drew_model = True
    x_text = float(data["size_bytes"].min())
    for value, source in sorted(links.items()):
        elements.append(hv.HLine(value / scale).opts(color="gray", line_dash="dotted", line_width=1.5))
        elements.append(hv.Text(x_text, value / scale, f" spec link {format_si(value, 'B/s')} ({source})",
                                halign="left", valign="bottom", fontsize=8))
        ys.append(value / scale)
    ys = [y for y in ys if y > 0 and math.isfinite(y)]
    return hv.Overlay(elements).opts(
        hv.opts.Curve(logx=True, logy=True),
        hv.opts.Overlay(title=_busbw_title(drew_medians, drew_model),
                        xlabel="message size S (bytes)", ylabel=f"busbw ({unit})", logx=True,
                        logy=True, ylim=(min(ys) / 2, max(ys) * 2), width=width_with_legend(names, 680), height=480,
                        **OVERLAY_LEGEND, show_grid=True),
    )


def _busbw_title(medians: bool, model: bool) -> str:
    """The title says what the plot draws, and only that (issue 55: it promised a dashed α–β model
    and ◆ S½ where no fit was good enough to draw)."""
    parts = ["line: each size's median time, bar: its IQR, ×: the mean" if medians else "line: each size's time"]
    if model:
        parts.append("dashed: α-β model, ◆ S½")
    return f"Collective busbw ({'; '.join(parts)}; hollow: noisy)"


def _hide_setting_ticks(plot, element):
    # The legend names the settings; the nested axis keeps only the configuration labels.
    plot.state.xaxis.major_label_text_font_size = "0pt"


def knob_comparison(rows: pd.DataFrame):
    """Peak busbw per knob setting, grouped bars per configuration (op, form, backend×ranks).

    Each bar is the highest busbw over the sizes measured with that setting; the hover gives
    the size it was reached at and its ratio to the ``defaults`` setting (no knobs) of the same
    configuration, or to the first setting when there is none. One setting gives one bar each.
    """
    hv = hv_bokeh()
    data = _collective_rows(rows)
    if data.empty:
        return hv.Div("<p>No collectives rows with status ok and a positive busbw.</p>")
    if "knobs" not in data:
        data = data.assign(knobs="{}")
    by = [c for c in _config_columns(data) if c != "knobs"]
    label = _labeller(data.assign(knobs="{}"))  # knobs are the bars, not part of the group name
    best = data.loc[data.groupby(by + ["knobs"], dropna=False)["busbw_bytes_per_s"].idxmax()]
    scale, prefix = display_scale(best["busbw_bytes_per_s"].tolist())
    unit = f"{prefix}B/s"
    bars = []
    for key, group in _groups(best, by):
        ref = group[group["knobs"] == "{}"]
        ref_value = float((ref if not ref.empty else group.iloc[:1])["busbw_bytes_per_s"].iloc[0])
        ref_name = knobs_label((ref if not ref.empty else group.iloc[:1])["knobs"].iloc[0])
        for row in group.itertuples():
            bars.append({
                "configuration": label(key), "setting": knobs_label(row.knobs),
                "busbw": row.busbw_bytes_per_s / scale,
                "at_size": format_si(row.size_bytes, "B"),
                "vs_ref": f"{row.busbw_bytes_per_s / ref_value:.2f}× {ref_name}",
                "noisy": bool(row.noisy),
                "wrong_elements": str(getattr(row, "wrong_elements", "unknown")),
                "knob_check": str(getattr(row, "knob_check", "unknown")),
            })
    frame = pd.DataFrame(bars)
    hover = [("configuration", "@{configuration}"), ("knobs", "@{setting}"),
             ("peak busbw", f"@{{busbw}}{{0.000}} {unit}"), ("at size", "@{at_size}"), ("vs", "@{vs_ref}"),
             ("noisy", "@{noisy}"), ("wrong elements", "@{wrong_elements}"), ("knob check", "@{knob_check}")]
    vdims = ["busbw", "at_size", "vs_ref", "noisy", "wrong_elements", "knob_check"]
    settings = frame["setting"].nunique()
    return hv.Bars(frame, ["configuration", "setting"], vdims).opts(
        tools=["hover"], hover_tooltips=hover, color="setting", cmap="Category10",
        title=f"Peak busbw per knob setting ({settings} setting{'s' if settings != 1 else ''})",
        xlabel="configuration (bars: knob settings)", ylabel=f"peak busbw ({unit})",
        width=width_with_legend(frame["setting"].unique(),
                           max(420, 50 * len(frame), 180 * frame["configuration"].nunique())),
        height=440, show_legend=True,
        **LEGEND_BESIDE, show_grid=True, hooks=[_hide_setting_ticks],
    )
