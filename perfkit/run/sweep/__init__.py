"""Sweeps: run a parameterized notebook once per configuration of a grid, resumably.

The spec, the ledger, the engine and where it runs (``executors.py``: local slots, Slurm, Ray).
Modules here may import ``perfkit.core`` and ``perfkit.run`` only: the engine knows notebooks and
parameters, not what they measure.

Python API (the same as ``perfkit sweep SPEC.yaml --out DIR``)::

    from perfkit.run.sweep import SweepPart, SweepSpec, run_sweep
    spec = SweepSpec(parts=(SweepPart(notebook="notebooks/gemm.ipynb", grid={"sizes": [[64], [128]]}),))
    result = run_sweep(spec, "runs/gemm-sweep", workers=2)
"""

from __future__ import annotations

import sys
from pathlib import Path

from .engine import SweepResult, device_slots, plan, run_configs
from .ledger import Ledger, SweepLocked
from .spec import Config, SweepPart, SweepSpec, expand, load_spec

__all__ = ["SweepPart", "SweepSpec", "Config", "SweepResult", "load_spec", "expand", "plan", "run_sweep",
           "run_configs", "device_slots", "Ledger", "SweepLocked"]


def run_sweep(spec: SweepSpec | str | Path, out_dir: str | Path, *, workers: int = 1, retry_failed: bool = False,
              progress: bool | None = None, prestart: bool | None = None, overlap: bool | None = None,
              configs: list[Config] | None = None) -> SweepResult:
    """Validate ``spec`` (a SweepSpec or a YAML path), then run what is not done into ``out_dir``.

    ``progress``: a tqdm bar with counts by status and an ETA; by default only on a terminal.
    ``configs``: ``expand(spec)``, where the caller has expanded it already. ``prestart`` and
    ``overlap``: :func:`~perfkit.run.sweep.engine.run_configs`'.
    """
    from tqdm.auto import tqdm

    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    configs = expand(spec) if configs is None else configs
    show = sys.stderr.isatty() if progress is None else progress
    bar = None
    counts: dict[str, int] = {}

    def on_start(todo: int, done: int) -> None:
        nonlocal bar
        bar = tqdm(total=todo, unit="config", desc=f"sweep ({done} already done)" if done else "sweep",
                   disable=not show, file=sys.stderr, dynamic_ncols=True)

    def on_outcome(outcome) -> None:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
        if bar is not None:
            bar.set_postfix(counts, refresh=False)
            bar.update(1)

    try:
        return run_configs(configs, out_dir, workers=workers, retry_failed=retry_failed,
                           on_start=on_start, on_outcome=on_outcome, prestart=prestart, overlap=overlap)
    finally:
        if bar is not None:
            bar.close()
