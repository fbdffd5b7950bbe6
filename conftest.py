"""nbval runs notebooks/ with their default parameters; this gives notebooks/report.ipynb and
notebooks/compare.ipynb real rows, and notebooks/trace.ipynb a real trace.

(At the repo root, not in notebooks/: pytest imports every conftest.py as the module
``conftest``, and tests/ imports names from its own; the conftest loaded last wins, and
tests/conftest.py loads after this one whatever the order of pytest's arguments.)

The report notebook never substitutes data for a missing folder, and nbval cannot inject
parameters, so its ``results_dir = ""`` default reads ``$PERFKIT_REPORT_DIR``. Before the
notebook's kernel starts, that variable is pointed at a temporary results folder holding one
tiny real GEMM configuration (measured here, recorded through ``perfkit.record``), unless the
caller already set it.

compare.ipynb likewise reads ``$PERFKIT_COMPARE_DIR`` for its ``base_dir = ""``: a tiny real A/B
folder, GEMM rows measured here under two thread counts (``torch.set_num_threads`` 1 and 2, the
in-process stand-in for ``OMP_NUM_THREADS``), interleaved over rounds as a sweep would, each
recorded with the ``variant``/``round`` tags and ``param_names`` a sweep's rows carry.

predict.ipynb's defaults read the real H200 step and H100 table in ``../shared/reference/``; it skips,
saying so, where that folder is absent.

trace.ipynb reads ``$PERFKIT_TRACE_PATH`` for its ``path = ""``: a results folder of one real
profiled CPU training run (``profile=True``, a tiny MLP, a 5 ms data delay per batch), its trace
written beside its row as a sweep's would be (``DIR/traces/<config_id>/<run>/rank0.json.gz``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_prepared: list[str] = []


def _prepare_report_dir() -> str:
    from perfkit.measuring.kernels.gemm import measure_gemm
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


def _prepare_compare_dir() -> str:
    import torch

    from perfkit.measuring.kernels.gemm import measure_gemm
    from perfkit.view.report import COMPARE_DIR_ENV
    from perfkit.core.results import RunContext, record

    folder = tempfile.mkdtemp(prefix="perfkit-compare-nbval-")
    _prepared.append(folder)
    params = {"sizes": [64, 192], "dtypes": ["fp32"], "min_run_time_s": 0.03}
    threads = {"t1": 1, "t2": 2}
    before = torch.get_num_threads()
    try:
        for round_ in (1, 2, 3):
            # Interleaved like a sweep's rounds (t1, t2, then t2, t1, ...): drift hits both sides.
            for variant in (list(threads) if round_ % 2 else list(threads)[::-1]):
                torch.set_num_threads(threads[variant])
                cid = f"gemm-nbval-{variant}-r{round_}"
                ctx = RunContext(results_path=Path(folder) / "results" / f"{cid}.parquet", config_id=cid,
                                 params={**params, "variant": variant, "round": round_, "variant_params": []},
                                 param_names=tuple(params), notebook="gemm.ipynb")
                record(measure_gemm(params["sizes"], params["dtypes"], device="cpu",
                                    min_run_time_s=params["min_run_time_s"]), context=ctx)
    finally:
        torch.set_num_threads(before)
    os.environ[COMPARE_DIR_ENV] = folder
    return folder


def _prepare_trace_dir() -> str:
    from perfkit.core.results import CONTEXT_ENV, RunContext, record
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training
    from perfkit.view.trace import TRACE_PATH_ENV

    folder = tempfile.mkdtemp(prefix="perfkit-trace-nbval-")
    _prepared.append(folder)
    params = {"model": "mlp", "steps": 5, "profile": True, "data_delay_s": 0.005}
    ctx = RunContext(results_path=Path(folder) / "results" / "train-nbval.parquet", config_id="train-nbval",
                     params=params, notebook="notebooks/train_step.ipynb")
    before = os.environ.get(CONTEXT_ENV)
    os.environ[CONTEXT_ENV] = ctx.to_env()  # where the run puts its trace: beside this configuration's rows
    try:
        row = run_training(TrainConfig(batch_size=8, device="cpu", **params))
    finally:
        if before is None:
            os.environ.pop(CONTEXT_ENV, None)
        else:
            os.environ[CONTEXT_ENV] = before
    assert row["status"] == "ok" and row["trace_path"], f"the profiled run for trace.ipynb made no trace: {row}"
    record(row, context=ctx)
    os.environ[TRACE_PATH_ENV] = folder
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # tryfirst: before nbval's setup of the notebook starts its kernel, which inherits os.environ.
    path = Path(str(item.fspath))
    if path.parent.name == "notebooks" and path.name == "predict.ipynb":
        shared = path.parents[2] / "shared" / "reference" / "gpu-h200"
        if not shared.is_dir():  # its defaults are the real H200 step and H100 table, read in place
            pytest.skip(f"{shared} is absent (shared/reference/ sits beside the repository)")
        return
    if path.parent.name != "notebooks" or path.name not in ("report.ipynb", "compare.ipynb", "trace.ipynb"):
        return
    from perfkit.view.report import COMPARE_DIR_ENV, REPORT_DIR_ENV
    from perfkit.view.trace import TRACE_PATH_ENV

    if path.name == "report.ipynb" and not os.environ.get(REPORT_DIR_ENV):
        _prepare_report_dir()
    if path.name == "compare.ipynb" and not os.environ.get(COMPARE_DIR_ENV):
        _prepare_compare_dir()
    if path.name == "trace.ipynb" and not os.environ.get(TRACE_PATH_ENV):
        _prepare_trace_dir()


def pytest_unconfigure(config):
    for folder in _prepared:
        shutil.rmtree(folder, ignore_errors=True)
