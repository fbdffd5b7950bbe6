"""The launcher, with real gloo ranks (2), started directly on one node and by torchrun for an endpoint.

The rank targets live in this module: ``launch`` hands the caller's ``sys.path`` to the ranks, so
``f"{__name__}:fn"`` is importable there however pytest imported this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from perfkit.core.cpu_share import thread_env
from perfkit.core.errors import BadInputError
from perfkit.run import _teardown
from perfkit.run.launch import LaunchResult, launch

pytestmark = pytest.mark.slow

# Generous: torchrun plus `import torch` on two loaded cores takes several seconds per launch.
TIMEOUT_S = 60.0
# What the launcher may take beyond its deadline: killing the tree and reading the files.
SLACK_S = 10.0


def _target(name: str) -> str:
    return f"{__name__}:{name}"


# ---- rank targets ------------------------------------------------------------------------------


def allreduce_target(config: dict) -> dict:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.tensor([float(rank + 1)]) * config["scale"]
    dist.all_reduce(x)
    print(f"rank {rank} reduced {x.item()}")
    return {"rank": rank, "world_size": dist.get_world_size(), "sum": x.item(),
            "backend": dist.get_backend()}


def raise_on_rank1_target(config: dict) -> dict:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad value on purpose")
    dist.barrier()  # rank 0 waits here for a peer that is gone
    return {}


def exit_on_rank1_target(config: dict) -> dict:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        print("rank 1 leaving early", flush=True)
        os._exit(3)
    dist.barrier()
    return {}


def signal_on_rank1_target(config: dict) -> dict:
    import signal

    import torch.distributed as dist

    if dist.get_rank() == 1:
        print("rank 1 about to die", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    dist.barrier()
    return {}


class DistBackendError(RuntimeError):
    """Named as torch's: what a rank raises when a peer is gone (a consequence, not a cause)."""


def peer_reports_before_the_dead_rank_is_seen_target(config: dict) -> dict:
    """The order a loaded host produces: rank 0 reports "connection closed" before rank 1's death
    can be seen (a dying process's socket closes before it can be reaped), here by two seconds, a
    lag CI's loaded hosts have shown (past the launcher's one-second grace for peers)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(2.0)
        print("rank 1 leaving late", flush=True)
        os._exit(3)
    raise DistBackendError("Connection closed by peer [127.0.0.1]:4242")


def hang_on_rank1_target(config: dict) -> dict:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(3600)  # never joins the collective
    x = torch.ones(1)
    dist.all_reduce(x)
    return {}


def report_pids_then_hang_target(config: dict) -> dict:
    import torch.distributed as dist

    path = os.path.join(config["dir"], f"rank{dist.get_rank()}")
    with open(f"{path}.tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.replace(f"{path}.tmp", path)  # the test never reads a file still being written
    time.sleep(3600)
    return {}


def env_target(config: dict) -> dict:
    return {"knob": os.environ.get(config["name"])}


def threads_target(config: dict) -> dict:
    import torch

    return {"omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS"),
            "torch_threads": torch.get_num_threads()}


def memory_error_target(config: dict) -> dict:
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise MemoryError("pretend the allocator ran out")
    return {}


# ---- tests -------------------------------------------------------------------------------------


def test_allreduce_returns_per_rank_results_and_logs(tmp_path, monkeypatch):
    # A private temp root for the launcher (tempfile.tempdir) and for torchrun and the ranks
    # (TMPDIR): whatever either leaves behind shows up here, and nobody else's launches do.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = launch(_target("allreduce_target"), {"scale": 2.0}, world_size=2, backend="gloo",
                    timeout_s=TIMEOUT_S, env={"TMPDIR": str(tmp_path)})
    assert isinstance(result, LaunchResult)
    assert result.status == "ok", result.error
    assert result.error is None and result.failed_rank is None
    # (1 + 2) * 2 on every rank, each rank reporting itself
    assert [r["rank"] for r in result.rank_results] == [0, 1]
    assert all(r["sum"] == 6.0 and r["world_size"] == 2 for r in result.rank_results)
    assert all(r["backend"] == "gloo" for r in result.rank_results)
    assert "rank 0 reduced 6.0" in result.rank_logs[0]
    assert "rank 1 reduced 6.0" in result.rank_logs[1]
    assert result.wall_time_s > 0
    # Neither torchrun's log dirs (torchelastic_*) nor the launcher's own dir are left behind.
    assert list(tmp_path.iterdir()) == []


def test_the_folder_of_a_killed_launcher_is_removed_by_the_next_launch_and_a_live_ones_kept(tmp_path, monkeypatch):
    # A launcher killed with SIGKILL (a kernel at its deadline, the OOM killer) never reaches the
    # `finally` that removes its folder; the folder is named after it (host, pid, start time), and
    # the next launch on the host removes it once that process is gone.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import tempfile; from perfkit.run import _teardown; "
                           f"print(tempfile.mkdtemp(prefix=_teardown.owned_name('perfkit-launch'), dir={str(tmp_path)!r}))"],
                          capture_output=True, text=True, timeout=60, check=True)
    orphan = Path(dead.stdout.strip())
    live = Path(tempfile.mkdtemp(prefix=_teardown.owned_name("perfkit-launch")))  # this process's: alive
    assert orphan.is_dir() and orphan.parent == tmp_path
    result = launch(_target("allreduce_target"), {"scale": 1.0}, world_size=1, backend="gloo", timeout_s=TIMEOUT_S)
    assert result.status == "ok", result.error
    assert list(tmp_path.iterdir()) == [live]  # the orphan gone, the launch's own folder removed, ours kept


def test_raising_rank_fails_with_its_traceback_and_rank():
    result = launch(_target("raise_on_rank1_target"), {}, world_size=2, backend="gloo",
                    timeout_s=TIMEOUT_S)
    assert result.status == "failed"
    assert result.failed_rank == 1
    assert "ValueError" in result.error and "bad value on purpose" in result.error
    assert "raise_on_rank1_target" in result.error  # the traceback, not just the message
    assert result.rank_results[1] is None
    assert result.wall_time_s < TIMEOUT_S


@pytest.mark.parametrize(
    "target, how, said",
    [("exit_on_rank1_target", "exit code 3", "rank 1 leaving early"),
     ("signal_on_rank1_target", "signal SIGKILL", "rank 1 about to die"),
     ("peer_reports_before_the_dead_rank_is_seen_target", "exit code 3", "rank 1 leaving late")],
)
def test_rank_ending_early_is_killed_with_exit_code_and_log_tail(target, how, said):
    # Rank 0 then fails with "connection closed by peer": the dead rank is still the cause.
    result = launch(_target(target), {}, world_size=2, backend="gloo", timeout_s=TIMEOUT_S)
    assert result.status == "killed", result.error
    assert result.failed_rank == 1
    assert how in result.error
    assert said in result.error  # the log tail travels with the error
    assert result.wall_time_s < TIMEOUT_S


def test_hanging_rank_times_out_within_the_deadline():
    timeout_s = 15.0
    t0 = time.monotonic()
    result = launch(_target("hang_on_rank1_target"), {}, world_size=2, backend="gloo",
                    timeout_s=timeout_s)
    elapsed = time.monotonic() - t0
    assert result.status == "timeout"
    assert "local ranks [0, 1]" in result.error
    assert elapsed < timeout_s + SLACK_S
    # Every rank was killed with the tree.
    for log in result.rank_logs:
        assert "Traceback" not in log


def test_killing_the_process_that_forked_the_ranks_ends_them_and_the_launch_as_killed(tmp_path):
    """CPU ranks are forked from one process (perfkit.run._rank_fork), which reports their exit
    statuses. Killed (an OOM killer's choice, say), the launch ends `killed` at once, not at its
    deadline, and no rank is left."""
    import signal
    import threading

    def kill_the_forking_process():
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            files = sorted(tmp_path.glob("rank[0-9]"))
            if len(files) == 2:
                pids = [tuple(map(int, f.read_text().split())) for f in files]
                os.kill(pids[0][1], signal.SIGKILL)
                return pids
            time.sleep(0.05)

    found = []
    killer = threading.Thread(target=lambda: found.extend(kill_the_forking_process() or []))
    killer.start()
    t0 = time.monotonic()
    result = launch(_target("report_pids_then_hang_target"), {"dir": str(tmp_path)}, world_size=2,
                    backend="gloo", timeout_s=TIMEOUT_S)
    killer.join()
    assert len(found) == 2 and found[0][1] == found[1][1], found  # one parent forked both ranks
    assert result.status == "killed", result.error
    assert "signal SIGKILL" in result.error
    assert time.monotonic() - t0 < TIMEOUT_S / 2
    assert not [pid for pid, _ in found if _teardown.alive(pid, None)]  # a zombie counts as ended


def test_env_reaches_ranks_but_not_the_caller():
    name = "PERFKIT_TEST_LAUNCH_KNOB"
    assert name not in os.environ
    result = launch(_target("env_target"), {"name": name}, world_size=2, backend="gloo",
                    timeout_s=TIMEOUT_S, env={name: "ring"})
    assert result.status == "ok", result.error
    assert [r["knob"] for r in result.rank_results] == ["ring", "ring"]
    assert name not in os.environ


def test_every_rank_has_joined_before_any_target_runs(monkeypatch):
    # torch's store-based barrier at the end of init_process_group is on in the ranks: a rank
    # whose target needs no collective (this one) must not exit while a peer is still in gloo's
    # connectFullMesh with it ("Connection closed by peer": 3 launches in 108 under load without
    # the barrier, 0 in 120 with it). A caller's explicit choice is kept.
    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER", raising=False)
    result = launch(_target("env_target"), {"name": "TORCH_DIST_INIT_BARRIER"}, world_size=2, backend="gloo",
                    timeout_s=TIMEOUT_S)
    assert result.status == "ok", result.error
    assert [r["knob"] for r in result.rank_results] == ["1", "1"]
    kept = launch(_target("env_target"), {"name": "TORCH_DIST_INIT_BARRIER"}, world_size=2, backend="gloo",
                  timeout_s=TIMEOUT_S, env={"TORCH_DIST_INIT_BARRIER": "0"})
    assert [r["knob"] for r in kept.rank_results] == ["0", "0"], kept.error


def test_a_thread_share_is_split_over_the_ranks_and_an_explicit_one_kept(monkeypatch):
    # A sweep slot of 4 threads running 2 ranks (the slot sets both thread variables, as
    # engine.device_slots does): 2 each, not 4 each (torchrun keeps an inherited
    # OMP_NUM_THREADS as it is for every rank).
    for name, value in thread_env(4).items():
        monkeypatch.setenv(name, value)
    split = launch(_target("threads_target"), {}, world_size=2, backend="gloo", timeout_s=TIMEOUT_S)
    assert split.status == "ok", split.error
    assert [(r["omp"], r["mkl"], r["torch_threads"]) for r in split.rank_results] == [("2", "2", 2)] * 2
    # The caller's per-rank choice (scaling_run's threads_per_rank) is what the ranks compute
    # with: the slot's inherited MKL_NUM_THREADS=4 must not override it (torch lets MKL win).
    kept = launch(_target("threads_target"), {}, world_size=2, backend="gloo", timeout_s=TIMEOUT_S,
                  env={"OMP_NUM_THREADS": "1"})
    assert kept.status == "ok", kept.error
    assert [(r["omp"], r["mkl"], r["torch_threads"]) for r in kept.rank_results] == [("1", "1", 1)] * 2


def test_memory_error_in_a_rank_is_oom():
    result = launch(_target("memory_error_target"), {}, world_size=2, backend="gloo",
                    timeout_s=TIMEOUT_S)
    assert result.status == "oom"
    assert result.failed_rank == 0
    assert "MemoryError" in result.error


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": "no_colon", "world_size": 2},
        {"target": "m:f", "world_size": 0},
        {"target": "m:f", "world_size": 3, "nnodes": 2, "rdzv_endpoint": "h:1"},
        {"target": "m:f", "world_size": 2, "nnodes": 2},  # several nodes need an endpoint
        {"target": "m:f", "world_size": 2, "device": "tpu"},
        {"target": "m:f", "world_size": 2, "env": {"NCCL_ALGO": 1}},  # not a string
    ],
)
def test_bad_input_is_rejected_before_anything_starts(kwargs):
    kwargs = {"backend": "gloo", "timeout_s": 5.0, **kwargs}
    target = kwargs.pop("target")
    with pytest.raises(BadInputError):
        launch(target, {}, **kwargs)


#: What torchrun's agent puts in a worker's environment (and the thread default it applies).
WORKER_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
#: Different per launch by nature: where the store listens, and the run's id.
PER_LAUNCH = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def environment_target(config: dict) -> dict:
    result = allreduce_target(config)
    result["env"] = {k: os.environ.get(k) for k in WORKER_VARIABLES}
    result["all_env"] = {k: v for k, v in os.environ.items() if not k.startswith("PERFKIT_TEARDOWN_")}
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        result["parent_pid"], result["parent_cmdline"] = os.getppid(), f.read().replace(b"\0", b" ").decode()
    with open(f"/proc/{os.getppid()}/stat") as f:
        result["grandparent_pid"] = int(f.read().rsplit(")", 1)[1].split()[1])
    return result


def test_one_node_ranks_see_what_torchrun_gives_them_and_an_explicit_endpoint_runs_torchrun(monkeypatch):
    """One node starts its ranks without torchrun (1.5 s of CPU and 2 s of wall time less per
    launch); an explicit c10d endpoint runs torchrun. The ranks cannot tell the two apart."""
    import socket

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)  # torchrun's defaults apply where nothing is set
    with socket.socket() as s:  # a free port for the rendezvous store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    via_torchrun = launch(_target("environment_target"), {"scale": 1.0}, world_size=2, backend="gloo",
                          timeout_s=TIMEOUT_S, rdzv_endpoint=f"localhost:{port}")
    forked = launch(_target("environment_target"), {"scale": 1.0}, world_size=2, backend="gloo", timeout_s=TIMEOUT_S)
    monkeypatch.setenv("PERFKIT_RANK_FORK", "0")
    execed = launch(_target("environment_target"), {"scale": 1.0}, world_size=2, backend="gloo", timeout_s=TIMEOUT_S)
    for result in (via_torchrun, forked, execed):
        assert result.status == "ok", result.error
        assert [r["sum"] for r in result.rank_results] == [3.0, 3.0]
    # Who started the ranks: torchrun for the endpoint; else one process started here that forked
    # both (a CPU launch), or this very process (PERFKIT_RANK_FORK=0, and every GPU launch).
    assert all("torch.distributed.run" in r["parent_cmdline"] for r in via_torchrun.rank_results)
    assert [r["parent_pid"] for r in execed.rank_results] == [os.getpid()] * 2
    assert len({r["parent_pid"] for r in forked.rank_results}) == 1
    assert all("perfkit.run._rank_fork" in r["parent_cmdline"] for r in forked.rank_results)
    assert [r["grandparent_pid"] for r in forked.rank_results] == [os.getpid()] * 2
    def lasting(env: dict) -> dict:
        return {k: v for k, v in env.items() if k not in PER_LAUNCH}

    for torchrun_rank, forked_rank, execed_rank in zip(via_torchrun.rank_results, forked.rank_results,
                                                       execed.rank_results):
        assert lasting(forked_rank["env"]) == lasting(torchrun_rank["env"]) == lasting(execed_rank["env"])
        assert forked_rank["env"]["MASTER_PORT"] and forked_rank["env"]["MASTER_PORT"] != str(port)
        # A forked rank's whole environment is the one exec would have given it.
        assert lasting(forked_rank["all_env"]) == {k: v for k, v in lasting(execed_rank["all_env"]).items()
                                                   if k != "PERFKIT_RANK_FORK"}


def test_slurm_rendezvous_reads_the_allocation():
    from perfkit.run.rendezvous import _expand_nodelist, slurm_rendezvous

    assert _expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert _expand_nodelist("n[8-10]") == ["n8", "n9", "n10"]
    env = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[12-15]"}
    assert slurm_rendezvous(port=29411, environ=env) == {"nnodes": 4, "node_rank": 2,
                                                          "rdzv_endpoint": "gpu12:29411"}
    with pytest.raises(BadInputError, match="not inside a Slurm allocation"):
        slurm_rendezvous(environ={})


@pytest.mark.slow
def test_two_nodes_meet_through_a_c10d_rendezvous():
    # Two "nodes" on this machine: two launches of one rank each, node_rank 0 and 1, meeting at
    # one c10d endpoint — the same code path as one torchrun per node of a Slurm allocation.
    import concurrent.futures as cf
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = dict(world_size=2, backend="gloo", timeout_s=TIMEOUT_S, nnodes=2,
                  rdzv_endpoint=f"127.0.0.1:{port}")
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(launch, _target("allreduce_target"), {"scale": 1.0}, node_rank=r, **common)
                   for r in (0, 1)]
        results = [f.result() for f in futures]
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    ranks = sorted(r.rank_results[0]["rank"] for r in results)
    assert ranks == [0, 1]  # one global rank per node
