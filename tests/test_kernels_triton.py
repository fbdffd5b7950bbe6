"""Triton kernels in the suite (issue 58): the worked example's Triton RMSNorm through the kernels
notebook, run by Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``).

Triton lives in ``.triton/`` (``make triton``, which ``make test`` runs), not in the venv: Triton
reads ``TRITON_INTERPRET`` when it is first imported, and torch imports it by itself during a
training step, so each test here runs Triton in a process of its own with the folder on its
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRITON_DIR = REPO / ".triton"
pytestmark = pytest.mark.skipif(not (TRITON_DIR / ".perfkit-installed").exists(),
                                reason="Triton is not installed in .triton/ (make triton; make test installs it)")


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(TRITON_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1"}


@pytest.mark.slow
def test_the_triton_example_runs_in_the_kernels_notebook_checked_and_said_to_be_interpreted(tmp_path):
    import perfkit
    from perfkit.analyse import kernels

    out = tmp_path / "kernels"
    impls = {"eager": "torch.nn.functional:rms_norm", "triton": "my_kernels:rms_norm_triton",
             "wrong": "my_kernels:rms_norm_wrong"}
    # A power-of-two row and a masked one (1000 of a 1024-wide block), in fp32 and bf16.
    params = {"impls": repr(impls), "dtypes": '["fp32", "bf16"]', "min_run_time_s": "0.02",
              "shapes": '[{"rows": 16, "hidden": 256}, {"rows": 8, "hidden": 1000}]'}
    ran = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(REPO / "notebooks" / "kernels.ipynb"),
                          "--out", str(out), *[a for k, v in params.items() for a in ("-p", k, v)]],
                         capture_output=True, text=True, timeout=600, env=_env())
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    recorded = perfkit.load(out)
    # The roofs the points are drawn under are recorded beside them (a CPU: its theoretical peaks).
    assert set(recorded["workload"]) == {"kernels", "ceiling"}
    rows = recorded[recorded["workload"] == "kernels"]
    assert (rows["status"] == "ok").all() and len(rows) == 3 * 2 * 2, rows[["impl", "status", "reason"]]
    triton = rows[rows["impl"] == "triton"]
    assert triton["correct"].all()
    assert (triton[triton["dtype"] == "fp32"]["max_abs_error"] < 1e-5).all()  # fp32 inside, as the reference
    assert not rows[rows["impl"] == "wrong"]["correct"].any()
    assert rows[rows["impl"] != "eager"]["timing_note"].str.contains("interpreter").all()
    fast = kernels.fast_p(kernels.speedups(rows)).set_index("impl")
    assert fast.loc["triton", "fast_0"] == 1.0 and fast.loc["wrong", ["fast_0", "fast_1"]].tolist() == [0.0, 0.0]
    # The notebook drew its views from these rows: perf_report and the roofline are bokeh plots.
    executed = json.loads(next((out / "notebooks").glob("*.ipynb")).read_text())
    sources = ["".join(c["source"]) for c in executed["cells"]]
    for view in ("perf_report(", "roofline("):
        cell = executed["cells"][next(i for i, s in enumerate(sources) if view in s)]
        assert any("application/vnd.bokehjs_exec.v0+json" in o.get("data", {}) or "text/html" in o.get("data", {})
                   for o in cell["outputs"]), (view, cell["outputs"])


def test_the_address_space_cap_counts_triton_as_start_up():
    """torch imports Triton during the first training step; an OOM probe's cap, read before that
    import, lost its libraries' address space from the headroom (the max-batch edge fell from
    24576 to 12288 with Triton importable)."""
    code = ("import sys, resource\n"
            "from perfkit.measuring.training.step import _cap_address_space\n"
            "_cap_address_space(1 << 40)\n"
            "assert 'triton' in sys.modules, 'the cap was read before triton was imported'\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert ran.returncode == 0, ran.stderr[-2000:]
