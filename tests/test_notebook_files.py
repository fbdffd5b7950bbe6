"""What every shipped notebook promises before it runs, and the display decisions behind it.

Committed notebooks are clean (outputs stripped, one `parameters` cell of plain literals) and name
the venv's `perfkit` kernel, so JupyterLab offers that kernel for them; plots load their
resources inline (offline) unless told otherwise; executed notebooks are trusted so that their
plots render when opened later. The browser-level checks are in test_jupyterlab.py.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*REPO.glob("notebooks/*.ipynb"), REPO / "templates" / "notebook.ipynb"])


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_shipped_notebook_is_clean_and_names_the_perfkit_kernel(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), "outputs not stripped"
    tagged = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1, f"{len(tagged)} cells tagged 'parameters'"
    for stmt in ast.parse("".join(tagged[0]["source"])).body:
        assert isinstance(stmt, ast.Assign), ast.dump(stmt)
        ast.literal_eval(stmt.value)  # plain literals only
    for line in "".join(tagged[0]["source"]).splitlines():  # papermill warns "Unable to parse line"
        assert "=" not in line.partition("#")[2], f"an '=' in a parameter's comment: {line}"
    assert nb["metadata"]["kernelspec"]["name"] == "perfkit"
    assert "perfkit" in nb["metadata"]["kernelspec"]["display_name"]


def test_plots_load_inline_by_default_and_cdn_on_request(monkeypatch):
    from perfkit.view import display
    from perfkit.core.errors import BadInputError

    monkeypatch.setattr(display, "_chosen", None)
    monkeypatch.delenv(display.RESOURCES_ENV, raising=False)
    assert display.resources_mode() == "inline"
    monkeypatch.setenv(display.RESOURCES_ENV, "cdn")
    assert display.resources_mode() == "cdn"
    display.use_resources("inline")
    assert display.resources_mode() == "inline"  # the notebook's own choice wins
    with pytest.raises(BadInputError, match="inline, cdn"):
        display.use_resources("local")
    monkeypatch.setattr(display, "_chosen", None)
    monkeypatch.setenv(display.RESOURCES_ENV, "offline")
    with pytest.raises(BadInputError, match="PERFKIT_RESOURCES"):
        display.resources_mode()


def test_inline_mode_leaves_no_cdn_link_in_a_plot(monkeypatch):
    """holoviews' panel layouts reference panel's CDN stylesheets unless perfkit inlines them."""
    from perfkit.view import display

    monkeypatch.setattr(display, "_chosen", "inline")
    monkeypatch.setattr(display, "_loaded", None)
    hv = display.hv_bokeh()
    import panel as pn

    html = pn.panel(hv.HoloMap({i: hv.Curve([0, i]) for i in (1, 2)}, kdims=["i"])).get_root()
    from bokeh.embed import json_item

    assert "cdn.holoviz.org" not in json.dumps(json_item(html))


def test_executed_notebooks_are_trusted(tmp_path, monkeypatch):
    from nbformat.sign import NotebookNotary

    from perfkit.run.execute import trust_executed

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    assert not NotebookNotary().check_signature(nbformat.read(path, as_version=4))
    assert trust_executed(path)
    assert NotebookNotary().check_signature(nbformat.read(path, as_version=4))


def test_progress_bars_only_where_someone_watches(monkeypatch):
    from perfkit.core import progress as pr

    items = [1, 2, 3]
    monkeypatch.delenv("PERFKIT_CONTEXT", raising=False)
    monkeypatch.delenv("PERFKIT_STATIC", raising=False)
    monkeypatch.setattr(pr.sys.stderr, "isatty", lambda: True, raising=False)
    bar = pr.progress(items, desc="x")
    assert bar is not items and list(bar) == items  # a terminal: a tqdm bar
    monkeypatch.setenv("PERFKIT_STATIC", "1")
    assert pr.progress(items, desc="x") is items  # headless: nothing
    monkeypatch.delenv("PERFKIT_STATIC")
    monkeypatch.setenv("PERFKIT_CONTEXT", "{}")
    assert pr.progress(items, desc="x") is items  # under an executor: nothing


_PARAM_TABLE_PROBE = """
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
# Inside a cell, as in a kernel: param sees IPython (get_ipython) only while a cell runs.
shell.run_cell("from perfkit.view.display import hv_bokeh; hv = hv_bokeh(); "
               "print('TABLE' if 'Parameters of' in hv.Curve.__doc__ else 'PLAIN')")
"""


@pytest.mark.slow  # a process of its own importing holoviews: 2.8 s each
@pytest.mark.parametrize("context, expected", [(None, "TABLE"), ('{"results_path": "x.parquet", "config_id": "c"}',
                                                                 "PLAIN")], ids=["interactive", "executed"])
def test_param_docstring_tables_only_where_someone_can_ask_for_them(context, expected, tmp_path):
    """A kernel executing a configuration (PERFKIT_CONTEXT) skips param's per-class docstring
    tables (0.2–0.35 s of CPU per plotting configuration); an interactive kernel keeps them."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PERFKIT_CONTEXT"}
    if context:
        env["PERFKIT_CONTEXT"] = context
    out = subprocess.run([sys.executable, "-c", _PARAM_TABLE_PROBE], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1:] == [expected], out.stdout + out.stderr


@pytest.mark.slow  # one real kernel
def test_a_notebook_says_in_plain_text_how_to_trust_it_where_its_plots_cannot_run(tmp_path):
    """Issue 55: an executed notebook opened untrusted showed blank space and no word of why. The
    note is the plain-text form of an output whose JavaScript form is empty: trusted, nothing
    shows; untrusted, JupyterLab falls back to the text."""
    import papermill as pm

    from perfkit.view.display import UNTRUSTED_NOTE

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from perfkit.view.display import hv_bokeh\nhv = hv_bokeh()")])
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    pm.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False)
    outputs = nbformat.read(out, as_version=4).cells[0].outputs
    notes = [o for o in outputs if o.get("data", {}).get("text/plain") == UNTRUSTED_NOTE]
    assert len(notes) == 1 and notes[0]["data"]["application/javascript"] == ""
    assert "jupyter trust" in UNTRUSTED_NOTE
