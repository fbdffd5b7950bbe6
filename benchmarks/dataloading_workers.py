"""The workers criterion (issue 31): a 2 ms/sample CPU decode, batch 8, a 16 ms step — 0 workers
input-bound, 2 workers compute-bound at the 5 % rule, and the recommendation naming 2 — with
both of torch's sharing strategies, and the hand-over floor: the wait per step of 2 workers
whose batches are always ready (no decode), i.e. what handing a batch to the main process costs.

    python benchmarks/dataloading_workers.py [--steps 60] [--decode-ms 2] [--step-ms 16]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfkit.analyse.dataloading import recommend  # noqa: E402
from perfkit.measuring.data.loading import LoaderConfig, run_loader_benchmark  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--decode-ms", type=float, default=2.0)
    parser.add_argument("--step-ms", type=float, default=16.0)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs; decode "
          f"{args.decode_ms} ms/sample, batch 8, step {args.step_ms} ms, {args.steps} steps (5 warm-up)")
    cache = tempfile.mkdtemp(prefix="perfkit-workers-")
    atexit.register(shutil.rmtree, cache, True)  # the generated dataset goes with the run
    base = dict(format="files", n_samples=256, batch_size=8, steps=args.steps, warmup_steps=5, loader_batches=0,
                step_compute_s=args.step_ms / 1e3, device="cpu", cache_dir=cache)
    for strategy in ("file_descriptor", "file_system"):
        rows = []
        for workers in (0, 1, 2):
            extra = dict(persistent_workers=True, sharing_strategy=strategy) if workers else {}
            row = run_loader_benchmark(LoaderConfig(**base, decode_cost_s=args.decode_ms / 1e3, num_workers=workers,
                                                    **extra))
            assert row["status"] == "ok", row["error"]
            rows.append(row)
            print(f"  {strategy:<15} workers {workers}: step {row['step_time_s'] * 1e3:6.2f} ms, wait "
                  f"{row['data_wait_s'] * 1e3:6.2f} ms, share {row['data_wait_share']:6.1%} -> {row['bound']}")
        floor = run_loader_benchmark(LoaderConfig(**base, decode_cost_s=0.0, num_workers=2, persistent_workers=True,
                                                  sharing_strategy=strategy))
        chosen = recommend(pd.DataFrame(rows)).iloc[0]
        print(f"  {strategy:<15} recommended workers: {chosen['recommended_num_workers']} "
              f"({chosen['recommended_bound']}); hand-over floor (2 workers, no decode): "
              f"{floor['data_wait_s'] * 1e3:.2f} ms per step, {floor['data_wait_share']:.1%}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
