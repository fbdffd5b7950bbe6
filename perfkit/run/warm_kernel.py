"""A kernel of this interpreter for one configuration, started (and warmed) before it is needed.

The kernel the sweep engine prestarts for a slot's next configuration: the notebook's imports run
in it in advance, at idle priority beside a running measurement (:meth:`WarmKernel.foreground`
restores normal scheduling when it is handed its configuration); its channels are Unix sockets of
its own; it and every process it starts end with it (:mod:`perfkit.run._teardown`).
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import _kernel_launcher, _teardown
from ..core.results import CONTEXT_ENV, RunContext

__all__ = ["WarmKernel"]


class WarmKernel:
    """A kernel of this interpreter, started (and optionally preloaded) before it is needed.

    One kernel serves exactly one configuration: isolation of device memory and of torch's
    global state matters more than the start-up it would save to reuse one.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 preload: Sequence[str] = (), background: bool = False, python: str | None = None):
        from jupyter_client.kernelspec import KernelSpec
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        self._run_sync = run_sync
        self.km = AsyncKernelManager(kernel_name="python3")
        # The kernel runs this interpreter (or an A/B variant's, named explicitly): a user-level
        # 'python3' kernelspec pointing at another Python must not silently take over (it would
        # measure a different torch).
        self.python = python or sys.executable
        self.km._kernel_spec = KernelSpec(
            # log_level ERROR: ipykernel 7 warns on every start that loopback TCP is unencrypted.
            # History in memory, as nbclient starts its kernels: a configuration's cells are not
            # the user's IPython history, and parallel kernels do not contend for its sqlite file.
            # perfkit's launcher starts a watch on this process before ipykernel (_kernel_launcher).
            # parent_handle=1: ipykernel's own parent poller off (it never polls for init, pid 1;
            # 0 would turn it off too but print a Ctrl-C note into our stdout). That poller exits
            # the kernel at once when the parent dies (os._exit), racing perfkit's watch, which
            # must first kill what the kernel started in other sessions (torchrun, ranks): half
            # the time here, the kernel's children outlived it.
            argv=[self.python, _kernel_launcher.__file__, "-f", "{connection_file}",
                  "--IPKernelApp.log_level=ERROR", "--HistoryManager.hist_file=:memory:",
                  "--IPKernelApp.parent_handle=1"],
            display_name=f"perfkit ({self.python})", language="python", name="python3",
        )
        # The kernel's five channels are Unix sockets in a folder of their own, not loopback TCP
        # ports: jupyter_client picks a free port by binding and releasing it, and between that and
        # the kernel's own bind, any other process (another kernel, a gloo store, a rank) may take
        # it; the kernel then dies at start ("Address already in use"). A short path: a socket's
        # name is limited to 107 bytes.
        # Owned (host, pid, start time): a Slurm task killed whole, driver and kernel at once,
        # cannot remove its own; the next kernel on the host removes it.
        self._ipc_dir = _teardown.owned_tempdir("perfkit-kernel")
        self.km.transport = "ipc"
        self.km.ip = os.path.join(self._ipc_dir, "k")
        # Its connection file there too (jupyter_client's default is a new /tmp/tmp*.json, which a
        # killed kernel's driver never removed: the suite left ~20 per run), so it goes with the folder.
        self.km.connection_file = os.path.join(self._ipc_dir, "kernel.json")
        self._kc = None  # this kernel's client (see client()) and the thread it belongs to
        self._kc_thread: int | None = None
        kernel_env = dict(os.environ)
        kernel_env.pop(CONTEXT_ENV, None)
        kernel_env.update(env or {})
        kernel_env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        # One kernel, one configuration: the token marks every process the configuration starts.
        self.token = _teardown.new_token()
        kernel_env[self.token] = "1"
        self.environ = kernel_env  # what the kernel runs with, as its rows' fingerprints say
        watched = {**kernel_env, _kernel_launcher.PARENT_ENV: str(os.getpid()),
                   _kernel_launcher.TOKEN_ENV: self.token, _kernel_launcher.IPC_DIR_ENV: self._ipc_dir}
        try:
            self._run_sync(self.km.start_kernel)(env=watched, cwd=str(cwd) if cwd else None)
        except BaseException:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            raise
        try:
            self._prepare(background, preload)
        except BaseException:
            self.shutdown()  # a kernel that failed its set-up is not left running
            raise

    def _prepare(self, background: bool, preload: Sequence[str]) -> None:
        # ``background``: the kernel warms up while another configuration is being measured on
        # the same cores; under SCHED_IDLE it only uses CPU time nobody else wants, so it does not
        # perturb that measurement. :meth:`foreground` restores normal scheduling when handed a
        # configuration.
        self.background = background and self._set_policy(getattr(os, "SCHED_IDLE", None))
        # ``preload``: the notebook's own import statements, run before the kernel is handed a
        # configuration so that small configurations do not pay import time on the critical path.
        # A failing import is left for the notebook itself to report.
        code = [f"try:\n    {stmt}\nexcept Exception:\n    pass" for stmt in preload]
        try:
            self.run_code("\n".join(code) or "pass")
        finally:
            self.close_client()  # the thread that runs the configuration makes its own

    def _set_policy(self, policy: int | None) -> bool:
        """Set the scheduling policy of every thread of the kernel process; False if not allowed."""
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if policy is None or pid is None or not hasattr(os, "sched_setscheduler"):
            return False
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except (OSError, ValueError):
            return False
        return True

    def foreground(self) -> bool:
        """Normal scheduling again (a no-op unless started in ``background``); False if refused."""
        if not self.background:
            return True
        ok = self._set_policy(os.SCHED_OTHER)
        self.background = not ok
        return ok

    def run_code(self, code: str, timeout_s: float = 120) -> None:
        """Run ``code`` in the kernel through this thread's client; raise if it fails."""
        kc = self.client(timeout_s)
        reply = self._run_sync(self._until_idle)(kc, kc.execute(code, silent=True, store_history=False), timeout_s)
        if reply is None:
            raise RuntimeError(f"kernel set-up did not finish in {timeout_s:.0f} s")
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"kernel set-up failed: {reply['content'].get('evalue')}")

    def client(self, timeout_s: float = 120):
        """This kernel's client for the calling thread, connected and known ready: the one that
        hands the configuration its context and that papermill executes the notebook through.

        jupyter_client's ``wait_for_ready`` (which nbclient calls for a client it starts itself)
        ends by waiting for 0.2 s of silence on IOPub, and a client per step paid it each time:
        0.4 s of every configuration's critical path went to sleeping. Readiness here is exact
        instead: a ``kernel_info`` request answered on the shell channel, and its ``idle`` status
        seen on IOPub (proof that the subscription is live, so no output is missed). A client
        belongs to the thread that made it: its sockets live on that thread's event loop."""
        if self._kc is not None and self._kc_thread != threading.get_ident():
            self.close_client()
        if self._kc is None:
            kc = self.km.client()
            kc.start_channels()
            try:
                self._run_sync(self._ready)(kc, timeout_s)
            except BaseException:
                kc.stop_channels()
                raise
            self._kc, self._kc_thread = kc, threading.get_ident()
        return self._kc

    def close_client(self) -> None:
        kc, self._kc = self._kc, None
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:  # noqa: BLE001 - a dead kernel's client may fail to close; it is gone either way
                pass

    async def _ready(self, kc, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if await self._until_idle(kc, kc.kernel_info(), min(1.0, max(0.05, deadline - time.monotonic()))):
                return
            if not await self.km.is_alive():
                raise RuntimeError("the kernel died before it answered kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kernel did not answer kernel_info in {timeout_s:.0f} s")

    @staticmethod
    async def _until_idle(kc, msg_id: str, timeout_s: float) -> dict | None:
        """The shell reply to request ``msg_id`` once its ``idle`` status was seen on IOPub too;
        None when either is not seen within ``timeout_s`` (IOPub not subscribed yet, or a kernel
        still starting: ask again)."""
        deadline = time.monotonic() + timeout_s
        reply = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            channel = kc.iopub_channel if reply is not None else kc.shell_channel
            try:
                msg = await channel.get_msg(timeout=left)
            except queue.Empty:  # nothing within the time left
                return None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if reply is None:
                reply = msg
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return reply

    def set_context(self, ctx: RunContext, cwd: Path) -> None:
        """Hand the kernel its configuration: where rows go, and the notebook's directory."""
        self.run_code(f"import os; os.environ[{CONTEXT_ENV!r}] = {ctx.to_env()!r}; os.chdir({str(cwd)!r})")

    @property
    def pgid(self) -> int | None:
        prov = getattr(self.km, "provisioner", None)
        return getattr(prov, "pgid", None) or getattr(prov, "pid", None)

    def kill(self) -> None:
        """SIGKILL the kernel and every process it started (torchrun, ranks: its token's holders),
        and wait until they are gone."""
        self._kill_group()
        self._reap()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def shutdown(self) -> None:
        """End the kernel now (one configuration per kernel: nothing in it is worth a graceful
        stop) and every process it started. The process group is killed and waited for first:
        ``shutdown_kernel(now=True)`` alone interrupts, kills, then polls every 0.1 s."""
        self.close_client()
        self._kill_group(wait=True)
        try:  # shutdown_kernel also removes the connection file and the sockets' files
            self._run_sync(self.km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass
        self._reap()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    def _kill_group(self, *, wait: bool = False) -> None:
        """SIGKILL the kernel's process group; ``wait``: until the kernel process is gone."""
        pgid = self.pgid
        if not pgid:
            return
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        if wait and process is not None:
            try:
                process.wait(timeout=10)
            except Exception:  # noqa: BLE001 - the token reap that follows still makes sure
                pass

    def _reap(self) -> None:
        left = _teardown.reap(self.token)
        if left:
            print(f"perfkit: processes {left} of a configuration survived SIGKILL (uninterruptible?)",
                  file=sys.stderr)
