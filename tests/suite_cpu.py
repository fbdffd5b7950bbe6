"""Where the suite's CPU goes, per test: a pytest plugin and its summary.

The suite's wall time on 2 cores is its CPU work / 2 (both cores are busy from the first minute
to the last), so the budget is kept by CPU seconds, not by wall seconds. Each test's CPU is the
worker's own (``time.process_time``) plus that of every process the test started and reaped
(``RUSAGE_CHILDREN``: kernels, ranks and ``perfkit`` commands, their own children included once
reaped). What a module-scoped fixture's servers cost (JupyterLab, Chromium, Ray) lands on the
test that ends them.

    PERFKIT_SUITE_CPU=/tmp/cpu make test                 # tests/conftest.py loads this plugin
    .venv/bin/python tests/suite_cpu.py /tmp/cpu        # by module, then the 40 costliest tests
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "PERFKIT_SUITE_CPU"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ[ENV]
    own, children, wall = time.process_time(), _children_cpu_s(), time.monotonic()
    yield
    entry = {"test": item.nodeid, "own_cpu_s": time.process_time() - own,
             "children_cpu_s": _children_cpu_s() - children, "wall_s": time.monotonic() - wall}
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"cpu-{os.getpid()}.jsonl", "a") as f:  # one file per worker: no interleaving
        f.write(json.dumps(entry) + "\n")


def summarize(folder: Path, top: int = 40) -> str:
    entries = {}
    for path in sorted(folder.glob("cpu-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            entries[entry["test"]] = entry  # a rerun test counts once, its last run
    if not entries:
        raise SystemExit(f"no cpu-*.jsonl under {folder}: run the suite with {ENV}={folder}")
    cpu = {t: e["own_cpu_s"] + e["children_cpu_s"] for t, e in entries.items()}
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for test, entry in entries.items():
        row = by_module[test.split("::")[0]]
        row[0], row[1], row[2] = row[0] + cpu[test], row[1] + entry["wall_s"], row[2] + 1
    lines = [f"{len(entries)} tests: {sum(cpu.values()):.0f} s of CPU "
             f"(own {sum(e['own_cpu_s'] for e in entries.values()):.0f}, "
             f"started processes {sum(e['children_cpu_s'] for e in entries.values()):.0f}), "
             f"{sum(e['wall_s'] for e in entries.values()):.0f} s of test wall time", "",
             f"{'cpu_s':>8} {'wall_s':>8} {'tests':>5}  module"]
    for module, (c, w, n) in sorted(by_module.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{c:8.1f} {w:8.1f} {n:5d}  {module}")
    lines += ["", f"{'cpu_s':>8} {'wall_s':>8}  test"]
    for test in sorted(cpu, key=cpu.get, reverse=True)[:top]:
        lines.append(f"{cpu[test]:8.1f} {entries[test]['wall_s']:8.1f}  {test}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/suite_cpu.py DIR  (the folder PERFKIT_SUITE_CPU named)")
    print(summarize(Path(sys.argv[1])))
