"""The test suite stops the services it started, and only those (issue 11, item 16).

A real pytest session (a subprocess, on two xdist workers like `make test`) asks
`ensure_slurm()` for a cluster. The bring-up script is a stand-in with up.sh's interface that
starts a detached "daemon" (a `sleep` in a session of its own, as real daemons are), and
`sinfo`/`sacct` stand-ins answer only for that state dir, so this runs in seconds and never
touches the real one-node Slurm that other tests may be using at the same time.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="ensure_slurm() starts a cluster only as root (uid != 0)")

FAKE_UP = """#!/usr/bin/env bash
set -eu
STATE=$1; mkdir -p "$STATE/run"
if [ -f "$STATE/run/daemon.pid" ] && kill -0 "$(cat "$STATE/run/daemon.pid")" 2>/dev/null; then exit 0; fi
setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo $! > "$STATE/run/daemon.pid"
touch "$STATE/slurm.conf"
echo "export SLURM_CONF='$STATE/slurm.conf'" > "$STATE/env.sh"
"""
FAKE_DOWN = """#!/usr/bin/env bash
STATE=$1
kill -KILL "$(cat "$STATE/run/daemon.pid")" 2>/dev/null && echo "[slurm-down] daemon stopped"
rm -f "$STATE/run/daemon.pid"
"""
# sinfo/sacct answer only when pointed at the stand-in cluster's config.
FAKE_CLIENT = """#!/usr/bin/env bash
case "${SLURM_CONF:-}" in "$FAKE_STATE"/*) ;; *) exit 1 ;; esac
[ "$(basename "$0")" = sinfo ] && echo "debug*"
exit 0
"""
INNER_TEST = """
from slurm_cluster import ensure_slurm

def test_a():
    assert ensure_slurm().partition == "debug"

def test_b():
    assert ensure_slurm().partition == "debug"
"""


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _daemon_alive(state: Path) -> bool:
    pid_file = state / "run" / "daemon.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def fake_slurm(tmp_path):
    state = tmp_path / "state"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sinfo", "sacct"):
        _write_exe(bin_dir / name, FAKE_CLIENT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_CONF", "PERFKIT_SLURM_REQUIRE", "PERFKIT_TEST_SESSION")}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{env.get('PYTHONPATH', '')}",
        "FAKE_STATE": str(state),
        "PERFKIT_SLURM_STATE": str(state),
        "PERFKIT_SLURM_UP_SH": str(_write_exe(tmp_path / "up.sh", FAKE_UP)),
        "PERFKIT_SLURM_DOWN_SH": str(_write_exe(tmp_path / "down.sh", FAKE_DOWN)),
    })
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TEST))
    yield state, env
    subprocess.run(["bash", env["PERFKIT_SLURM_DOWN_SH"], str(state)], capture_output=True)


def _inner_session(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    # -p conftest loads the suite's conftest.py (on PYTHONPATH) as a plugin: the hooks under test.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-n", "2",
         "-q", str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_daemons_the_suite_started_are_stopped_when_it_ends(fake_slurm, tmp_path):
    state, env = fake_slurm
    cp = _inner_session(tmp_path, env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert (state / "run" / "daemon.pid").exists() or "daemon stopped" in cp.stdout, cp.stdout
    deadline = time.monotonic() + 5
    while _daemon_alive(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _daemon_alive(state), f"the daemon the suite started outlived it:\n{cp.stdout}"
    assert "stopped the one-node Slurm this test session started" in cp.stdout


@pytest.mark.slow
def test_a_cluster_running_before_the_suite_is_left_running(fake_slurm, tmp_path):
    state, env = fake_slurm
    subprocess.run(["bash", env["PERFKIT_SLURM_UP_SH"], str(state)], check=True, env=env)
    assert _daemon_alive(state)
    cp = _inner_session(tmp_path, env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert _daemon_alive(state), "the suite stopped a cluster it did not start"
