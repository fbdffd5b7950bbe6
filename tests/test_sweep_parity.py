"""A multi-rank training step measures the same under ``perfkit sweep`` as under ``perfkit run``
(tests/_parity.py says why; the scaling notebook's case is in tests/test_scaling_run.py, beside
the ``perfkit run`` of it that the scaling tests already make)."""

from __future__ import annotations

import pytest

from _parity import assert_within_noise, cli, ok_rows, run_args, sweep_rows
from conftest import NOTEBOOKS

PARAMS = {"model": "mlp", "parallelism": "ddp", "world_size": 2, "batch_size": 64, "steps": 6, "warmup_steps": 1}


@pytest.mark.slow
def test_a_multi_rank_training_step_measures_the_same_under_sweep_as_under_run(tmp_path):
    notebook = NOTEBOOKS / "train_step.ipynb"
    def measured_by_run(out):
        cli("run", notebook, "--out", out, *run_args(PARAMS))
        return ok_rows(out)

    run, sweep = measured_by_run(tmp_path / "run"), sweep_rows(notebook, PARAMS, tmp_path / "sweep")
    # cpu_threads: the threads of every rank, summed (perfkit.core.cpu_share.run_cores).
    assert run["cpu_threads"].tolist() == sweep["cpu_threads"].tolist() == [2]
    assert_within_noise(run, sweep, again_run=lambda: measured_by_run(tmp_path / "run-again"),
                        again_sweep=lambda: sweep_rows(notebook, PARAMS, tmp_path / "sweep-again"))
