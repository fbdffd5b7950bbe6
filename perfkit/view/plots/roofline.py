"""The roofline plot: op points of :func:`perfkit.analyse.roofline.roofline_points` under the ceilings.

Log-log: x is arithmetic intensity (FLOP per minimum byte), y achieved FLOP/s. Ceilings are
drawn as the model defines them (attainable(I) = min(P, I × B), ``reference/formulas.md``): a
horizontal compute roof per dtype and a diagonal I × B per memory level, each diagonal clipped
where it meets the compute roof of its own origin. Line style says where a roof comes from:
solid measured, dashed spec, dotted theoretical.

Points are sized by their share of the step time and coloured by op family; the whole-step row
(``op == "<step>"``) is a black diamond. Zero-FLOP ops (copies, views) have no place on a log
FLOP/s axis; they are counted in the title, and their rows stay in the table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...core.errors import BadInputError
from ._common import OVERLAY_LEGEND, display_scale, format_si, hv_bokeh, ok_rows, roof_labels

__all__ = ["roofline", "roofline_static", "roofline_section"]

_STEP_OP = "<step>"  # perfkit.analyse.roofline.STEP_OP; not imported so plotting stays free of torch
_ORIGIN_DASH = {"measured": "solid", "spec": "dashed", "theoretical": "dotted"}
_FAMILY_COLORS = {  # Category10, in perfkit.measuring.ops.counting.FAMILIES order
    "matmul": "#1f77b4", "conv": "#ff7f0e", "attention": "#2ca02c", "norm": "#d62728",
    "softmax": "#9467bd", "reduction": "#8c564b", "elementwise": "#e377c2",
    "embedding": "#7f7f7f", "loss": "#bcbd22", "other": "#17becf",
}
#: For families the table does not name (a user's kernels, one family per impl): Dark2, then Set1,
#: none of them the table's, one each in order of appearance.
_OTHER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
                 "#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00")
_MEMORY_COLORS = ("#08519c", "#3182bd", "#6baed6", "#9ecae1", "#31a354")
_PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
_TORCH_TO_PRECISION = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16",
                       "float16": "fp16"}
_VDIMS = ["op", "family", "shapes", "dtype", "calls", "time_s", "time_text", "time_share", "attainable",
          "percent_of_roof", "bound", "marker_size", "config"]


def _precision(value) -> str | None:
    """``float32``/``torch.float32`` → ``fp32``; precision names and other values unchanged."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    name = str(value).removeprefix("torch.")
    if name.startswith("float8"):
        return "fp8"
    return _TORCH_TO_PRECISION.get(name, name)


def _shapes_text(shapes) -> str:
    if shapes is None or (isinstance(shapes, float) and math.isnan(shapes)):
        return ""
    try:
        return "(" + ", ".join("(" + ", ".join(str(int(d)) for d in s) + ")" for s in shapes) + ")"
    except TypeError:
        return str(shapes)


def _prepare(points: pd.DataFrame, widget_dim: str | None) -> tuple[pd.DataFrame, int]:
    """Drawable rows with display columns, and how many rows had no place on log axes."""
    rows = ok_rows(points)
    missing = {"op", "intensity_flop_per_byte", "flop_per_s"} - set(rows.columns)
    if missing:
        raise BadInputError(f"roofline needs roofline_points rows; missing columns {sorted(missing)}")
    df = rows.copy()
    for col in ("family", "input_shapes", "dtype", "ceiling_dtype", "calls", "time_s",
                "time_share", "attainable_flop_per_s", "percent_of_roof", "bound"):
        if col not in df:
            df[col] = None
    df["roof_dtype"] = [_precision(c) or _precision(d)
                        for c, d in zip(df["ceiling_dtype"], df["dtype"])]
    x = pd.to_numeric(df["intensity_flop_per_byte"], errors="coerce")
    y = pd.to_numeric(df["flop_per_s"], errors="coerce")
    drawable = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if widget_dim == "dtype":  # integer ops (index arithmetic) have no FLOP roof to switch to
        drawable &= df["roof_dtype"].isin(_PRECISIONS)
    dropped = int((~drawable).sum())
    df = df[drawable].copy()
    df["family"] = np.where(df["op"] == _STEP_OP, "step", df["family"].fillna("other"))
    df["shapes"] = df["input_shapes"].map(_shapes_text)
    if widget_dim == "dtype":
        df["_key"] = df["roof_dtype"].astype(str)
    elif widget_dim is not None and widget_dim in df:
        df["_key"] = df[widget_dim].astype(str)
    else:
        df["_key"] = "all"
    df["dtype"] = df["dtype"].fillna(df["roof_dtype"]).fillna("").astype(str)
    share = pd.to_numeric(df["time_share"], errors="coerce").fillna(0.0).clip(0.0, 1.0)
    df["marker_size"] = 6.0 + 30.0 * np.sqrt(share)  # area grows with the share of step time
    return df, dropped


def _roofs(ceilings: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (kind, dtype or level, origin): several rows for one roof resolve to the
    highest, as :mod:`perfkit.analyse.roofline` does."""
    if ceilings is None or ceilings.empty:
        return pd.DataFrame(columns=["kind", "name", "origin", "value"])
    c = ok_rows(ceilings)
    c = c[c["kind"].isin(["compute", "memory"]) & (pd.to_numeric(c["value"], errors="coerce") > 0)]
    c = c.assign(name=np.where(c["kind"] == "compute", c["dtype"], c["level"]),
                 value=pd.to_numeric(c["value"]))
    return (c.groupby(["kind", "name", "origin"], sort=False, dropna=True)["value"].max()
            .reset_index())


def _trajectories(hv, frame: pd.DataFrame, trajectory_by: str, scale: float) -> list:
    """One path per (op, family) through its pooled points, ordered by ``trajectory_by``.

    Points of one op at one value of ``trajectory_by`` (several shapes) pool to one: summed FLOP
    over summed bytes and over summed time, the op's total on the roofline.
    """
    paths = []
    pooled_sums = {"flop", "bytes", "time_s"} <= set(frame.columns)
    for (op, family), group in frame.groupby(["op", "family"], sort=False):
        if group[trajectory_by].nunique() < 2:
            continue
        vertices = []
        for value, g in group.groupby(trajectory_by, sort=True):
            if pooled_sums and g["bytes"].sum() > 0 and g["time_s"].sum() > 0:
                x = g["flop"].sum() / g["bytes"].sum()
                y = g["flop"].sum() / g["time_s"].sum()
            else:
                x = float(np.exp(np.log(g["intensity_flop_per_byte"]).mean()))
                y = float(np.exp(np.log(g["flop_per_s"]).mean()))
            vertices.append({"x": x, "y": y / scale, "op": op, "family": family,
                             "config": f"{trajectory_by}={value}"})
        color = "black" if family == "step" else _FAMILY_COLORS.get(family, "#17becf")
        paths.append(hv.Path([pd.DataFrame(vertices)], kdims=["x", "y"],
                             vdims=["op", "family", "config"], group="Trajectory").opts(
            color=color, line_width=2, alpha=0.6, tools=["hover"],
            hover_tooltips=[("op", "@{op}"), ("family", "@{family}"), ("trajectory", "@{config}")]))
    return paths


def _ceiling_lines(hv, roofs: pd.DataFrame, dtypes: set[str], xlim, ylim, scale: float) -> list:
    """Compute roofs of ``dtypes`` (horizontal) and memory roofs (I × B, clipped) with labels."""
    xlo, xhi = xlim
    compute = roofs[(roofs["kind"] == "compute") & roofs["name"].isin(dtypes)]
    memory = roofs[roofs["kind"] == "memory"].sort_values("value", ascending=False)
    elements = []

    def line(points, name, origin, value, unit, color):
        roof = format_si(value, unit)
        data = pd.DataFrame(points, columns=["x", "y"]).assign(ceiling=f"{name} ({origin})",
                                                               roof=roof)
        curve = hv.Curve(data, "x", ["y", "ceiling", "roof"], group="Ceiling",
                         label=f"{name} {origin} {roof}").opts(
            color=color, line_dash=_ORIGIN_DASH.get(origin, "dashdot"), line_width=1.8,
            tools=["hover"], hover_tooltips=[("ceiling", "@{ceiling}"), ("roof", "@{roof}")])
        elements.append(curve)

    labels = []
    for row in compute.itertuples():
        same = memory[memory["origin"] == row.origin]
        # The horizontal roof starts at the ridge of its fastest memory roof (the roof's corner).
        start = max(xlo, row.value / same["value"].max()) if not same.empty else xlo
        line([(start, row.value / scale), (xhi, row.value / scale)], row.name, row.origin,
             row.value, "FLOP/s", "#444444")
        labels.append((row.value, f"{row.name} {row.origin} {format_si(row.value, 'FLOP/s')} "))
    elements += roof_labels(hv, labels, xhi, scale, halign="right")
    for i, row in enumerate(memory.itertuples()):
        same = compute[compute["origin"] == row.origin]
        clip = same["value"].max() if not same.empty else compute["value"].max()
        end = xhi if (clip is None or not clip > 0) else min(xhi, clip / row.value)
        start = max(xlo, ylim[0] * scale / row.value)  # where the diagonal enters the plot
        if end <= start:
            continue
        color = _MEMORY_COLORS[i % len(_MEMORY_COLORS)]
        line([(start, start * row.value / scale), (end, end * row.value / scale)], row.name,
             row.origin, row.value, "B/s", color)
    return elements


def _points(hv, frame: pd.DataFrame, scale: float, unit: str, trajectory_by: str | None) -> list:
    hover = [("op", "@{op}"), ("family", "@{family}"), ("shapes", "@{shapes}"), ("dtype", "@{dtype}"),
             ("calls", "@{calls}"), ("time", "@{time_text}"),
             ("time share", "@{time_share}{0.0%}"),
             ("intensity", "@{intensity_flop_per_byte}{0.000} FLOP/B"),
             ("achieved", f"@{{achieved}}{{0.000}} {unit}"),
             ("attainable", f"@{{attainable}}{{0.000}} {unit}"),
             ("% of roof", "@{percent_of_roof}{0.0} %"), ("bound", "@{bound}")]
    if trajectory_by is not None:
        hover.append((trajectory_by, "@{config}"))
    elements = []
    others = [f for f in dict.fromkeys(frame["family"]) if f not in _FAMILY_COLORS and f != "step"]
    for family, group in frame.groupby("family", sort=False):
        color = (_FAMILY_COLORS[family] if family in _FAMILY_COLORS
                 else _OTHER_COLORS[others.index(family) % len(_OTHER_COLORS)] if family in others else "black")
        data = group.assign(
            achieved=group["flop_per_s"].astype(float) / scale,
            attainable=pd.to_numeric(group["attainable_flop_per_s"], errors="coerce") / scale,
            config=group[trajectory_by].astype(str) if trajectory_by else "",
            time_text=group["time_s"].map(_time_text),
            bound=group["bound"].fillna("no roof").astype(str))
        data = data[["intensity_flop_per_byte", "achieved", *_VDIMS]]
        is_step = family == "step"
        elements.append(hv.Points(data, ["intensity_flop_per_byte", "achieved"],
                                  _VDIMS,
                                  group="Step" if is_step else "Ops", label=family).opts(
            color=color, marker="diamond" if is_step else "circle",
            size=14 if is_step else hv.dim("marker_size"),
            fill_alpha=0.7, line_color="black", line_width=0.5, tools=["hover"],
            hover_tooltips=hover))
    return elements


def _time_text(seconds) -> str:
    """0.0000123 → '12.3 µs' (the tooltip's time; a fixed format showed '0.0000 s')."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return "n/a"
    if seconds != seconds:
        return "n/a"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _frames(df: pd.DataFrame, trajectory_by: str | None) -> dict[str, pd.DataFrame]:
    keys = sorted(df["_key"].unique())
    if trajectory_by is not None and len(keys) > 1:
        per_value = df.groupby(trajectory_by)["_key"].nunique()
        if (per_value <= 1).all():  # the sweep runs across the widget (a precision sweep):
            return {"all": df}      # its trajectories need every key in one panel
    return {k: df[df["_key"] == k] for k in keys}


def _overlays(points, ceilings, trajectory_by, widget_dim, title) -> tuple[dict, str]:
    hv = hv_bokeh()
    if trajectory_by is not None and trajectory_by not in points:
        raise BadInputError(f"trajectory_by {trajectory_by!r} is not a column of the points")
    df, dropped = _prepare(points, widget_dim)
    roofs = _roofs(ceilings)
    frames = _frames(df, trajectory_by) if not df.empty else {"all": df}
    dim = widget_dim if widget_dim is not None and "all" not in frames else "view"
    dtypes = set(df["roof_dtype"].dropna()) if not df.empty else set(
        roofs.loc[roofs["kind"] == "compute", "name"])
    compute_used = roofs[(roofs["kind"] == "compute") & roofs["name"].isin(dtypes)]["value"]
    memory = roofs[roofs["kind"] == "memory"]["value"]
    ys = df["flop_per_s"].astype(float).tolist()
    xs = df["intensity_flop_per_byte"].astype(float).tolist()
    scale, prefix = display_scale(ys + compute_used.tolist())
    unit = f"{prefix}FLOP/s"
    ridges = [p / b for p in compute_used for b in memory]
    xlim = (min(xs + ridges, default=0.1) / 4, max(xs + ridges, default=10.0) * 4)
    top = max(ys + compute_used.tolist(), default=scale)
    ylim = (min(ys, default=top / 1e3) / 4 / scale, top * 3 / scale)
    note = f"; {dropped} ops without FLOP, time or roof not drawn" if dropped else ""
    out = {}
    for key, frame in frames.items():
        frame_dtypes = set(frame["roof_dtype"].dropna()) or dtypes
        parts = _ceiling_lines(hv, roofs, frame_dtypes, xlim, ylim, scale)
        if trajectory_by is not None:
            parts += _trajectories(hv, frame, trajectory_by, scale)
        parts += _points(hv, frame, scale, unit, trajectory_by)
        heading = title + (f" ({key})" if key != "all" else "") + note
        out[key] = hv.Overlay(parts).opts(
            hv.opts.Overlay(title=heading, xlabel="arithmetic intensity (FLOP/byte)",
                            ylabel=f"achieved {unit}", logx=True, logy=True, xlim=xlim,
                            ylim=ylim, width=1000, height=500, show_grid=True,
                            **OVERLAY_LEGEND))
    return out, dim


def roofline(points: pd.DataFrame, ceilings: pd.DataFrame | None, *,
             trajectory_by: str | None = None, widget_dim: str | None = "dtype",
             title: str = "Roofline"):
    """Interactive log-log roofline of ``points`` (:func:`perfkit.analyse.roofline.roofline_points`
    rows, or recorded ones) under ``ceilings`` (a ceilings table); a ``hv.HoloMap``.

    ``widget_dim``: the column whose values a widget switches between (default the precision:
    ``dtype`` values are shown as fp32/bf16; a row without one, the step, takes its roof's
    dtype); None draws everything in one frame. ``trajectory_by``: a swept column (batch size,
    precision); the same op (op + family) at successive values is linked by a path. When the
    sweep runs across the widget's values (each precision a configuration), the widget is
    dropped so the paths stay whole. ``hv.render`` draws the first frame; for the report use
    :func:`roofline_static`, which draws every frame.
    """
    hv = hv_bokeh()
    frames, dim = _overlays(points, ceilings, trajectory_by, widget_dim, title)
    return hv.HoloMap(frames, kdims=[dim])


def roofline_static(points: pd.DataFrame, ceilings: pd.DataFrame | None, *,
                    trajectory_by: str | None = None, widget_dim: str | None = "dtype",
                    title: str = "Roofline"):
    """The frames of :func:`roofline` one under the other (``hv.Layout``): no widget needed,
    so it renders whole into the standalone HTML report."""
    hv = hv_bokeh()
    frames, _ = _overlays(points, ceilings, trajectory_by, widget_dim, title)
    return hv.Layout(list(frames.values())).cols(1)


def roofline_section(rows: pd.DataFrame, all_rows: pd.DataFrame):
    """The report's roofline section: ``rows`` are the ``workload == "roofline"`` rows; the
    ceilings are the ``workload == "ceiling"`` rows recorded by the same configurations.

    One static roofline per model and measured device (per precision within it): a CPU's points
    are never drawn under a GPU's roofs, nor the reverse. When batch size (else precision) was
    swept, each op's points are linked across it.
    """
    from ...core.env import measured_devices

    hv = hv_bokeh()
    ceilings = None
    if {"workload", "config_id"} <= set(all_rows.columns) and "config_id" in rows:
        ceilings = all_rows[(all_rows["workload"] == "ceiling")
                            & all_rows["config_id"].isin(rows["config_id"].unique())]
        ceilings = ceilings.assign(_device=_device_keys(measured_devices(ceilings)))
    rows = rows.assign(_device=_device_keys(measured_devices(rows)))
    by_model = ([(m, g) for m, g in rows.groupby("model", sort=True)] if "model" in rows
                else [(None, rows)])
    panels = []
    for model, model_rows in by_model:
        for device, group in model_rows.groupby("_device", sort=True):
            swept = next((c for c in ("batch_size", "precision")
                          if c in group and group[c].nunique() > 1), None)
            title = f"Roofline: {model}" if model is not None else "Roofline"
            if rows["_device"].nunique() > 1:
                title += f" on {device}"
            own = ceilings
            if ceilings is not None:  # the roofs these configurations had, of this device only
                own = ceilings[ceilings["config_id"].isin(group["config_id"].unique())
                               & (ceilings["_device"] == device)]
            panels.extend(roofline_static(group.drop(columns="_device"), own,
                                          trajectory_by=swept, title=title))
    return hv.Layout(panels).cols(1)


def _device_keys(measured: pd.DataFrame) -> list[str]:
    """``kind name`` per row of :func:`perfkit.core.env.measured_devices` (``unknown`` parts)."""
    return [f"{kind or 'unknown'} {name or 'unknown'}"
            for kind, name in zip(measured["kind"], measured["name"])]
