"""Where a sweep's configurations run, chosen once: ``perfkit sweep`` and ``perfkit advise --verify``
(and any caller of the Python API) hand an :class:`Executor` the spec and the folder.

``local`` runs them on this node's device slots (:func:`perfkit.run.sweep.run_sweep`), ``slurm`` as
one job array (:mod:`.slurm`), ``ray`` as one Ray task each (:mod:`.ray_executor`); every one
writes the same rows and ledger entries into the folder, so what reads them never asks which ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .engine import SweepResult
from .spec import Config, SweepSpec, expand

__all__ = ["Executor", "EXECUTORS"]

EXECUTORS = ("local", "slurm", "ray")


@dataclass(frozen=True)
class Executor:
    """``kind`` (one of :data:`EXECUTORS`) with its settings: ``options`` are the Slurm or Ray
    driver's keyword arguments (``slurm_options``/``ray_options`` of :mod:`.cli` read them from the
    flags); ``workers``, ``prestart`` and ``overlap`` are the local executor's."""

    kind: str = "local"
    options: Mapping[str, object] = field(default_factory=dict)
    workers: int = 1
    prestart: bool | None = None
    overlap: bool | None = None

    def __post_init__(self):
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor {self.kind!r}: one of {', '.join(EXECUTORS)}")
        if self.kind == "local" and self.options:
            raise ValueError(f"the local executor takes no {', '.join(self.options)} (workers, prestart and overlap only)")

    def run(self, spec: SweepSpec, out: str | Path, *, configs: list[Config] | None = None,
            retry_failed: bool = False, progress: bool | None = None) -> SweepResult:
        """Run what is not done of ``spec`` into ``out``. ``configs``: ``expand(spec)`` where the
        caller has it already (expanding reads every notebook). ``progress``: None prints it where it
        can be seen (a bar on a terminal for the local executor; the cluster drivers' status lines)."""
        if self.kind == "local":
            from . import run_sweep

            return run_sweep(spec, out, workers=self.workers, retry_failed=retry_failed, progress=progress,
                             prestart=self.prestart, overlap=self.overlap,
                             configs=configs)
        shown = True if progress is None else progress
        configs = expand(spec) if configs is None else configs
        if self.kind == "slurm":
            from .slurm import run_slurm_sweep

            return run_slurm_sweep(spec, configs, out, retry_failed=retry_failed, progress=shown, **self.options)
        from .ray_executor import run_ray_sweep

        return run_ray_sweep(spec, configs, out, retry_failed=retry_failed, progress=shown, **self.options)
