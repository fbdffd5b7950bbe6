"""Every notebook, as a person sees it in a real JupyterLab, offline (issue 12).

A `jupyter lab` of this environment on a loopback port and headless Chromium (Debian's
`chromium`, driven by playwright, as the report's browser test): each notebook under
`notebooks/` is opened, run with Run All, and must show no cell error, a bokeh canvas for
every plot, every widget rendered, and make no request to any host but this machine (the CDN
requests of holoviews/panel are what broke notebooks offline). The widgets are exercised the
way a person would: the sweep panel's form filled and Run pressed until the sweep is done, the
report explorer's dropdown changed until the plot draws other data. An executed notebook that
a sweep kept shows its plots when opened later without running anything.

Screenshots go to $PERFKIT_SCREENSHOT_DIR (default: the test's temp dir), one per notebook.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyterlab_driver import JupyterLab, NotebookPage, launch_chromium

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RUN_TIMEOUT_S = 420

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT_S + 180)]


@pytest.fixture(scope="module")
def browser():
    with launch_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory):
    return tmp_path_factory.mktemp("lab") / "root"


@pytest.fixture(scope="module")
def lab(lab_root):
    lab_root.mkdir(parents=True, exist_ok=True)
    # A person's JupyterLab: not a headless execution (make test sets PERFKIT_STATIC for nbval).
    env = {k: v for k, v in os.environ.items() if k not in ("PERFKIT_STATIC", "PERFKIT_CONTEXT")}
    env["PERFKIT_OUT"] = str(lab_root / "interactive-rows")
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        server = JupyterLab(lab_root)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = Path(os.environ.get("PERFKIT_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _perfkit(*args: str, timeout_s: float = 300) -> None:
    """Run the `perfkit` command as a person would (no test-only environment), asserting it succeeds."""
    perfkit = Path(sys.executable).with_name("perfkit")
    env = {k: v for k, v in os.environ.items() if k not in ("PERFKIT_STATIC", "PERFKIT_CONTEXT")}
    cp = subprocess.run([str(perfkit), *args], env=env, capture_output=True, text=True, timeout=timeout_s)
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.fixture(scope="module")
def gemm_sweep(tmp_path_factory) -> Path:
    """A real executed configuration (two dtypes, so the explorer has a dropdown choice)."""
    out = tmp_path_factory.mktemp("gemm-run")
    _perfkit("run", str(REPO / "notebooks" / "gemm.ipynb"), "--out", str(out), "-p", "sizes", "[64, 128]",
             "-p", "dtypes", '["fp32", "bf16"]', "-p", "min_run_time_s", "0.05")
    return out


@pytest.fixture(scope="module")
def ab_sweep(tmp_path_factory) -> Path:
    """A real interleaved A/B sweep of the GEMM notebook (1 vs 2 threads, 2 rounds) for compare.ipynb."""
    out = tmp_path_factory.mktemp("ab-sweep")
    spec = out / "ab.yaml"
    spec.write_text(json.dumps({
        "notebook": str(REPO / "notebooks" / "gemm.ipynb"),
        "parameters": {"sizes": [64, 128], "dtypes": ["fp32"], "min_run_time_s": 0.05}, "grid": {},
        "configs": [{}], "rounds": 2,
        "variants": [{"name": "one", "env": {"OMP_NUM_THREADS": "1"}}, {"name": "two", "env": {"OMP_NUM_THREADS": "2"}}],
    }))  # JSON is YAML
    _perfkit("sweep", str(spec), "--out", str(out / "runs"), "--quiet", timeout_s=600)
    return out / "runs"


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory) -> Path:
    """A real profiled training step (CPU, tiny MLP), made the way trace.ipynb tells a person to."""
    out = tmp_path_factory.mktemp("profiled-run")
    _perfkit("run", str(REPO / "notebooks" / "train_step.ipynb"), "--out", str(out), "-p", "model", "mlp",
             "-p", "steps", "5", "-p", "device", "cpu", "-p", "profile", "True")
    assert list((out / "traces").rglob("rank0.json.gz")), f"no trace under {out}/traces"
    return out


def _copy_notebook(src: Path, root: Path, name: str | None = None, **params) -> str:
    """Copy a notebook into the lab's root, setting parameters in its parameters cell as a
    person would edit them."""
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        if "parameters" in cell["metadata"].get("tags", []):
            source = "".join(cell["source"])
            for key, value in params.items():
                source, n = re.subn(rf"^{key}\s*=.*$", f"{key} = {value!r}", source, flags=re.M)
                assert n == 1, f"no parameter {key} in {src.name}"
            cell["source"] = source
    name = name or src.name
    (root / name).write_text(json.dumps(nb))
    return name


def _assert_renders(page: NotebookPage, outputs: list[dict], what: str) -> None:
    errors = [f"cell {o['cell']}: {o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]
    assert not errors, f"{what}: cell errors {errors}"
    plots = [o for o in outputs if o["is_plot"]]
    blank = [o["cell"] for o in plots if o["canvases"] == 0]
    assert not blank, f"{what}: plots without a bokeh canvas in cells {blank}"
    broken = [o["cell"] for o in outputs if "Error displaying widget" in o["text"]]
    assert not broken, f"{what}: widgets not rendered in cells {broken}"
    assert not page.outside_requests, f"{what}: requests to hosts outside this machine: {page.outside_requests}"
    assert not page.page_errors, f"{what}: page errors {page.page_errors}"


# What a notebook measures is checked by nbval at its defaults (notebooks/) and by each notebook's
# own tests; here it is what JupyterLab shows. The measuring notebooks run with their cheapest
# settings that draw the same plots: inference with the reference roofs (cores × clock ×
# FLOP/cycle) instead of measured ones (seconds of both cores), fewer GEMM sizes and message sizes.
# (roofline.ipynb keeps its measured roofs: a CPU has no reference memory roof to place ops under.)
CHEAPER = {"inference.ipynb": {"ceilings": "none"},
           "gemm.ipynb": {"sizes": [64, 128], "min_run_time_s": 0.05}, "collectives.ipynb": {"max_bytes": 65536}}


def _notebook_params(path: Path, request) -> dict:
    if path.name in CHEAPER:
        return CHEAPER[path.name]
    if path.name == "report.ipynb":
        return {"results_dir": str(request.getfixturevalue("gemm_sweep"))}
    if path.name == "compare.ipynb":
        return {"base_dir": str(request.getfixturevalue("ab_sweep")), "base": "one"}
    if path.name == "trace.ipynb":
        return {"path": str(request.getfixturevalue("profiled_run"))}
    if path.name == "predict.ipynb":  # the real H200 step and H100 table, read in place
        ref = REPO.parent / "shared" / "reference"
        if not (ref / "gpu-h200").is_dir():
            pytest.skip(f"{ref} is absent (shared/reference/ sits beside the repository)")
        return {"results_dir": str(ref / "gpu-h200"), "trace": str(ref / "gpu-h200" / "trace" / "hf-llama-bf16-b16-rank0.json.gz"),
                "network": str(ref / "native" / "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt"), "world_sizes": [8, 64]}
    if path.name == "kernels.ipynb":  # the example's entry points where the copy cannot reach ../templates
        return {"model_path": str(REPO / "templates"), "shapes": [{"rows": 64, "hidden": 256}, {"rows": 64, "hidden": 1024}],
                "dtypes": ["fp32"], "min_run_time_s": 0.02}
    return {}


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_renders_offline(source, lab, lab_root, browser, shots, request):
    name = _copy_notebook(source, lab_root, **_notebook_params(source, request))
    page = NotebookPage(browser, lab, name)
    try:
        kernel = page.kernel()
        assert kernel["name"] == "perfkit" and "perfkit" in kernel["display_name"], (
            f"{name} opened with kernel {kernel}: the notebook should name the venv's 'perfkit' kernel "
            "(`make venv` registers it)")
        try:
            page.run_all(RUN_TIMEOUT_S)
        finally:  # the notebook as run, whether or not the checks below pass
            page.screenshot(shots / f"{source.stem}.png")
        outputs = page.outputs()
        _assert_renders(page, outputs, name)
        # report.ipynb shows the explorer's widgets; script.ipynb a user's script's own output and
        # its metrics' table (what a script prints has no plot perfkit can know in advance).
        if source.name not in ("report.ipynb", "script.ipynb"):
            assert any(o["is_plot"] for o in outputs), f"{name} drew no plot"
        if source.name == "gemm.ipynb":  # long work shows tqdm's notebook bar when run by hand
            assert any(o["progress_bars"] for o in outputs), "no progress bar while measuring the GEMM points"
        if source.name == "report.ipynb":
            _change_explorer_dropdown(page, shots)
    finally:
        page.close()


def _change_explorer_dropdown(page: NotebookPage, shots: Path) -> None:
    """The explorer's pickers (panel Selects in a shadow root: filter, facet, colour, x, y; issue 55)
    are there, and its y picker, the last, changes what the plot draws."""
    labels = " ".join(page.page.locator("label").all_inner_texts())
    for name in ("filter by", "facet", "colour", "x", "y"):
        assert name in labels, f"the explorer has no {name!r} picker ({labels!r})"
    selects = page.page.locator("select")
    select, x_select = selects.last, selects.nth(selects.count() - 2)
    options = select.locator("option").all_inner_texts()
    assert len(options) >= 3, f"the explorer's dropdown offers {options}"
    before = page.plot_data()
    current = select.input_value()
    # another y than the one drawn and than x (y = x would draw the x column against itself)
    other = next(o for o in options if o not in (current, x_select.input_value()))
    select.select_option(other)
    deadline = time.monotonic() + 90  # the kernel redraws: slower under the suite's parallel load
    while page.plot_data() == before and time.monotonic() < deadline:
        time.sleep(0.3)
    assert page.plot_data() != before, f"changing the dropdown to {other!r} did not change the plotted data"
    page.screenshot(shots / "report-explorer-after-dropdown.png")


def test_executed_notebook_shows_plots_when_opened_later(gemm_sweep, lab, lab_root, browser, shots):
    executed = next((gemm_sweep / "notebooks").glob("*.ipynb"))
    shutil.copy(executed, lab_root / "executed-gemm.ipynb")
    page = NotebookPage(browser, lab, "executed-gemm.ipynb")
    try:
        time.sleep(3)  # nothing is run: the saved outputs render (or not) on opening
        outputs = page.outputs()
        assert any(o["is_plot"] for o in outputs), "the executed notebook kept no plot output"
        _assert_renders(page, outputs, executed.name)
        page.screenshot(shots / "executed-gemm-opened-later.png")
    finally:
        page.close()


def test_sweep_panel_runs_a_sweep_from_its_form(lab, lab_root, browser, shots):
    shutil.copy(REPO / "tests" / "notebooks" / "trivial.ipynb", lab_root / "trivial.ipynb")
    name = _copy_notebook(REPO / "tests" / "notebooks" / "widgets_lab.ipynb", lab_root)
    page = NotebookPage(browser, lab, name)
    try:
        page.run_all(120)
        outputs = page.outputs()
        _assert_renders(page, outputs, name)
        assert any(WIDGET_VIEW in o["mimes"] for o in outputs), "the sweep panel was not displayed as widgets"
        field = page.page.locator(".widget-text", has=page.page.locator("label", has_text="x")).locator("input")
        field.fill("1; 2")
        page.page.get_by_role("button", name="Run sweep").click()
        page.page.get_by_text("done in").wait_for(timeout=240_000)
        text = page.page.locator(".jp-Notebook").inner_text()
        assert "2 / 2" in text and "ok: 2" in text, text
        # the rows appear: one per swept value, each ok
        table = page.page.locator(".jp-Notebook table").last
        header = table.locator("th").all_inner_texts()
        rows = [dict(zip(header, r.locator("td").all_inner_texts())) for r in table.locator("tbody tr").all()]
        assert sorted((r["x"], r["status"]) for r in rows) == [("1", "ok"), ("2", "ok")], rows
        page.screenshot(shots / "sweep-panel-after-run.png", tall=1000)
    finally:
        page.close()
    rows = list((lab_root / "sweep-out" / "results").glob("*.parquet"))
    assert len(rows) == 2, rows
