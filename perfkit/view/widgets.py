"""JupyterLab panels: pick a notebook's parameters, launch a small sweep with a live progress bar,
and explore results with holoviews widgets.

Under papermill/nbval (no frontend to talk to widgets) every panel degrades to a plain static
output: a table of the choices, or the plot of the first selection. Static mode is on when an
executor runs the notebook (``PERFKIT_CONTEXT`` is set) or ``PERFKIT_STATIC`` is set.
"""

from __future__ import annotations

import ast
import html
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..run.notebooks import read_notebook
from .plots._common import display_text

__all__ = ["static_mode", "sweep_panel", "explore", "parse_grid_text"]


def static_mode() -> bool:
    """True when no one can interact with widgets (a headless execution)."""
    return bool(os.environ.get("PERFKIT_STATIC") or os.environ.get("PERFKIT_CONTEXT"))


def parse_grid_text(text: str, default: object) -> list:
    """A widget's text → the list of values to sweep for one parameter.

    One value per line or separated by ``;``; each read like ``perfkit run -p`` reads a value
    (a Python literal, or the text itself for a string parameter)."""
    from ..run.notebooks import Parameter, coerce_cli_value

    param = Parameter(name="value", default=default, literal=True, source=repr(default))
    parts = [p.strip() for chunk in text.splitlines() for p in chunk.split(";")]
    if isinstance(default, str):  # the field shows string defaults as written: "fp32", quotes included
        return [ast.literal_eval(p) if p[:1] in "\"'" and p[-1:] == p[:1] else p for p in parts if p]
    return [coerce_cli_value(param, p) for p in parts if p]


def sweep_panel(notebook: str | Path, out_dir: str | Path, *, workers: int = 1):
    """A form with one field per parameter of ``notebook`` (values to sweep, ``;``-separated),
    a Run button, a live progress bar with counts by status, and the summary when done."""
    spec = read_notebook(notebook)
    if static_mode():
        return _static_parameters_table(spec)
    import ipywidgets as w

    fields = {name: w.Text(value=p.source, description=name, tooltip=p.comment or p.type_name,
                           layout=w.Layout(width="60%"), style={"description_width": "160px"})
              for name, p in spec.parameters.items()}
    run = w.Button(description="Run sweep", button_style="primary", icon="play")
    bar = w.IntProgress(value=0, min=0, max=1, description="0 / 0", layout=w.Layout(width="60%"))
    status = w.HTML()
    results = w.HTML()  # set from the sweep's thread: an Output widget's capture does not work there

    def on_click(_):
        from ..core.errors import BadInputError
        from ..run.sweep import SweepPart, SweepSpec, expand
        from ..run.sweep.engine import run_configs

        try:
            grid = {name: parse_grid_text(field.value, spec.parameters[name].default)
                    for name, field in fields.items()
                    if field.value.strip() != spec.parameters[name].source.strip()}
            part = SweepPart(notebook=spec.path, grid=grid) if grid else SweepPart(notebook=spec.path, configs=[{}])
            configs = expand(SweepSpec(parts=(part,)))
        except BadInputError as exc:
            status.value = f"<b style='color:#b00'>{html.escape(exc.reason)}</b>"
            return
        run.disabled = True
        counts: dict[str, int] = {}

        def on_start(todo, done):
            bar.max, bar.value = max(todo, 1), 0
            bar.description = f"0 / {todo}"
            status.value = f"{done} already done in {out_dir}" if done else ""

        def on_outcome(outcome):
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
            bar.value += 1
            bar.description = f"{bar.value} / {bar.max}"
            status.value = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))

        def go():
            try:
                result = run_configs(configs, out_dir, workers=workers, on_start=on_start, on_outcome=on_outcome)
                results.value = _results_html(result, list(grid))
            except Exception as exc:  # noqa: BLE001 - show it in the panel, keep the kernel alive
                status.value = f"<b style='color:#b00'>{html.escape(f'{type(exc).__name__}: {exc}')}</b>"
            finally:
                run.disabled = False

        threading.Thread(target=go, daemon=True, name="perfkit-sweep-panel").start()

    run.on_click(on_click)
    help_text = w.HTML("<p>Each field holds the value(s) to run; several values separated by "
                       "<code>;</code> are swept (their cartesian product).</p>")
    return w.VBox([help_text, *fields.values(), run, bar, status, results])


def _results_html(result, swept: list[str]) -> str:
    """The finished sweep: its counts and where it wrote, and its rows (swept settings, status)."""
    from ..core.results import load

    counts = ", ".join(f"{k}: {v}" for k, v in sorted(result.counts().items()))
    head = (f"<p>done in {result.wall_time_s:.1f} s ({html.escape(counts)}) &rarr; "
            f"<code>{html.escape(str(result.out_dir))}</code></p>")
    try:
        rows = load(result.out_dir)
    except Exception as exc:  # noqa: BLE001 - the summary above stays useful without the table
        return head + f"<p>rows not readable: {html.escape(str(exc))}</p>"
    cols = [c for c in ["config_id", *swept, "status", "reason"] if c in rows]
    return head + display_text(rows[cols].tail(50)).to_html(index=False, escape=True)


def _static_parameters_table(spec) -> pd.DataFrame:
    return pd.DataFrame([{"parameter": n, "default": p.source, "type": p.type_name, "help": p.comment}
                         for n, p in spec.parameters.items()])


def explore(rows: pd.DataFrame, *, x: str, y: str, by: Sequence[str] = (), color: str | None = None,
            logx: bool = True, logy: bool = False):
    """``y`` against ``x`` with a dropdown/slider per column of ``by`` (e.g. precision,
    parallelism), and one line per value of ``color``. Only ``ok`` rows are drawn.

    In JupyterLab this is a holoviews HoloMap with widgets; statically, every frame is laid out
    (a few) or the first one is shown."""
    from .plots import hv_bokeh, ok_rows

    hv = hv_bokeh()
    data = ok_rows(rows)
    missing = [c for c in [x, y, *by, *([color] if color else [])] if c not in data]
    if missing:
        from ..core.errors import BadInputError

        raise BadInputError(f"explore(): no column(s) {missing} in the rows; columns: {sorted(map(str, data.columns))}")
    data = data.assign(**{c: data[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
                          for c in by if data[c].dtype == object})

    def frame(sub: pd.DataFrame):
        sub = sub.sort_values(x)
        if color:
            curves = [hv.Curve(g, x, y, label=str(k)) * hv.Scatter(g, x, y, label=str(k)).opts(tools=["hover"], size=6)
                      for k, g in sub.groupby(color)]
            return hv.Overlay(curves).opts(legend_position="right")
        return hv.Curve(sub, x, y) * hv.Scatter(sub, x, y).opts(tools=["hover"], size=6)

    if not by:
        return frame(data).opts(hv.opts.Curve(logx=logx, logy=logy))
    frames = {key if isinstance(key, tuple) else (key,): frame(group) for key, group in data.groupby(list(by))}
    holomap = hv.HoloMap(frames, kdims=list(by)).opts(hv.opts.Curve(logx=logx, logy=logy, width=640, height=380))
    if static_mode():
        return holomap.layout(list(by)).cols(2) if len(frames) <= 6 else holomap.last
    return holomap
