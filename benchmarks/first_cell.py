"""Where a training configuration's first cell spends its seconds (issue 45, item 5).

Each phase is timed in a fresh Python process, so nothing is cached: ``import torch``, then
``import torch._dynamo`` (AdamW's first step imports it: the prestarted kernel's ``perfkit.warm``
does this ahead), then ``run_training`` of the default built-in transformer on the CPU, split into
its timed steps and the rest (build, FLOP count, memory model, the row). The cold kernel pays every
phase. A prestarted, warmed kernel pays only the last one. The medians over ``--repeats`` fresh
processes are printed, with the load.

    python benchmarks/first_cell.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torch._dynamo
t2 = time.perf_counter()
from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.step import run_training
t3 = time.perf_counter()
row = run_training(TrainConfig(model="transformer", device="cpu"))
t4 = time.perf_counter()
assert row["status"] == "ok", row.get("error")
steps = sum(row["step_time_samples_s"])
print(json.dumps({"import torch": t1 - t0, "import torch._dynamo": t2 - t1, "import perfkit": t3 - t2,
                  "run_training: timed steps": steps, "run_training: the rest": t4 - t3 - steps}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for name, seconds in med.items():
        print(f"  {name:<28} {seconds:7.3f} s")
    cold = sum(med.values())
    warm = med["run_training: timed steps"] + med["run_training: the rest"]
    print(f"first cell, cold kernel: {cold:.2f} s; prestarted and warmed: {warm:.2f} s "
          f"({med['run_training: timed steps']:.3f} s of it the timed steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
