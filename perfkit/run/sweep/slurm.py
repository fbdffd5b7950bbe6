"""The Slurm executor: a sweep's configurations as one Slurm job array, through submitit.

``perfkit sweep SPEC --out DIR --executor slurm`` decides what to run exactly as the local engine
does (:func:`.engine.plan` and the same resume rules), submits those configurations as ONE job
array, and then only watches: every task runs the same per-configuration code path as a local
slot (``running`` ledger entry, stale rows removed, :func:`perfkit.run.execute.execute_config`, final
entry), on a compute node, writing into DIR (which must be on a filesystem the nodes share).

- **Job ids** go to ``DIR/slurm/jobs.json`` (config id → job id and attempt; written atomically,
  and refused with exit 2 when unreadable, never reset: that would submit running tasks again); submitit's pickles
  and the tasks' logs go to ``DIR/slurm/``. A driver started again on DIR first re-attaches to
  recorded tasks still pending or running (never resubmitting them), settles recorded tasks that
  ended while no driver watched, then plans and submits what is left.
- **Endings.** A task records its own ending whenever it can. When Slurm ended it first (the
  task's SIGTERM handler exits without writing, so the driver, which knows why, writes it):
  TIMEOUT/DEADLINE → ``timeout``; CANCELLED/PREEMPTED/NODE_FAIL/BOOT_FAIL → ``killed`` (runs again
  on resume); OUT_OF_MEMORY → ``oom``; FAILED (the task itself crashed) → ``failed`` with the
  traceback from the task's stderr log. The driver then appends the final ledger entry and a
  status row, so every configuration leaves a row.
- **Waiting** is polling with bounded intervals (1 s, backing off to 15 s while nothing changes):
  the ledger first, then one ``sacct`` call for the tasks without an ending. Nothing calls
  submitit's blocking ``result()``.
- **Ctrl-C** (or SIGTERM) stops the driver only: the tasks keep running and recording their own
  endings. The driver says how to re-attach (run the same command again) or cancel (``scancel``).
- **OOM edge.** Tasks run independently, so the local engine's in-run edge becomes: before it
  runs, a task looks in the ledger for an ``oom`` of the same configuration at a smaller value
  of ``oom_axis`` and is ``skipped`` if there is one (effective with ``array_parallelism``).
- Submitit's own timeout signal (USR2, meant for checkpoint-and-requeue) is replaced by a no-op
  (``--signal=CONT@30``) and ignored by the tasks: a notebook is not checkpointable, and Slurm's
  time limit is reported as ``timeout``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ...core import status as st
from ...core.cpu_share import thread_env
from ...core.durable import write_text_atomic
from ...core.errors import BadInputError
from .engine import (OomEdges, SweepResult, plan, raise_on_sigterm, restore_sigterm, run_one,
                     should_run)
from .busy import BusyShare, allocation_share, append_summary
from .endings import outcome_of, settle
from .ledger import RUNNING, Ledger, LedgerEntry, SweepLock
from .slurm_settings import slurm_parameters
from .spec import Config, SweepSpec

__all__ = ["run_slurm_sweep", "SlurmSubmitError"]

# Slurm's final job states (sacct prints "CANCELLED by <uid>"; the first word counts) and the
# status a configuration gets when its task could not record its own ending.
_SLURM_ENDINGS = {
    "TIMEOUT": st.TIMEOUT, "DEADLINE": st.TIMEOUT,
    "CANCELLED": st.KILLED, "PREEMPTED": st.KILLED, "NODE_FAIL": st.KILLED, "BOOT_FAIL": st.KILLED,
    "REVOKED": st.KILLED,
    "OUT_OF_MEMORY": st.OOM,
    "FAILED": st.FAILED,
    "COMPLETED": st.FAILED,  # the task returned without an ending in the ledger: something is broken
}
_GRACE_S = 5.0
"""A task that Slurm reports ended gets this long for its ledger ending to appear (shared FS)."""
_LOST_AFTER_S = 180.0
"""A recorded job that sacct (answering) does not know for this long is lost: ``killed``."""


class SlurmSubmitError(BadInputError):
    """sbatch refused the job array (bad partition, limits...): nothing was submitted."""


# --- the task: runs on the compute node ---------------------------------------------------------

def _leave_ending_to_driver(signum, frame):
    # Slurm ends the step (time limit, scancel, preemption): SIGTERM now, SIGKILL KillWait later.
    # Only the driver learns *why* (sacct), so the task exits without recording an ending; its
    # kernel kills its own process group when it sees this process gone (perfkit.run._kernel_launcher).
    os._exit(128 + signum)


def _run_task(c: Config, out_dir: str, attempt: int) -> str:
    """The body of one array task (module level, so submitit pickles it by reference)."""
    signal.signal(signal.SIGTERM, _leave_ending_to_driver)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # submitit's requeue-on-timeout, if asked for anyway
    out = Path(out_dir)
    state = Ledger(out).state()
    last = state.get(c.config_id)
    if last is not None and last.attempt >= attempt:  # Slurm requeued this task: a new attempt
        attempt = last.attempt + 1
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{job}_{os.environ.get('SLURM_ARRAY_TASK_ID')}" if job else os.environ.get("SLURM_JOB_ID", "?")
    slot = f"slurm:{job}"
    env = {"PERFKIT_SLOT": slot}
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        env.update(thread_env(int(cpus)))
    return run_one(c, out, attempt=attempt, slot=slot, env=env, edges=OomEdges.from_ledger(state, like=c)).status


# --- the driver ---------------------------------------------------------------------------------

class _Jobs:
    """``DIR/slurm/jobs.json``: config id → {job_id, attempt, submitted_at}; rewritten atomically.

    A file that cannot be read is refused, never reset: it is the only record of tasks that may
    still be queued or running, and an empty one would submit them all again."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, dict] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text())
                configs = data["configs"]
                if not isinstance(configs, dict) or not all(
                        isinstance(r, dict) and {"job_id", "attempt"} <= set(r) for r in configs.values()):
                    raise ValueError("'configs' is not a mapping of config id → {job_id, attempt}")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                what = " ".join(str(exc).split())[:200]
                raise BadInputError(
                    f"{path} is unreadable ({type(exc).__name__}: {what}); it records the Slurm jobs of this "
                    f"sweep, some maybe still running: restore it, or check squeue/scancel and move it away "
                    f"to submit everything again") from None
            self.data = dict(configs)

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps({"version": 1, "configs": self.data}, indent=1, sort_keys=True))


def _expand_ids(job_id: str) -> list[str]:
    """sacct's ``123_[1-3,7%2]`` (pending array tasks) → ``["123_1", "123_2", "123_3", "123_7"]``."""
    m = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", job_id)
    if not m:
        return [job_id]
    ids = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        ids += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return ids


def _sacct(job_ids: Sequence[str], field: str) -> dict[str, str] | None:
    """Each job's ``field`` as sacct reports it (allocations only, ``-X``), by job id with array
    ranges expanded; None when sacct did not answer."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    if not arrays:
        return {}
    try:
        cp = subprocess.run(["sacct", "-n", "-X", "-P", "-o", f"JobID,{field}", "-j", ",".join(arrays)],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if cp.returncode != 0:
        return None
    values: dict[str, str] = {}
    for line in cp.stdout.splitlines():
        jid, _, value = line.strip().partition("|")
        if jid and value.strip():
            for one in _expand_ids(jid):
                values[one] = value.strip()
    return values


def _slurm_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """Each job's state (first word) as sacct reports it; None when sacct did not answer."""
    states = _sacct(job_ids, "State")
    return None if states is None else {j: s.split()[0].rstrip("+") for j, s in states.items()}


def _slurm_elapsed(job_ids: Sequence[str]) -> dict[str, float] | None:
    """Each job's allocation time, seconds (sacct ``ElapsedRaw``); None when sacct did not answer."""
    raw = _sacct(job_ids, "ElapsedRaw")
    return None if raw is None else {j: float(v) for j, v in raw.items() if v.isdigit()}


def _busy(ran: dict[str, dict], ledger: Ledger, wall_s: float) -> BusyShare:
    """The allocations' busy share (:func:`.busy.allocation_share`) of the tasks this driver watched:
    each held its device for sacct's elapsed time, or at least its ledger attempt (sacct counts whole
    seconds and may not have the last task's end yet)."""
    elapsed = _slurm_elapsed([r["job_id"] for r in ran.values()]) if ran else {}
    state = ledger.state()
    entries = []
    for cid, rec in ran.items():
        e = state.get(cid)
        if e is None or e.attempt < rec["attempt"]:
            continue
        attempt_s = (e.end - e.start) if e.end is not None and e.start is not None else 0.0
        held = max((elapsed or {}).get(rec["job_id"], 0.0), attempt_s)
        entries.append((rec["job_id"], held or None, e.window_start, e.window_end))
    return allocation_share(entries, wall_s, "Slurm", "sacct" if elapsed is not None else
                            "the ledger's attempts: sacct did not answer")


def _stderr_tail(out_dir: Path, job_id: str, limit: int = 4000) -> tuple[str | None, str]:
    """The exception name and traceback from a task's submitit stderr log (last traceback only)."""
    path = out_dir / "slurm" / f"{job_id}_0_log.err"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, f"(no stderr log at {path})"
    start = text.rfind("Traceback (most recent call last)")
    tail = text[start:] if start >= 0 else text[-limit:]
    tail = tail[-limit:].strip()
    name = None
    for line in reversed(tail.splitlines()):
        m = re.match(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure))\b:?", line.strip())
        if m:
            name = m.group(1).rsplit(".", 1)[-1]
            break
    return name, f"{tail}\n(from {path})"


class _HoldSigint:
    """Defer Ctrl-C over a block (main thread only); ``fired`` says whether one came."""

    fired = False

    def __enter__(self):
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum, frame):
        self.fired = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _ended(event: LedgerEntry | None, attempt: int) -> bool:
    return event is not None and event.status != RUNNING and event.attempt >= attempt


def _settle(c: Config, rec: dict, slurm_state: str, out_dir: Path, ledger: Ledger) -> LedgerEntry:
    """Record the ending of a task that Slurm ended before it could: ledger entry and status row."""
    status = _SLURM_ENDINGS.get(slurm_state, st.KILLED)
    job_id, attempt = rec["job_id"], rec["attempt"]
    if slurm_state in ("FAILED", "COMPLETED"):
        error_name, tb = _stderr_tail(out_dir, job_id)
        error_name = error_name or f"Slurm{slurm_state.title()}"
        message = f"Slurm job {job_id} ended {slurm_state} without recording an ending; task traceback:\n{tb}"
    elif slurm_state == "UNKNOWN":
        error_name = "SlurmJobLost"
        message = f"Slurm job {job_id} is unknown to sacct; it runs again on resume"
    else:
        error_name = f"Slurm{slurm_state.title().replace('_', '')}"
        message = {st.TIMEOUT: f"Slurm job {job_id} reached its time limit ({slurm_state})",
                   st.OOM: f"Slurm job {job_id} exceeded its memory ({slurm_state})"}.get(
            status, f"Slurm job {job_id} ended {slurm_state}; it runs again on resume")
    return settle(c, attempt, status, error_name, message, out_dir=out_dir, ledger=ledger, slot=f"slurm:{job_id}")


def run_slurm_sweep(spec: SweepSpec, configs: Sequence[Config], out_dir: str | Path, *, retry_failed: bool = False,
                    progress: bool = True, poll_s: tuple[float, float] = (1.0, 15.0),
                    **slurm_overrides: object) -> SweepResult:
    """Run what the ledger says is not done as one Slurm job array; see the module docstring.

    ``slurm_overrides``: the keys of :data:`.slurm_settings.SLURM_KEYS` (None = not given), over ``spec.slurm``;
    ``sbatch_options`` are merged key by key.
    """
    try:
        import submitit
    except ImportError:
        raise BadInputError("the Slurm executor needs submitit: pip install 'perfkit[slurm]'") from None
    from tqdm.auto import tqdm

    settings = dict(spec.slurm)
    for key, value in slurm_overrides.items():
        if value is None:
            continue
        if key == "sbatch_options":
            value = {**dict(settings.get("sbatch_options") or {}), **dict(value)}
        settings[key] = value
    out_dir = Path(out_dir).resolve()
    slurm_parameters(settings, configs)  # bad settings: exit 2 before the lock or any submission
    t0 = time.monotonic()
    with SweepLock(out_dir):
        ledger = Ledger(out_dir)
        jobs = _Jobs(out_dir / "slurm" / "jobs.json")
        by_id = {c.config_id: c for c in configs}
        watch: dict[str, dict] = {}  # config id → its recorded job, until it has an ending
        first_seen: dict[str, float] = {}  # when a terminal (or unknown) Slurm state was first seen

        # 1. Recorded tasks without an ending: re-attach to live ones, settle those Slurm ended.
        state = ledger.state()
        open_recs = {cid: rec for cid, rec in jobs.data.items()
                     if cid in by_id and not _ended(state.get(cid), rec["attempt"])}
        if open_recs:
            states = _slurm_states([r["job_id"] for r in open_recs.values()])
            if states is None:
                raise BadInputError("sacct does not answer: cannot tell which recorded Slurm tasks still run")
            for cid, rec in open_recs.items():
                s = states.get(rec["job_id"])
                if s in _SLURM_ENDINGS and not _ended(ledger.state().get(cid), rec["attempt"]):
                    _settle(by_id[cid], rec, s, out_dir, ledger)
                elif s is None:
                    watch[cid] = rec  # unknown: maybe just submitted; lost after _LOST_AFTER_S
                elif s not in _SLURM_ENDINGS:
                    watch[cid] = rec
        reattached = len(watch)
        held = _HoldSigint()

        # 2. Plan as the local engine does, then submit the rest as one array.
        state = ledger.state()
        todo = [c for c, prev in plan(configs, out_dir, retry_failed=retry_failed)
                if c.config_id not in watch and should_run(prev, retry_failed)]
        array_ids: set[str] = {rec["job_id"].split("_")[0] for rec in watch.values()}
        if todo:
            params = slurm_parameters(settings, todo, name=f"perfkit:{out_dir.name}")
            attempts = [(state[c.config_id].attempt if c.config_id in state else 0) + 1 for c in todo]
            executor = submitit.AutoExecutor(folder=out_dir / "slurm", cluster="slurm", slurm_max_num_timeout=0)
            executor.update_parameters(**params)
            # Ctrl-C between sbatch and jobs.json would leave tasks that a resume cannot see (and
            # would submit again): it is held until the job ids are saved.
            held = _HoldSigint()
            try:
                with held:
                    submitted = executor.map_array(_run_task, todo, [str(out_dir)] * len(todo), attempts)
                    now = time.time()
                    for c, job, attempt in zip(todo, submitted, attempts):
                        rec = {"job_id": str(job.job_id), "attempt": attempt, "submitted_at": now}
                        jobs.data[c.config_id] = rec
                        watch[c.config_id] = rec
                        array_ids.add(str(job.job_id).split("_")[0])
                    jobs.save()
            except Exception as exc:  # noqa: BLE001 - sbatch's refusal, reported on one line
                text = " ".join(str(exc).split())
                raise SlurmSubmitError(f"sbatch refused the job array: {text[:400]}") from exc

        result = SweepResult(out_dir=out_dir, total=len(configs), already_done=len(configs) - len(watch),
                             to_run=len(watch))
        desc = "slurm sweep"
        if result.already_done:
            desc += f" ({result.already_done} already done)"
        if reattached:
            desc += f" ({reattached} re-attached)"
        bar = tqdm(total=len(watch), unit="config", desc=desc, disable=not progress, file=sys.stderr,
                   dynamic_ncols=True)
        counts: dict[str, int] = {}

        def finish(cid: str, entry: LedgerEntry) -> None:
            watch.pop(cid)
            result.outcomes.append(outcome_of(by_id[cid], entry, out_dir))
            counts[entry.status] = counts.get(entry.status, 0) + 1
            bar.update(1)

        # 3. Watch: the ledger says what ended; sacct says what Slurm ended first.
        ran = dict(watch)
        previous_term = raise_on_sigterm()
        interval = poll_s[0]
        try:
            if held.fired:
                raise KeyboardInterrupt
            while watch:
                changed = False
                state = ledger.state()
                for cid, rec in list(watch.items()):
                    if _ended(state.get(cid), rec["attempt"]):
                        finish(cid, state[cid])
                        changed = True
                states = _slurm_states([r["job_id"] for r in watch.values()]) if watch else {}
                now = time.monotonic()
                live: dict[str, int] = {}
                for cid, rec in list(watch.items()):
                    s = states.get(rec["job_id"]) if states is not None else "SACCT?"
                    if s is None:
                        s = "UNKNOWN"
                    live[s] = live.get(s, 0) + 1
                    if s in _SLURM_ENDINGS or s == "UNKNOWN":
                        since = first_seen.setdefault(f"{cid}:{s}", now)
                        wait = _GRACE_S if s != "UNKNOWN" else _LOST_AFTER_S
                        if now - since < wait:
                            continue
                        if _ended(ledger.state().get(cid), rec["attempt"]):
                            continue  # it wrote its ending after all: picked up next round
                        finish(cid, _settle(by_id[cid], rec, s, out_dir, ledger))
                        changed = True
                bar.set_postfix({**counts, **{s.lower(): n for s, n in live.items()}}, refresh=True)
                if watch:
                    time.sleep(interval)
                    interval = poll_s[0] if changed else min(interval * 1.5, poll_s[1])
        except KeyboardInterrupt:
            ids = " ".join(sorted(array_ids))
            print(f"\nperfkit: the driver stopped; {len(watch)} configuration(s) stay queued or running on Slurm "
                  f"(job array {ids}) and record their own endings.\n  re-attach: run the same "
                  f"`perfkit sweep ... --out {out_dir} --executor slurm` again\n  cancel:    scancel {ids}",
                  file=sys.stderr)
            raise
        finally:
            restore_sigterm(previous_term)
            bar.close()
        result.wall_time_s = time.monotonic() - t0
        if ran:
            result.busy = _busy(ran, ledger, result.wall_time_s)
            append_summary(out_dir, result.busy)
        return result
