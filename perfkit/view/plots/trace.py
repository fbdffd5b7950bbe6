"""Trace plots: where the time of a profiled run goes (HTA's temporal breakdown) and its top kernels.

Inputs are the frames of :mod:`perfkit.analyse.trace.breakdown` (``temporal_breakdown``,
``top_kernels``), optionally with a ``trace`` column naming the trace set each row comes from
(several sets, e.g. a sweep's configurations, draw side by side). No trace is read here.
"""

from __future__ import annotations

import pandas as pd

from ._common import LEGEND_BESIDE, hv_bokeh

__all__ = ["temporal_plot", "top_kernels_plot", "short_name", "TEMPORAL_PARTS", "ops_roofline", "OP_COLORS"]

#: One colour per op family (perfkit.analyse.trace.op_models.CATEGORIES).
OP_COLORS = {"GEMM": "#1f77b4", "attention": "#d62728", "convolution": "#9467bd", "normalization": "#2ca02c",
             "elementwise": "#ff7f0e", "reduction": "#8c564b"}

#: The temporal breakdown's parts, in stacking order, with their colours (idle grey: nothing ran).
TEMPORAL_PARTS = {"idle": "#b0b0b0", "compute": "#2ca02c", "non-compute": "#ff7f0e"}
_PART_COLUMNS = {"idle": "idle_time", "compute": "compute_time", "non-compute": "non_compute_time"}


def short_name(name: str, width: int = 70) -> str:
    """``name`` elided in the middle to ``width`` characters: kernels of one template differ at
    the end of their names as much as at the start."""
    if len(name) <= width:
        return name
    tail = (width - 1) * 2 // 5
    return name[:width - 1 - tail] + "…" + name[-tail:]


def _label(frame: pd.DataFrame) -> pd.Series:
    rank = "rank " + frame["rank"].astype(int).astype(str)
    return frame["trace"].astype(str) + " · " + rank if "trace" in frame else rank


def temporal_plot(temporal: pd.DataFrame, *, title: str = "Temporal breakdown of the GPU timeline"):
    """One horizontal bar per trace set and rank, stacked: idle, compute and non-compute share of
    ``kernel_time`` (HTA's ``*_pctg``); hover gives the times. Ranks without GPU activity (a
    CPU-only trace) have no timeline to split and are left out, which the plot says."""
    hv = hv_bokeh()
    has_gpu = temporal[temporal["kernel_time(us)"] > 0] if len(temporal) else temporal
    if has_gpu.empty:
        return hv.Div("<p>No GPU activity in these traces (CPU only): HTA's temporal breakdown splits the GPU "
                      "timeline, so there is nothing to stack; see the top CPU operators.</p>")
    has_gpu = has_gpu.iloc[::-1]  # bokeh draws the first factor at the bottom: the first run goes on top
    labels = _label(has_gpu)
    parts = []
    for part, column in _PART_COLUMNS.items():
        parts.append(pd.DataFrame({"run": labels.to_numpy(), "part": part,
                                   "share_pct": has_gpu[f"{column}_pctg"].to_numpy(),
                                   "time_ms": has_gpu[f"{column}(us)"].to_numpy() / 1e3,
                                   "kernel_time_ms": has_gpu["kernel_time(us)"].to_numpy() / 1e3}))
    data = pd.concat(parts, ignore_index=True)
    left_out = len(temporal) - len(has_gpu)
    note = f" ({left_out} CPU-only rank(s) left out)" if left_out else ""
    return hv.Bars(data, ["run", "part"], ["share_pct", "time_ms", "kernel_time_ms"]).opts(
        stacked=True, invert_axes=True, color="part", cmap=TEMPORAL_PARTS, tools=["hover"],
        hover_tooltips=[("run", "@{run}"), ("part", "@{part}"), ("share", "@{share_pct}{0.0} %"),
                        ("time", "@{time_ms}{0.000} ms"), ("kernel_time", "@{kernel_time_ms}{0.000} ms")],
        xlabel="", ylabel="share of kernel_time (%)", title=title + note,
        **LEGEND_BESIDE,
        width=900, height=90 + 32 * data["run"].nunique(), show_grid=True)


def top_kernels_plot(top: pd.DataFrame, *, ranks=None, width: int = 900):
    """One horizontal bar chart per trace set and rank (``ranks``: only these), longest on top:
    each kernel's (CPU operator's, on a CPU-only trace) share of the rank's time, hover with
    its full name, count and total time. A layout when there are several."""
    hv = hv_bokeh()
    if ranks is not None:
        top = top[top["rank"].isin(list(ranks))]
    if top.empty:
        return hv.Div("<p>No kernels or CPU operators in the analysed window.</p>")
    keys = ["trace", "rank"] if "trace" in top else ["rank"]
    panels = []
    for key, group in top.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        group = group.sort_values("total_time_s", ascending=True)  # bokeh draws the first factor at the bottom
        shown = _unique([short_name(n, 50) for n in group["name"]])
        data = pd.DataFrame({"kernel": shown, "share_pct": 100 * group["share"].to_numpy(),
                             "name": group["name"].to_numpy(), "count": group["count"].to_numpy(),
                             "total_time_ms": 1e3 * group["total_time_s"].to_numpy(),
                             "kernel_type": group["kernel_type"].to_numpy()})
        what = "kernels" if (group["kind"] == "kernel").all() else "CPU operators"
        where = " · ".join([str(key[0]), f"rank {key[1]}"] if len(key) == 2 else [f"rank {key[0]}"])
        panels.append(hv.Bars(data, "kernel", ["share_pct", "name", "count", "total_time_ms", "kernel_type"]).opts(
            invert_axes=True, tools=["hover"], color="#1f77b4", xlabel="", ylabel="share of the rank's time (%)",
            hover_tooltips=[("name", "@{name}"), ("type", "@{kernel_type}"), ("count", "@{count}"),
                            ("total", "@{total_time_ms}{0.000} ms"), ("share", "@{share_pct}{0.0} %")],
            title=f"Top {what}: {where}", width=width, height=80 + 24 * len(data), show_grid=True))
    # Each chart its own kernels: a shared categorical axis would list every chart's names in each.
    return panels[0] if len(panels) == 1 else hv.Layout(panels).opts(shared_axes=False).cols(1)


def _unique(labels: list[str]) -> list[str]:
    """Two names that shorten alike stay two bars."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def ops_roofline(shapes: pd.DataFrame, roof: dict, peaks: dict | None = None, *, title: str = ""):
    """Every unique op shape of a trace on its device's roofline: intensity (FLOP/byte) against
    achieved FLOP/s, one colour per op family (legend), marker area by kernel time; the HBM roof
    (I·B) and each dtype's compute roof drawn and labelled at their right end. ``shapes`` is
    :attr:`perfkit.analyse.trace.ops.TraceOps.shapes`, ``roof`` its ``roof``, ``peaks`` the spec
    row's dense peaks by dtype ({} when the device is unknown: points without roofs, said)."""
    import numpy as np

    hv = hv_bokeh()
    pts = shapes[(shapes["flop"] > 0) & (shapes["flop_per_s"] > 0) & (shapes["intensity_flop_per_byte"] > 0)].copy()
    if pts.empty:
        return hv.Div("<p>No op with FLOP on this trace's roof (recorded without shapes? profile with "
                      "record_shapes=True).</p>")
    pts["tflop_per_s"] = pts["flop_per_s"] / 1e12
    pts["time_ms"] = pts["kernel_time_s"] * 1e3
    pts["roof_pct"] = 100 * pts["roof_share"]
    pts["size"] = 6 + 18 * np.sqrt(pts["kernel_time_s"] / pts["kernel_time_s"].max())
    pts["shapes"] = pts["input_dims"].str.slice(0, 60)
    xlo, xhi = pts["intensity_flop_per_byte"].min() / 3, pts["intensity_flop_per_byte"].max() * 3
    elements = []
    bandwidth = roof.get("memory_bytes_per_s")
    used = set(pts["dtype"].dropna())
    peaks = {k: v for k, v in (peaks or {}).items() if k in used or k in ("fp32",)}
    top = max([pts["tflop_per_s"].max(), *[v / 1e12 for v in peaks.values()]]) * 2
    if bandwidth:
        xs = np.geomspace(xlo, xhi, 50)
        ceiling = max(peaks.values()) / 1e12 if peaks else top
        elements.append(hv.Curve((xs, np.minimum(xs * bandwidth / 1e12, ceiling)), "intensity", "tflop_per_s",
                                 label=f"HBM {bandwidth / 1e12:.3g} TB/s").opts(color="#444444", line_dash="dashed"))
    for dtype, peak in sorted(peaks.items(), key=lambda kv: kv[1]):
        elements.append(hv.HLine(peak / 1e12).opts(color="#888888", line_dash="dotted", line_width=1))
        elements.append(hv.Text(xhi, peak / 1e12, f"{dtype} {peak / 1e12:.4g} TFLOP/s ", halign="right",
                                valign="bottom").opts(text_font_size="8pt", text_color="#555555"))
    for category, group in pts.groupby("category", sort=False):
        elements.append(hv.Scatter(group, "intensity_flop_per_byte",
                                   ["tflop_per_s", "op", "shapes", "dtype", "count", "time_ms", "roof_pct", "size"],
                                   label=str(category)).opts(
            color=OP_COLORS.get(category, "#7f7f7f"), size="size", alpha=0.75, tools=["hover"],
            hover_tooltips=[("op", "@{op}"), ("shapes", "@{shapes}"), ("dtype", "@{dtype}"), ("calls", "@{count}"),
                            ("kernel time", "@{time_ms}{0.000} ms"), ("achieved", "@{tflop_per_s}{0.00} TFLOP/s"),
                            ("intensity", "@{intensity_flop_per_byte}{0.0} FLOP/B"), ("of roof", "@{roof_pct}{0.0} %")]))
    device = roof.get("model") or roof.get("device") or "unknown device"
    note = "" if roof.get("model") else f" — {roof.get('reason') or 'no roof'}"
    return hv.Overlay(elements).opts(
        logx=True, logy=True, xlim=(xlo, xhi), ylim=(pts["tflop_per_s"].min() / 3, top),
        xlabel="arithmetic intensity (FLOP/byte)", ylabel="achieved (TFLOP/s)", width=820, height=460,
        title=title or f"Ops of the trace on the {device} roofline{note}", show_grid=True, **LEGEND_BESIDE)
