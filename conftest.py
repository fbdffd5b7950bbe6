"""nbval runs notebooks/ with their default parameters; this gives notebooks/report.ipynb real rows.

(At the repo root, not in notebooks/: pytest imports every conftest.py as the module
``conftest``, and tests/ imports names from its own; the conftest loaded last wins, and
tests/conftest.py loads after this one whatever the order of pytest's arguments.)

The report notebook never substitutes data for a missing folder, and nbval cannot inject
parameters, so its ``results_dir = ""`` default reads ``$PERFKIT_REPORT_DIR``. Before the
notebook's kernel starts, that variable is pointed at a temporary results folder holding one
tiny real GEMM configuration (measured here, recorded through ``perfkit.record``), unless the
caller already set it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_prepared: list[str] = []


def _prepare_report_dir() -> str:
    from perfkit.measuring.gemm import measure_gemm
    from perfkit.view.report import REPORT_DIR_ENV
    from perfkit.core.results import RunContext, record

    folder = tempfile.mkdtemp(prefix="perfkit-report-nbval-")
    _prepared.append(folder)
    params = {"sizes": [32, 64], "dtypes": ["fp32", "tf32"]}
    ctx = RunContext(results_path=Path(folder) / "results" / "gemm-nbval.parquet", config_id="gemm-nbval",
                     params=params, notebook="notebooks/gemm.ipynb")
    # tf32 on a CPU gives a `skipped` row with its reason: the report's failures table has a row.
    record(measure_gemm(params["sizes"], params["dtypes"], device="cpu", min_run_time_s=0.02), context=ctx)
    os.environ[REPORT_DIR_ENV] = folder
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # tryfirst: before nbval's setup of the notebook starts its kernel, which inherits os.environ.
    path = Path(str(item.fspath))
    if path.name != "report.ipynb" or path.parent.name != "notebooks":
        return
    from perfkit.view.report import REPORT_DIR_ENV

    if not os.environ.get(REPORT_DIR_ENV):
        _prepare_report_dir()


def pytest_unconfigure(config):
    for folder in _prepared:
        shutil.rmtree(folder, ignore_errors=True)
