"""The report written as one standalone HTML page, its sections built and rendered in parallel.

Nearly all of a report's time is holoviews building its plots and bokeh turning them into
models and JSON (the quickstart: ~7 s of render, ~2 s of serialisation, ~2 s of section
building, ~1 s of advice on 2 cores; issue 55's goal is 8 s to write). Sections are independent,
so each is built, rendered and serialised (``bokeh.embed.json_item``) by one of ``workers``
processes forked from this one after holoviews and the rows are loaded (nothing is imported or
read twice), longest first; the page is assembled here from their HTML text and JSON.

The page is plain HTML: the text of the summary, the sections' headings and tables are HTML as
written, not bokeh Div models in one bokeh layout; each plot is a ``<div>`` with its own bokeh
document in the JSON beside it, embedded by a script at the end: the plots of the first screen
at once, then the others one at a time in page order (the quickstart's 25 plots are 3,246 bokeh
models; its first screen draws in ~0.5 s, the last plot ~5 s later). Bokeh's JavaScript and CSS
are inlined, only the bundles the plots use: the page opens offline.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from . import plots
from ..core.results import load
from .report import Section, page_bottom_html, page_top_html, present_sections, section_items

__all__ = ["write_report", "write_page", "page_html", "build_report", "page_findings", "render_plot"]

#: What the forked workers read (set in the parent just before the pool forks; inherited).
_JOB: dict = {}


def page_findings(df: pd.DataFrame) -> list:
    """The advice on the folder's ok rows, once for the page (none where there is nothing to advise)."""
    from ..analyse.advice import advise
    from ..analyse.advice.rules import all_rules
    from ..core.errors import BadInputError

    rows = df[df["status"] == "ok"] if "status" in df and "config_id" in df else df.iloc[0:0]
    if rows.empty:
        return []
    try:
        return advise(rows, all_rules())
    except BadInputError:
        return []


def render_plot(obj, hv):
    """The bokeh model of a plot. A layout's panels are rendered one by one and set in a grid of
    its columns: holoviews renders a layout of overlays in about 1.7× the time of its panels
    alone (the quickstart's training section: 4.1 s against 2.4 s), most of the report's time
    (issue 55: the report's write goal is 8 s). The panels' axes are not linked; each keeps its own
    toolbar, merged into one by the grid."""
    from bokeh.layouts import gridplot

    if not isinstance(obj, hv.Layout) or len(obj) < 2:
        return hv.render(obj, backend="bokeh")
    ncols = getattr(obj, "_max_cols", None) or len(obj)
    return gridplot([hv.render(panel, backend="bokeh") for panel in obj.values()], ncols=min(ncols, len(obj)))


def _cost(section: Section, rows: pd.DataFrame) -> float:
    """A section's rough cost, to hand the longest out first: a plot's series are mostly one per
    configuration (holoviews' time grows with its elements); the advice draws no plot, its rules
    read every row."""
    configs = rows["config_id"].nunique() if "config_id" in rows else len(rows)
    return len(rows) / 20 if section.findings else configs + len(rows) / 10


def _build(index: int) -> tuple[list[tuple[str, object]], list | None]:
    """Section ``index`` of :data:`_JOB`: its parts as ("html", text) and ("plot", bokeh JSON item),
    and the page's findings where this section computed them."""
    import holoviews as hv
    from bokeh.embed import json_item

    section, rows = _JOB["present"][index]
    df = _JOB["df"]
    findings = page_findings(df) if section.findings else None
    items = section_items(section, rows, df, output=_JOB["output"], results_dir=_JOB["results_dir"],
                          findings=findings)
    parts = []
    for item in items:
        if isinstance(item, str):
            parts.append(("html", item))
        else:
            model = render_plot(item, hv)
            parts.append(("plot", (json_item(model), _height_px(model), _components(model))))
    return parts, findings


#: BokehJS's optional bundles, and what in a document needs each (bokeh.embed.bundle's tests).
_OPTIONAL = ("bokeh-gl", "bokeh-widgets", "bokeh-tables", "bokeh-mathjax")


def _components(model) -> frozenset[str]:
    """The optional BokehJS bundles ``model``'s document needs, as ``file_html`` chooses them (the
    page inlines only those: MathJax's alone is 1.8 MB). Where bokeh's private tests are not
    there (another bokeh), every bundle."""
    try:
        from bokeh.embed.bundle import _all_objs, _use_gl, _use_mathjax, _use_tables, _use_widgets
    except ImportError:
        return frozenset(_OPTIONAL)
    objs = _all_objs([model])
    tests = zip(_OPTIONAL, (_use_gl, _use_widgets, _use_tables, _use_mathjax))
    return frozenset(name for name, uses in tests if uses(objs))


def _height_px(model) -> int:
    """The height a plot will take on the page: its placeholder's, so that the page has its
    length before the plots are drawn (a grid: its rows' tallest plots, and its toolbar)."""
    from bokeh.models import GridPlot

    if isinstance(model, GridPlot):
        rows: dict[int, int] = {}
        for child, row, _col, *_ in model.children:
            rows[row] = max(rows.get(row, 0), _height_px(child))
        return sum(rows.values()) + 30
    return int(getattr(model, "height", None) or 300)


def _workers(requested: int | None, tasks: int) -> int:
    if requested is not None:
        return max(1, min(requested, tasks))
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1  # forking is what makes the workers cheap (no re-import, no re-read)
    return max(1, min(os.cpu_count() or 1, tasks))


def write_report(directory: str | Path, output: str | Path, *, title: str | None = None,
                 workers: int | None = None) -> Path:
    """Load every row under ``directory`` and write the standalone report to ``output``: the
    sections built and rendered by ``workers`` processes (by default one per core)."""
    df = load(directory)
    title = title or f"perfkit report: {Path(directory).resolve().name}"
    return write_page(df, Path(output), title=title, results_dir=directory, workers=workers)


def write_page(df: pd.DataFrame, output: Path, *, title: str, results_dir=None, workers: int | None = None) -> Path:
    """Write the report of ``df`` to ``output`` (atomically: a failure leaves any older page)."""
    plots.hv_bokeh()  # holoviews and bokeh imported once, here, before any fork
    present = present_sections(df)
    order = sorted(range(len(present)), key=lambda i: -_cost(*present[i]))
    n = _workers(workers, len(present))
    advised = any(section.findings for section, _ in present)  # its worker computes the page's findings
    _JOB.update(df=df, present=present, output=output, results_dir=results_dir)
    try:
        if n > 1:
            # A worker that dies (killed, out of memory) fails the write (BrokenProcessPool),
            # where a multiprocessing.Pool would wait for its result forever.
            with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
                pending = {i: pool.submit(_build, i) for i in order}
                try:
                    findings = None if advised else page_findings(df)  # here, while the workers work
                    built = {i: job.result() for i, job in pending.items()}
                except BaseException:
                    pool.shutdown(cancel_futures=True)
                    raise
        else:
            findings = None if advised else page_findings(df)
            built = {i: _build(i) for i in order}
    finally:
        _JOB.clear()
    findings = next((f for _, f in built.values() if f is not None), findings) or []
    titles = [section.title for section, _ in present]
    parts = [("html", page_top_html(df, title, findings, titles))]
    for i in range(len(present)):
        parts += built[i][0]
    parts += [("html", text) for text in page_bottom_html(df, output=output, results_dir=results_dir)]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(page_html(title, parts), encoding="utf-8")
    tmp.replace(output)
    return output


_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})

_EMBED = """<script>
(function () {
  // Each plot's bokeh document is embedded from the JSON beside its <div>: first those on or
  // near the screen (as they come into view), then the rest one at a time in page order, so
  // the first screen draws at once and the whole page is drawn soon after (print, find).
  const items = Array.from(document.querySelectorAll('script[type="application/json"][data-pk-plot]'));
  const started = new Map();
  const embed = (el) => {
    if (!started.has(el)) {
      started.set(el, Bokeh.embed.embed_item(JSON.parse(el.textContent), el.dataset.pkPlot));
    }
    return started.get(el);
  };
  const byId = new Map(items.map((el) => [el.dataset.pkPlot, el]));
  const near = new IntersectionObserver((entries) => entries.forEach((e) => {
    if (e.isIntersecting) { near.unobserve(e.target); embed(byId.get(e.target.id)); }
  }), {rootMargin: "600px 0px"});
  items.forEach((el) => near.observe(document.getElementById(el.dataset.pkPlot)));
  let next = 0;
  const rest = () => {
    while (next < items.length && started.has(items[next])) next++;
    if (next < items.length) embed(items[next]).then(() => setTimeout(rest, 0));
    else window.pkAllEmbedded = true;
  };
  // The plots on the first screen now; the rest start once those are drawn.
  const first = items.filter((el) =>
    document.getElementById(el.dataset.pkPlot).getBoundingClientRect().top < window.innerHeight);
  Promise.all(first.map(embed)).then(() => requestAnimationFrame(() => {
    window.pkFirstScreenMs = performance.now();  // since navigation began
    setTimeout(rest, 0);
  }));
})();
</script>"""


def page_html(title: str, parts: list[tuple[str, object]]) -> str:
    """The page: bokeh's resources inlined, then each part in order (HTML text as is; a plot as a
    ``<div>`` and its JSON item, embedded by the script at the end)."""
    import html

    from bokeh.resources import INLINE

    body, needed = [], set()
    for n, (kind, value) in enumerate(parts):
        if kind == "html":
            body.append(f'<div class="pk-text">{value}</div>')
            continue
        item, height_px, components = value
        needed |= components
        target = f"pk-plot-{n}"
        # Inside a script element '</script' would end it and '<!--' change how it is read: the
        # JSON text carries '<', '>' and '&' as \u escapes, which read the same (as json_script does).
        data = json.dumps(item, separators=(",", ":")).translate(_SCRIPT_SAFE)
        body.append(f'<div class="pk-plot" id="{target}" style="min-height:{height_px}px"></div>\n'
                    f'<script type="application/json" data-pk-plot="{target}">{data}</script>')
    resources = INLINE.clone(components=[c for c in INLINE.components if c not in _OPTIONAL or c in needed]).render()
    # panel (imported by holoviews) registers an ES-module shim that bokeh links by a relative
    # path instead of inlining; no plot here uses it, and offline it would only be a failed load.
    resources = re.sub(r'<script src="static/extensions/[^"]*"></script>\s*', "", resources)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n"
            # An empty icon: opened from disk, browsers would otherwise request a missing /favicon.ico.
            "<link rel=\"icon\" href=\"data:,\">\n"
            f"{resources}\n</head>\n<body>\n" + "\n".join(body) + f"\n{_EMBED}\n</body>\n</html>\n")


def build_report(df: pd.DataFrame, *, title: str = "perfkit report", output: str | Path | None = None,
                 results_dir: str | Path | None = None):
    """A bokeh layout of the report for ``df`` (rows as :func:`perfkit.core.results.load` gives),
    built in this process; ``output``/``results_dir``: where the page and the rows are, for links
    to trace files: the parts :func:`write_report` writes as a page, rendered here, one by one."""
    import holoviews as hv
    from bokeh.layouts import column
    from bokeh.models import Div

    plots.hv_bokeh()
    findings = page_findings(df)
    present = present_sections(df)
    shown = [section.title for section, _ in present]
    parts = [Div(text=page_top_html(df, title, findings, shown), sizing_mode="stretch_width")]
    for section, rows in present:
        for item in section_items(section, rows, df, output=output, results_dir=results_dir, findings=findings):
            parts.append(Div(text=item, sizing_mode="stretch_width") if isinstance(item, str) else render_plot(item, hv))
    parts += [Div(text=text, sizing_mode="stretch_width")
              for text in page_bottom_html(df, output=output, results_dir=results_dir)]
    layout = column(*parts)
    layout.tags = shown
    return layout
