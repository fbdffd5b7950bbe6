"""A real one-node Slurm cluster for tests (helper module, not a test file).

Usage from a test module::

    from slurm_cluster import SlurmCluster, ensure_slurm

    @pytest.fixture(scope="session")
    def slurm() -> SlurmCluster:
        return ensure_slurm()

`ensure_slurm()` reuses a cluster that already answers (`sinfo` and `sacct` work with
the current environment, or with the env file of a cluster that `.ci/slurm/up.sh`
started earlier); otherwise it runs `.ci/slurm/up.sh` (root only: it may apt-get install
slurm-wlm, slurmdbd, munge and mariadb-server, ~35 s, then starts the daemons, ~4 s).
When that is impossible it calls `pytest.skip` with the exact reason -- or `pytest.fail`
when PERFKIT_SLURM_REQUIRE=1 (set this in CI so that Slurm tests can never be skipped
silently).

Environment knobs: PERFKIT_SLURM_STATE (state dir, default /tmp/perfkit-slurm),
PERFKIT_SLURM_PARTITION (default "debug"), PERFKIT_SLURM_UP_TIMEOUT (seconds, default
900), PERFKIT_SLURM_REQUIRE=1 (fail instead of skip).

Every command here runs with a timeout; nothing waits unboundedly.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import pytest

REPO = Path(__file__).resolve().parents[1]
# PERFKIT_SLURM_UP_SH / PERFKIT_SLURM_DOWN_SH name other bring-up/teardown scripts with the same
# interface (STATE_DIR argument, env.sh written by up) -- e.g. for a site's own test cluster.
UP_SH = Path(os.environ.get("PERFKIT_SLURM_UP_SH") or REPO / ".ci" / "slurm" / "up.sh")
DOWN_SH = Path(os.environ.get("PERFKIT_SLURM_DOWN_SH") or REPO / ".ci" / "slurm" / "down.sh")
DEFAULT_STATE = "/tmp/perfkit-slurm"
# The pytest session (controller, shared by its xdist workers) that owns what up.sh starts here.
SESSION_ENV = "PERFKIT_TEST_SESSION"
OWNER_FILE = "started-by-test-session"

# Final job states as sacct prints them (sacct appends " by <uid>" to CANCELLED).
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED",
})


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmCluster:
    """A reachable Slurm cluster: the environment to talk to it and its partition."""

    env: Mapping[str, str]          # extra variables (SLURM_CONF, ...) for Slurm clients
    partition: str
    state_dir: Path | None = None   # set when the cluster is the one up.sh manages
    source: str = ""                # how it was found: "existing", "env-file", "up.sh"
    up_seconds: float = 0.0         # time spent in up.sh (0 when reused)
    up_log: str = field(default="", repr=False)

    @property
    def slurm_conf(self) -> str | None:
        return self.env.get("SLURM_CONF")

    def full_env(self) -> dict[str, str]:
        """os.environ plus this cluster's variables (for subprocesses)."""
        env = dict(os.environ)
        env.update(self.env)
        return env

    def apply_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Export the cluster variables into os.environ (e.g. for submitit)."""
        for k, v in self.env.items():
            monkeypatch.setenv(k, v)

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, sacct, ...) with a timeout."""
        try:
            cp = subprocess.run(list(args), env=self.full_env(), capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise SlurmError(f"{shlex.join(args)} timed out after {timeout} s") from e
        if check and cp.returncode != 0:
            raise SlurmError(f"{shlex.join(args)} failed (rc={cp.returncode}): {cp.stderr.strip()}")
        return cp

    def sbatch(self, *args: str, timeout: float = 30) -> str:
        """Submit a batch job to this cluster's partition; return the job id."""
        cp = self.run("sbatch", "--parsable", f"--partition={self.partition}", *args, timeout=timeout)
        return cp.stdout.strip().split(";")[0]

    def sacct_state(self, job_id: str) -> str | None:
        """The job allocation's state as sacct reports it, or None if not (yet) recorded."""
        cp = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False, timeout=20)
        lines = [ln.strip() for ln in cp.stdout.splitlines() if ln.strip()]
        return lines[0] if cp.returncode == 0 and lines else None

    def wait_state(self, job_id: str, states: Iterable[str], timeout: float, poll: float = 1.0) -> str:
        """Poll sacct until the job's state (first word) is one of `states`; return it.

        Raises SlurmError when the job reaches another terminal state or `timeout` passes.
        """
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = None
        while True:
            state = self.sacct_state(job_id)
            word = state.split()[0] if state else None
            if word in wanted:
                return state
            if word in TERMINAL_STATES:
                raise SlurmError(f"job {job_id} ended {state!r}, expected one of {sorted(wanted)}")
            if time.monotonic() >= deadline:
                raise SlurmError(f"job {job_id} still {state!r} after {timeout} s, "
                                 f"expected one of {sorted(wanted)}")
            time.sleep(poll)


def read_env_file(path: Path) -> dict[str, str]:
    """Parse the `export K='V'` lines of up.sh's env.sh."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("export ") or "=" not in line:
            continue
        key, _, value = line[len("export "):].partition("=")
        parts = shlex.split(value)
        env[key.strip()] = parts[0] if parts else ""
    return env


def _works(env: Mapping[str, str]) -> bool:
    full = dict(os.environ)
    full.update(env)
    for cmd in (["sinfo", "-h", "-o", "%P"], ["sacct", "-n", "-X", "-S", "now-1minutes", "-o", "JobID"]):
        try:
            cp = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=15,
                                stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if cp.returncode != 0:
            return False
    return True


def _default_partition(env: Mapping[str, str]) -> str | None:
    full = dict(os.environ)
    full.update(env)
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], env=full, capture_output=True, text=True,
                             timeout=15, stdin=subprocess.DEVNULL).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    for p in out:
        if p.endswith("*"):
            return p[:-1]
    return out[0] if out else None


def _give_up(reason: str):
    if os.environ.get("PERFKIT_SLURM_REQUIRE") == "1":
        pytest.fail(f"Slurm required (PERFKIT_SLURM_REQUIRE=1) but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


_cache: dict[str, SlurmCluster | str] = {}


def ensure_slurm(state_dir: str | os.PathLike | None = None) -> SlurmCluster:
    """Return a working SlurmCluster, or skip (fail if PERFKIT_SLURM_REQUIRE=1) with the reason."""
    state = Path(state_dir or os.environ.get("PERFKIT_SLURM_STATE") or DEFAULT_STATE)
    key = str(state)
    if key not in _cache:
        try:
            _cache[key] = _find_or_start(state)
        except _Unavailable as e:
            _cache[key] = str(e)
    got = _cache[key]
    if isinstance(got, str):
        _give_up(got)
    return got  # type: ignore[return-value]


class _Unavailable(Exception):
    pass


def _find_or_start(state: Path) -> SlurmCluster:
    wanted_partition = os.environ.get("PERFKIT_SLURM_PARTITION")

    # 1. A cluster that the current environment already reaches (SLURM_CONF or /etc/slurm).
    if os.environ.get("SLURM_CONF") or Path("/etc/slurm/slurm.conf").exists():
        if _works({}):
            part = wanted_partition or _default_partition({}) or "debug"
            env = {"SLURM_CONF": os.environ["SLURM_CONF"]} if os.environ.get("SLURM_CONF") else {}
            return SlurmCluster(env=env, partition=part, source="existing")

    # 2. The cluster up.sh started earlier in this state dir, if it still answers.
    env_file = state / "env.sh"
    if env_file.exists():
        env = read_env_file(env_file)
        if env.get("SLURM_CONF") and _works(env):
            part = env.get("PERFKIT_SLURM_PARTITION", "debug")
            if wanted_partition in (None, part):
                return SlurmCluster(env=env, partition=part, state_dir=state, source="env-file")

    # 3. Start one with up.sh.
    if os.geteuid() != 0:
        raise _Unavailable(f"no Slurm cluster reachable and starting one with {UP_SH.relative_to(REPO)} "
                           f"needs root (uid={os.geteuid()})")
    if not UP_SH.exists():
        raise _Unavailable(f"{UP_SH} is missing")
    timeout = float(os.environ.get("PERFKIT_SLURM_UP_TIMEOUT", "900"))
    t0 = time.monotonic()
    for attempt in (1, 2):  # up.sh is idempotent; a second run rides out a slow daemon restart
        try:
            cp = subprocess.run(["bash", str(UP_SH), str(state)], capture_output=True, text=True,
                                timeout=max(60.0, timeout - (time.monotonic() - t0)),
                                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"")
            out = out.decode(errors="replace") if isinstance(out, bytes) else out
            raise _Unavailable(f"{UP_SH.name} timed out after {timeout:.0f} s; last output: "
                               f"{out.strip().splitlines()[-1:]}") from None
        if cp.returncode == 0:
            break
    took = time.monotonic() - t0
    log = cp.stdout + cp.stderr
    if cp.returncode != 0:
        fail = [ln for ln in cp.stderr.splitlines() if "FAILED" in ln] or log.strip().splitlines()[-3:]
        raise _Unavailable(f"{UP_SH.name} failed (rc={cp.returncode}): {' | '.join(fail)}")
    if not env_file.exists():
        raise _Unavailable(f"{UP_SH.name} succeeded but wrote no {env_file}")
    _claim(state)
    env = read_env_file(env_file)
    if not _works(env):
        raise _Unavailable(f"{UP_SH.name} succeeded but sinfo/sacct do not work with {env_file}")
    return SlurmCluster(env=env, partition=env.get("PERFKIT_SLURM_PARTITION", "debug"),
                        state_dir=state, source="up.sh", up_seconds=took, up_log=log)


def _claim(state: Path) -> None:
    """Record that this test session started the daemons under `state`, so that it stops them.

    A cluster that was already running (CI's `.ci/run` starts one before the suite, a developer
    may keep one up) is never claimed, so the suite stops only what it started itself.
    """
    session = os.environ.get(SESSION_ENV)
    if session:
        (state / OWNER_FILE).write_text(session + "\n")


def stop_if_started_by(session: str, state_dir: str | os.PathLike | None = None) -> str | None:
    """Stop the cluster under `state_dir` if the test session `session` started it.

    Called once by the pytest controller when the whole session ends (after every xdist worker).
    Returns what down.sh printed, or None when this session started nothing there.
    """
    state = Path(state_dir or os.environ.get("PERFKIT_SLURM_STATE") or DEFAULT_STATE)
    owner = state / OWNER_FILE
    try:
        if owner.read_text().strip() != session:
            return None
    except OSError:
        return None
    try:
        cp = subprocess.run(["bash", str(DOWN_SH), str(state)], capture_output=True, text=True,
                            timeout=180, stdin=subprocess.DEVNULL)
        out = cp.stdout + cp.stderr
    except subprocess.TimeoutExpired:
        out = f"{DOWN_SH.name} timed out after 180 s"
    owner.unlink(missing_ok=True)
    return out
