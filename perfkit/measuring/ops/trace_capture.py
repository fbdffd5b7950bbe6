"""One profiler trace per configuration and rank: ``torch.profiler`` over a few steps, gzipped.

A run with ``profile=True`` (training step, scaling, collectives) wraps its step loop in
:class:`StepProfiler`: a ``torch.profiler`` schedule that waits ``wait`` steps, warms up for
``warmup`` and records ``active`` (after the run's own warm-up, so compilation and first-touch
allocation stay out), then writes one Chrome/Kineto trace, gzipped, per rank:

    DIR/traces/<config_id>/<run>/rank<r>.json.gz      (beside DIR/results/<config_id>.parquet)

(``<run>`` names one training run of the configuration: a scaling configuration runs several.)

Each step is a ``ProfilerStep#N`` span (``step()`` at the end of every loop iteration, so a
step's span runs from the top of the loop and includes fetching its batch); the batch fetch itself is a :data:`DATA_WAIT_SPAN`
span, so the share of a step spent waiting for data is visible in the trace and in
:func:`perfkit.analyse.trace.breakdown.data_wait_share`. Multi-rank traces carry
``distributedInfo`` (torch.profiler adds it when a process group is up).

Bounded by construction: few active steps, shapes and stacks off unless asked, and a size cap:
a trace over ``max_bytes`` (gzipped) is deleted and the row says why instead of a trace nobody can
open (trace viewers fail past ~500 MB). CPU runs record CPU ops; CUDA and ROCm runs kernels too.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from perfkit.core.errors import BadInputError

__all__ = ["ProfileSettings", "StepProfiler", "DATA_WAIT_SPAN", "quiet_kineto", "trace_dir", "rank_trace_path", "data_wait_span", "write_trace",
           "current_trace_dir", "summary_columns"]

#: The record_function span around fetching a step's batch (perfkit's own data-wait marker).
DATA_WAIT_SPAN = "data_wait"

#: Kineto's logger prints each message at or above ``KINETO_LOG_LEVEL`` (read once, at the
#: profiler's first start in a process). Its ``USDT`` markers ("SyncActivityProfilerHandler.cpp
#: ... profiler_start/stop", one pair per profiled region, in every executed notebook) are its
#: highest severity, above ERROR (libkineto ``Logger.h``, ``LoggerOutputType``; measured on torch
#: 2.13: 5 still prints them, 6 prints nothing), so no level hides them and keeps errors.
_KINETO_SILENT = "6"


def quiet_kineto(*, device_profiled: bool) -> None:
    """Hide Kineto's markers where that hides nothing a user needs: a CPU-only profile, whose
    events are torch's own. A device profile keeps Kineto's output (its errors are where CUPTI's
    or roctracer's failures, e.g. insufficient privileges, are said), markers and all; a
    ``KINETO_LOG_LEVEL`` the user set is always kept."""
    if not device_profiled:
        os.environ.setdefault("KINETO_LOG_LEVEL", _KINETO_SILENT)


@dataclass(kw_only=True, frozen=True)
class ProfileSettings:
    """What a profiled run records."""

    wait: int = 0
    """Steps (after the run's warm-up) before the profiler starts."""
    warmup: int = 1
    """Profiler warm-up steps (recorded, then discarded: the profiler's own start-up cost)."""
    active: int = 2
    """Steps recorded into the trace."""
    record_shapes: bool = False
    with_stack: bool = False
    max_bytes: int = 200 * 2**20
    """A gzipped trace larger than this is deleted, and the row says so."""

    def __post_init__(self):
        for name in ("wait", "warmup"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise BadInputError(f"profile {name} must be a whole number of steps ≥ 0")
        if not isinstance(self.active, int) or self.active < 1:
            raise BadInputError("profile active must be at least 1 step")
        if self.max_bytes <= 0:
            raise BadInputError("profile max_bytes must be positive")

    @property
    def steps_needed(self) -> int:
        return self.wait + self.warmup + self.active

    def as_dict(self) -> dict:
        return asdict(self)


def trace_dir(results_path: str | Path, config_id: str) -> Path:
    """Where a configuration's traces go: ``DIR/traces/<config_id>/`` for ``DIR/results/<id>.parquet``."""
    results_path = Path(results_path)
    return results_path.parent.parent / "traces" / config_id


def rank_trace_path(directory: str | Path | None, rank: int) -> Path:
    """Rank ``rank``'s trace file in ``directory`` (None: the working directory)."""
    return Path(directory or ".") / f"rank{rank}.json.gz"


def current_trace_dir(*parts: str) -> Path:
    """The traces folder of the configuration running now (an executor's, or the interactive
    session's), with ``parts`` below it."""
    from perfkit.core.results import current_context

    ctx = current_context()
    return trace_dir(ctx.results_path.resolve(), ctx.config_id).joinpath(*parts)


#: The shares :func:`summary_columns` averages over ranks.
_SHARES = ("trace_idle_share", "trace_exposed_comm_share", "trace_data_wait_share", "trace_short_kernel_share")


def summary_columns(paths) -> dict:
    """What a results row carries of its traces (one per rank; :func:`perfkit.analyse.trace.breakdown.trace_summary`):
    each share averaged over the ranks, and rank 0's top kernel (top CPU op on a CPU trace).
    A trace that cannot be analysed leaves the row its measurement and says why."""
    paths = [p for p in paths if p]
    if not paths:  # before the import: the analysis (0.2 s of imports) only where a trace exists
        return {}
    from perfkit.analyse.trace.breakdown import trace_summary

    try:
        summary = trace_summary(paths)
    except Exception as exc:  # noqa: BLE001 - the measurement stands without its trace summary
        return {"trace_summary_error": f"{type(exc).__name__}: {exc}"}
    row = {col: float(summary[col].mean()) for col in _SHARES}
    first = summary.sort_values("rank").iloc[0]
    row.update(trace_top_kernel=first["trace_top_kernel"], trace_top_kernel_share=float(first["trace_top_kernel_share"]))
    return row


def data_wait_span():
    """The span to wrap a batch fetch in (a no-op cost outside a profiler)."""
    return torch.profiler.record_function(DATA_WAIT_SPAN)


class StepProfiler:
    """``with StepProfiler(settings, path, device, skip_steps=k) as p: ... p.step()`` at the end of each step.

    ``skip_steps``: the run's own warm-up steps, before the profiler's schedule begins. After the
    ``with`` block, :attr:`path` is the trace written (None when none was), :attr:`reason` why not.
    """

    def __init__(self, settings: ProfileSettings | None, path: str | Path, *, device: str, skip_steps: int = 0):
        self.settings = settings
        self.target = Path(path)
        self.device = device
        self.skip_steps = skip_steps
        self.path: Path | None = None
        self.reason: str | None = None if settings else "profile off"
        self._prof = None

    def __enter__(self) -> StepProfiler:
        if self.settings is None:
            return self
        from torch.profiler import ProfilerActivity, profile, schedule

        s = self.settings
        activities = [ProfilerActivity.CPU]
        if self.device == "cuda" and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)  # ROCm's kernels come through the same activity
        quiet_kineto(device_profiled=len(activities) > 1)
        self._prof = profile(
            activities=activities, record_shapes=s.record_shapes, with_stack=s.with_stack,
            schedule=schedule(skip_first=self.skip_steps, wait=s.wait, warmup=s.warmup, active=s.active, repeat=1),
            on_trace_ready=self._write,
        )
        self._prof.__enter__()
        return self

    def step(self) -> None:
        """Mark a step boundary (call at the end of every step)."""
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc) -> None:
        if self._prof is not None:
            self._prof.__exit__(*exc)
            self._prof = None
        if self.settings is not None and self.path is None and self.reason is None:
            self.reason = (f"no trace: the run had fewer steps than the profile needs "
                           f"({self.skip_steps} warm-up + {self.settings.steps_needed})")

    def _write(self, prof) -> None:
        self.path, self.reason = write_trace(prof, self.target, max_bytes=self.settings.max_bytes)


def write_trace(prof, target: str | Path, *, max_bytes: int = ProfileSettings.max_bytes) -> tuple[Path | None, str | None]:
    """Export ``prof`` (a finished ``torch.profiler.profile``) as a gzipped Chrome trace at
    ``target``, atomically; (path, None), or (None, why not) when it is over ``max_bytes``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = target.with_name(target.name.removesuffix(".gz") + f".tmp-{os.getpid()}")
    tmp = raw.with_name(raw.name + ".gz")
    try:
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        size = tmp.stat().st_size
        if size > max_bytes:
            return None, (f"trace of {size / 2**20:.0f} MiB gzipped is over the cap of {max_bytes / 2**20:.0f} MiB: "
                          f"profile fewer active steps, or raise profile max_bytes")
        os.replace(tmp, target)
        return target, None
    finally:
        for leftover in (raw, tmp):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
