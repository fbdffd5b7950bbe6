"""What each rank runs: ``python -m perfkit.run._rank_entry JOB_FILE`` (started by the launcher, or torchrun).

Written for :func:`perfkit.run.launch.launch` only. The rank redirects its own stdout and stderr (the
file descriptors, so C++ logging such as ``NCCL_DEBUG=INFO`` is captured too) into a log file in
the launch's private directory, joins the process group, runs the target and writes either the
target's result or its exception to ``local<LOCAL_RANK>.json`` there. The launcher reads those
files; a rank that dies without writing one was killed or exited on its own.

A rank never outlives its launcher: when the process that called ``launch`` dies (a kernel killed
at a sweep's timeout or restarted in JupyterLab), nobody would read its result or stop it, and on
a GPU it would hold device memory under the next configuration. It then kills every process of
its launch (the launch's teardown token: its peers, torchrun if any, their children) and itself.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import time
import traceback

from perfkit.run import _teardown

__all__: list[str] = []


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Line buffering so a rank that is killed still leaves the tail of its log behind.
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)  # the launcher never sees a half-written file


def _resolve(target: str):
    module_name, _, function_name = target.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def _init_process_group(backend: str, device: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    kwargs = {"backend": backend, "timeout": datetime.timedelta(seconds=max(1.0, timeout_s))}
    if device == "cuda":  # also ROCm: HIP devices are "cuda" in torch, RCCL is "nccl"
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    # Every rank waits at the store until all have built their process group before any runs its
    # target (torch's own store-based barrier, off by default since torch 2.3). Without it a rank
    # whose target needs no collective can finish and exit while a peer is still completing
    # gloo's connectFullMesh handshake with it, and that peer fails with "Connection closed by
    # peer": 3 launches in 108 under load here (4 concurrent launchers on 2 cores), 0 in 120 with it.
    os.environ.setdefault("TORCH_DIST_INIT_BARRIER", "1")
    dist.init_process_group(**kwargs)


def use_caller_path(job: dict) -> None:
    """The caller's import path first, so a target importable in the caller (a notebook's folder,
    a tests/ directory) is importable here without the caller exporting PYTHONPATH."""
    for entry in reversed(job["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def _end_launch(token: str | None) -> None:
    print("perfkit: the launching process is gone; ending this launch", flush=True)
    if token:
        _teardown.reap(token)
    os._exit(1)


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    work_dir = job["work_dir"]
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    _redirect_output(os.path.join(work_dir, f"local{local_rank}.log"))
    if job.get("launcher_pid"):
        _teardown.watch(job["launcher_pid"], job.get("launcher_start"), lambda: _end_launch(job.get("token")))
    result_path = os.path.join(work_dir, f"local{local_rank}.json")
    use_caller_path(job)
    try:
        function = _resolve(job["target"])
        _init_process_group(job["backend"], job["device"], job["timeout_s"])
        result = function(job["config"])
        if not isinstance(result, dict):
            raise TypeError(f"target {job['target']} returned {type(result).__name__}, not a dict")
        payload = {"ok": True, "rank": rank, "result": result}
        json.dumps(payload)  # fail here, as this rank's error, if the result is not JSON
    except Exception as error:  # noqa: BLE001 - every failure of the target is reported
        cls = type(error)
        payload = {
            "ok": False,
            "rank": rank,
            "error_name": f"{cls.__module__}.{cls.__qualname__}",
            "message": str(error),
            "traceback": traceback.format_exc(),
            "time": time.time(),
        }
        traceback.print_exc()
        write_json_atomic(result_path, payload)
        sys.stdout.flush()
        sys.stderr.flush()
        # Exit at once: peers may be blocked in a collective with this rank, and a normal
        # interpreter shutdown could wait on the process group; the launcher then stops the peers.
        os._exit(1)
    write_json_atomic(result_path, payload)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
