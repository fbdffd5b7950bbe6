"""A configuration measures the same under ``perfkit sweep`` as under ``perfkit run``.

The sweep gives each kernel a slot's environment (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` =
the slot's cores); whatever a configuration then starts must compute with the threads it would
have had alone. It did not: the scaling notebook asks its ranks for ``OMP_NUM_THREADS=1``, the
slot's ``MKL_NUM_THREADS=2`` was inherited beside it, torch lets MKL win, and each of 2 ranks
computed with 2 threads on 2 cores — the quickstart's 2-rank DDP step 4-12x slower under the
sweep (issue 25 A). Here the same configuration runs both ways, on real ranks:

- the threads every rank computed with (``torch.get_num_threads()`` in the rank, recorded in the
  row) are equal both ways and what was asked — exact, and what broke;
- the step times are within a band that the noise of 2 shared cores allows (3x: a loaded
  machine moved the same 2-rank step 4.4-7.2 ms between two runs; the bug made it 9.6x).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import perfkit
from conftest import NOTEBOOKS, REPO

#: Ratio of two medians of the same configuration that 2 shared cores' noise stays within.
NOISE_BAND = 3.0

CASES = {
    # The quickstart's scaling part (world sizes 1 and 2, ranks asked for 1 thread each).
    "scaling": (NOTEBOOKS / "scaling.ipynb", {"model": "mlp", "world_sizes": [1, 2], "batch": 64, "steps": 6}),
    # A 2-rank DDP training step (the launcher splits the slot's threads over the ranks).
    "train_step": (NOTEBOOKS / "train_step.ipynb",
                   {"model": "mlp", "parallelism": "ddp", "world_size": 2, "batch_size": 64, "steps": 6,
                    "warmup_steps": 1}),
}


def _cli(*args, timeout_s=400):
    proc = subprocess.run([sys.executable, "-m", "perfkit.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _both_ways(tmp_path, name):
    notebook, params = CASES[name]
    run_out, sweep_out = tmp_path / "run", tmp_path / "sweep"
    # A str parameter takes the text as it is, others a Python literal (coerce_cli_value).
    _cli("run", notebook, "--out", run_out,
         *[a for k, v in params.items() for a in ("-p", k, v if isinstance(v, str) else repr(v))])
    spec = tmp_path / "spec.yaml"
    # devices_per_config 2: one slot holding both cores, as the quickstart runs it.
    spec.write_text(yaml.safe_dump({"name": name, "parts": [
        {"notebook": str(notebook), "devices_per_config": 2, "oom_axis": None,
         "parameters": {k: v for k, v in params.items() if k != "steps"}, "grid": {"steps": [params["steps"]]}}]}))
    _cli("sweep", spec, "--out", sweep_out, "--quiet")
    keys = ["parallelism", "world_size"]
    run = perfkit.load(run_out).sort_values(keys).reset_index(drop=True)
    sweep = perfkit.load(sweep_out).sort_values(keys).reset_index(drop=True)
    assert (run["status"] == "ok").all() and (sweep["status"] == "ok").all()
    assert run[keys].values.tolist() == sweep[keys].values.tolist()
    return run, sweep


def _within_noise(run, sweep):
    for (_, a), (_, b) in zip(run.iterrows(), sweep.iterrows()):
        ratio = b["step_time_s"] / a["step_time_s"]
        assert 1 / NOISE_BAND <= ratio <= NOISE_BAND, (
            f"{a['parallelism']} x{a['world_size']}: sweep {b['step_time_s'] * 1e3:.2f} ms vs "
            f"run {a['step_time_s'] * 1e3:.2f} ms")


@pytest.mark.slow
def test_the_scaling_notebook_measures_the_same_under_sweep_as_under_run(tmp_path):
    run, sweep = _both_ways(tmp_path, "scaling")
    threads = lambda rows: [list(t) for t in rows["rank_cpu_threads"]]  # noqa: E731
    assert threads(run) == threads(sweep) == [[1] * int(n) for n in run["world_size"]]
    _within_noise(run, sweep)


@pytest.mark.slow
def test_a_multi_rank_training_step_measures_the_same_under_sweep_as_under_run(tmp_path):
    run, sweep = _both_ways(tmp_path, "train_step")
    # cpu_threads: the threads of every rank, summed (perfkit.core.cpu_share.run_cores).
    assert run["cpu_threads"].tolist() == sweep["cpu_threads"].tolist() == [2]
    _within_noise(run, sweep)
