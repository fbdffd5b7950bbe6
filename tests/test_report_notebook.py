"""report.ipynb shows the rows of the folder it is given, or fails: never substitute rows.

nbval runs it on a folder notebooks/conftest.py prepares (through ``$PERFKIT_REPORT_DIR``);
here it runs through ``perfkit run`` (a real papermill kernel) on folders that do not exist.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import perfkit
from conftest import NOTEBOOKS
from perfkit.core.errors import BadInputError
from perfkit.view.report import REPORT_DIR_ENV, notebook_results_dir

NOTEBOOK = NOTEBOOKS / "report.ipynb"


@pytest.mark.slow
def test_a_missing_results_dir_fails_the_notebook_with_the_reason(tmp_path):
    missing = tmp_path / "runs" / "quickstrat"  # a typo of a real sweep folder
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(NOTEBOOK), "--out", str(tmp_path / "o"),
                          "-p", "results_dir", str(missing), "--timeout-s", "240"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "failed" in out.stdout and "BadInputError" in out.stdout
    assert f"results directory {str(missing)!r} does not exist" in out.stdout
    rows = perfkit.load(tmp_path / "o")
    assert rows["status"].tolist() == ["failed"]  # the run's own status row, no measured rows
    assert not missing.exists()


def test_an_empty_results_dir_reads_the_environment_then_the_demo_or_says_what_to_run(tmp_path, monkeypatch):
    from perfkit.view import report

    monkeypatch.delenv(REPORT_DIR_ENV, raising=False)
    monkeypatch.setattr(report, "DEMO_DIR", tmp_path / "no-demo-yet")
    with pytest.raises(BadInputError, match=f"results_dir is empty and \\${REPORT_DIR_ENV} is not set: run `make demo`"):
        notebook_results_dir("")
    demo = tmp_path / "runs" / "quickstart"
    demo.mkdir(parents=True)
    monkeypatch.setattr(report, "DEMO_DIR", demo)
    assert notebook_results_dir("") == demo  # after make demo, the notebook opens on its results
    monkeypatch.setenv(REPORT_DIR_ENV, str(tmp_path))
    assert notebook_results_dir("") == tmp_path
    (tmp_path / "results").mkdir()
    assert notebook_results_dir(str(tmp_path / "results")) == tmp_path / "results"
    with pytest.raises(BadInputError, match="does not exist"):
        notebook_results_dir(str(tmp_path / "nope"))  # given explicitly: the environment is not consulted
