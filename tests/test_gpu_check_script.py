"""benchmarks/gpu_check.sh, checked where it runs cheaply: its plan (--dry-run), and a run on a
machine without a GPU (the GPU-only steps say they are skipped, the GPU tests skip with their
reason, the summary and outputs land in the one folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
STEPS = ("env", "peaks", "gpu_tests", "train_bf16", "nccl", "sdpa_count")


def _run(*args, timeout=300):
    env = {**os.environ, "PERFKIT_PYTHON": sys.executable}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_dry_run_lists_every_step_within_eight_minutes(tmp_path):
    out = _run("--dry-run", tmp_path / "o")
    assert out.returncode == 0, out.stderr
    for step in STEPS:
        assert f"  {step}: at most " in out.stdout
    total_s = int(out.stdout.split("total at most ")[1].split()[0])
    assert total_s < 8 * 60
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run every step")
def test_without_a_gpu_the_gpu_steps_skip_and_say_so(tmp_path):
    dest = tmp_path / "gpu-check"
    out = _run(dest)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = (dest / "summary.txt").read_text()
    lines = {line.split()[0]: line for line in summary.splitlines()[1:]}
    assert set(lines) == set(STEPS)
    for step in ("peaks", "train_bf16", "nccl", "sdpa_count"):
        assert "skipped (no GPU)" in lines[step]
    assert " ok " in lines["env"] and " ok " in lines["gpu_tests"]
    assert json.loads((dest / "env.json").read_text())["device_kind"] == "cpu"
    tests_log = (dest / "gpu_tests.log").read_text()
    assert "SKIPPED" in tests_log and "needs a CUDA/ROCm GPU" in tests_log
    assert " passed" not in tests_log and " failed" not in tests_log  # nothing ran without its GPU
    assert len(list(dest.iterdir())) <= 8  # what a device run can bring back from $OUT
