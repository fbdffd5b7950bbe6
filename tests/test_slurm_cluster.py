"""Real-Slurm tests (issue 8): a one-node cluster with accounting, see .ci/slurm/.

All tests are `slow`.  The cluster comes from `ensure_slurm()`: it is started by
.ci/slurm/up.sh when needed (root only; otherwise the tests skip with the reason, or fail
when PERFKIT_SLURM_REQUIRE=1).  test_timeout_shows_in_sacct takes 60-100 s because
Slurm's time limits have a granularity of one minute (and slurmctld checks them about
every 30 s).  Every wait is bounded.
"""
from __future__ import annotations

import importlib.util
import time

import pytest

try:
    from slurm_cluster import SlurmCluster, ensure_slurm
except ImportError:  # tests/ imported as a package
    from tests.slurm_cluster import SlurmCluster, ensure_slurm


pytestmark = [pytest.mark.slow]
if importlib.util.find_spec("pytest_timeout") is not None:
    # Room for a first-time up.sh (apt-get install, ~40 s here) inside the first test's
    # setup; the waits inside the tests are bounded on their own.
    pytestmark.append(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    return ensure_slurm()


def _running(slurm: SlurmCluster, job_id: str, timeout: float = 60) -> None:
    slurm.wait_state(job_id, {"RUNNING"}, timeout=timeout, poll=0.5)


def test_sbatch_echo_completes(slurm: SlurmCluster, tmp_path):
    out = tmp_path / "hi.out"
    job = slurm.sbatch(f"--chdir={tmp_path}", f"--output={out}", "--time=2", "--wrap", "echo hi")
    state = slurm.wait_state(job, {"COMPLETED"}, timeout=60)
    assert state == "COMPLETED"
    assert out.read_text().strip() == "hi"
    exit_code = slurm.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "ExitCode").stdout.strip()
    assert exit_code == "0:0"


def test_scancel_shows_cancelled(slurm: SlurmCluster, tmp_path):
    job = slurm.sbatch(f"--chdir={tmp_path}", "--output=/dev/null", "--time=5", "--wrap", "sleep 300")
    try:
        _running(slurm, job)
    finally:
        slurm.run("scancel", job)
    state = slurm.wait_state(job, {"CANCELLED"}, timeout=60)
    assert state.startswith("CANCELLED")  # sacct prints "CANCELLED by 0"


def _square(x: int) -> int:
    return x * x


def _submitit_executor(slurm: SlurmCluster, tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit", reason="submitit is not installed (pip install submitit)")
    slurm.apply_env(monkeypatch)  # submitit's sbatch/sacct calls inherit os.environ
    ex = submitit.SlurmExecutor(folder=tmp_path / "submitit", max_num_timeout=0)
    ex.update_parameters(partition=slurm.partition, time=2, cpus_per_task=1, signal_delay_s=10)
    return ex


def _wait_done(job, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not job.done(force_check=True):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"submitit job {job.job_id} not done after {timeout} s (state {job.state})")
        time.sleep(1)


def test_submitit_roundtrip(slurm: SlurmCluster, tmp_path, monkeypatch):
    ex = _submitit_executor(slurm, tmp_path, monkeypatch)
    job = ex.submit(_square, 7)
    _wait_done(job, timeout=90)
    assert job.result() == 49
    # The result pickle can appear before slurmdbd has recorded the job's end.
    assert slurm.wait_state(job.job_id, {"COMPLETED"}, timeout=30) == "COMPLETED"


# A Slurm TIMEOUT and a cancelled job seen through submitit are exercised end to end by
# tests/test_sweep_slurm.py (the executor's timeout and scancel tests); not repeated here.
