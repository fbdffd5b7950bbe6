"""The Ray executor (issue 32) against a real local Ray cluster.

The module's fixture starts a head with ``ray start`` on 127.0.0.1 (2 CPUs and 2 declared GPUs:
Ray hands them out and sets CUDA_VISIBLE_DEVICES like real ones, and a CPU torch ignores them)
and ends every process of it at the end (found by an environment marker they all inherit),
checking that none is left. Every Ray process stays on
the loopback address (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray would otherwise swap 127.0.0.1
for the machine's interface address). The drivers run as ``perfkit sweep`` processes, as users run them.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

import perfkit
from conftest import REPO, sigint_default
from perfkit.run import _teardown
from perfkit.run.sweep import Ledger
from perfkit.run.sweep.busy import read_summaries

pytestmark = pytest.mark.slow

MODES = Path(__file__).parent / "notebooks" / "modes.ipynb"
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address():
    pytest.importorskip("ray", reason="ray is not installed (pip install 'perfkit[ray]'; make installs it)")
    ray_cli = str(Path(sys.executable).parent / "ray")
    temp_dir = tempfile.mkdtemp(prefix="pkray-", dir="/tmp")  # short: Ray's socket paths live under it
    port = _free_port()
    # Every process of this cluster (GCS, raylet, workers, the kernels its tasks start) inherits
    # the marker: the end stops exactly those, never another Ray of this machine (`ray stop` would).
    marker = _teardown.new_token()
    # Ray's token authentication, with this cluster's own token: the drivers get it through
    # _RAY_ENV; nothing reads or writes the user's ~/.ray/auth_token (which a `ray start` without
    # RAY_AUTH_MODE would use if present, leaving drivers without the mode unauthenticated).
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))
    _RAY_ENV.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    # The head is started with the command perfkit's own "no cluster" error tells a user to run
    # (issue 47: its earlier hint started a head the driver could not join), plus this test's port,
    # resources and folders.
    from perfkit.run.sweep.ray_executor import START_HEAD

    words = shlex.split(START_HEAD)
    at = words.index("ray")
    hinted_env = dict(w.split("=", 1) for w in words[:at])
    env = {**os.environ, **_RAY_ENV, **hinted_env, marker: "1"}
    started = subprocess.run([ray_cli, *words[at + 1:], f"--port={port}",
                              "--num-cpus=2", "--num-gpus=2", "--include-dashboard=false", "--disable-usage-stats",
                              f"--temp-dir={temp_dir}", "--object-store-memory=100000000"],
                             env=env, capture_output=True, text=True, timeout=120)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert len(_teardown.holders(marker)) >= 3  # GCS, raylet, their helpers: found by the marker
        yield f"127.0.0.1:{port}"
    finally:
        for pid in _teardown.holders(marker):
            try:
                os.kill(pid, signal.SIGTERM)  # the workers and most helpers end on SIGTERM
            except OSError:
                pass
        deadline = time.monotonic() + 3
        while _teardown.holders(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _teardown.reap(marker)  # GCS, raylet and two agents do not: SIGKILL, as `ray stop --force`
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
            _RAY_ENV.pop(name, None)
        assert not left, f"Ray processes {left} outlived SIGKILL"


def _sweep(spec: Path, out: Path, *args, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **_RAY_ENV}, **kw)


def _spec(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _slot_holders() -> list[int]:
    """Processes a Ray configuration started (the kernel and its children carry its slot)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"PERFKIT_SLOT=ray:" in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _all_gone(within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _slot_holders()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_gemm_and_two_rank_training_give_the_local_executors_rows(ray_address, tmp_path):
    spec = _spec(tmp_path, {"timeout_s": 300, "parts": [
        {"notebook": str(REPO / "notebooks" / "gemm.ipynb"),
         "parameters": {"min_run_time_s": 0.02, "sizes": [64], "dtypes": ["fp32"]}},
        {"notebook": str(REPO / "notebooks" / "train_step.ipynb"), "devices_per_config": 2,
         "parameters": {"model": "mlp", "steps": 3, "warmup_steps": 1, "world_size": 2, "parallelism": "ddp",
                        "batch_size": 8}}]})
    local = subprocess.Popen([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out",
                              str(tmp_path / "local"), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    ray = _sweep(spec, tmp_path / "ray", "--executor", "ray", "--ray-address", ray_address,
                 "--ray-cpus-per-config", 1)
    local_out, _ = local.communicate(timeout=300)
    assert ray.returncode == 0 and local.returncode == 0, (ray.stdout, ray.stderr, local_out)
    by_ray, by_local = perfkit.load(tmp_path / "ray"), perfkit.load(tmp_path / "local")
    assert sorted(by_ray["config_id"]) == sorted(by_local["config_id"]) and set(by_ray["status"]) == {"ok"}
    # The same columns with the same types, but the environment's own (which differ by design: a
    # Ray task's kernel has its slot, Ray's device assignment and Ray's variables).
    schema = lambda df: {c: str(t) for c, t in df.dtypes.items() if not c.startswith("env_")}  # noqa: E731
    assert schema(by_ray) == schema(by_local)
    assert len(by_ray[by_ray["world_size"] == 2]) >= 1
    slots = {e.slot for e in Ledger(tmp_path / "ray").events()}
    assert any(s.endswith(":gpu:0,1") for s in slots)  # the two-rank configuration had both GPUs
    assert not _all_gone()


def test_two_configurations_never_share_a_device(ray_address, tmp_path):
    spec = _spec(tmp_path, {"notebook": str(MODES), "parameters": {"mode": "sleep", "sleep_s": 1.5},
                            "grid": {"batch_size": [1, 2, 3, 4, 5]}})
    ran = _sweep(spec, tmp_path / "out", "--executor", "ray", "--ray-address", ray_address)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    spans = [(e.slot, e.start, e.end) for e in Ledger(tmp_path / "out").events() if e.status == "ok"]
    assert len(spans) == 5 and {s for s, _, _ in spans} == {spans[0][0].rsplit(":", 1)[0] + f":{g}" for g in "01"}
    for slot in {s for s, _, _ in spans}:
        on_it = sorted((a, b) for s, a, b in spans if s == slot)
        assert all(prev_end <= start for (_, prev_end), (start, _) in zip(on_it, on_it[1:])), on_it
    # Each kernel saw exactly its GPU, under both vendors' names (its rows' fingerprints say so).
    seen = [json.loads(j)["env_vars"] for j in perfkit.load(tmp_path / "out")["env_json"]]
    assert sorted(v["CUDA_VISIBLE_DEVICES"] for v in seen) in (["0", "0", "0", "1", "1"], ["0", "0", "1", "1", "1"])
    assert all(v["HIP_VISIBLE_DEVICES"] == v["CUDA_VISIBLE_DEVICES"] for v in seen)
    # Issue 45: each task's allocation is its attempt; the busy share is Σ windows ÷ Σ attempts.
    busy = read_summaries(tmp_path / "out")[-1]
    assert busy.executor == "Ray" and len(busy.held_s) == 5 and busy.configs == 5
    windows = {e.config_id: (e.window_end - e.window_start, e.end - e.start)
               for e in Ledger(tmp_path / "out").events() if e.status == "ok"}
    for cid, (window_s, attempt_s) in windows.items():
        assert busy.measured_s[cid] == pytest.approx(window_s) and busy.held_s[cid] == pytest.approx(attempt_s)
        assert 1.5 <= window_s <= attempt_s
    assert f"device busy {busy.share:.2f} of 5 Ray allocations'" in ran.stdout


def test_a_timeout_leaves_no_process_and_a_killed_worker_ends_killed_then_resumes_ok(ray_address, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    # Only the sleeping configuration has the short deadline: the held one, re-run on resume, must
    # not time out while its kernel starts beside a loaded suite (CI: more than 6 s under load 5).
    spec = _spec(tmp_path, {"parts": [
        {"notebook": str(MODES), "timeout_s": 6, "configs": [{"mode": "sleep", "sleep_s": 120.0, "batch_size": 1}]},
        {"notebook": str(MODES), "timeout_s": 120, "configs": [{"mode": "hold", "hold_file": str(hold),
                                                                "batch_size": 2}]}]})
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet",
                               "--executor", "ray", "--ray-address", ray_address],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **_RAY_ENV})
    try:
        held = None
        deadline = time.monotonic() + 120
        while held is None and time.monotonic() < deadline:
            held = next((e for e in Ledger(out).events() if e.status == "running" and e.params.get("mode") == "hold"),
                        None)
            time.sleep(0.2)
        assert held is not None, "the held configuration never started"
        time.sleep(2.0)  # its kernel is running the notebook
        os.kill(held.pid, signal.SIGKILL)  # the Ray worker running it
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == 1, stdout + stderr
    endings = {e.params["mode"]: e for e in Ledger(out).events() if e.status != "running"}
    assert set(endings) == {"sleep", "hold"}, stdout + stderr  # the driver says why one has no ending
    assert endings["sleep"].status == "timeout"
    assert endings["hold"].status == "killed" and endings["hold"].error_name == "RayWorkerCrashed", endings["hold"]
    assert not _all_gone(), "a process of a configuration outlived it by 10 s"
    hold.unlink()
    again = _sweep(spec, out, "--executor", "ray", "--ray-address", ray_address)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [(e.attempt, e.status) for e in Ledger(out).events() if e.params.get("mode") == "hold"] == [
        (1, "running"), (1, "killed"), (2, "running"), (2, "ok")]
    rows = perfkit.load(out)
    assert sorted(rows["status"]) == ["ok", "timeout"]  # one row per configuration, from its last attempt


def test_ctrl_c_cancels_the_running_tasks_and_the_same_command_resumes(ray_address, tmp_path):
    spec = _spec(tmp_path, {"notebook": str(MODES), "parameters": {"mode": "sleep", "sleep_s": 60.0},
                            "grid": {"batch_size": [1]}})
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet",
                               "--executor", "ray", "--ray-address", ray_address], preexec_fn=sigint_default,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **_RAY_ENV})
    try:
        deadline = time.monotonic() + 120
        while not any(e.status == "running" for e in Ledger(out).events()) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        driver.send_signal(signal.SIGINT)
        _, stderr = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode != 0 and "run again on resume" in stderr and "--executor ray` again" in stderr, stderr
    assert [e.status for e in Ledger(out).events()] == ["running", "killed"]
    assert not _all_gone()


def test_bad_input_is_one_line_and_exit_2_at_once(tmp_path, monkeypatch):
    spec = _spec(tmp_path, {"notebook": str(MODES), "grid": {"batch_size": [1]}})
    t0 = time.monotonic()
    nobody = _sweep(spec, tmp_path / "a", "--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}")
    assert nobody.returncode == 2 and time.monotonic() - t0 < 30, nobody.stderr
    assert "no Ray cluster answers at 127.0.0.1:" in nobody.stderr and len(nobody.stderr.strip().splitlines()) == 1
    from perfkit.run.sweep.ray_executor import START_HEAD

    assert f"start one with `{START_HEAD}`" in nobody.stderr  # the command the module's fixture runs
    misplaced = _sweep(spec, tmp_path / "b", "--ray-address", "127.0.0.1:6379")
    assert misplaced.returncode == 2 and "--ray-address only apply with --executor ray" in misplaced.stderr
    malformed = _sweep(spec, tmp_path / "c", "--executor", "ray", "--ray-address", "headnode")
    assert malformed.returncode == 2 and "expected HOST:PORT" in malformed.stderr
    # ray missing: the extra is named, nothing runs.
    from perfkit.core.errors import BadInputError
    from perfkit.run.sweep import expand, load_spec
    from perfkit.run.sweep.ray_executor import run_ray_sweep

    monkeypatch.setitem(sys.modules, "ray", None)
    loaded = load_spec(spec)
    with pytest.raises(BadInputError, match=r"pip install 'perfkit\[ray\]'"):
        run_ray_sweep(loaded, expand(loaded), tmp_path / "d", address="127.0.0.1:6379")
    assert not (tmp_path / "d" / "ledger").exists()


def test_more_cpus_than_any_node_has_is_refused(ray_address, tmp_path):
    spec = _spec(tmp_path, {"notebook": str(MODES), "grid": {"batch_size": [1]}, "ray": {"cpus_per_config": 16}})
    ran = _sweep(spec, tmp_path / "out", "--executor", "ray", "--ray-address", ray_address)
    assert ran.returncode == 2 and "cpus_per_config 16 > the 2 CPUs of the largest node" in ran.stderr, ran.stderr


def test_a_local_ray_runs_in_the_driver_and_ends_with_it(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'perfkit[ray]'; make installs it)")
    spec = _spec(tmp_path, {"notebook": str(MODES), "parameters": {"mode": "ok"}, "grid": {"batch_size": [1, 2]}})
    marker = _teardown.new_token()  # inherited by the driver's Ray and everything it starts
    token = tmp_path / "auth_token"  # its own: a local ray.init would otherwise write ~/.ray/auth_token
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, **_RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), marker: "1"}
    ran = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "out"),
                          "--quiet", "--executor", "ray", "--ray-address", "local"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(perfkit.load(tmp_path / "out")["status"]) == ["ok", "ok"]
    assert all(e.slot.startswith("ray:") for e in Ledger(tmp_path / "out").events())
    deadline = time.monotonic() + 10
    while (left := _teardown.holders(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _teardown.reap(marker)
    assert not left, f"processes {left} of the driver's Ray outlived it by 10 s"


def test_a_head_without_cpus_beside_an_autoscaler_is_not_refused_but_too_few_cpus_are():
    # Issue 47: a head started with --num-cpus 0 (KubeRay's default, beside an autoscaler) has no CPU
    # until the autoscaler adds workers for the tasks: "no task could ever start" was wrong there.
    from perfkit.core.errors import BadInputError
    from perfkit.run.sweep.ray_executor import _check_capacity

    _check_capacity(2.0, 0.0)  # every live node without CPUs: the autoscaler's to provide
    _check_capacity(2.0, 8.0)
    with pytest.raises(BadInputError, match="no task could ever start"):
        _check_capacity(16.0, 8.0)
