"""GEMM throughput plot."""

from __future__ import annotations

import pandas as pd

from ._common import OVERLAY_LEGEND, ceiling_lines, display_scale, hv_bokeh, ok_rows, width_with_legend

__all__ = ["gemm_throughput"]


def gemm_throughput(df: pd.DataFrame, ceilings: pd.DataFrame | None = None):
    """Achieved FLOP/s vs matrix size, one line per dtype, with the device's peaks as lines."""
    hv = hv_bokeh()
    rows = ok_rows(df)
    rows = rows[rows["flop_per_s"].notna()] if "flop_per_s" in rows else rows.iloc[0:0]
    if rows.empty:
        return hv.Div("<p>No GEMM rows with status ok.</p>")
    dtypes = sorted(rows["dtype"].unique())
    peaks = []
    if ceilings is not None and not ceilings.empty:
        peaks = ceilings[(ceilings["kind"] == "compute") & ceilings["dtype"].isin(dtypes)]["value"].tolist()
    scale, prefix = display_scale(rows["flop_per_s"].tolist() + peaks)
    unit = f"{prefix}FLOP/s"
    hover = [("dtype", "@{dtype}"), ("size", "@{size}"), ("achieved", f"@{{achieved}}{{0.000}} {unit}"),
             ("median time", "@{time_s}{0.000000} s"), ("IQR", "@{time_iqr_s}{0.000000} s"),
             ("noisy", "@{noisy}")]
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
    # Every point inside the frame (issue 55: the first and last sizes sat on its edges, cut in half).
    xlim = (float(rows["size"].min()) / 1.25, float(rows["size"].max()) * 1.25)
    overlay = hv.Overlay(curves + ceiling_lines(ceilings, dtypes, scale=scale, x_text=xlim[0]))
    return overlay.opts(
        hv.opts.Curve(logx=True, logy=True),
        hv.opts.Overlay(title="GEMM throughput (hollow: noisy, IQR/median > 0.1)",
                        xlabel="matrix size M=N=K", ylabel=f"achieved {unit}", logx=True, logy=True,
                        xlim=xlim, ylim=ylim, width=width_with_legend(overlay), height=440, **OVERLAY_LEGEND,
                        show_grid=True),
    )
