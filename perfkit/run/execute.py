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

Every row also says when its configuration measured (:data:`WINDOW_COLUMNS`): from its first code
cell to the release before its first ``view`` cell (:mod:`perfkit.run._papermill_engine`), where a
sweep hands the device to the next configuration (``on_release``) while the view cells still run.
The configuration ends ``ok`` only once its whole notebook did.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core import status as st
from ..core.results import RunContext, load, record_ending, stamp
from .warm_kernel import WarmKernel

__all__ = ["Outcome", "WarmKernel", "execute_config", "banner", "trust_executed", "has_status_row", "WINDOW_COLUMNS"]

#: The columns of every row saying when its configuration measured (Unix time, s) and for how long.
WINDOW_COLUMNS = ("measure_window_start_unix_s", "measure_window_end_unix_s", "measure_window_s")


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
    window_start_unix_s: float | None = None
    """When it began measuring: its first code cell's start (Unix time, s; None when no cell ran)."""
    window_end_unix_s: float | None = None
    """When it stopped: the release before its first ``view`` cell, else its last cell's end."""
    released: bool = False
    """Whether it handed its device on before its notebook ended (it reached a ``view`` cell)."""

    @property
    def window_s(self) -> float | None:
        """How long it held its device for measuring."""
        if self.window_start_unix_s is None or self.window_end_unix_s is None:
            return None
        return self.window_end_unix_s - self.window_start_unix_s


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
    on_release: Callable[[], None] | None = None,
) -> Outcome:
    """Run one configuration to its end and return how it ended (never raises for the run).

    ``python``: the interpreter of the kernel started here (an A/B variant's); ``row_columns``:
    columns every row gets besides the parameters (an A/B sweep's ``variant`` and ``round``);
    ``on_release``: called (from this thread) when the notebook's measuring ended and its ``view``
    cells are about to run (never for a notebook without them, or one that ends before them). Every
    row gets the measurement window (:data:`WINDOW_COLUMNS`)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from ._papermill_engine import ENGINE_NAME, MeasureWindow

    notebook, output_notebook, results_path = Path(notebook), Path(output_notebook), Path(results_path)
    output_notebook.parent.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(results_path=results_path.resolve(), config_id=config_id,
                     params={**params, **(row_columns or {})}, param_names=tuple(params), notebook=notebook.name)
    started = time.time()
    t0 = time.monotonic()
    window = MeasureWindow(on_release=on_release)
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
            request_save_on_cell_execute=True, cwd=str(notebook.resolve().parent), window=window,
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
        window.close(time.time())
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
    if window.start_unix_s is not None:
        stamp(results_path, dict(zip(WINDOW_COLUMNS, (window.start_unix_s, window.end_unix_s,
                                                      window.end_unix_s - window.start_unix_s))))
    return Outcome(config_id=config_id, status=status, error_name=error_name, message=message,
                   cell=cell, output_notebook=output_notebook, results_path=results_path,
                   started_at=started, duration_s=duration, window_start_unix_s=window.start_unix_s,
                   window_end_unix_s=window.end_unix_s, released=window.released)
