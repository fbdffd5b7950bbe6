"""How often does ``perfkit compare`` cry wolf, and how often does it catch a real 10 % slowdown?

Real timings on this machine, not synthetic samples. A *trial* is one A/B comparison as an A/B
sweep makes it: each side runs ``--rounds`` times, every round a fresh Python process (as every
configuration gets a fresh kernel) that times a matmul with ``perfkit.measure`` and hands back
its raw samples; the rounds are interleaved (A B, B A, ...). The verdict is
``perfkit.analyse.ab_stats``' (the same code ``perfkit compare`` runs, one point per trial).

Experiments (``--experiments``, default all):

- ``aa``: the same workload on both sides → rate of false ``slower`` verdicts (goal ≤ 1 in 20);
- ``ab10``: side B does 10 % more work (the matmul's inner dimension × 1.1) → rate of ``slower``
  (goal ≥ 19 in 20);
- ``load-interleaved`` / ``load-back-to-back``: A/A again, with a busy process started on one
  core halfway through every trial; the rounds either interleaved or all of A then all of B (two
  sweeps one after the other). Interleaving spreads the load over both sides; back to back puts it
  all on B, so B looks slower.

``--drift SIGMA`` gives every round a level of its own, as runs on a shared GPU cluster have
(2–5 %): the round's matmul inner dimension is scaled by exp(N(0, SIGMA)). With ``--rounds 1``
that is issue 53's case, two sweeps of one run each: each trial is then also judged as the gate
judged it before (``run_to_run=0``: the bootstrap alone, blind to the spread between runs), on
the same samples.

Prints, per experiment, the count of each verdict, the rate of the one that matters and the
median wall time per trial, with the load average before the run.

    python benchmarks/compare_power.py [--trials 20] [--rounds 6] [--threads 1] [--drift 0.05] [--experiments aa ab10 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfkit.analyse.ab_stats import compare_samples, verdict  # noqa: E402

# One side's round: a fresh process, its own warm-up, perfkit's timer, raw samples out.
_WORKER = """
import json, sys, torch
from perfkit.core.timing import measure
m, k = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
a, b = torch.randn(m, k), torch.randn(k, m)
t = measure(lambda: torch.mm(a, b), min_run_time_s=float(sys.argv[3]))
print(json.dumps(list(t.samples_s)))
"""
_BUSY = "while True: pass"
EXPERIMENTS = ("aa", "ab10", "load-interleaved", "load-back-to-back")


def _round(m: int, k: int, run_time_s: float, threads: int) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", _WORKER, str(m), str(k), str(run_time_s)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def trial(*, m: int, k_base: int, k_new: int, rounds: int, interleave: bool, load_half: bool, run_time_s: float,
          threads: int, drift: float = 0.0, rng=None) -> tuple[str, str, float]:
    """One comparison: (verdict, the verdict blind to run-to-run spread, wall time in seconds)."""
    if interleave:
        order = [side for r in range(rounds) for side in (("a", "b") if r % 2 == 0 else ("b", "a"))]
    else:
        order = ["a"] * rounds + ["b"] * rounds
    groups: dict[str, list] = {"a": [], "b": []}
    busy = None
    t0 = time.perf_counter()
    try:
        for i, side in enumerate(order):
            if load_half and busy is None and i >= len(order) // 2:
                busy = subprocess.Popen([sys.executable, "-c", _BUSY])
            k = k_base if side == "a" else k_new
            level = float(np.exp(rng.normal(0.0, drift))) if drift else 1.0
            groups[side].append(_round(m, max(1, round(k * level)), run_time_s, threads))
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    wall_s = time.perf_counter() - t0
    c = compare_samples(groups["a"], groups["b"])
    blind = compare_samples(groups["a"], groups["b"], run_to_run=0.0)
    # One point per trial: Holm over one p-value is the p-value itself.
    return (verdict(c, p_adjusted=c.p_value, lower_is_better=True)[0],
            verdict(blind, p_adjusted=blind.p_value, lower_is_better=True)[0], wall_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side in each trial (≥ 5, as for a CI gate)")
    parser.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--size", type=int, default=256, help="the matmul is (size × k) @ (k × size)")
    parser.add_argument("--k", type=int, default=512, help="inner dimension of side A")
    parser.add_argument("--run-time-s", type=float, default=0.3, help="timed run per round (perfkit.measure)")
    parser.add_argument("--drift", type=float, default=0.0,
                        help="σ of each round's own level (log scale; 0.05: a 5 %% spread between runs)")
    parser.add_argument("--seed", type=int, default=0, help="of the rounds' levels under --drift")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP threads of each round (1: a 2-thread round on 2 shared cores is hostage to any neighbour)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"{args.trials} trials × {args.rounds} rounds per side; matmul {args.size}×{args.k} @ {args.k}×{args.size}, "
          f"{args.threads} threads" + (f"; each round's level drifts σ = {args.drift:g}" if args.drift else ""))
    rng = np.random.default_rng(args.seed)
    goals = {"aa": ("slower", "≤ 1/20"), "ab10": ("slower", "≥ 19/20"),
             "load-interleaved": ("slower", "false alarms"), "load-back-to-back": ("slower", "false alarms")}
    for name in args.experiments:
        k_new = round(args.k * 1.1) if name == "ab10" else args.k
        verdicts, blind, walls = Counter(), Counter(), []
        for _ in range(args.trials):
            v, b, wall_s = trial(m=args.size, k_base=args.k, k_new=k_new, rounds=args.rounds,
                                 interleave=name != "load-back-to-back", load_half=name.startswith("load"),
                                 run_time_s=args.run_time_s, threads=args.threads, drift=args.drift, rng=rng)
            verdicts[v] += 1
            blind[b] += 1
            walls.append(wall_s)
        watched, goal = goals[name]
        for label, tally in (("", verdicts), (" (blind to run-to-run, as before issue 53)", blind)):
            counts = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
            print(f"{name:<18} {watched} {tally[watched]}/{args.trials} ({tally[watched] / args.trials:.0%}; goal {goal})"
                  f"  [{counts}]{label}", flush=True)
        print(f"{'':<18} median {statistics.median(walls):.1f} s per trial", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
