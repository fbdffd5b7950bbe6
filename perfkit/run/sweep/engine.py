"""The local sweep engine: configurations → device slots → fresh kernels → papermill.

- **Resume.** The ledger says what ended. A configuration that ended ``ok``/``skipped``/``oom``
  is done; one interrupted (no ending, or ``killed``: preempted, cancelled, kernel lost) runs
  again; ``failed``/``timeout`` run again only with ``retry_failed``. Before an attempt, rows of
  an earlier unfinished attempt are removed, so every configuration's rows come from exactly one
  attempt.
- **Slots.** ``workers`` slots run at once (:mod:`.slots`): disjoint GPUs, or a share of the
  cores each; whatever a configuration starts computes with the threads it would have had alone
  (``with_threads``: the launcher's split, a caller's per-rank count, a variant's ``OMP_NUM_THREADS``).
- **Kernel start-up off the critical path.** While a slot runs one configuration, its next
  kernel starts (imports the notebook's modules; on a GPU, makes its context) in the background.
  A kernel never serves two configurations.
- **The device handed on when measuring ends.** With ``overlap`` (GPU slots by default), a
  configuration's ``view`` cells run while the slot's next configuration measures; it still ends
  only when its notebook did, with its own status. A CPU slot does not overlap unless asked: view
  cells would compete for the cores being measured. :mod:`.busy` says how busy the slots were.
- **OOM is an edge.** After an ``oom`` at value v of the spec's ``oom_axis`` (batch size),
  pending configurations equal but for a larger value (same variant) are ``skipped`` without
  running.
- **A/B variants.** A configuration of an interleaved A/B sweep runs in a kernel of its
  variant's interpreter with its environment over the slot's; a warmed kernel of another
  variant is not used for it.
- **No configuration vanishes.** Whatever fails around a configuration's body (its kernel does
  not start, the engine itself raises), it ends ``failed`` with the reason, a ledger entry and a
  row, and its slot goes on with the next one; the exit code counts every configuration that
  was to run.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...core import status as st
from ...core.cpu_share import affinity_cpus
from ..execute import Outcome, WarmKernel, execute_config, has_status_row
from ..notebooks import read_notebook, warm_statement
from ...core.results import record
from .busy import BusyShare, append_summary, busy_share
from .ledger import RUNNING, Ledger, LedgerEntry, SweepLock
from .slots import Slot, device_slots, is_gpu_slot, warm_next
from .spec import Config, Variant
from .variants import kernel_env

__all__ = ["SweepResult", "plan", "should_run", "run_one", "end_without_run", "run_configs", "device_slots",
           "config_paths", "OomEdges", "raise_on_sigterm", "restore_sigterm", "RERUN_BY_DEFAULT"]

#: Endings that a plain resume runs again: the run was interrupted from outside.
RERUN_BY_DEFAULT = frozenset({RUNNING, st.KILLED})


@dataclass(kw_only=True)
class SweepResult:
    out_dir: Path
    total: int
    """Configurations in the spec."""
    already_done: int
    """Configurations the ledger already had as finished (not run again)."""
    to_run: int = 0
    """Configurations this sweep set out to run (the spec's, less those already done)."""
    outcomes: list[Outcome] = field(default_factory=list)
    wall_time_s: float = 0.0
    busy: BusyShare | None = None
    """How busy the device slots were (:mod:`.busy`); None when nothing ran."""

    def counts(self) -> Counter:
        return Counter(o.status for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        """0 when every configuration that was to run ended ok or skipped, 1 otherwise (one
        without an ending counts as a failure)."""
        ended_well = all(o.status in (st.OK, st.SKIPPED) for o in self.outcomes)
        return 0 if ended_well and len(self.outcomes) >= self.to_run else 1


def plan(configs: Sequence[Config], out_dir: Path, *, retry_failed: bool = False) -> list[tuple[Config, str | None]]:
    """Each configuration with its ledger status (None when it never ran), and whether to run."""
    state = Ledger(out_dir).state()
    return [(c, state[c.config_id].status if c.config_id in state else None) for c in configs]


def should_run(previous: str | None, retry_failed: bool) -> bool:
    if previous is None or previous in RERUN_BY_DEFAULT:
        return True
    return retry_failed and previous in (st.FAILED, st.TIMEOUT)


class OomEdges:
    """Remembers OOMs along each configuration's ``oom_axis`` and answers 'is this past one?'."""

    def __init__(self):
        self._edges: list[tuple[Config, object]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _rest(c: Config) -> tuple:
        return (str(c.notebook), c.variant_name,
                sorted((k, repr(v)) for k, v in c.params.items() if k != c.oom_axis))

    @classmethod
    def from_ledger(cls, state, like: Config) -> OomEdges:
        """Edges of every ``oom`` the ledger holds, read along ``like``'s axis (a Slurm task
        sees the whole sweep's history, not just what its own process ran)."""
        edges = cls()
        for e in state.values():
            if e.status == st.OOM:
                edges.add(Config(config_id=e.config_id, notebook=Path(e.notebook), params=e.params, timeout_s=None,
                                 devices=like.devices, oom_axis=like.oom_axis, part=like.part,
                                 variant=Variant(name=e.variant) if e.variant else None))
        return edges

    def add(self, c: Config) -> None:
        if c.oom_axis and c.oom_axis in c.params:
            with self._lock:
                self._edges.append((c, c.params[c.oom_axis]))

    def past_edge(self, c: Config) -> object | None:
        if not c.oom_axis or c.oom_axis not in c.params:
            return None
        value = c.params[c.oom_axis]
        with self._lock:
            for edge, edge_value in self._edges:
                try:
                    if self._rest(edge) == self._rest(c) and value >= edge_value:
                        return edge_value
                except TypeError:
                    continue
        return None


def config_paths(c: Config, out_dir: Path) -> tuple[Path, Path]:
    """Where a configuration's executed notebook and its rows go."""
    return out_dir / "notebooks" / f"{c.config_id}.ipynb", out_dir / "results" / f"{c.config_id}.parquet"


def run_one(c: Config, out_dir: Path, *, attempt: int, slot: str, ledger: Ledger | None = None,
            edges: OomEdges | None = None, env: dict[str, str] | None = None,
            take_kernel: Callable[[Config], WarmKernel] | None = None,
            interrupted: Callable[[], bool] = lambda: False,
            on_release: Callable[[], None] | None = None) -> Outcome | None:
    """One attempt of one configuration, ledger entries included — what every executor runs
    (a local slot, a Slurm array task). Returns None when ``interrupted`` before it started.
    ``env``: the slot's environment; the configuration's variant adds its own over it;
    ``on_release``: called when its measuring ended and its ``view`` cells begin."""
    ledger = ledger or Ledger(out_dir)
    output_nb, results_path = config_paths(c, out_dir)
    results_path.unlink(missing_ok=True)  # rows of an unfinished earlier attempt
    entry = LedgerEntry(config_id=c.config_id, status=RUNNING, attempt=attempt, notebook=str(c.notebook),
                        params=c.params, start=time.time(), output_notebook=str(output_nb),
                        results_path=str(results_path), host=os.uname().nodename, pid=os.getpid(), slot=slot,
                        variant=c.variant_name, round=c.round)
    edge = edges.past_edge(c) if edges is not None else None
    if edge is not None:
        ledger.append(entry)
        outcome = end_without_run(c, out_dir, st.SKIPPED, "OomEdge",
                                  f"{c.oom_axis}={c.params[c.oom_axis]!r} is past the OOM edge at {edge!r}")
    else:
        try:
            kernel = take_kernel(c) if take_kernel else None
        except Exception as exc:  # noqa: BLE001 - this configuration fails, not the sweep
            kernel, no_kernel = None, exc
        else:
            no_kernel = None
        if interrupted():
            if kernel is not None:
                kernel.shutdown()
            return None
        ledger.append(entry)
        if no_kernel is not None:
            outcome = end_without_run(c, out_dir, st.FAILED, type(no_kernel).__name__,
                                      f"the kernel did not start: {no_kernel}")
        else:
            outcome = execute_config(c.notebook, c.params, config_id=c.config_id, output_notebook=output_nb,
                                     results_path=results_path, timeout_s=c.timeout_s,
                                     env=kernel_env(env, c.variant), kernel=kernel,
                                     python=c.variant.python if c.variant else None, row_columns=c.row_columns,
                                     on_release=on_release)
        if interrupted() and outcome.status != st.OK:
            outcome = Outcome(**{**outcome.__dict__, "status": st.KILLED, "error_name": "Interrupted",
                                 "message": "the sweep was interrupted; it runs again on resume"})
    ledger.append(LedgerEntry(**{**entry.__dict__, "status": outcome.status, "end": time.time(),
                                 "duration_s": outcome.duration_s, "error_name": outcome.error_name,
                                 "message": outcome.message, "cell": outcome.cell,
                                 "window_start": outcome.window_start_unix_s,
                                 "window_end": outcome.window_end_unix_s}))
    return outcome


def end_without_run(c: Config, out_dir: Path, status: str, error_name: str, message: str) -> Outcome:
    """The ending of a configuration whose notebook did not run: its status row (with its
    parameters, like every ending) and its outcome; the caller writes the ledger entry."""
    output_nb, results_path = config_paths(c, out_dir)
    if not has_status_row(results_path, status, c.config_id):
        record([{}], status=status, reason=f"{error_name}: {message}" if status != st.SKIPPED else message,
               context=c.run_context(results_path))
    return Outcome(config_id=c.config_id, status=status, error_name=error_name, message=message, cell=None,
                   output_notebook=output_nb, results_path=results_path, started_at=time.time(), duration_s=0.0)


def _engine_failure(c: Config, out_dir: Path, attempt: int, slot: str, ledger: Ledger, exc: Exception) -> Outcome:
    """Record ``failed`` for a configuration that :func:`run_one` could not end itself."""
    import traceback

    message = f"the sweep engine failed around this configuration: {exc}\n{traceback.format_exc()}"
    outcome = end_without_run(c, out_dir, st.FAILED, type(exc).__name__, message)
    ledger.append(LedgerEntry(config_id=c.config_id, status=st.FAILED, attempt=attempt, notebook=str(c.notebook),
                              params=c.params, end=time.time(), duration_s=0.0, error_name=outcome.error_name,
                              message=message, output_notebook=str(outcome.output_notebook),
                              results_path=str(outcome.results_path),
                              host=os.uname().nodename, pid=os.getpid(), slot=slot,
                              variant=c.variant_name, round=c.round))
    return outcome


def run_configs(
    configs: Sequence[Config],
    out_dir: str | Path,
    *,
    workers: int = 1,
    retry_failed: bool = False,
    on_start: Callable[[int, int], None] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    slots_env: Sequence[dict[str, str]] | None = None,
    prestart: bool | None = None,
    overlap: bool | None = None,
) -> SweepResult:
    """Run what the ledger says is not done, ``workers`` at a time; see the module docstring.

    ``prestart``: start each slot's next kernel while its current configuration runs. None (the
    default) does so on GPU slots only: there the measurement runs on the device, while on a CPU
    slot a kernel starting up beside a measurement perturbs it even at idle priority (seen here:
    2-thread OpenMP matmuls 2-100x slower). False starts each kernel when its configuration is due.
    ``overlap``: hand a slot to its next configuration when the current one reaches its ``view``
    cells; None (the default) does so on GPU slots only, for the same reason."""
    out_dir = Path(out_dir).resolve()
    t0 = time.monotonic()
    with SweepLock(out_dir):
        ledger = Ledger(out_dir)
        planned = plan(configs, out_dir, retry_failed=retry_failed)
        todo = [c for c, prev in planned if should_run(prev, retry_failed)]
        attempts = {e.config_id: e.attempt for e in ledger.state().values()}
        result = SweepResult(out_dir=out_dir, total=len(configs), already_done=len(configs) - len(todo),
                             to_run=len(todo))
        if on_start:
            on_start(len(todo), result.already_done)
        if not todo:
            return result
        devices = max(c.devices for c in todo)
        envs = list(slots_env) if slots_env is not None else device_slots(workers, devices)
        on_gpus = all(is_gpu_slot(env) for env in envs)
        prestart = on_gpus if prestart is None else prestart
        overlap = on_gpus if overlap is None else overlap
        specs = {nb: read_notebook(nb) for nb in {c.notebook for c in todo}}
        preload = tuple(dict.fromkeys(s for spec in specs.values() for s in spec.imports))

        def statement(c: Config) -> str | None:
            return warm_statement(specs[c.notebook], c.params)

        pending: queue.Queue[Config] = queue.Queue()
        for c in todo:
            pending.put(c)
        edges = OomEdges()
        lock = threading.Lock()
        stop = threading.Event()
        slots = [Slot(env["PERFKIT_SLOT"], env, preload) for env in envs[:max(1, min(len(envs), len(todo)))]]
        # Configurations of one slot still in their view cells while it measures the next: each
        # is a kernel on the host's cores (and, on a GPU, a context), so a few per slot at most.
        viewing_per_slot = max(1, min(4, len(affinity_cpus()) // (2 * len(slots))))
        windows: list[tuple[str, float | None, float | None]] = []
        if prestart:
            for slot, c in zip(slots, todo):
                slot.warm(c.variant, statement(c))

        warming = threading.Lock()

        def take_kernel(slot: Slot, c: Config, taken: list[WarmKernel]) -> WarmKernel:
            kernel = slot.take(c.variant)
            slot.hold(kernel)
            taken.append(kernel)
            if prestart:
                with warming:
                    warm_next(slot, slots, pending, statement)
            return kernel

        def one(slot: Slot, c: Config, on_release: Callable[[], None] | None) -> bool:
            """Run ``c`` to its end on ``slot``; False when the sweep was interrupted before it began."""
            attempt = attempts.get(c.config_id, 0) + 1
            taken: list[WarmKernel] = []
            try:
                outcome = run_one(c, out_dir, attempt=attempt, slot=slot.name, ledger=ledger, edges=edges,
                                  take_kernel=lambda c: take_kernel(slot, c, taken), interrupted=stop.is_set,
                                  on_release=on_release)
            except Exception as exc:  # noqa: BLE001 - the engine's own error: this config fails, the slot goes on
                try:
                    outcome = _engine_failure(c, out_dir, attempt, slot.name, ledger, exc)
                except Exception as again:  # noqa: BLE001 - nothing can be written (disk full?)
                    print(f"perfkit: {c.config_id} has no ending: {exc}; then {again}", file=sys.stderr)
                    return True  # it counts as not ended: the exit code is 1
            finally:
                for kernel in taken:
                    slot.drop(kernel)
            if outcome is None:
                return False
            if outcome.status == st.OOM:
                edges.add(c)
            with lock:
                result.outcomes.append(outcome)
                windows.append((slot.name, outcome.window_start_unix_s, outcome.window_end_unix_s))
            if on_outcome:
                on_outcome(outcome)
            return True

        def work(slot: Slot) -> None:
            viewing: list[threading.Thread] = []
            try:
                while not stop.is_set():
                    try:
                        c = pending.get_nowait()
                    except queue.Empty:
                        return
                    if not overlap:
                        if not one(slot, c, None):
                            return
                        continue
                    released = threading.Event()

                    def body(c=c, released=released) -> None:
                        try:
                            one(slot, c, released.set)
                        finally:
                            released.set()

                    thread = threading.Thread(target=body, name=f"config-{c.config_id}", daemon=True)
                    thread.start()
                    released.wait()
                    viewing = [t for t in viewing + [thread] if t.is_alive()]
                    while len(viewing) > viewing_per_slot:
                        viewing.pop(0).join()
            finally:
                for t in viewing:
                    t.join()

        # Completion is tracked with events, not Thread.is_alive(): a KeyboardInterrupt landing in
        # Thread.join() can leave a running thread reported as stopped (CPython bpo-45274).
        done = [threading.Event() for _ in slots]

        def run_slot(slot: Slot, finished: threading.Event) -> None:
            try:
                work(slot)
            finally:
                finished.set()

        threads = [threading.Thread(target=run_slot, args=(s, d), name=f"slot-{s.name}", daemon=True)
                   for s, d in zip(slots, done)]
        previous_term = raise_on_sigterm()
        try:
            for t in threads:
                t.start()
            while not all(d.is_set() for d in done):
                for d in done:
                    d.wait(timeout=0.2)
        except KeyboardInterrupt:
            stop.set()
            deadline = time.monotonic() + 30
            while not all(d.is_set() for d in done) and time.monotonic() < deadline:
                for slot in slots:  # again each round: a slot may have just taken a kernel
                    slot.kill_active()
                time.sleep(0.1)
            raise
        finally:
            restore_sigterm(previous_term)
            for slot in slots:
                slot.close()
        result.wall_time_s = time.monotonic() - t0
        result.busy = busy_share(windows, result.wall_time_s, overlap)
        append_summary(out_dir, result.busy)
        return result


def raise_on_sigterm():
    """SIGTERM (Slurm's, a job scheduler's) ends the sweep like Ctrl-C: kernels killed, ledger kept."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def restore_sigterm(previous) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)

