"""perfkit's sweep against a sequential loop of `papermill` CLI calls, in the same run.

12 trivial configurations of one notebook: wall time of ``perfkit sweep`` (``--workers`` slots,
warm kernels) divided by the wall time of 12 ``papermill`` CLI invocations one after another.
Goal on a 2-core machine: ratio <= 0.35. Also prints the per-configuration overhead of each.

    python benchmarks/sweep_overhead.py [--configs 12] [--workers 2]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="perfkit-bench-"))
    try:
        nb = work / "trivial.ipynb"
        _trivial_notebook(nb)
        bindir = Path(sys.executable).parent
        papermill = shutil.which("papermill", path=str(bindir)) or "papermill"

        t0 = time.perf_counter()
        for i in range(args.configs):
            subprocess.run([papermill, str(nb), str(work / f"pm-{i}.ipynb"), "-p", "x", str(i),
                            "--kernel", "python3", "--no-progress-bar"], check=True, capture_output=True)
        loop_s = time.perf_counter() - t0

        spec = work / "spec.yaml"
        spec.write_text(yaml.safe_dump({"notebook": str(nb), "grid": {"x": list(range(args.configs))}}))
        print(f"papermill CLI loop:       {loop_s:7.2f} s  ({loop_s / args.configs:.2f} s per configuration)")
        # --prestart on is what a GPU node gets by default; off is the CPU default (see --help).
        for prestart in ("on", "off"):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out",
                            str(work / f"sweep-{prestart}"), "--workers", str(args.workers), "--quiet",
                            "--prestart", prestart], check=True, capture_output=True)
            sweep_s = time.perf_counter() - t0
            print(f"perfkit sweep, prestart {prestart:<3}: {sweep_s:7.2f} s  ({sweep_s / args.configs:.2f} s per "
                  f"configuration, --workers {args.workers});  ratio sweep / loop {sweep_s / loop_s:.3f}  (goal <= 0.35)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
