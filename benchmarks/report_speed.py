"""How long a results folder's report takes to write and to draw in a browser.

Writes the report with ``perfkit report`` in a fresh process (imports included: what a user
waits for), ``--repeats`` times, then opens it in headless Chromium and times from navigation to
the first screen is drawn (its plots' bokeh documents idle), and to the moment every plot of
the page is drawn (the page embeds them after the first screen, in page order). Issue 55's goals for the quickstart
(``make demo``'s ``runs/quickstart``) on 2 cores: written in ≤ 8 s, drawn in ≤ 3 s.

    python benchmarks/report_speed.py runs/quickstart [--repeats 3]

Prints the medians and every sample, the page's size and ``uptime``'s load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _write_s(folder: Path, out: Path) -> float:
    perfkit = Path(sys.executable).with_name("perfkit")
    t0 = time.perf_counter()
    subprocess.run([str(perfkit), "report", str(folder), "-o", str(out)], check=True, capture_output=True)
    return time.perf_counter() - t0


#: The page embeds one bokeh document per plot (perfkit.view.report_page): those on the first
#: screen at once, then the rest in page order. The first screen's time is the page's own clock
#: (window.pkFirstScreenMs: its plots embedded and a frame painted, ms since navigation began);
#: the whole page's is polled: every plot's document begun and idle.
_WHOLE_PAGE = """() => window.pkAllEmbedded === true
  && Bokeh.documents.length >= document.querySelectorAll('div.pk-plot').length
  && Bokeh.documents.every(d => d.is_idle)"""


def _draw_s(page_path: Path, chromium: str) -> tuple[float, float, int]:
    """(seconds to the first screen drawn, seconds to every plot drawn, bokeh models)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=_CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        t0 = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_function(_WHOLE_PAGE, timeout=120_000, polling=20)
        whole = time.perf_counter() - t0
        first = page.evaluate("() => window.pkFirstScreenMs") / 1e3
        n_models = page.evaluate("() => Bokeh.documents.reduce((n, d) => n + d.all_models.size, 0)")
        browser.close()
    return first, whole, n_models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a results folder (make demo writes runs/quickstart)")
    parser.add_argument("--repeats", type=int, default=3, help="writes and draws timed (default 3)")
    args = parser.parse_args()
    if not args.folder.is_dir():
        print(f"report_speed: {args.folder} is not a folder; run `make demo` for runs/quickstart", file=sys.stderr)
        return 2
    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    work = Path(tempfile.mkdtemp(prefix="perfkit-report-speed-"))
    try:
        out = work / "report.html"
        writes = [_write_s(args.folder, out) for _ in range(args.repeats)]
        print(f"load: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} CPUs")
        print(f"write: median {statistics.median(writes):.2f} s (goal ≤ 8 s); samples "
              + ", ".join(f"{s:.2f}" for s in writes) + f"; page {out.stat().st_size / 1e6:.2f} MB")
        if chromium is None:
            print("draw: not timed, no Chromium here")
            return 0
        draws = [_draw_s(out, chromium) for _ in range(args.repeats)]
        print(f"draw, first screen: median {statistics.median(d[0] for d in draws):.2f} s (goal ≤ 3 s); samples "
              + ", ".join(f"{d[0]:.2f}" for d in draws))
        print(f"draw, whole page (every plot, embedded after the first screen): median "
              f"{statistics.median(d[1] for d in draws):.2f} s; samples " + ", ".join(f"{d[1]:.2f}" for d in draws)
              + f"; {draws[0][2]} bokeh models")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
