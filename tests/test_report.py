"""The standalone report: sections from recorded rows, failures, fingerprints, escaping, and a
real headless Chromium that must render every bokeh plot without a JavaScript error."""

import html
import os
from pathlib import Path

import pandas as pd
import pytest

from perfkit.core.env import fingerprint, flat_columns
from perfkit.view.report_page import write_report
from perfkit.core.results import write_rows

from jupyterlab_driver import ALL_PLOTS_DRAWN_JS, CHROMIUM_ARGS, chromium_path

EVIL = "<script>alert('pwned')</script>"


def _gemm_rows(env, dtype="fp32", config="gemm-a"):
    rows = []
    for size in (64, 128, 256):
        t = 2 * size ** 3 / 1e11
        rows.append({"config_id": config, "workload": "gemm", "status": "ok", "reason": None, "size": size,
                     "dtype": dtype, "flop": 2 * size ** 3, "time_s": t, "time_iqr_s": t * 0.02, "noisy": False,
                     "time_samples_s": [t, t], "flop_per_s": 2 * size ** 3 / t, "bytes_per_s": 1e9, **env})
    return rows


@pytest.fixture
def results_dir(tmp_path):
    env = flat_columns(fingerprint("cpu"))
    write_rows(pd.DataFrame(_gemm_rows(env) + _gemm_rows(env, dtype=EVIL, config="gemm-b")),
               tmp_path / "results" / "gemm.parquet")
    failed = {**env, "config_id": "train-x", "workload": "train_step", "status": "oom",
              "reason": f"OutOfMemoryError: {EVIL}", "batch_size": 4096}
    skipped = {**env, "config_id": "gemm-c", "workload": "gemm", "status": "skipped",
               "reason": "tf32 needs an NVIDIA GPU", "dtype": "tf32"}
    write_rows(pd.DataFrame([failed, skipped]), tmp_path / "results" / "other.parquet")
    return tmp_path


def test_report_has_sections_failures_and_fingerprint(results_dir):
    html = write_report(results_dir, results_dir / "report.html").read_text()
    assert "GEMM throughput" in html
    assert "Failed, oom, timeout, killed and skipped configurations" in html
    assert "train-x" in html and "gemm-c" in html and "tf32 needs an NVIDIA GPU" in html
    assert "Environment fingerprints" in html
    assert "cdn.bokeh.org" not in html  # resources inlined


def test_data_labels_are_escaped(results_dir):
    html = write_report(results_dir, results_dir / "report.html").read_text()
    assert EVIL not in html
    # The failures table is HTML, escaped once; a plot's legend is in its JSON, where '<', '>' and
    # '&' are \\u escapes (the data can neither end the script element nor change how it is read).
    assert "OutOfMemoryError: &lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert "\\u003cscript\\u003ealert('pwned')\\u003c/script\\u003e" in html


def test_mixed_environments_are_flagged(results_dir):
    env = flat_columns(fingerprint("cpu"))
    other = {**env, "env_torch": "2.99.0", "env_fingerprint_id": "other"}
    write_rows(pd.DataFrame(_gemm_rows(other, config="gemm-z")), results_dir / "results" / "z.parquet")
    html = write_report(results_dir, results_dir / "report.html").read_text()
    assert "Rows from different environments" in html and "2.99.0" in html


def test_sections_only_when_rows_exist(tmp_path):
    env = flat_columns(fingerprint("cpu"))
    write_rows(pd.DataFrame([{**env, "config_id": "x", "status": "failed", "reason": "boom"}]),
               tmp_path / "results" / "x.parquet")
    html = write_report(tmp_path, tmp_path / "r.html").read_text()
    assert "GEMM throughput</h2>" not in html.replace("&lt;", "<") and "boom" in html


@pytest.mark.slow
def test_report_renders_in_a_real_browser(results_dir):
    chromium = chromium_path()
    if chromium is None:
        pytest.skip("no Chromium on this machine: `make test` installs Debian's chromium when run as root")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is not installed")
    from test_parallelism_report import parallel_train_rows  # training and parallelism sections too

    write_rows(parallel_train_rows(with_pp=True).assign(**flat_columns(fingerprint("cpu"))),
               results_dir / "results" / "parallel.parquet")
    report = write_report(results_dir, results_dir / "report.html")
    errors, console = [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1600})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: console.append((msg.type, msg.text)))
        failed_requests = []
        page.on("requestfailed", lambda r: failed_requests.append(r.url[:200]))
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(report.as_uri())
        page.wait_for_function(ALL_PLOTS_DRAWN_JS, timeout=60_000)
        # Bokeh 3 draws into canvases inside shadow roots: walk them to count.
        count_canvases = """() => {
            const walk = (root) => Array.from(root.querySelectorAll('*')).reduce(
                (n, el) => n + (el.tagName === 'CANVAS' ? 1 : 0) + (el.shadowRoot ? walk(el.shadowRoot) : 0), 0);
            return walk(document);
        }"""
        page.wait_for_function(f"() => ({count_canvases})() > 0", timeout=30_000)
        n_canvas = page.evaluate(count_canvases)
        body_text = page.evaluate("""() => {  // text of the page, shadow roots included
            const walk = (root) => Array.from(root.querySelectorAll('*')).map(
                el => (el.shadowRoot ? walk(el.shadowRoot) : '')).join(' ') + ' ' + (root.textContent || '');
            return document.body.innerText + ' ' + walk(document);
        }""")
        n_plots = page.evaluate("""() => Bokeh.documents.flatMap(d => d.roots()).flatMap(r => [r, ...(r.children || [])])
                                   .filter(m => m.type === 'Figure' || m.constructor.name === 'Figure').length""")
        shot = Path(os.environ.get("PERFKIT_SCREENSHOT_DIR", results_dir)) / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert not errors, errors
    assert not failed_requests, failed_requests
    assert not dialogs, dialogs  # the <script> label never ran
    assert not [text for kind, text in console if kind == "error"], console
    assert n_plots >= 1 and n_canvas >= n_plots
    for title in ("GEMM throughput", "Training step", "Parallelism: memory per rank"):  # (plot titles: canvas)
        assert title in body_text, title
    assert "OutOfMemoryError: <script>alert('pwned')</script>" in body_text  # shown as text
    assert shot.stat().st_size > 10_000


def test_an_empty_plot_inside_a_section_layout_leaves_no_panel_model_in_the_page(tmp_path):
    # A training sweep with no known peak (bf16 on this CPU) and no activation model (convnet):
    # its section's layout holds Divs ("MFU unknown"...). Inside a layout holoviews renders a Div
    # as panel's HTML model, which a standalone page cannot resolve: Bokeh then drew nothing.
    from perfkit.view.report_page import build_report

    rows = pd.DataFrame([{"workload": "train_step", "status": "ok", "model": "convnet", "batch_size": b,
                          "precision": "bf16", "parallelism": "none", "world_size": 1,
                          "samples_per_s": 10.0 * b, "step_time_s": 0.1, "step_time_iqr_s": 0.001,
                          "peak_mem_bytes": 1e8,
                          "peak_mem_kind": "cpu_max_rss", "mfu": float("nan"),
                          "mfu_reason": "no theoretical bf16 peak for this CPU", "config_id": str(b)}
                         for b in (4, 8)])
    layout = build_report(rows, title="t")
    assert "Training" in " ".join(layout.tags)
    modules = {type(m).__module__ for m in layout.references()}
    assert not [m for m in modules if m.startswith("panel")], modules


@pytest.mark.slow  # the whole H200 report laid out
def test_every_tooltip_of_the_h200_report_names_a_field_its_plot_has_and_the_first_screen_summarises():
    """Issue 55: HoloViews rewrote a tooltip field that began like another (@time_share →
    @{time_s}hare); every field of every plot's tooltips must be one its data has. And the page
    opens on a summary: the device, how the configurations ended, the findings, the sections."""
    import re

    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    from perfkit.core.results import load
    from perfkit.view.report_page import build_report

    folder = Path(__file__).resolve().parents[2] / "shared" / "reference" / "gpu-h200"
    if not folder.is_dir():
        pytest.skip(f"the H200 reference folder is not at {folder} (read in place)")
    layout = build_report(load(folder), results_dir=folder)
    checked = 0
    for fig in layout.select({"type": figure}):
        fields = set().union(*(r.data_source.data.keys() for r in fig.renderers if hasattr(r, "data_source")))
        for tool in fig.select({"type": HoverTool}):
            for _, spec in tool.tooltips or []:
                named = re.findall(r"@\{(\w+)\}", spec)
                assert set(named) <= fields and not re.search(r"@\{\w+\}[a-z]", spec), (fig.title.text, spec)
                checked += 1
    assert checked > 50
    first = layout.children[0].text  # the page opens on it
    assert "devices:</b> NVIDIA H200 (driver nvidia 580.159.04)" in first and "16 configurations: 16 ok" in first
    assert "host/launch-bound" in first and "What binds it" in first and 'href="#roofline"' in first
    assert first.count("<li><b>") + first.count("<li>") >= 5


def test_the_first_screen_reads_a_frame_without_a_workload_column_or_with_a_repeated_index():
    # CI (issue 55's first screen): a one-row folder of a user's notebook has no `workload`, and a
    # frame concatenated from two folders repeats its index; both broke the headlines.
    from perfkit.view.report_summary import summary_html

    bare = pd.DataFrame([{"status": "ok", "time_s": 0.01}])
    assert "ran:" in summary_html(bare, [], [])
    step = {"workload": "train_step", "status": "ok", "model": "transformer", "batch_size": 8,
            "precision": "fp32", "mfu": 0.25}
    twice = pd.concat([pd.DataFrame([{**step, "samples_per_s": 100.0}]),
                       pd.DataFrame([{**step, "samples_per_s": 300.0, "batch_size": 32}])])
    assert list(twice.index) == [0, 0]
    page = summary_html(twice, [], [])
    assert "best 300 samples/s (transformer, batch 32, fp32); MFU 25.0 %" in page


def test_each_configuration_opens_on_its_rows_figures_and_traces(tmp_path):
    """Issue 55's drill-down: a configuration's line opens on its rows' headline figures (what each
    row is, how it ended, its times and rates) and the traces it recorded, linked to the Traces
    section; its executed notebook (its plots) stays one link away."""
    import html as _html

    from perfkit.core.results import RunContext, record

    def config(cid, rows, params):
        ctx = RunContext(results_path=tmp_path / "results" / f"{cid}.parquet", config_id=cid, params=params,
                         param_names=tuple(params), notebook="train_step.ipynb")
        record(rows, context=ctx)

    # A user's notebook's rows (no section of their own: the drill-down is where they show).
    step = {"workload": "my_step", "model": "transformer", "batch_size": 8, "precision": "fp32",
            "time_s": 0.0123, "samples_per_s": 650.4, "losses": [4.2, 4.1]}
    config("train_step-aaa", [step], {"batch_size": 8})
    config("train_step-bbb", [{**step, "batch_size": 16, "trace_path": "traces/train_step-bbb/rank0.json.gz"}],
           {"batch_size": 16})
    text = _html.unescape(write_report(tmp_path, tmp_path / "report.html").read_text()).replace('\\"', '"')
    drill = text[text.index("configurations: status, parameters, rows (open one"):]
    assert "<th>workload</th><th>model</th><th>batch_size</th><th>precision</th><th>status</th>" in drill
    assert "<td>my_step</td><td>transformer</td><td>16</td><td>fp32</td><td>ok</td><td>0.0123</td><td>650.4</td>" in drill
    assert 'traces: rank0.json.gz (<a href="#traces">their summary</a>)' in drill
    assert drill.count("<details><summary>1</summary>") == 2  # one row each, opened on demand


def _page_text(html_text: str) -> list[str]:
    """The page's HTML text parts and plot placeholders in order, without what differs between
    two writes (the time it was generated, bokeh's ids)."""
    import re

    body = html_text[html_text.index("<body>"):]
    body = re.sub(r"generated [0-9-]+ [0-9:]+ UTC", "generated (time)", body)
    parts = re.findall(r'<div class="pk-text">(.*?)</div>\n(?=<div class="pk-|<script>)|<div class="pk-plot"', body, re.S)
    return parts


@pytest.mark.slow  # two reports of three sections: ~5 s
def test_the_page_is_the_same_written_by_one_process_or_several(results_dir):
    from test_parallelism_report import parallel_train_rows  # several sections, of different costs

    write_rows(parallel_train_rows(with_pp=False).assign(**flat_columns(fingerprint("cpu"))),
               results_dir / "results" / "parallel.parquet")
    one = write_report(results_dir, results_dir / "one.html", workers=1).read_text()
    two = write_report(results_dir, results_dir / "two.html", workers=2).read_text()
    assert _page_text(one) == _page_text(two) and one.count('class="pk-plot"') == two.count('class="pk-plot"') >= 3
    # Each plot's document carries what it draws: the GEMM sizes of both dtypes, from either writer.
    for page in (one, two):
        assert page.count('"name":"ColumnDataSource"') >= 1 and "GEMM throughput" in page
    # In report order, however the sections were handed out (the longest first).
    from perfkit.core.results import load
    from perfkit.view.report import present_sections

    titles = [section.title for section, _ in present_sections(load(results_dir))]
    at = [two.index(f">{html.escape(title)}</h2>") for title in titles]
    assert len(titles) >= 3 and at == sorted(at)
    # Only the BokehJS bundles the plots use are inlined (MathJax's alone is 1.8 MB); plots draw
    # on a canvas, so not WebGL's either.
    assert "BEGIN bokeh.min.js" in one and "BEGIN bokeh-mathjax" not in one and "BEGIN bokeh-gl" not in one


def test_plots_draw_on_a_canvas_not_webgl():
    """BokehJS's WebGL draws every plot into one WebGL canvas and copies it into each: without a
    GPU (software GL) that copy was 2.1 of the 5.1 s the quickstart report took to draw."""
    from perfkit.view.display import hv_bokeh

    hv = hv_bokeh()
    fig = hv.render(hv.Overlay([hv.Curve([(1, 2), (2, 3)]), hv.Scatter([(1, 2), (2, 3)])]), backend="bokeh")
    assert fig.output_backend == "canvas"


def test_a_section_that_fails_leaves_the_older_page(results_dir, monkeypatch):
    from perfkit.view import report

    page = results_dir / "report.html"
    page.write_text(before := "<html>an older report</html>")

    def broken(rows, all_rows):
        raise RuntimeError("a plot that cannot be drawn")

    gemm = next(s for s in report.SECTIONS if s.title == "GEMM throughput")
    sections = list(report.SECTIONS)
    sections[sections.index(gemm)] = report.Section(title=gemm.title, select=gemm.select, build=broken)
    monkeypatch.setattr(report, "SECTIONS", sections)
    with pytest.raises(RuntimeError, match="cannot be drawn"):
        write_report(results_dir, page, workers=2)
    assert page.read_text() == before and not list(results_dir.glob("*.tmp"))


@pytest.mark.timeout(60)  # the bug this catches waits forever
def test_a_report_worker_that_dies_fails_the_write_instead_of_waiting(results_dir, monkeypatch):
    import signal

    from perfkit.view import report

    page = results_dir / "report.html"
    page.write_text(before := "<html>an older report</html>")

    def killed(rows, all_rows):
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a worker

    gemm = next(s for s in report.SECTIONS if s.title == "GEMM throughput")
    sections = list(report.SECTIONS)
    sections[sections.index(gemm)] = report.Section(title=gemm.title, select=gemm.select, build=killed)
    monkeypatch.setattr(report, "SECTIONS", sections)
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        write_report(results_dir, page, workers=2)
    assert page.read_text() == before
