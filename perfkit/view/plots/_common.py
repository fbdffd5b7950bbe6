"""Shared plotting helpers: the holoviews backend, SI display scaling, ceiling lines."""

from __future__ import annotations

import pandas as pd

from ..display import hv_bokeh  # one place decides inline (offline) or CDN resources

__all__ = ["hv_bokeh", "ceiling_lines", "format_si", "ok_rows", "display_scale"]

_ORIGIN_DASH = {"measured": "solid", "spec": "dashed", "theoretical": "dotted"}




def format_si(value: float, unit: str) -> str:
    """1.23e12 FLOP/s → '1.23 TFLOP/s' (display only; data stays in SI base units)."""
    if value is None or pd.isna(value):
        return "unknown"
    unit = {"bytes/s": "B/s", "bytes": "B"}.get(unit, unit)
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df else df


def display_scale(values, *, below_one: bool = False) -> tuple[float, str]:
    """Factor and SI prefix for an axis whose largest value is max(values) (display only);
    ``below_one`` (times in seconds) also scales values under 1 to milli or micro."""
    top = max((abs(v) for v in values if v == v), default=1.0)
    scales = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    scales += [(1e-3, "m"), (1e-6, "µ")] if below_one else []
    for factor, prefix in scales:
        if top >= factor:
            return factor, prefix
    return scales[-1]


def ceiling_lines(ceilings: pd.DataFrame, dtypes, *, scale: float = 1.0, x_text: float = 1.0) -> list:
    """Horizontal lines for the compute ceilings of ``dtypes``: solid measured, dashed spec,
    dotted theoretical; each labelled with its value and origin (values divided by ``scale``)."""
    hv = hv_bokeh()
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
