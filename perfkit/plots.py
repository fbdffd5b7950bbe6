"""Plots: holoviews (bokeh) objects built from results DataFrames. No measuring, no I/O.

Every function takes rows as :func:`perfkit.results.load` returns them and returns a holoviews
object that displays in JupyterLab and renders into the standalone report. Noisy points
(IQR/median > 0.1) are drawn hollow and say so in their hover.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["gemm_throughput", "ceiling_lines", "format_si", "ok_rows"]

_ORIGIN_DASH = {"measured": "solid", "spec": "dashed", "theoretical": "dotted"}


def _hv():
    import holoviews as hv

    if not hv.Store.current_backend or "bokeh" not in hv.Store.renderers:
        hv.extension("bokeh", logo=False)
    return hv


def format_si(value: float, unit: str) -> str:
    """1.23e12 FLOP/s → '1.23 TFLOP/s' (display only; data stays in SI base units)."""
    if value is None or pd.isna(value):
        return "unknown"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df else df


def _display_scale(values) -> tuple[float, str]:
    """Factor and prefix for an axis whose largest value is max(values) (display only)."""
    top = max((v for v in values if v == v), default=1.0)
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= factor:
            return factor, prefix
    return 1.0, ""


def ceiling_lines(ceilings: pd.DataFrame, dtypes, *, scale: float = 1.0, x_text: float = 1.0) -> list:
    """Horizontal lines for the compute ceilings of ``dtypes``: solid measured, dashed spec,
    dotted theoretical; each labelled with its value and origin (values divided by ``scale``)."""
    hv = _hv()
    lines = []
    if ceilings is None or ceilings.empty:
        return lines
    compute = ceilings[(ceilings["kind"] == "compute") & ceilings["dtype"].isin(list(dtypes))]
    for row in compute.itertuples():
        label = f"{row.dtype} {row.origin} peak {format_si(row.value, 'FLOP/s')}"
        lines.append(
            hv.HLine(row.value / scale).opts(
                line_dash=_ORIGIN_DASH.get(row.origin, "dashdot"), line_width=1.5, color="gray")
        )
        lines.append(hv.Text(x_text, row.value / scale, f" {label}", halign="left", valign="bottom",
                             fontsize=8))
    return lines


def gemm_throughput(df: pd.DataFrame, ceilings: pd.DataFrame | None = None):
    """Achieved FLOP/s vs matrix size, one line per dtype, with the device's peaks as lines."""
    hv = _hv()
    rows = ok_rows(df)
    rows = rows[rows["flop_per_s"].notna()] if "flop_per_s" in rows else rows.iloc[0:0]
    if rows.empty:
        return hv.Div("<p>No GEMM rows with status ok.</p>")
    dtypes = sorted(rows["dtype"].unique())
    peaks = []
    if ceilings is not None and not ceilings.empty:
        peaks = ceilings[(ceilings["kind"] == "compute") & ceilings["dtype"].isin(dtypes)]["value"].tolist()
    scale, prefix = _display_scale(rows["flop_per_s"].tolist() + peaks)
    unit = f"{prefix}FLOP/s"
    hover = [("dtype", "@dtype"), ("size", "@size"), ("achieved", f"@achieved{{0.000}} {unit}"),
             ("median time", "@time_s{0.000000} s"), ("IQR", "@time_iqr_s{0.000000} s"),
             ("noisy", "@noisy")]
    vdims = ["achieved", "dtype", "time_s", "time_iqr_s", "noisy"]
    curves = []
    for dtype, group in rows.sort_values("size").groupby("dtype", sort=True):
        data = group.assign(achieved=group["flop_per_s"] / scale)
        data["noisy"] = data["noisy"].astype(bool) if "noisy" in data else False
        data = data[["size"] + vdims]
        curves.append(hv.Curve(data, "size", vdims, label=str(dtype)))
        curves.append(hv.Scatter(data, "size", vdims, label=str(dtype)).opts(
            tools=["hover"], hover_tooltips=hover, size=8,
            fill_alpha=hv.dim("noisy").categorize({True: 0.0, False: 1.0}, default=1.0),
        ))
    values = (rows["flop_per_s"] / scale).tolist() + [p / scale for p in peaks]
    ylim = (min(values) / 2, max(values) * 2)
    overlay = hv.Overlay(curves + ceiling_lines(ceilings, dtypes, scale=scale, x_text=float(rows["size"].min())))
    return overlay.opts(
        hv.opts.Curve(logx=True, logy=True),
        hv.opts.Overlay(title="GEMM throughput (hollow: noisy, IQR/median > 0.1)",
                        xlabel="matrix size M=N=K", ylabel=f"achieved {unit}", logx=True, logy=True,
                        ylim=ylim, width=760, height=440, legend_position="bottom_right",
                        show_grid=True),
    )
