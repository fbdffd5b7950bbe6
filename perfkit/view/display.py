"""Where plots get their JavaScript: one decision for every display path of perfkit.

GPU cluster nodes often have no internet, and holoviews/panel load BokehJS and their extensions
from ``cdn.bokeh.org``/``cdn.holoviz.org`` unless told otherwise: in JupyterLab every cell then
runs and no plot appears. perfkit therefore loads the resources **inline** (from the installed
bokeh/panel packages, into the notebook's output) by default, so a notebook renders offline, live
and when an executed notebook is opened later. ``cdn`` keeps notebooks small (a few kB instead
of a few MB per loaded notebook) where the browser reaches the internet.

Choose with ``PERFKIT_RESOURCES=inline|cdn`` (environment, e.g. for a whole sweep) or
:func:`use_resources` in a notebook before the first plot. ipywidgets need nothing here: the
JupyterLab widget manager serves them from the local server.
"""

from __future__ import annotations

import os

__all__ = ["RESOURCES_ENV", "RESOURCE_MODES", "resources_mode", "use_resources", "hv_bokeh"]

RESOURCES_ENV = "PERFKIT_RESOURCES"
RESOURCE_MODES = ("inline", "cdn")

_chosen: str | None = None   # set by use_resources(); wins over the environment
_loaded: str | None = None   # the mode the holoviews bokeh extension was loaded with by perfkit


def resources_mode() -> str:
    """The resource mode in force: :func:`use_resources`' choice, else ``$PERFKIT_RESOURCES``,
    else ``inline``."""
    from ..core.errors import BadInputError

    mode = _chosen or os.environ.get(RESOURCES_ENV, "").strip().lower() or "inline"
    if mode not in RESOURCE_MODES:
        raise BadInputError(f"{RESOURCES_ENV}={mode!r}: use one of {', '.join(RESOURCE_MODES)}")
    return mode


def use_resources(mode: str) -> None:
    """Load plot resources ``inline`` (offline, the default) or from the ``cdn`` from now on."""
    from ..core.errors import BadInputError

    if mode not in RESOURCE_MODES:
        raise BadInputError(f"use_resources({mode!r}): use one of {', '.join(RESOURCE_MODES)}")
    global _chosen
    _chosen = mode


def hv_bokeh():
    """holoviews with its bokeh backend loaded in the resource mode in force; returns ``hv``.

    Loads the extension at most once per mode: a notebook that called ``hv.extension("bokeh")``
    itself (CDN resources) still gets inline resources the first time a perfkit plot is built.

    Plots draw on a plain canvas, not WebGL (holoviews' default since 1.18): perfkit's plots hold
    tens to thousands of points, where WebGL gains nothing, and BokehJS then draws every glyph into
    one WebGL canvas and copies it into each plot's (``blit_webgl``). Without a GPU (a remote
    desktop, a headless browser, a VM: software GL) that copy was 2.1 of the 5.1 s the quickstart
    report's page took to draw in headless Chromium (a CDP profile); on canvas the page draws in
    2.2 s, and the page no longer carries BokehJS's WebGL bundle.
    """
    _no_param_docstrings_when_executed()
    import holoviews as hv

    global _loaded
    mode = resources_mode()
    if _loaded != mode or "bokeh" not in hv.Store.renderers:
        import panel as pn

        # holoviews renders through panel: its `inline` also swaps panel's CDN stylesheets
        # (loading.css, theme CSS) for inline copies; hv.extension's own `inline` covers the JS.
        pn.config.inline = mode == "inline"
        hv.extension("bokeh", logo=False, inline=(mode == "inline"))
        hv.renderer("bokeh").webgl = False  # see the docstring
        _register_inline_css_hook()
        _loaded = mode
        _say_how_to_trust()
    return hv


UNTRUSTED_NOTE = ("If no plot shows below, this notebook is not trusted here (JupyterLab runs no "
                  "JavaScript of a notebook it did not execute itself): File > Trust Notebook, or "
                  "`jupyter trust NOTEBOOK.ipynb`, then reopen it. perfkit trusts the notebooks it executes.")


def _say_how_to_trust() -> None:
    """In a notebook, one output whose JavaScript form is empty and whose plain-text form says how to
    trust it: a trusted notebook renders the (empty) JavaScript, an untrusted one falls back to the
    text, so the note shows exactly where the plots cannot (issue 55: blank space, no word of why)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    from IPython.display import display

    display({"application/javascript": "", "text/plain": UNTRUSTED_NOTE}, raw=True)


def _no_param_docstrings_when_executed() -> None:
    """In a kernel perfkit executes a configuration in (``PERFKIT_CONTEXT`` set: papermill, no
    person at it), param does not write its parameter table into the docstring of every
    holoviews/panel/bokeh class it creates. Under IPython it does (``param.parameterized.
    docstring_describe_params``, param 2.x), for ``hv.Curve?``: about 580 classes, 0.2–0.35 s of
    CPU measured in each configuration that plots, read by nobody there. An interactive session keeps
    them; the classes, plots and outputs are the same either way."""
    from ..core.results import CONTEXT_ENV

    if os.environ.get(CONTEXT_ENV):  # classes made before this keep their tables; later ones skip them
        import param

        param.parameterized.docstring_describe_params = False


def _inline_css(viewable, root) -> None:
    """Panel preprocessing hook: replace panel's CDN stylesheets in a rendered model by inline ones.

    Panel does this itself for its own objects when ``pn.config.inline`` is set, but holoviews
    renders its plots' panel layouts through another path that keeps the CDN ``<link>``s
    (loading.css, theme CSS): without this, those are the requests that fail offline.
    """
    if _loaded != "inline":
        return
    from bokeh.models import UIElement
    from panel.io.notebook import patch_inline_stylesheets

    for model in root.select({"type": UIElement}):
        patch_inline_stylesheets(model)


def _register_inline_css_hook() -> None:
    from panel.viewable import Viewable

    if _inline_css not in Viewable._preprocessing_hooks:  # panel's extension point (panel.links uses it)
        Viewable._preprocessing_hooks.append(_inline_css)
