"""The entry point of every kernel perfkit starts: ipykernel's, after a watch on the sweep.

Run by path (``python .../_kernel_launcher.py -f CONNECTION_FILE ...``), standard library only
until ipykernel: the kernel may be an A/B variant's interpreter, without perfkit installed.

Before the kernel imports anything, a daemon thread starts watching the process that started it
(its pid in ``PERFKIT_KERNEL_PARENT``). When that process dies (a sweep killed with SIGKILL, a
Slurm task killed whole), the thread kills every holder of the configuration's teardown token
(torchrun and its ranks, which lead sessions of their own), removes the kernel's sockets' folder,
and kills the kernel's own process group: no orphan lives on under init holding memory and cores,
or writes rows after a resumed sweep re-ran its configuration. Started here rather than by a
first cell, it also covers a kernel still starting when the sweep died (a warm kernel started
ahead), which nothing else would end: ipykernel's own parent poller is off
(``--IPKernelApp.parent_handle=1``), as it would exit the kernel before this thread's kills.

A parent already gone when the watch starts (the kernel re-parented during its first
milliseconds) is seen as gone: the pid is compared with the one the starter wrote, not with
whatever ``getppid()`` says at start.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import threading
import time

PARENT_ENV = "PERFKIT_KERNEL_PARENT"
TOKEN_ENV = "PERFKIT_KERNEL_TOKEN"
IPC_DIR_ENV = "PERFKIT_KERNEL_IPC_DIR"


def _load_teardown():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_teardown.py")
    spec = importlib.util.spec_from_file_location("_perfkit_teardown", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _watch(parent: int, token: str | None, ipc_dir: str | None) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    if token:
        _load_teardown().reap(token)
    if ipc_dir:
        shutil.rmtree(ipc_dir, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    parent = os.environ.pop(PARENT_ENV, None)
    token = os.environ.pop(TOKEN_ENV, None)
    ipc_dir = os.environ.pop(IPC_DIR_ENV, None)
    if parent:
        threading.Thread(target=_watch, args=(int(parent), token, ipc_dir), daemon=True,
                         name="perfkit-parent-watch").start()
    # As ipykernel_launcher: this file's folder (perfkit/run) must not shadow the notebook's imports.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
