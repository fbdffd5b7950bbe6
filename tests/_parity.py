"""One configuration under ``perfkit run`` and under ``perfkit sweep``: the helpers of the parity
tests (tests/test_sweep_parity.py, tests/test_scaling_run.py).

The sweep gives each kernel a slot's environment (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` =
the slot's cores); whatever a configuration starts must compute with the threads it would have
had alone. It did not: the scaling notebook asked its ranks for ``OMP_NUM_THREADS=1``, the
slot's ``MKL_NUM_THREADS=2`` was inherited beside it, torch lets MKL win, and each of 2 ranks
computed with 2 threads on 2 cores — the quickstart's 2-rank DDP step 4-12x slower under the
sweep (issue 25 A). The tests compare, on real ranks, the threads every rank computed with
(exact) and the step times (within :data:`NOISE_BAND`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

import perfkit
from conftest import REPO

#: Ratio of two medians of the same configuration that 2 shared cores' noise stays within: a
#: loaded machine moved the same 2-rank step 4.4-7.2 ms between two runs; the bug made it 9.6x.
NOISE_BAND = 3.0
KEYS = ["parallelism", "world_size"]


def cli(*args, timeout_s=400) -> None:
    proc = subprocess.run([sys.executable, "-m", "perfkit.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def run_args(params: dict) -> list[str]:
    """``-p NAME VALUE`` pairs: a str parameter takes the text as it is, others a Python literal."""
    return [a for k, v in params.items() for a in ("-p", k, v if isinstance(v, str) else repr(v))]


def sweep_rows(notebook: Path, params: dict, out: Path):
    """The rows of ``params`` run as a one-configuration sweep, one slot holding both cores
    (``devices_per_config: 2``, as the quickstart runs its 2-rank parts)."""
    spec = out.parent / f"{out.name}.yaml"
    spec.write_text(yaml.safe_dump({"name": out.name, "parts": [
        {"notebook": str(notebook), "devices_per_config": 2, "oom_axis": None, "parameters": params}]}))
    cli("sweep", spec, "--out", out, "--quiet")
    return ok_rows(out)


def ok_rows(out: Path):
    rows = perfkit.load(out).sort_values(KEYS).reset_index(drop=True)
    assert (rows["status"] == "ok").all(), rows["status"].tolist()
    return rows


def _outside_noise(run, sweep) -> list[tuple[str, str]]:
    """(side, message) for each side whose fastest step is past :data:`NOISE_BAND` x the other's
    median; the side named is the slow one."""
    assert run[KEYS].values.tolist() == sweep[KEYS].values.tolist()
    slow = []
    for (_, a), (_, b) in zip(run.iterrows(), sweep.iterrows()):
        for one, other, name in ((a, b, "run"), (b, a, "sweep")):
            fastest = min(one["step_time_samples_s"])
            if fastest > NOISE_BAND * other["step_time_s"]:
                slow.append((name, f"{a['parallelism']} x{a['world_size']}: the {name}'s fastest step "
                                   f"{fastest * 1e3:.2f} ms vs the other's median {other['step_time_s'] * 1e3:.2f} ms"))
    return slow


def assert_within_noise(run, sweep, *, again_run=None, again_sweep=None) -> None:
    """Each side's fastest step within :data:`NOISE_BAND` of the other's median. The two sides
    run minutes apart beside different tests (three workers on two cores): a neighbour's burst
    moved one side's median 3.9x (run 25.9 ms, sweep 6.6 ms, no bug); its fastest of the timed
    steps is the one least disturbed, while the bug slowed every step (2 ranks x 2 threads).

    A burst can still outlast every timed step of a millisecond configuration (CI: a world-size-1
    step of 2.15 ms under ``perfkit run``, no step under 8.26 ms in the sweep beside two busy
    workers). So a side found slow is measured once more (``again_run``/``again_sweep``, callables
    giving its rows afresh) and both sides are judged again: the bug is in the configuration and
    slows the second measurement as it did the first; a neighbour's burst does not follow it."""
    slow = _outside_noise(run, sweep)
    if not slow:
        return
    sides = {name for name, _ in slow}
    if ("run" in sides and again_run is None) or ("sweep" in sides and again_sweep is None):
        raise AssertionError("; ".join(m for _, m in slow))
    run = again_run() if "run" in sides else run
    sweep = again_sweep() if "sweep" in sides else sweep
    still = _outside_noise(run, sweep)
    assert not still, ("; ".join(m for _, m in still) + " (measured again after: "
                       + "; ".join(m for _, m in slow) + ")")
