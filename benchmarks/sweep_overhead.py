"""perfkit's sweep against a sequential loop of `papermill` CLI calls, and how busy it keeps a device.

**Overhead.** 12 trivial configurations of one notebook: wall time of ``perfkit sweep``
(``--workers`` slots, each configuration in a fresh kernel, prestart on and off) divided by the wall
time of 12 ``papermill`` CLI invocations one after another. The three are measured ``--repeats``
times, interleaved, and each ratio is of medians (a shared machine's neighbours hit all three alike).
Goal (issue 26): ratio <= 0.2 with both prestart settings. Each sweep's device-busy share is printed
beside it (CPU slots: no overlap, the default there).

**Device busy (issue 45).** 12 configurations whose measurement waits ``--device-wait`` seconds on
a simulated device (the host idle, as while a GPU works), then draw a holoviews/bokeh plot of their
row in a cell tagged ``view``, swept with ``--workers 1 --prestart on``, with ``--overlap off``
(before: each configuration ends before the next measures) and ``--overlap on`` (after: the slot is
handed on at the view cell). Goal: busy share >= 0.85 with overlap. Prints the load first.

    python benchmarks/sweep_overhead.py [--configs 12] [--workers 2] [--repeats 3] [--device-wait 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import yaml


def _trivial_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 0")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("y = x * 2\nprint(y)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _device_notebook(path: Path) -> None:
    """Measures by waiting (a device working, the host idle), then views its row in a plot."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("x = 0\nwait_s = 2.0")
    params.metadata["tags"] = ["parameters"]
    view = nbformat.v4.new_code_cell('hv.extension("bokeh", logo=False)\n'
                                     'hv.Curve(rows, "x", "device_time_s").opts(tools=["hover"], title=f"x={x}")')
    view.metadata["tags"] = ["view"]
    nb.cells = [params, nbformat.v4.new_code_cell("import time\nimport holoviews as hv\nimport perfkit"),
                nbformat.v4.new_code_cell("time.sleep(wait_s)\n"
                                          "rows = perfkit.record([{'x': x, 'device_time_s': wait_s}])"), view]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _busy(out: Path) -> str:
    from perfkit.run.sweep.busy import read_summaries

    runs = read_summaries(out)
    return f"busy share {runs[-1].share:.3f}" if runs else "busy share -"


def _device_busy(work: Path, configs: int, wait_s: float) -> None:
    nb = work / "device.ipynb"
    _device_notebook(nb)
    spec = work / "device.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(nb), "parameters": {"wait_s": wait_s},
                                    "grid": {"x": list(range(configs))}}))
    print(f"\ndevice busy: {configs} configurations, each {wait_s} s on a simulated device, then a plot "
          f"(--workers 1 --prestart on); goal >= 0.85 with overlap")
    for overlap in ("off", "on"):
        out = work / f"device-{overlap}"
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet",
                              "--workers", "1", "--prestart", "on", "--overlap", overlap],
                             check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        label = "before (--overlap off)" if overlap == "off" else "after  (--overlap on) "
        print(f"{label} {_busy(out)};  {wall:6.2f} s wall, {wall / configs:.2f} s per configuration;  "
              f"{run.stdout.strip().splitlines()[-1]}")


def _load() -> str:
    return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device-wait", type=float, default=2.0,
                        help="seconds each device-busy configuration measures (0: skip that section)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="perfkit-bench-"))
    try:
        nb = work / "trivial.ipynb"
        _trivial_notebook(nb)
        bindir = Path(sys.executable).parent
        papermill = shutil.which("papermill", path=str(bindir)) or "papermill"

        spec = work / "spec.yaml"
        spec.write_text(yaml.safe_dump({"notebook": str(nb), "grid": {"x": list(range(args.configs))}}))

        def papermill_loop(r: int) -> None:
            for i in range(args.configs):
                subprocess.run([papermill, str(nb), str(work / f"pm-{r}-{i}.ipynb"), "-p", "x", str(i),
                                "--kernel", "python3", "--no-progress-bar"], check=True, capture_output=True)

        def sweep(prestart: str):
            def go(r: int) -> None:
                # --prestart on is what a GPU node gets by default; off is the CPU default (see --help).
                subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out",
                                str(work / f"sweep-{prestart}-{r}"), "--workers", str(args.workers), "--quiet",
                                "--prestart", prestart], check=True, capture_output=True)
            return go

        runs = {"papermill CLI loop": papermill_loop, "perfkit sweep, prestart on": sweep("on"),
                "perfkit sweep, prestart off": sweep("off")}
        times = {name: [] for name in runs}
        print(_load())
        rfc = importlib.util.find_spec("rfc3987_syntax") is not None
        print(f"rfc3987-syntax {'installed: nbformat imports cost 1.2 s more in both' if rfc else 'absent'} "
              f"(make venv removes it)")
        for r in range(args.repeats):
            for name, go in runs.items():
                t0 = time.perf_counter()
                go(r)
                times[name].append(time.perf_counter() - t0)
        print(_load())
        loop_s = statistics.median(times["papermill CLI loop"])
        for name, samples in times.items():
            med = statistics.median(samples)
            line = (f"{name:28s} median {med:6.2f} s  ({med / args.configs:.3f} s per configuration)  "
                    f"samples {', '.join(f'{t:.2f}' for t in samples)}")
            if name != "papermill CLI loop":
                line += f";  ratio {med / loop_s:.3f} (goal <= 0.2, --workers {args.workers})"
                last = work / f"sweep-{name.rsplit(' ', 1)[-1]}-{args.repeats - 1}"
                line += f";  {_busy(last)} (last repeat)"
            print(line)
        if args.device_wait > 0:
            _device_busy(work, args.configs, args.device_wait)
            print(_load())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
