"""What ``profile=True`` costs: training-step time with the profiler recording vs without, same run.

The training step of ``notebooks/train_step.ipynb``'s defaults (a tiny transformer on CPU), run
``--pairs`` times with the profile off and on, alternating (off, on, on, off, ...) so drift hits
both alike. With the defaults (``ProfileSettings``: one profiler warm-up step, 2 recorded, shapes
and stacks off) it compares the median time of the recorded steps against the same steps of the
unprofiled runs, and the whole timed run's median too. Goal: ≤ 1.5× on CPU.

    python benchmarks/profile_overhead.py [--pairs 5] [--model transformer] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfkit.measuring.training.config import TrainConfig  # noqa: E402
from perfkit.measuring.training.step import train_step_benchmark  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--active", type=int, default=2, help="profiled steps (profile_active_steps)")
    args = parser.parse_args()
    os.environ.setdefault("PERFKIT_OUT", tempfile.mkdtemp(prefix="perfkit-profile-overhead-"))
    warmup = 1
    steps = warmup + 1 + args.active  # the run's warm-up, the profiler's warm-up, the recorded steps
    recorded = slice(1, 1 + args.active)  # indices into the timed samples (the run's warm-up is not timed)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.model}, batch "
          f"{args.batch_size}, {args.pairs} pairs, {steps} steps each ({args.active} recorded)")
    times: dict[bool, dict[str, list[float]]] = {False: {"recorded": [], "all": []}, True: {"recorded": [], "all": []}}
    for i in range(args.pairs):
        for profile in ((False, True) if i % 2 == 0 else (True, False)):
            row = train_step_benchmark(TrainConfig(model=args.model, batch_size=args.batch_size, seq_len=16, steps=steps,
                                                   warmup_steps=warmup, profile=profile, profile_active_steps=args.active,
                                                   device="cpu", count_flops=False))
            samples = row["step_time_samples_s"]
            times[profile]["recorded"] += samples[recorded]
            times[profile]["all"].append(row["step_time_s"])
            if profile and not row["trace_path"]:
                raise SystemExit(f"no trace written: {row['trace_reason']}")
    for what in ("recorded", "all"):
        off, on = statistics.median(times[False][what]), statistics.median(times[True][what])
        label = "recorded steps" if what == "recorded" else "whole timed run"
        print(f"{label:<16} off {off * 1e3:8.2f} ms   on {on * 1e3:8.2f} ms   ratio {on / off:.2f}x  (goal <= 1.5x)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
