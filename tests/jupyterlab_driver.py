"""A real JupyterLab driven by headless Chromium, for tests (helper module, not a test file).

`JupyterLab` starts ``jupyter lab`` from this interpreter's environment on a free loopback port
with no token, a temporary root, settings and workspace directory (news and update checks off,
every cell rendered: no windowing), and `Chromium` opens notebooks in it with playwright. The
page object exposes what a person would see: each output's type, MIME types, rendered canvases
and text, and every request the page made to a host that is not this machine.

JupyterLab is started with ``expose_app_in_browser`` so tests can run commands
(``notebook:run-all-cells``) and read the notebook model through ``window.jupyterapp``.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}

# Settings a person would click away: the news/update pop-up (it also asks the internet), and
# windowing (off-screen cells are not rendered, so their plots would not exist to check).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

# Every output of every code cell of the current notebook, as a person sees it.
_OUTPUTS_JS = """() => {
  const canvases = (root) => Array.from(root.querySelectorAll('*')).reduce(
      (n, el) => n + (el.tagName === 'CANVAS' ? 1 : 0) + (el.shadowRoot ? canvases(el.shadowRoot) : 0), 0);
  const w = window.jupyterapp.shell.currentWidget;
  const out = [];
  w.content.widgets.forEach((cell, i) => {
    if (cell.model.type !== 'code') return;
    const area = cell.outputArea;
    for (let j = 0; j < area.model.length; j++) {
      const o = area.model.get(j).toJSON();
      const node = area.widgets[j] ? area.widgets[j].node : null;
      out.push({cell: i, output_type: o.output_type, ename: o.ename || null, evalue: o.evalue || null,
                mimes: Object.keys(o.data || {}), canvases: node ? canvases(node) : 0,
                progress_bars: node ? node.querySelectorAll('.widget-hprogress').length : 0,
                // a bokeh document holding a figure (holoviews' extension output is a document too)
                is_plot: /"name":"(Figure|GridPlot)"/.test((o.data || {})['text/html'] || ''),
                text: node ? node.innerText.slice(0, 500) : ''});
    }
  });
  return out;
}"""

_IDLE_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle'; }"""

# Run All is over when the kernel is idle and every code cell ran -- or one failed: JupyterLab
# then drops the cells queued after it, which keep no execution count.
_ALL_RAN_JS = """() => { const w = window.jupyterapp.shell.currentWidget;
  const code = w.content.widgets.filter(c => c.model.type === 'code');
  if (w.sessionContext.session.kernel.status !== 'idle') return false;
  const failed = code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  const queued = code.some(c => (c.promptNode && c.promptNode.textContent || '').includes('*'));
  return !queued && (failed || code.every(c => c.model.executionCount !== null)); }"""

# A standalone report (perfkit.view.report_page) has drawn every plot: each plot <div>'s bokeh
# document embedded (the page embeds the first screen's, then the rest in page order) and idle.
ALL_PLOTS_DRAWN_JS = """() => window.pkAllEmbedded === true && window.Bokeh !== undefined
  && Bokeh.documents.length >= document.querySelectorAll('div.pk-plot').length
  && Bokeh.documents.every(d => d.is_idle)"""

# Data of every ColumnDataSource of every Bokeh document on the page: what the plots draw.
PLOT_DATA_JS = """() => {
  if (!window.Bokeh) return null;
  const docs = window.Bokeh.documents || [];
  const data = [];
  for (const doc of docs) {
    for (const m of doc._all_models.values()) {
      if (m.type === 'ColumnDataSource' || (m.constructor && m.constructor.name === 'ColumnDataSource')) {
        const d = {};
        for (const [k, v] of m.data instanceof Map ? m.data.entries() : Object.entries(m.data)) {
          d[k] = Array.from(v, x => (typeof x === 'number' ? x : String(x)));
        }
        data.push(d);
      }
    }
  }
  return JSON.stringify(data);
}"""


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class ReportPage:
    """A standalone HTML report open in headless Chromium, and what went wrong on it."""

    page: object
    errors: list[str] = field(default_factory=list)
    """JavaScript errors the page raised."""
    failed: list[str] = field(default_factory=list)
    """URLs of requests that failed (an offline report makes none)."""


@contextlib.contextmanager
def launch_chromium():
    """Headless Chromium through playwright; the test skips, with the reason, without Chromium or
    playwright. The browser closes when the block ends."""
    import pytest

    chromium = chromium_path()
    if chromium is None:
        pytest.skip("no Chromium on this machine: `make test` installs Debian's chromium when run as root")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is not installed")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def report_page(report: Path, *, width: int = 1200, height: int = 1600):
    """Open ``report`` in headless Chromium (:func:`launch_chromium`), errors and failed requests
    kept, once every plot of it is drawn."""
    with launch_chromium() as browser:
        opened = ReportPage(page=browser.new_page(viewport={"width": width, "height": height}))
        opened.page.on("pageerror", lambda exc: opened.errors.append(str(exc)))
        opened.page.on("requestfailed", lambda r: opened.failed.append(r.url[:200]))
        opened.page.goto(report.as_uri())
        opened.page.wait_for_function(ALL_PLOTS_DRAWN_JS, timeout=60_000)
        yield opened


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """``jupyter lab`` on 127.0.0.1 serving ``root``; stop() ends it (and its kernels)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None, start_timeout_s: float = 120):
        self.root = root
        self.port = _free_port()
        settings = root.parent / f"{root.name}-lab-settings"
        for rel, values in LAB_SETTINGS.items():
            path = settings / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        self.log_path = root.parent / f"{root.name}-jupyterlab.log"
        jupyter = Path(sys.executable).with_name("jupyter")
        cmd = [str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
               "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={settings / 'workspaces'}"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                                     stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"jupyter lab did not start: {self.log_path.read_text()[-2000:]}")
                time.sleep(0.3)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shutdown_kernels(self) -> None:
        """End every kernel the server runs (a notebook's, once its test is done with it)."""
        with urllib.request.urlopen(f"{self.url}/api/kernels", timeout=10) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(f"{self.url}/api/kernels/{k['id']}", method="DELETE")
            try:
                urllib.request.urlopen(req, timeout=30).close()
            except OSError:
                pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)


class NotebookPage:
    """One notebook open in JupyterLab in a Chromium page."""

    def __init__(self, browser, lab: JupyterLab, path: str, viewport=(1400, 1000)):
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.outside_requests: list[str] = []
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        self.page.on("request", self._on_request)
        self.page.on("pageerror", lambda exc: self.page_errors.append(str(exc)[:300]))
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text[:300]))
        self.lab = lab
        # ?reset: a fresh workspace, so the notebooks earlier tests opened are not reopened with it
        self.page.goto(f"{lab.url}/lab/tree/{urllib.parse.quote(path)}?reset")
        self.page.wait_for_function(_IDLE_JS, timeout=120_000)

    def _on_request(self, request) -> None:
        parsed = urllib.parse.urlparse(request.url)
        if parsed.scheme in ("data", "blob", "about", "chrome-extension"):
            return
        if parsed.hostname not in LOOPBACK_HOSTS:
            self.outside_requests.append(request.url[:200])

    def kernel(self) -> dict:
        return self.page.evaluate("""() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;
            return {name: s.session.kernel.name, display_name: s.kernelDisplayName}; }""")

    def run_all(self, timeout_s: float) -> None:
        self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        self.page.wait_for_function(_ALL_RAN_JS, timeout=timeout_s * 1000)
        time.sleep(1.0)  # let BokehJS finish drawing the last outputs

    def outputs(self) -> list[dict]:
        return self.page.evaluate(_OUTPUTS_JS)

    def plot_data(self) -> str | None:
        return self.page.evaluate(PLOT_DATA_JS)

    def screenshot(self, path: Path, tall: int = 2600) -> Path:
        """The notebook as a person scrolls it: the viewport made tall enough for the outputs."""
        self.page.set_viewport_size({"width": 1400, "height": tall})
        time.sleep(0.5)
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.page.close()
        self.lab.shutdown_kernels()
