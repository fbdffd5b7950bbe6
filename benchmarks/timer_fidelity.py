"""perfkit's timer against torch.utils.benchmark in the same run.

Prints, for a ~10 µs elementwise op and a ~1 ms matmul, the ratio of perfkit's median to
``torch.utils.benchmark.Timer.blocked_autorange``'s median. Goal: within 3 % (ratio 0.97-1.03).
The two timers alternate several rounds so machine noise hits both alike; the reported ratio is
the median of the per-round ratios.

    python benchmarks/timer_fidelity.py [--rounds 15] [--min-run-time-s 0.2]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as tb

from perfkit.core.timing import measure


def _cases():
    torch.manual_seed(0)
    x = torch.randn(32768)  # ~10 us add on one CPU thread of this machine class
    y = torch.randn(32768)
    out = torch.empty(32768)
    a = torch.randn(400, 400)  # ~1 ms fp32 matmul here
    b = torch.randn(400, 400)
    c = torch.empty(400, 400)
    return {
        "elementwise add 32768 fp32": lambda: torch.add(x, y, out=out),
        "matmul 400^3 fp32": lambda: torch.matmul(a, b, out=c),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-run-time-s", type=float, default=0.2)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a fixed, quiet configuration for both timers
    print(f"{'case':<28} {'perfkit median':>15} {'torch median':>13} {'ratio':>7}  per-round ratios")
    worst = 0.0
    for name, fn in _cases().items():
        ratios, ours, theirs = [], [], []
        for _ in range(args.rounds):
            m = measure(fn, min_run_time_s=args.min_run_time_s)
            t = tb.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=args.min_run_time_s)
            ours.append(m.median_s)
            theirs.append(t.median)
            ratios.append(m.median_s / t.median)
        ratio = statistics.median(ratios)
        worst = max(worst, abs(ratio - 1))
        print(f"{name:<28} {statistics.median(ours) * 1e6:>12.2f} us {statistics.median(theirs) * 1e6:>10.2f} us "
              f"{ratio:>7.3f}  {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"largest deviation from 1: {worst:.1%} (goal: within 3 %)")


if __name__ == "__main__":
    main()
