"""Shared plotting helpers: the holoviews backend, SI display scaling, ceiling lines."""

from __future__ import annotations

import json

import pandas as pd

from ..display import hv_bokeh  # one place decides inline (offline) or CDN resources

__all__ = ["hv_bokeh", "ceiling_lines", "roof_labels", "LABEL_GAP", "format_si", "ok_rows", "display_scale", "display_text", "LEGEND_BESIDE", "OVERLAY_LEGEND",
           "Legend", "width_with_legend", "whole", "mapping_label"]

_ORIGIN_DASH = {"measured": "solid", "spec": "dashed", "theoretical": "dotted"}

#: A legend beside the plot, never over its data (holoviews' bokeh backend draws ``top_right``
#: and the like inside the frame, ``right`` outside it); a click on an entry hides its series.
LEGEND_BESIDE = {"legend_position": "right", "legend_opts": {"click_policy": "hide"}}
#: The same for an overlay, whose legend holoviews drops past ``legend_limit`` (25) glyphs: kept
#: however many series it draws (the quickstart's MFU and saved-activation plots, 28 and 30
#: glyphs, showed no names at all).
OVERLAY_LEGEND = {**LEGEND_BESIDE, "legend_limit": 100_000}


class Legend:
    """Series names as a legend shows them, behind short element labels.

    holoviews looks a plot's options up by each element's label, sanitising the label character
    by character every time (``holoviews.core.util.sanitize``); a series named by its whole
    configuration (``bf16 transformer n_layers=4 d_model=1024 ...``) made that a fifth of the
    report's training section (1.3 of 6.0 s, profiled). Elements are labelled ``s<n>``, and the
    overlay's ``legend_labels`` (:meth:`opts`) maps each back to its name: the legend, its click to
    hide a series and a line merged with its points under one entry are as before."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        """Element label → the name shown."""
        self._labels: dict[str, str] = {}

    def label(self, name: str) -> str:
        """The element label standing for ``name`` (the same one each time it is asked)."""
        if name not in self._labels:
            self._labels[name] = f"s{len(self._labels)}"
            self.names[self._labels[name]] = name
        return self._labels[name]

    @staticmethod
    def shown(overlay, element) -> str:
        """The name ``overlay``'s legend shows for ``element`` (its label where none is mapped)."""
        names = overlay.opts.get("plot").kwargs.get("legend_labels") or {}
        return names.get(element.label, element.label)

    def opts(self, extra=(), *, width: bool = True) -> dict:
        """The overlay options that show the names: ``legend_labels``, and a width that fits them
        (beside ``extra`` entries labelled as they are) unless ``width`` is False. With
        :data:`OVERLAY_LEGEND`, which keeps the legend however many glyphs there are."""
        out = {"legend_labels": dict(self.names)}
        if width:
            out["width"] = width_with_legend([*self.names.values(), *extra])
        return out


def width_with_legend(entries, plot_width_px: int = 760) -> int:
    """A figure's width for a plot area of about ``plot_width_px`` beside a legend of ``entries``
    (labels, or holoviews elements whose ``label`` is one; about 7 px a character, 60 px for the
    glyph and padding). Bokeh takes an outside legend's width from the figure's: at a fixed
    width, long labels (``fp32 pp 1F1B m=2×2 n_layers=4 d_model=256``) squeezed the plot area."""
    labels = (getattr(e, "label", e) for e in entries)
    return plot_width_px + 60 + 7 * max((len(str(x)) for x in labels if x is not None), default=0)


def whole(value):
    """A float that is a whole number as an ``int`` (``2.0`` → ``2``: an integer column that met a
    missing value reads back as float); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def mapping_label(value, *, empty: str, sep: str = ", ", sort: bool = True) -> str:
    """A mapping, or its JSON, as ``k=v`` pairs (``{"NCCL_ALGO": "Ring"}`` → ``NCCL_ALGO=Ring``);
    ``empty`` for an empty or missing one; text that is not a JSON object as it is."""
    if value is None or (isinstance(value, float) and value != value):
        value = {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    if not isinstance(value, dict):
        return str(value)
    items = sorted(value.items()) if sort else value.items()
    return sep.join(f"{k}={v}" for k, v in items) or empty


def display_text(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as text for a table: a float column whose values are all whole numbers (an
    integer column that a missing value made float) printed as integers (``2``, not ``2.0``),
    missing values as empty cells."""
    out = frame.copy()
    for col in out.columns:
        values = out[col]
        if pd.api.types.is_float_dtype(values) and values.dropna().map(float.is_integer).all():
            out[col] = values.map(lambda v: "" if pd.isna(v) else str(int(v)))
        else:
            out[col] = values.map(lambda v: "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v))
    return out




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
    labels = []
    for row in compute.itertuples():
        lines.append(
            hv.HLine(row.value / scale).opts(
                line_dash=_ORIGIN_DASH.get(row.origin, "dashdot"), line_width=1.5, color="gray")
        )
        labels.append((float(row.value), f"{row.dtype} {row.origin} peak {format_si(row.value, 'FLOP/s')}"))
    return lines + roof_labels(hv, labels, x_text, scale, halign="left")


#: Two roof labels closer than this factor on a log axis would print over each other.
LABEL_GAP = 1.6


def roof_labels(hv, labels: list[tuple[float, str]], x: float, scale: float, *, halign: str) -> list:
    """One label per horizontal roof, never over another (issue 55: "fp32 spec 67" over "fp32
    measured 53.9", "bf16 spec 989" over "fp16 spec 989"): roofs of one value share a label; of
    two close roofs the lower one's label goes under its line and the upper one's above; a third
    close one is named by the legend alone."""
    merged: dict[float, list[str]] = {}
    for value, text in sorted(labels):
        merged.setdefault(value, []).append(text.strip())
    placed: list[list] = []  # [value, text, valign]
    for value, texts in sorted(merged.items()):
        text = " · ".join(dict.fromkeys(texts))
        if placed and value < placed[-1][0] * LABEL_GAP:
            if placed[-1][2] == "top" or (len(placed) > 1 and placed[-1][0] < placed[-2][0] * LABEL_GAP):
                continue  # crowded: the legend names it
            placed[-1][2] = "top"
        placed.append([value, text, "bottom"])
    pad = (" {}" if halign == "left" else "{} ").format
    return [hv.Text(x, value / scale, pad(text), halign=halign, valign=valign, fontsize=8)
            for value, text, valign in placed]
