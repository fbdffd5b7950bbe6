"""tests/suite_cpu.py: each test's CPU, its own and its started processes', and the summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

BURNING = '''
import subprocess, sys, time

def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_starts_a_busy_process():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                    "while time.process_time() < end: pass"], check=True)

def test_is_busy_itself():
    _burn(0.4)
'''


def test_each_test_is_charged_its_own_cpu_and_its_processes(tmp_path):
    (tmp_path / "test_burning.py").write_text(BURNING)
    folder = tmp_path / "cpu"
    env = {**os.environ, "PERFKIT_SUITE_CPU": str(folder), "PYTHONPATH": str(TESTS)}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cpu",
                          str(tmp_path / "test_burning.py")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    entries = {e["test"].split("::")[-1]: e for p in folder.glob("cpu-*.jsonl")
               for e in map(json.loads, p.read_text().splitlines())}
    child, own = entries["test_starts_a_busy_process"], entries["test_is_busy_itself"]
    assert child["children_cpu_s"] >= 0.55 and child["own_cpu_s"] < 0.3, child
    assert own["own_cpu_s"] >= 0.38 and own["children_cpu_s"] < 0.05, own
    summary = subprocess.run([sys.executable, str(TESTS / "suite_cpu.py"), str(folder)], capture_output=True,
                             text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0].startswith("2 tests:") and "test_burning.py" in summary.stdout
    costliest = [line for line in lines if line.rstrip().endswith("test_starts_a_busy_process")]
    assert costliest and float(costliest[0].split()[0]) >= 0.55, summary.stdout
