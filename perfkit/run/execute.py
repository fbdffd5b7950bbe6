"""Execute one configuration: a parameterized notebook, run by papermill in a fresh kernel.

This is the single code path every executor uses (``perfkit run``, the local sweep's workers,
Slurm tasks): start a kernel of *this* interpreter (not whatever ``python3`` kernelspec happens
to be first on the Jupyter path), tell it where its rows go, run the notebook with papermill,
and classify how it ended:

- an exception in a cell → ``failed`` (``oom`` for the allocator errors of perfkit.core.status;
  ``skipped`` for :func:`perfkit.skip`), with the error's name, message and cell;
- wall time over ``timeout_s`` → ``timeout``: the kernel's whole process group is killed;
- the kernel dies on its own → ``killed``.

Every process a configuration starts ends with it: each kernel gets a teardown token in its
environment (:mod:`perfkit.run._teardown`) that its descendants inherit, torchrun's ranks in their
own sessions included, and killing or shutting down the kernel kills every holder and waits
until none is left. A kernel whose sweep dies (SIGKILL) does the same from a watch thread that its
launcher starts before ipykernel (:mod:`perfkit.run._kernel_launcher`).

The executed notebook is always written, papermill's error banner included; a killed kernel
gets a banner of ours. Whatever happens, the configuration's results file ends with at least one
row carrying its status and parameters: an ``ok`` notebook that recorded nothing (a user's own
notebook that only prints) gets one, or the results would not show that it ran.
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
from dataclasses import dataclass
from pathlib import Path

from . import _kernel_launcher, _teardown
from ..core import status as st
from ..core.results import CONTEXT_ENV, RunContext, load, record_ending

__all__ = ["Outcome", "WarmKernel", "execute_config", "banner", "trust_executed", "has_status_row"]



@dataclass(kw_only=True, frozen=True)
class Outcome:
    """How one configuration ended."""

    config_id: str
    status: str
    """One of perfkit.core.status.STATUSES."""
    error_name: str | None
    message: str | None
    cell: int | None
    """Execution count of the failing cell, when a cell failed."""
    output_notebook: Path
    results_path: Path
    started_at: float
    """Unix time, seconds."""
    duration_s: float


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


def banner(output_notebook: Path, text: str) -> None:
    """Put a visible note at the top of an executed notebook (papermill does this for errors).

    papermill rewrites the notebook in place after every cell, so a kill that ends a configuration
    can cut a write off: the bytes it left are kept beside it (``<name>.partial``) and the banner
    goes into a notebook of its own that says so, rather than the ending failing to be recorded."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    if output_notebook.exists():
        try:
            nb = nbformat.read(output_notebook, as_version=4)
        except Exception:  # noqa: BLE001 - cut off mid-write (JSON or schema): kept, not read
            partial = output_notebook.with_name(output_notebook.name + ".partial")
            output_notebook.replace(partial)
            text += f" (its executed notebook was cut off mid-write: what was written is in {partial.name})"
    cell = nbformat.v4.new_markdown_cell(f'<span style="color:red; font-size:2em">{text}</span>')
    cell.metadata["tags"] = ["perfkit-banner"]
    nb.cells.insert(0, cell)
    nbformat.write(nb, output_notebook)


def trust_executed(path: str | Path) -> bool:
    """Sign an executed notebook as trusted by this user, so that JupyterLab renders its plots.

    JupyterLab runs no JavaScript output of an untrusted notebook, and holoviews/bokeh plots are
    JavaScript: a sweep's executed notebook opened later would show its tables but no plot.
    Jupyter signs a notebook its user executed when saving it; papermill does not, so perfkit
    does the same for the notebooks it executed itself (signatures go to the user's Jupyter
    signature database, ``nbformat.sign.NotebookNotary``). Returns False, changing nothing, when
    the database cannot be written (a read-only home, say): the notebook stays untrusted.
    """
    import nbformat
    from nbformat.sign import NotebookNotary

    try:
        nb = nbformat.read(str(path), as_version=4)
        NotebookNotary().sign(nb)
    except Exception:  # noqa: BLE001 - a missing signature never fails a configuration
        return False
    return True


def has_status_row(results_path: Path, status: str | None, config_id: str | None = None) -> bool:
    """Whether the results file holds a row with ``status`` (any status when None), of
    ``config_id`` when given."""
    if not results_path.exists():
        return False
    frame = load(results_path)
    if "status" not in frame:
        return False
    found = frame["status"].notna() if status is None else frame["status"] == status
    if config_id is not None and "config_id" in frame:
        found &= frame["config_id"] == config_id
    return bool(found.any())


def execute_config(
    notebook: str | Path,
    params: Mapping[str, object],
    *,
    config_id: str,
    output_notebook: str | Path,
    results_path: str | Path,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    kernel: WarmKernel | None = None,
    log_output: bool = False,
    python: str | None = None,
    row_columns: Mapping[str, object] | None = None,
) -> Outcome:
    """Run one configuration to its end and return how it ended (never raises for the run).

    ``python``: the interpreter of the kernel started here (an A/B variant's); ``row_columns``:
    columns every row gets besides the parameters (an A/B sweep's ``variant`` and ``round``)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from ._papermill_engine import ENGINE_NAME

    notebook, output_notebook, results_path = Path(notebook), Path(output_notebook), Path(results_path)
    output_notebook.parent.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(results_path=results_path.resolve(), config_id=config_id,
                     params={**params, **(row_columns or {})}, param_names=tuple(params), notebook=notebook.name)
    started = time.time()
    t0 = time.monotonic()
    fired = threading.Event()
    status, error_name, message, cell = st.OK, None, None, None
    watchdog = None
    try:
        if kernel is None:
            kernel = WarmKernel(env=env, cwd=notebook.resolve().parent, python=python)
        kernel.set_context(ctx, notebook.resolve().parent)

        def _expire():
            fired.set()
            kernel.kill()

        if timeout_s:
            remaining = max(0.1, timeout_s - (time.monotonic() - t0))
            watchdog = threading.Timer(remaining, _expire)
            watchdog.daemon = True
            watchdog.start()
        pm.execute_notebook(
            str(notebook), str(output_notebook), parameters=dict(params), km=kernel.km,
            engine_name=ENGINE_NAME, kc=kernel.client(), kernel_name="python3", progress_bar=False, log_output=log_output,
            request_save_on_cell_execute=True, cwd=str(notebook.resolve().parent),
        )
    except PapermillExecutionError as exc:
        status = st.TIMEOUT if fired.is_set() else st.status_for_error(exc.ename, exc.evalue)
        error_name, message, cell = exc.ename, exc.evalue, exc.exec_count
    except Exception as exc:  # noqa: BLE001 - a dead kernel, a broken notebook: classify, don't crash
        name = type(exc).__name__
        if fired.is_set():
            status, error_name = st.TIMEOUT, "Timeout"
            message = f"wall time exceeded timeout_s={timeout_s}; kernel killed"
        elif name == "DeadKernelError" or (name == "RuntimeError" and "died" in str(exc)):  # nbclient: "Kernel died before replying"
            status, error_name, message = st.KILLED, name, str(exc).strip() or "the kernel died"
        else:
            status, error_name, message = st.FAILED, name, str(exc).strip()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if kernel is not None:
            kernel.shutdown()
    duration = time.monotonic() - t0
    if status in (st.TIMEOUT, st.KILLED):
        banner(output_notebook, f"perfkit: this configuration ended <b>{status}</b> after "
                f"{duration:.1f} s: {message}")
    if output_notebook.exists():  # its plots render when the user opens it later in JupyterLab
        trust_executed(output_notebook)
    # A failure always shows as a row of its status; an ``ok`` run only needs one when it
    # recorded nothing at all (its own rows may carry other statuses, e.g. a skipped point).
    if not has_status_row(results_path, None if status == st.OK else status, config_id):
        reason = None
        if status != st.OK:
            reason = f"{error_name}: {message}" if error_name else message
            if cell is not None:
                reason = f"{reason} (cell {cell})"
        # Described as its kernel ran (thread share, variables; set_context's cwd), not as this engine runs.
        environ = kernel.environ if kernel is not None else {**os.environ, **(env or {})}
        record_ending(ctx, status, reason, environ=environ, cwd=notebook.resolve().parent)
    return Outcome(config_id=config_id, status=status, error_name=error_name, message=message,
                   cell=cell, output_notebook=output_notebook, results_path=results_path,
                   started_at=started, duration_s=duration)
