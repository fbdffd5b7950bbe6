import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference"
NOTEBOOKS = REPO / "notebooks"

# Test helper modules in tests/ must be importable by child processes (torchrun ranks, kernels).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO / "tests")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
sys.path.insert(0, str(REPO / "tests"))

# The suite runs more threads than the machine has cores by design (pytest-xdist workers beside
# kernels and gloo ranks, each with its own OpenMP pool). libgomp's default lets an idle OpenMP
# thread spin before it sleeps, and on oversubscribed cores that spinning takes the CPU from the
# processes with work to do: test_training + test_zero under `-n 4` on 2 cores took 243 s of CPU
# (128 s wall) with the default and 160 s (87 s wall) with PASSIVE. Set before any torch loads
# (libgomp reads it once), inherited by the workers and every process a test starts. It changes
# how idle threads wait, never what a test computes or checks; a value already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def sigint_default() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT (Ctrl-C): its SIGINT back to
    the default. A suite started from a background job (``make test &`` in a script) runs with
    SIGINT ignored, every child inherits that across exec, and Python then installs no
    KeyboardInterrupt handler: the Ctrl-C the test sends would be ignored and the test hang."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _is_controller(config) -> bool:
    """True in the process that runs the whole session (not in a pytest-xdist worker)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if os.environ.get("PERFKIT_SUITE_CPU"):  # where the suite's CPU goes, per test (tests/suite_cpu.py)
        import suite_cpu

        config.pluginmanager.register(suite_cpu, "suite_cpu")
    # A fresh id per session, inherited by its xdist workers: services a worker starts for the
    # suite (the one-node Slurm) are tagged with it, and the controller stops them at the end.
    if _is_controller(config):
        import uuid

        from slurm_cluster import SESSION_ENV
        os.environ[SESSION_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def pytest_unconfigure(config):
    if _is_controller(config):
        from slurm_cluster import SESSION_ENV, stop_if_started_by
        out = stop_if_started_by(os.environ.get(SESSION_ENV, ""))
        if out is not None:
            print(f"\nstopped the one-node Slurm this test session started:\n{out.strip()}")


#: The modules whose tests take longest one after another (seconds of wall time, the sum over each
#: module's tests in two whole-suite runs under `make test`, 2 cores, December 2026), longest
#: first. pytest-xdist's loadscope gives a worker a whole module at a time, in collection order
#: once its own reordering (by test count) is off (`--no-loadscope-reorder`, as `make test` runs
#: it): started last, a long module was the suite's tail, one worker busy while the others had
#: finished (test_jupyterlab's 13 tests, ~450 s, began at three quarters of the run). Longest
#: first is the classic list schedule; a module not listed keeps its place after these. This
#: orders the run only: every test still runs.
LONGEST_MODULES = (
    "tests/test_jupyterlab.py",         # 450 s
    "tests/test_sweep_slurm.py",        # 250 s, much of it waiting on Slurm's own time limits
    "tests/test_sweep_ray.py",          # 215 s
    "tests/test_memory_fit.py",         # 215 s
    "tests/test_trace_capture.py",      # 200 s
    "tests/test_scaling_run.py",        # 170 s
    "tests/test_user_models.py",        # 160 s
    "tests/test_sweep.py",              # 155 s
    "tests/test_training.py",           # 145 s
    "tests/test_trace_breakdown.py",    # 125 s
    "tests/test_script_workload.py",    # 120 s
    "tests/test_cli.py",                # 105 s
    "tests/test_teardown.py",           # 105 s
    "tests/test_advise.py",             # 100 s
)


def _longest_first(items) -> None:
    """Items of the LONGEST_MODULES first (in that order), then the notebooks nbval runs (each a
    module of its own, up to ~55 s), then the rest as collected. Stable: a module's items keep
    their order and stay together."""
    stale = [m for m in LONGEST_MODULES if not (REPO / m).is_file()]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_MODULES names files that do not exist: {stale}")
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}

    def key(item) -> int:
        module = item.nodeid.split("::", 1)[0]
        return rank.get(module, len(rank) + (0 if module.startswith("notebooks/") else 1))

    items.sort(key=key)


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    # Tests marked `gpu` need a CUDA/ROCm device: on a machine without one they skip and say so
    # (benchmarks/gpu_check.sh runs them on a GPU node).
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU: torch.cuda.is_available() is False here "
                                       "(a GPU node runs these with benchmarks/gpu_check.sh)")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture
def reference_dir():
    if not REFERENCE.is_dir():
        pytest.skip(f"reference data not found at {REFERENCE} (shared/ must sit beside the repo)")
    return REFERENCE


@pytest.fixture
def run_context(tmp_path, monkeypatch):
    """Point record() at a temp results file, as an executor would."""
    from perfkit.core.results import CONTEXT_ENV, RunContext

    ctx = RunContext(results_path=tmp_path / "results" / "cfg-1.parquet", config_id="cfg-1",
                     params={"batch_size": 8, "precision": "bf16", "sizes": [1, 2]}, notebook="t.ipynb")
    monkeypatch.setenv(CONTEXT_ENV, ctx.to_env())
    return ctx


def ceiling_row(kind, dtype, level, value, origin="measured"):
    """One row of the ceilings table (perfkit.measuring.kernels.peaks.CEILING_COLUMNS) for hand-made ceiling sets."""
    return {"kind": kind, "dtype": dtype, "level": level, "value": value,
            "unit": "FLOP/s" if kind == "compute" else "bytes/s", "origin": origin,
            "source": "test"}


def filesystem_type(path) -> str:
    """The filesystem type of ``path`` as coreutils names it (``ext2/ext3`` for ext4), a check
    independent of perfkit's own reading of /proc/self/mountinfo."""
    import subprocess

    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True,
                          check=True).stdout.strip()


#: Disk filesystems whose clean pages POSIX_FADV_DONTNEED drops (mm/fadvise.c invalidates the
#: mapping's unmapped clean pages); tmpfs pages have no backing store to be dropped to.
DROPPING_FILESYSTEMS = ("ext2/ext3", "xfs", "btrfs")


@pytest.fixture
def cache_on(tmp_path, request):
    """A dataset cache on disk (``tmp_path``) or on tmpfs (a folder in /dev/shm): parametrize
    indirectly with ``"disk"`` or ``"tmpfs"``."""
    import shutil
    import tempfile

    if request.param == "disk":
        return tmp_path
    if not os.path.isdir("/dev/shm") or filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    folder = Path(tempfile.mkdtemp(prefix="perfkit-test-", dir="/dev/shm"))
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


def samples_digest(arrays) -> str:
    """SHA-256 over the bytes of ``arrays`` in order (uint8): a dataset read back equals what was written."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.asarray(a, dtype=np.uint8).tobytes())
    return h.hexdigest()
