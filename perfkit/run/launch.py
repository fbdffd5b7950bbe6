"""Run a function on N ranks and say how it ended.

``launch("pkg.mod:fn", config, world_size=2, backend="gloo", timeout_s=60)`` starts N processes
``python -m perfkit.run._rank_entry JOB``. Every rank joins the process group with the given
backend, calls ``fn(config)`` and writes its result, or its exception, to a file in a private
temporary directory; its stdout and stderr go to a log file there too.

On one node the launcher starts the ranks itself, as torchrun's agent would: the same worker
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a TCPStore
this process hosts on a port it bound itself, ``TORCHELASTIC_USE_AGENT_STORE``, torchrun's
``OMP_NUM_THREADS=1`` default), each rank in a session of its own, and every rank stopped once one
has failed. torchrun in between cost each launch 1.5 s of CPU (its own ``import torch``) and 2 s of
wall time, on every point of a scaling run or an OOM-edge search. On a CPU the ranks are forked
from one process that imported torch (and ``preload``) once (:mod:`perfkit.run._rank_fork`: 3.5 s
of CPU less per extra training rank); on a GPU each rank is started by exec. Across nodes, or with an explicit
``rdzv_endpoint``, ``python -m torch.distributed.run`` (the interpreter's own torchrun) runs its c10d
rendezvous on each node.

The launcher keeps its own deadline rather than trusting torchrun's: torchrun notices a rank that
exits, but not one that hangs in a collective waiting for a peer. Ranks lead sessions of their
own, so killing one process group is not enough: the launch's processes get a teardown token in
their environment (:mod:`perfkit.run._teardown`), which ranks pass to their children, and every
holder of it is killed when the launch ends, however it ends (Ctrl-C in a notebook included).
The launcher itself may die first (a kernel killed by a sweep's timeout, a JupyterLab kernel
restart): each rank watches the launching process and, once it is gone, kills the launch's
token holders (torchrun, its peers) and itself.

Statuses (:mod:`perfkit.core.status`): ``ok`` (every rank returned), ``failed``/``oom`` (a rank raised),
``killed`` (a rank ended without a result: an exit code or a signal), ``timeout`` (the deadline
passed first); which rank's ending is the cause: :mod:`perfkit.run.launch_outcome`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from perfkit.run import _teardown
from perfkit.run.launch_outcome import (LaunchResult, exit_codes, forked_rank_exit, is_peer_loss, outcome,
                                        rank_reports, read_text)
from perfkit.run.rendezvous import slurm_rendezvous  # re-exported: launch(..., **slurm_rendezvous())
from perfkit.core.cpu_share import thread_env, with_threads
from perfkit.core.errors import BadInputError

__all__ = ["LaunchResult", "launch", "slurm_rendezvous"]

#: How often the launcher looks at the ranks' result files and exit statuses.
_POLL_S = 0.05
#: After a rank has reported an error (or, across nodes, every rank its result), how long torchrun
#: gets to stop the other ranks and exit before the launcher kills the tree itself.
_TEARDOWN_GRACE_S = 10.0
#: On one node, once every rank has written its result: how long the ranks get to leave the
#: process group before the tree is killed. Nothing is left to wait for (each result file is
#: complete, its log line-buffered), and torchrun's own shutdown (exit barrier, rendezvous store)
#: took 2-3 s of every launch's 8-11 s (a no-op target on 2 ranks, load ~3).
_DONE_GRACE_S = 1.0
#: On one node, once a rank has failed: how long the others get to end on their own before they are
#: killed. A rank that died is seen dead here a moment after its peers read its closed socket (a
#: process's files close before its parent can reap it): its exit code, the cause, is kept only if
#: it ends within this, and a peer's "connection closed" report must not stand in for it.
_PEERS_GRACE_S = 1.0
#: On one node, when the only errors reported are peers' "connection closed": the rank they lost is
#: still ending (its socket closed before it could be reaped, and on a loaded host that lag has
#: passed a second); it gets this long to be seen, so that its exit code, not the peers' report,
#: is the cause given.
_PEER_LOSS_GRACE_S = 5.0
#: ``0``: a one-node CPU launch starts each rank by exec, not by fork from one process (:func:`_forks`).
RANK_FORK_ENV = "PERFKIT_RANK_FORK"



def _validate(target, world_size, nnodes, node_rank, rdzv_endpoint, timeout_s, device, env):
    module_name, sep, function_name = target.partition(":")
    if not sep or not module_name or not function_name:
        raise BadInputError(f"target must be 'module:function', got {target!r}")
    if world_size < 1 or nnodes < 1:
        raise BadInputError(f"world_size and nnodes must be >= 1, got {world_size} and {nnodes}")
    if world_size % nnodes:
        raise BadInputError(f"world_size {world_size} is not divisible by nnodes {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise BadInputError(f"node_rank must be in [0, {nnodes}), got {node_rank}")
    if nnodes > 1 and not rdzv_endpoint:
        raise BadInputError("a launch over several nodes needs rdzv_endpoint (host:port)")
    if not timeout_s > 0:
        raise BadInputError(f"timeout_s must be positive, got {timeout_s}")
    if any(not isinstance(k, str) or not isinstance(v, str) for k, v in (env or {}).items()):
        raise BadInputError("env names and values must be strings")
    if device not in ("cpu", "cuda"):
        raise BadInputError(f"device must be 'cpu' or 'cuda', got {device!r}")


def _torchrun_command(job_path, work_dir, nproc, nnodes, node_rank, rdzv_endpoint):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--nnodes", str(nnodes)]
    if rdzv_endpoint:
        # Every node of one job must agree on the id; one job per endpoint at a time.
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                    "--rdzv-id", "perfkit", "--node-rank", str(node_rank)]
    else:
        command += ["--standalone"]  # c10d store on a free port: concurrent launches do not clash
    command += [
        "--max-restarts", "0",  # a failure is a result to record, never something to retry
        "--monitor-interval", "0.1",
        "--log-dir", os.path.join(work_dir, "torchrun"),  # instead of /tmp/torchelastic_*
        "-m", "perfkit.run._rank_entry", job_path,
    ]
    return command


def _rank_threads(inherited: Mapping[str, str], env: Mapping[str, str], nproc: int) -> dict:
    """CPU threads for each of ``nproc`` local ranks when this process has a thread share
    (``OMP_NUM_THREADS``: a sweep slot's cores) and the caller did not set one per rank: the share
    split over the ranks, at least 1. torchrun sets 1 only when the variable is unset, so every
    rank would otherwise compute with the whole share: on a 2-core slot, 2 ranks × 2 threads
    oversubscribed the cores and starved DDP's gloo all-reduce thread (steps 3-60x longer)."""
    share = inherited.get("OMP_NUM_THREADS", "")
    if nproc < 2 or "OMP_NUM_THREADS" in env or not share.isdigit():
        return {}
    return thread_env(max(1, int(share) // nproc))


def _child_env(inherited: Mapping[str, str], env: Mapping[str, str], nproc: int) -> dict:
    """The ranks' environment: this process's, the thread split, then the caller's ``env`` — a
    caller's ``OMP_NUM_THREADS`` sets every thread variable (:func:`with_threads`), so a slot's
    inherited ``MKL_NUM_THREADS`` cannot give a rank more threads than it was told (it gave each
    of the scaling notebook's 1-thread ranks 2 under ``perfkit sweep``: the 2-rank DDP step 3-12x
    slower than under ``perfkit run``)."""
    return with_threads(with_threads(inherited, _rank_threads(inherited, env, nproc)), env)


def launch(
    target: str,
    config: dict,
    *,
    world_size: int,
    backend: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    device: str = "cpu",
    preload: Sequence[str] = (),
) -> LaunchResult:
    """Run ``target(config)`` on ``world_size`` ranks (over ``nnodes`` nodes) and collect results.

    ``target`` is ``"module:function"``; the function takes the (JSON-serialisable) config and
    returns a JSON-serialisable dict, after ``init_process_group(backend=backend)`` on every rank
    (``gloo`` on CPU, ``nccl`` on CUDA and ROCm) with the rank's device set (``cuda``:
    ``LOCAL_RANK``). ``env`` is added to the launched processes' environment only; without an
    ``OMP_NUM_THREADS`` in it, this process's thread share is split over the local ranks
    (:func:`_rank_threads`); with one, it sets every thread variable (:func:`_child_env`). One node
    starts its ranks directly (module docstring) unless ``rdzv_endpoint`` is given (required with
    several nodes; every node calls ``launch`` with its ``node_rank``), which runs torchrun's c10d
    rendezvous. The launch ends within ``timeout_s`` plus a few seconds of teardown whatever the
    ranks do. ``preload``: modules the ranks will import (the target's, ``torch._dynamo``), imported
    once before a CPU launch forks its ranks (:mod:`perfkit.run._rank_fork`); they must not read a
    rank's own state (``RANK``, ``LOCAL_RANK``) when imported.
    """
    _validate(target, world_size, nnodes, node_rank, rdzv_endpoint, timeout_s, device, env)
    config_text = json.dumps(config)  # bad config is the caller's error, before anything starts
    nproc = world_size // nnodes
    work_dir = _teardown.owned_tempdir("perfkit-launch")  # a killed launcher's is removed by the next
    try:
        token = _teardown.new_token()
        child_env = {**_child_env(os.environ, env or {}, nproc), token: "1"}
        job_path = os.path.join(work_dir, "job.json")
        with open(job_path, "w") as f:
            f.write(json.dumps({
                "target": target, "config": json.loads(config_text), "backend": backend,
                "device": device, "timeout_s": timeout_s, "work_dir": work_dir,
                "sys_path": [p for p in sys.path if isinstance(p, str)],
                # The ranks end the launch themselves when this process dies before them.
                "launcher_pid": os.getpid(), "launcher_start": _teardown.start_time(os.getpid()),
                "token": token, "preload": list(preload),
            }))
        start = time.monotonic()
        if rdzv_endpoint:
            command = _torchrun_command(job_path, work_dir, nproc, nnodes, node_rank, rdzv_endpoint)
            done_grace_s = _DONE_GRACE_S if nnodes == 1 else _TEARDOWN_GRACE_S
            timed_out, codes, launcher_log = _supervise_torchrun(command, child_env, token, work_dir, nproc,
                                                                 timeout_s, done_grace_s)
        else:
            timed_out, codes, launcher_log = _supervise_ranks(job_path, child_env, token, work_dir, nproc, timeout_s,
                                                             device)
        return outcome(work_dir, nproc, timed_out, codes, launcher_log, timeout_s, time.monotonic() - start)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _end(token: str, procs: list[subprocess.Popen]) -> None:
    """Kill every process of the launch (its token's holders) and reap the ones started here."""
    left = _teardown.reap(token)
    for proc in procs:
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if left:
        print(f"perfkit.run.launch: processes {left} of this launch survived SIGKILL (uninterruptible?)",
              file=sys.stderr)


def _settle_by(work_dir, nproc, now, deadline, *, failure_grace_s, peer_loss_grace_s, done_grace_s,
               codes=None) -> float | None:
    """When the launch ends, once its outcome is known; None while it is not. A rank's own error, or
    a rank that ended without a report (``codes``: the exit codes seen so far, where the launcher
    sees them), gives the others ``failure_grace_s``; errors that only report a lost peer give that
    peer ``peer_loss_grace_s`` to be seen ending; every rank reported, ``done_grace_s``."""
    reports = rank_reports(work_dir, nproc)
    errors = [r for r in reports if r is not None and not r.get("ok")]
    silent = any(code != 0 and reports[i] is None for i, (_, code) in (codes or {}).items())
    if silent or any(not is_peer_loss(r) for r in errors):
        return min(now + failure_grace_s, deadline)
    if errors:
        return min(now + peer_loss_grace_s, deadline)
    if all(r is not None for r in reports):
        return min(now + done_grace_s, deadline)
    return None


def _supervise_torchrun(command, child_env, token, work_dir, nproc, timeout_s, done_grace_s):
    """torchrun until its ranks have reported and it exited, or the deadline: (timed out, exit
    codes from its failure summary, its log)."""
    torchrun_log_path = os.path.join(work_dir, "torchrun.log")
    deadline = time.monotonic() + timeout_s
    with open(torchrun_log_path, "wb") as log:
        proc = subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    settle_by = None  # set once the outcome is known: torchrun gets until then to exit
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if settle_by is None:
                settle_by = _settle_by(work_dir, nproc, now, deadline, failure_grace_s=_TEARDOWN_GRACE_S,
                                       peer_loss_grace_s=_TEARDOWN_GRACE_S, done_grace_s=done_grace_s)
            if now >= (settle_by if settle_by is not None else deadline):
                timed_out = settle_by is None
                break
            time.sleep(_POLL_S)
    finally:
        # Also on KeyboardInterrupt (Ctrl-C in a notebook): torchrun, the ranks and whatever they
        # started hold the launch's token; none of them outlives the launch.
        _end(token, [proc])
    torchrun_log = read_text(torchrun_log_path)
    return timed_out, exit_codes(torchrun_log), torchrun_log


def _host_store(nproc: int, timeout_s: float):
    """A TCPStore for the ranks to meet at, hosted here on a free loopback port (the port is bound
    by the store itself: two launches at once never race for one), as torchrun's agent hosts its
    own. ``import torch`` is free in a kernel that measures, which already holds it."""
    import datetime

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world_size=nproc, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=max(1.0, timeout_s)))


def _worker_env(base: Mapping[str, str], local_rank: int, nproc: int, port: int, run_id: str) -> dict:
    """What torchrun's agent gives local rank ``local_rank`` of a one-node launch
    (torch/distributed/elastic/agent/server/local_elastic_agent.py, torch 2.13), with the store
    this process hosts: ranks see no difference."""
    worker = dict(base)
    if nproc > 1 and "OMP_NUM_THREADS" not in worker:
        worker["OMP_NUM_THREADS"] = "1"  # torchrun's default when the variable is unset
    worker.update({
        "RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "GROUP_RANK": "0", "ROLE_RANK": str(local_rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": worker.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    })
    return worker


def _forks(device: str, nproc: int) -> bool:
    """Whether a one-node launch forks its ranks from one process (:mod:`perfkit.run._rank_fork`):
    on a CPU with 2 ranks or more, unless ``PERFKIT_RANK_FORK=0`` asks for one exec per rank."""
    return device == "cpu" and nproc > 1 and os.environ.get(RANK_FORK_ENV, "1") != "0"


def _start_ranks(job_path, work_dir, envs, log, fork):
    """The processes that run the ranks, and a function giving local rank i's exit status (Popen's
    ``returncode``) once it has ended, else None. Forked: one process, which reports each rank's."""
    popen = dict(stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    if not fork:
        command = [sys.executable, "-m", "perfkit.run._rank_entry", job_path]
        procs = [subprocess.Popen(command, env=env, **popen) for env in envs]
        return procs, lambda i: procs[i].poll()
    ranks_path = os.path.join(work_dir, "ranks.json")
    with open(ranks_path, "w") as f:
        json.dump(envs, f)
    # Only what every rank shares: libgomp and MKL read their variables at load, in this process.
    shared = {k: v for k, v in envs[0].items() if all(env.get(k) == v for env in envs)}
    server = subprocess.Popen([sys.executable, "-m", "perfkit.run._rank_fork", job_path, ranks_path],
                              env=shared, **popen)

    def code(i):
        found = forked_rank_exit(work_dir, i)
        if found is None and server.poll() is not None:  # it writes every rank's before it exits
            found = forked_rank_exit(work_dir, i)
            return server.returncode if found is None else found  # it was killed: the launch ends
        return found

    return [server], code


def _supervise_ranks(job_path, child_env, token, work_dir, nproc, timeout_s, device):
    """The ranks of one node, started here, until each has exited, one has failed (the others are
    stopped within :data:`_PEERS_GRACE_S`, as torchrun stops them), or the deadline: (timed out,
    exit codes of the ranks that ended on their own, what they printed before redirecting it)."""
    store = _host_store(nproc, timeout_s)
    deadline = time.monotonic() + timeout_s
    launcher_log_path = os.path.join(work_dir, "launcher.log")
    run_id = os.path.basename(work_dir)
    procs: list[subprocess.Popen] = []
    codes: dict[int, tuple[int, int]] = {}
    timed_out = False
    settle_by = None  # once the outcome is known: the ranks get until then to end on their own
    try:
        envs = [_worker_env(child_env, local_rank, nproc, store.port, run_id) for local_rank in range(nproc)]
        with open(launcher_log_path, "wb") as log:
            procs, exit_code = _start_ranks(job_path, work_dir, envs, log, _forks(device, nproc))
        while len(codes) < nproc:
            for local_rank in range(nproc):
                if local_rank not in codes and (code := exit_code(local_rank)) is not None:
                    codes[local_rank] = (local_rank, code)
            now = time.monotonic()
            if settle_by is None or settle_by - now > _PEERS_GRACE_S:  # else nothing can bring it closer
                known_by = _settle_by(work_dir, nproc, now, deadline, failure_grace_s=_PEERS_GRACE_S,
                                      peer_loss_grace_s=_PEER_LOSS_GRACE_S, done_grace_s=_DONE_GRACE_S, codes=codes)
                if known_by is not None:
                    settle_by = known_by if settle_by is None else min(settle_by, known_by)
            if now >= (settle_by if settle_by is not None else deadline):
                timed_out = settle_by is None
                break
            time.sleep(_POLL_S)
    finally:
        _end(token, procs)  # also on KeyboardInterrupt: no rank outlives the launch
        del store
    return timed_out, codes, read_text(launcher_log_path)
