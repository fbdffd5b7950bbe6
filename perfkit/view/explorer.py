"""An explorer over any results folder: pickers for x, y, colour and facet, and a filter, over
every ``ok`` row; axes named with their units (``flop_per_s`` → "flop per s (FLOP/s)").

HoloViz's own explorer (hvPlot's ``explorer``) is the model; this one is a small Panel app in the
stack perfkit already uses, so it renders in JupyterLab as every perfkit widget does (no server,
no extension beyond panel's). Run headless (papermill, nbval, the report), it draws the plot of
its default choices, with a line saying what the pickers would offer.
"""

from __future__ import annotations

import json

import pandas as pd

__all__ = ["explorer", "axis_label", "choices"]

_NONE = "(none)"
_SKIP_PREFIX = ("env_",)
_SKIP_SUFFIX = ("_samples_s", "_samples", "_json", "_reason", "_path", "_paths")


def axis_label(column: str) -> str:
    """A column as an axis name, with its unit: ``step_time_s`` → "step time (s)"."""
    from ..core.results import unit_of

    unit = unit_of(column)
    words = column
    if unit:
        for suffix in ("_bytes_per_s", "_per_s", "_bytes", "_flop", "_s"):
            if column.endswith(suffix) and len(column) > len(suffix):
                words = column[: -len(suffix)]
                break
    words = words.replace("_", " ")
    return f"{words} ({unit})" if unit else words


def choices(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(numeric columns an axis can take, columns with few values a colour, facet or filter can
    take), of the ``ok`` rows; environment, sample and text-blob columns left out."""
    numeric, categorical = [], []
    for c in rows.columns:
        name = str(c)
        if name.startswith(_SKIP_PREFIX) or name.endswith(_SKIP_SUFFIX) or name in ("config_id",):
            continue
        col = rows[c]
        if col.notna().sum() == 0:
            continue
        if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            numeric.append(name)
            if col.nunique() <= 12:
                categorical.append(name)
        elif col.map(lambda v: isinstance(v, (str, bool)) or v is None).all() and 1 < col.nunique() <= 30:
            categorical.append(name)
    return numeric, categorical


def _plot(hv, data: pd.DataFrame, x: str, y: str, colour: str, facet: str):
    sub = data[data[x].notna() & data[y].notna()].sort_values(x)
    if sub.empty:
        return hv.Div(f"<p>No ok row has both {x} and {y}.</p>")
    log = {"logx": bool((sub[x] > 0).all() and sub[x].max() / max(sub[x].min(), 1e-300) > 100),
           "logy": bool((sub[y] > 0).all() and sub[y].max() / max(sub[y].min(), 1e-300) > 100)}
    opts = dict(xlabel=axis_label(x), ylabel=axis_label(y), tools=["hover"], size=7, **log)

    def panel(part: pd.DataFrame, title: str):
        if colour == _NONE:
            return hv.Scatter(part, x, [y]).opts(title=title, width=560, height=360, **opts)
        groups = [hv.Scatter(g, x, [y], label=f"{colour}={k}").opts(**opts) for k, g in part.groupby(colour, sort=True)]
        return hv.Overlay(groups).opts(title=title, width=700, height=360, legend_position="right")

    if facet == _NONE:
        return panel(sub, f"{axis_label(y)} against {axis_label(x)}")
    return hv.Layout([panel(g, f"{facet}={k}") for k, g in sub.groupby(facet, sort=True)]).cols(2)


def _text(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists and dicts as JSON text, so that they group and filter."""
    return frame.assign(**{c: frame[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
                           for c in frame.columns if frame[c].dtype == object})


def explorer(rows: pd.DataFrame, *, x: str | None = None, y: str | None = None, colour: str | None = None):
    """The explorer of ``rows`` (module docstring): a Panel app in a live notebook, the default
    plot headless. ``x``, ``y``, ``colour``: the first choices (defaults: the folder's first
    swept size or batch, a rate or time, a precision)."""
    from .plots import hv_bokeh, ok_rows
    from .widgets import static_mode

    hv = hv_bokeh()
    data = _text(ok_rows(rows))
    numeric, categorical = choices(data)
    if len(numeric) < 2:
        return hv.Div("<p>Nothing to explore: fewer than two numeric columns in the ok rows.</p>")
    prefer = lambda options, names: next((n for n in names if n in options), options[0])  # noqa: E731
    x = x if x in numeric else prefer(numeric, ["size", "batch_size", "world_size", "num_workers", "size_bytes"])
    y = y if y in numeric else prefer([n for n in numeric if n != x] or numeric,
                                      ["flop_per_s", "samples_per_s", "step_time_s", "busbw_bytes_per_s", "time_s"])
    colour = colour if colour in categorical else next(
        (c for c in ("dtype", "precision", "parallelism", "workload") if c in categorical), _NONE)
    if static_mode():
        note = hv.Div(f"<p>Explorer (live in JupyterLab): x, y from {len(numeric)} numeric columns, colour, "
                      f"facet and a filter from {len(categorical)}; drawn here at its defaults.</p>")
        return hv.Layout([note, _plot(hv, data, x, y, colour, _NONE)]).cols(1)
    import panel as pn

    pn.extension(inline=True)
    pick_filter = pn.widgets.Select(name="filter by", options=[_NONE, *categorical], value=_NONE)
    keep = pn.widgets.MultiChoice(name="keep values", options=[])
    pick_facet = pn.widgets.Select(name="facet", options=[_NONE, *categorical], value=_NONE)
    pick_colour = pn.widgets.Select(name="colour", options=[_NONE, *categorical], value=colour)
    pick_x = pn.widgets.Select(name="x", options=numeric, value=x)
    pick_y = pn.widgets.Select(name="y", options=numeric, value=y)

    def values(column):
        keep.options = [] if column == _NONE else sorted(map(str, data[column].dropna().unique()))
        keep.value = []
    pick_filter.param.watch(lambda e: values(e.new), "value")

    def view(x, y, colour, facet, column, kept):
        part = data if column == _NONE or not kept else data[data[column].astype(str).isin(kept)]
        return _plot(hv, part, x, y, colour, facet)

    bound = pn.bind(view, pick_x, pick_y, pick_colour, pick_facet, pick_filter, keep)
    return pn.Column(pn.Row(pick_filter, keep, pick_facet), pn.Row(pick_colour, pick_x, pick_y),
                     pn.panel(bound))
