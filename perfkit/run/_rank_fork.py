"""The ranks of a one-node CPU launch, forked from one process that imported torch once.

``python -m perfkit.run._rank_fork JOB RANKS`` (started by :func:`perfkit.run.launch.launch` only)
imports torch, ``torch.distributed`` and the job's ``preload`` modules (the target's module, and
``torch._dynamo`` for a training step, which torch imports on the first optimizer or DDP wrapper),
then forks one child per local rank. Each child leads a session of its own, takes its rank's
environment (``RANK``, ``LOCAL_RANK``, ... as the launcher computed it) and runs
:func:`perfkit.run._rank_entry.main`, exactly what ``python -m perfkit.run._rank_entry`` runs. This
process then waits for them and writes each one's exit status (Popen's convention: negative for a
signal) to ``exit<LOCAL_RANK>.json`` in the launch's directory, where the launcher reads it
(:func:`perfkit.run.launch_outcome.forked_rank_exit`); if this
process is killed, the launcher gives every rank not yet reported its status and ends the launch
(its token's holders, the ranks, are killed as always).

Why: every rank paid its own ``import torch`` and, when it trains, ``torch._dynamo`` with sympy:
3.5 s of CPU before it measured anything (AMD EPYC, 2 cores), on every point of a scaling run or
an OOM-edge search. Forked, N ranks pay it once. Teardown is unchanged: this process is started
with the launch's teardown token in its environment, and a forked child's ``/proc/PID/environ`` is
its parent's, so every rank (and whatever it forks or starts) holds the token.

What the fork keeps the same: the thread variables (libgomp and MKL read them when they load, here)
are the ranks' own, identical for every local rank; the launcher gives this process only the
variables every rank shares, and each child sets its rank's own. What differs from a rank started
by exec: ``cpu_max_rss`` (a process's peak resident set) counts only the library pages a rank
touches itself, not every page its own imports would have read in; on this VM a rank after
``import torch`` starts at ~220 MB instead of ~300 MB.

CPU only: on a GPU the import chain may touch the CUDA driver, which a forked child cannot use;
GPU ranks are started by exec (:func:`perfkit.run.launch._supervise_ranks`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from perfkit.run import _rank_entry

__all__: list[str] = []


def _preload(job: dict) -> None:
    _rank_entry.use_caller_path(job)  # as each rank sets it: a preloaded target importable in the caller is here
    for name in ("torch", "torch.distributed", *job.get("preload", ())):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports the error as its own
            pass


def _become_rank(job_path: str, env: dict) -> None:
    """In the forked child: a session of its own and the rank's environment, then the rank."""
    code = 1
    try:
        os.setsid()  # as the launcher's start_new_session: a rank leads its own session
        os.environ.update(env)  # this process has the variables all ranks share; the rank's own
        code = _rank_entry.main(job_path) or 0
    except SystemExit as exit_:  # as the interpreter ends on it: None is 0, a message is 1
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever ends the rank ends this child, with its traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(job_path: str, ranks_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    with open(ranks_path) as f:
        rank_envs = json.load(f)
    _preload(job)
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here is printed twice by the children
    children = {}
    for local_rank, env in enumerate(rank_envs):
        pid = os.fork()
        if pid == 0:
            _become_rank(job_path, env)
        children[pid] = local_rank
    while children:
        pid, status = os.waitpid(-1, 0)
        if pid in children:
            _rank_entry.write_json_atomic(os.path.join(job["work_dir"], f"exit{children.pop(pid)}.json"),
                                           {"returncode": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
