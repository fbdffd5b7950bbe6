"""The Ray executor: a sweep's configurations as Ray tasks on a running Ray cluster.

``perfkit sweep SPEC --out DIR --executor ray --ray-address HOST:PORT`` decides what to run as the
local engine does (:func:`.engine.plan`, the same resume rules), submits each configuration as one
Ray task, and watches them. A task runs the same per-configuration code path as a local slot and a
Slurm task (:func:`.engine.run_one`: ``running`` ledger entry, stale rows removed, the notebook in a
fresh kernel, the final entry) on whichever node Ray places it, writing into DIR (a filesystem the
nodes share).

- **Resources.** A task asks for ``cpus_per_config`` CPUs (its kernel computes with that many
  threads: ``core.cpu_share.thread_env``) and, on a cluster with GPUs, ``devices_per_config`` GPUs.
  Ray never hands one GPU to two tasks and never runs more tasks on a node than its CPUs allow, so
  configurations neither share a device nor oversubscribe cores. A task's GPU ids (Ray's
  assignment) become the kernel's ``CUDA_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``, and its
  slot in the ledger (``ray:<node>:gpu:<ids>``). A task runs on one node, so a configuration's
  ranks (started by perfkit's launcher inside its kernel) share that node; no placement group is
  needed for one task. A request no node can meet is bad input (exit 2), not a hang.
- **Endings.** A task records its own ending. When Ray ends it first, the driver writes it: the
  worker or its node died → ``killed`` (runs again on resume); Ray's memory monitor killed it →
  ``oom``; an error around the configuration → ``failed`` with Ray's traceback. Ray does not retry
  a task (``max_retries=0``): whether to run it again is the ledger's decision. The kernel of a
  worker that died ends by itself (its launcher watches its parent, :mod:`perfkit.run._kernel_launcher`).
- **Ctrl-C** (or SIGTERM) of the driver stops scheduling and cancels the running tasks: Ray ends a
  job's tasks with its driver, so nothing could be re-attached to. Running configurations end
  ``killed`` and the same command resumes them. To keep a sweep running without a terminal, run
  the driver itself on the cluster: ``ray job submit -- perfkit sweep ... --executor ray``.
- **Addresses.** ``HOST:PORT`` of the cluster's head (GCS), or ``local`` for a Ray started in this
  process (on this machine, ended with the sweep). The address is probed first (3 s): no cluster
  there is one line and exit 2, not Ray's minute of retries. With a head on the loopback address
  the driver stays on it too (Ray would otherwise swap 127.0.0.1 for the machine's interface
  address: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which ``ray start`` needs as well). Ray's usage
  statistics are turned off.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...core import status as st
from ...core.cpu_share import thread_env
from ...core.errors import BadInputError
from .engine import (OomEdges, SweepResult, plan, raise_on_sigterm, restore_sigterm, run_one,
                     should_run)
from .busy import allocation_share, append_summary
from .endings import outcome_of, settle
from .ledger import RUNNING, Ledger, SweepLock
from .spec import Config, SweepSpec

__all__ = ["RAY_KEYS", "run_ray_sweep", "ray_settings"]

#: The ``ray:`` keys of a sweep spec (and the keyword overrides the CLI flags fill).
RAY_KEYS = ("address", "cpus_per_config")
_PROBE_S = 3.0


def ray_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """The spec's ``ray:`` mapping checked: ``address`` (``HOST:PORT`` or ``local``; else
    ``RAY_ADDRESS``) and ``cpus_per_config`` (default 1)."""
    unknown = sorted(set(settings) - set(RAY_KEYS))
    if unknown:
        raise BadInputError(f"unknown ray setting(s) {unknown}; valid: {list(RAY_KEYS)}")
    address = settings.get("address") or os.environ.get("RAY_ADDRESS")
    if not address:
        raise BadInputError("--executor ray needs the cluster: --ray-address HOST:PORT (its head's GCS port, "
                            "6379 by default), or RAY_ADDRESS, or 'local' for a Ray in this process")
    address = str(address).removeprefix("ray://") if str(address) != "local" else "local"
    if address != "local":
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise BadInputError(f"--ray-address {address!r}: expected HOST:PORT (e.g. 127.0.0.1:6379) or 'local'")
    cpus = settings.get("cpus_per_config", 1)
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus <= 0:
        raise BadInputError(f"ray cpus_per_config must be a positive number, got {cpus!r}")
    return {"address": address, "cpus_per_config": cpus}


# --- the task: runs on a Ray worker ---------------------------------------------------------------

def _run_task(c: Config, out_dir: str, attempt: int, cpus: float) -> str:
    """The body of one Ray task (module level: Ray pickles it by reference)."""
    import ray

    context = ray.get_runtime_context()
    gpus = [str(i) for i in context.get_accelerator_ids().get("GPU", [])]
    env = dict(thread_env(max(1, int(cpus))))
    if gpus:  # Ray's assignment, for NVIDIA and AMD alike (a kernel sees exactly these devices)
        ids = ",".join(gpus)
        env.update(CUDA_VISIBLE_DEVICES=ids, HIP_VISIBLE_DEVICES=ids)
    slot = f"ray:{context.get_node_id()[:8]}:" + (f"gpu:{','.join(gpus)}" if gpus else f"cpu:{cpus:g}")
    env["PERFKIT_SLOT"] = slot
    out = Path(out_dir)
    state = Ledger(out).state()
    return run_one(c, out, attempt=attempt, slot=slot, env=env, edges=OomEdges.from_ledger(state, like=c)).status


# --- the driver -----------------------------------------------------------------------------------

def _probe(address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            pass
    except OSError as exc:
        raise BadInputError(f"no Ray cluster answers at {address} ({exc.strerror or exc}): start one with "
                            f"`{START_HEAD}`, or pass its head's HOST:PORT") from None


#: The head this machine can start that a loopback driver joins: Ray swaps 127.0.0.1 for the interface
#: address unless clusters are off, in the head as in the driver (a head started without it made the
#: sweep fail after a minute, with a misleading hint about tokens).
START_HEAD = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address 127.0.0.1"


def _loopback(address: str) -> bool:
    return address == "local" or address.rpartition(":")[0] in ("127.0.0.1", "localhost")


def _connect(ray, address: str) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report to the internet
    options = dict(log_to_driver=False, include_dashboard=False, configure_logging=False)
    if address == "local":
        ray.init(_node_ip_address="127.0.0.1", num_cpus=len(os.sched_getaffinity(0)), **options)
        return
    _probe(address)
    if _loopback(address):
        options["_node_ip_address"] = "127.0.0.1"
    options.pop("include_dashboard")  # a setting of a cluster this driver starts, not of one it joins
    try:
        ray.init(address=address, **options)
    except Exception as exc:  # noqa: BLE001 - Ray's refusal on one line
        hint = "" if os.environ.get("RAY_AUTH_MODE") == "token" else (
            " (a cluster with token authentication, Ray's default where a token exists, needs RAY_AUTH_MODE=token "
            "and its token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
        raise BadInputError(f"could not join the Ray cluster at {address}: {' '.join(str(exc).split())[:300]}"
                            f"{hint}") from None


def _node_capacity(ray) -> tuple[float, float]:
    """The most CPUs and GPUs one live node has."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = max((n["Resources"].get("CPU", 0) for n in nodes), default=0)
    gpus = max((n["Resources"].get("GPU", 0) for n in nodes), default=0)
    return cpus, gpus


def _check_capacity(cpus: float, node_cpus: float) -> None:
    """Refuse ``cpus_per_config`` that no live node has, unless no node has any CPU: a head started
    with ``--num-cpus 0`` beside an autoscaler (KubeRay's default) runs tasks only on the workers the
    autoscaler adds for them, so its tasks wait for those instead of being refused."""
    if 0 < node_cpus < cpus:
        raise BadInputError(f"ray cpus_per_config {cpus:g} > the {node_cpus:g} CPUs of the largest node: no task "
                            f"could ever start; lower it")


def _ending(exc: BaseException) -> tuple[str, str]:
    """The status and error name of a task that Ray ended (its ``ray.get`` raised ``exc``)."""
    name = type(exc).__name__
    if name == "OutOfMemoryError":  # Ray's memory monitor killed the worker
        return st.OOM, "RayOutOfMemory"
    if name in ("WorkerCrashedError", "NodeDiedError", "TaskCancelledError", "ActorDiedError",
                "RaySystemError", "ObjectLostError", "LocalRayletDiedError"):
        return st.KILLED, f"Ray{name.removesuffix('Error')}"
    return st.FAILED, name


def run_ray_sweep(spec: SweepSpec, configs: Sequence[Config], out_dir: str | Path, *, retry_failed: bool = False,
                  progress: bool = True, poll_s: float = 1.0, **overrides: object) -> SweepResult:
    """Run what the ledger says is not done as Ray tasks; see the module docstring.

    ``overrides``: the keys of :data:`RAY_KEYS` (None = not given), over ``spec.ray``."""
    settings = ray_settings({**dict(spec.ray), **{k: v for k, v in overrides.items() if v is not None}})
    if _loopback(settings["address"]):
        # Ray replaces 127.0.0.1 by the machine's interface address (for clusters of many machines)
        # unless clusters are off, which it reads once, at import: then every address stays loopback.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise BadInputError("the Ray executor needs ray: pip install 'perfkit[ray]'") from None
    from tqdm.auto import tqdm

    out_dir = Path(out_dir).resolve()
    t0 = time.monotonic()
    with SweepLock(out_dir):
        ledger = Ledger(out_dir)
        todo = [c for c, prev in plan(configs, out_dir, retry_failed=retry_failed) if should_run(prev, retry_failed)]
        result = SweepResult(out_dir=out_dir, total=len(configs), already_done=len(configs) - len(todo),
                             to_run=len(todo))
        if not todo:
            result.wall_time_s = time.monotonic() - t0
            return result
        _connect(ray, settings["address"])
        try:
            return _drive(ray, tqdm, todo, settings, out_dir, ledger, result, progress, poll_s, t0)
        finally:
            ray.shutdown()


def _drive(ray, tqdm, todo, settings, out_dir, ledger, result, progress, poll_s, t0) -> SweepResult:
    cpus = settings["cpus_per_config"]
    node_cpus, node_gpus = _node_capacity(ray)
    _check_capacity(cpus, node_cpus)
    state = ledger.state()
    task = ray.remote(max_retries=0)(_run_task)
    refs: dict = {}
    for c in todo:
        attempt = (state[c.config_id].attempt if c.config_id in state else 0) + 1
        # More GPUs than any node has: all of one node's (its notebook then records what it cannot
        # run as skipped), as the local engine does; none on a cluster without GPUs.
        gpus = min(c.devices, node_gpus)
        ref = task.options(num_cpus=cpus, num_gpus=gpus, name=f"perfkit:{c.config_id}").remote(
            c, str(out_dir), attempt, cpus)
        refs[ref] = (c, attempt)
    bar = tqdm(total=len(todo), unit="config", desc="ray sweep" + (f" ({result.already_done} already done)"
                                                                    if result.already_done else ""),
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    counts: dict[str, int] = {}
    previous_term = raise_on_sigterm()
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1, timeout=poll_s)
            for ref in done:
                c, attempt = refs.pop(ref)
                try:
                    ray.get(ref)
                    entry = ledger.state().get(c.config_id)
                    if entry is None or entry.status == RUNNING or entry.attempt < attempt:
                        raise RuntimeError("the task returned without an ending in the ledger")
                except Exception as exc:  # noqa: BLE001 - Ray ended it (or it broke): recorded, not raised
                    status, name = _ending(exc)
                    text = str(exc).strip() or name
                    entry = settle(c, attempt, status, name, f"Ray ended the task: {text[-3000:]}", out_dir=out_dir,
                                   ledger=ledger, slot="ray")
                result.outcomes.append(outcome_of(c, entry, out_dir))
                counts[entry.status] = counts.get(entry.status, 0) + 1
                bar.update(1)
            state = ledger.state()  # once a poll: it reads every writer's ledger file
            running = sum(1 for c, a in refs.values()
                          if (e := state.get(c.config_id)) is not None and e.status == RUNNING and e.attempt >= a)
            bar.set_postfix({**counts, "running": running, "pending": len(refs) - running}, refresh=True)
    except KeyboardInterrupt:
        for ref in refs:
            ray.cancel(ref, force=True)  # the worker is killed; its kernel's watch ends the rest
        for c, attempt in refs.values():
            last = ledger.state().get(c.config_id)
            if last is not None and last.status == RUNNING and last.attempt >= attempt:
                settle(c, attempt, st.KILLED, "Interrupted", "the sweep was interrupted; it runs again on resume",
                       out_dir=out_dir, ledger=ledger, slot="ray")
        print(f"\nperfkit: the driver stopped; {len(refs)} configuration(s) were cancelled (Ray ends a job's tasks "
              f"with its driver) and run again on resume:\n  resume: run the same `perfkit sweep ... --out "
              f"{out_dir} --executor ray` again", file=sys.stderr)
        raise
    finally:
        restore_sigterm(previous_term)
        bar.close()
    result.wall_time_s = time.monotonic() - t0
    # Each task held its device (Ray's resources) for its attempt; between tasks Ray holds nothing.
    state = ledger.state()
    entries = [(c.config_id, (e.end - e.start) if e.end is not None and e.start is not None else None,
                e.window_start, e.window_end)
               for c in todo if (e := state.get(c.config_id)) is not None]
    result.busy = allocation_share(entries, result.wall_time_s, "Ray", "the ledger's attempts")
    append_summary(out_dir, result.busy)
    return result
