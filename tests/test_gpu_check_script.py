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
STEPS = ("env", "ceiling", "gpu_tests", "probes", "nccl", "sweep")


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
    lines = {line.split()[0]: line for line in summary.splitlines()[1:] if not line.startswith("wheels:")}
    assert set(lines) == set(STEPS)
    assert summary.splitlines()[-1].startswith("wheels: none given; papermill ")
    for step in ("ceiling", "probes", "nccl", "sweep"):
        assert "skipped (no GPU)" in lines[step]
    assert " ok " in lines["env"] and " ok " in lines["gpu_tests"]
    assert json.loads((dest / "env.json").read_text())["device_kind"] == "cpu"
    tests_log = (dest / "gpu_tests.log").read_text()
    assert "SKIPPED" in tests_log and "needs a CUDA/ROCm GPU" in tests_log
    assert " passed" not in tests_log and " failed" not in tests_log  # nothing ran without its GPU
    assert len(list(dest.iterdir())) <= 8  # what a device run can bring back from $OUT


def test_bad_arguments_exit_2_with_one_line_and_a_wheel_folder_is_named_in_the_plan(tmp_path):
    out = _run("--wheels", tmp_path / "none")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "no .whl" in out.stderr
    out = _run("--bogus")
    assert out.returncode == 2 and "unknown option --bogus" in out.stderr
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "fake-1.0-py3-none-any.whl").write_bytes(b"")
    out = _run("--dry-run", "--wheels", wheels, tmp_path / "o")
    assert out.returncode == 0 and f"wheels: 1 from {wheels}" in out.stdout, out.stdout + out.stderr
    assert "usage" not in _run("--help").stderr and "--wheels DIR" in _run("--help").stdout


@pytest.mark.slow  # a perfkit process whose check builds hf:llama's config (transformers' import)
def test_the_sweep_spec_of_the_check_expands_against_the_notebooks(tmp_path):
    spec = tmp_path / "spec.yaml"
    made = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_probes.py"), "sweep-spec", str(REPO)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    spec.write_text(made.stdout)
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "s"),
                          "--dry-run"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "5 configurations, 5 to run" in out.stdout
    for notebook in ("gemm", "roofline", "train_step", "inference", "kernels"):
        assert f"{notebook}-" in out.stdout
