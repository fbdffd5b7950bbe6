"""Every process a configuration starts ends with it: environment tokens, found through ``/proc``.

Linux only (``/proc``), standard library only: the kernel's parent watch loads this file by path,
without importing the perfkit package (pandas, torch) first.

A **token** is an environment variable with a unique name (``PERFKIT_TEARDOWN_<hex>``) put into
the environment of a process perfkit starts (a configuration's kernel, a launch's torchrun).
Children inherit their parent's environment and torchrun passes its own to the ranks, so every
descendant carries the token even after it has left its parent's process group or session
(torchrun's workers lead sessions of their own) or been re-parented to init. :func:`reap` kills
every process whose initial environment (``/proc/PID/environ``) holds the token and waits until
none is left. A unique *name* (not a fixed name with a unique value) keeps the tokens of nested
owners apart: a rank carries both its kernel's token and its launch's.

:func:`watch` is the other direction: a process that must not outlive another (a rank, its
launcher) polls it, and recognises a recycled pid by the start time in ``/proc/PID/stat``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

__all__ = ["TOKEN_PREFIX", "new_token", "holders", "reap", "start_time", "alive", "watch"]

TOKEN_PREFIX = "PERFKIT_TEARDOWN_"


def new_token() -> str:
    """A fresh token name; put ``{name: "1"}`` into a child's environment."""
    return f"{TOKEN_PREFIX}{uuid.uuid4().hex}"


def holders(token: str) -> list[int]:
    """Pids of the live processes (this one excepted) whose environment holds ``token``.

    A zombie's environment reads empty, so a process already killed and waiting to be reaped by
    its parent does not count: it holds no memory, device or core any more.
    """
    needle = token.encode() + b"="
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone meanwhile, or another user's process (not ours to reap)
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            found.append(int(entry))
    return found


def reap(token: str, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every holder of ``token`` until none is left and each one killed has ended (a zombie,
    or gone); the pids still there after ``wait_s``.

    Repeated rather than once: a holder may be starting a child while the first round kills it.
    Waiting for the killed to end, not only to drop out of :func:`holders`: a process's environment
    reads empty from the moment its memory starts being released (``exit_mm``), which for a process
    holding a framework's heap takes a while under load, before it is a zombie.
    """
    deadline = time.monotonic() + wait_s
    killed: dict[int, int] = {}  # pid -> its start time
    while True:
        pids = holders(token)
        dying = [pid for pid, started in killed.items() if pid not in pids and alive(pid, started)]
        if (not pids and not dying) or time.monotonic() >= deadline:
            return pids + dying
        for pid in pids:
            started = killed.get(pid) or start_time(pid)
            if started is None:  # gone meanwhile
                continue
            killed[pid] = started
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05 if pids else 0.01)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: fields after it start at state (3).
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, field 22 of ``/proc/PID/stat``)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, started: int | None) -> bool:
    """True while ``pid`` runs and is the process that started at ``started`` (not a reuse)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):  # a killed process not yet reaped is dead
        return False
    return started is None or int(fields[19]) == started


def watch(pid: int, started: int | None, on_death: Callable[[], None], interval_s: float = 0.5) -> threading.Thread:
    """Call ``on_death`` (from a daemon thread) once ``pid`` has ended."""
    def _run():
        while alive(pid, started):
            time.sleep(interval_s)
        on_death()

    thread = threading.Thread(target=_run, daemon=True, name=f"perfkit-watch-{pid}")
    thread.start()
    return thread


def owned_name(prefix: str) -> str:
    """``<prefix>-<host>-<pid>-<start time>-``: a temporary name that says which process owns it
    (:func:`remove_orphaned_dirs` removes it once that process is gone)."""
    return f"{prefix}-{_short_host()}-{os.getpid()}-{start_time(os.getpid())}-"


def remove_orphaned_dirs(folder: str, prefix: str) -> None:
    """Remove ``folder``'s directories named by :func:`owned_name` whose owner on this host is
    gone (killed before it could remove them itself)."""
    head = f"{prefix}-{_short_host()}-"
    for path in glob.glob(os.path.join(glob.escape(folder), glob.escape(head) + "*")):
        parts = os.path.basename(path)[len(head):].split("-")
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit() \
                and not alive(int(parts[0]), int(parts[1])):
            shutil.rmtree(path, ignore_errors=True)


def owned_tempdir(prefix: str) -> str:
    """A new temporary directory named by :func:`owned_name`, after removing the ones of ``prefix``
    whose owner is gone: a process killed before it could remove its own (SIGKILL, the OOM killer,
    a Slurm task killed whole) leaves it, and the next one on the host removes it."""
    folder = tempfile.gettempdir()
    remove_orphaned_dirs(folder, prefix)
    return tempfile.mkdtemp(prefix=owned_name(prefix), dir=folder)


def _short_host() -> str:
    # Short: a Unix socket's path under such a folder must stay within 107 bytes.
    return socket.gethostname().split(".")[0][:24]
