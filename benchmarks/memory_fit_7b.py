"""``perfkit fit`` of a 7B Llama shape on this CPU: wall time and host memory (issue 30).

The shape is Llama-2-7B's (hidden 4096, 32 layers, 32 heads, intermediate 11008, vocabulary
32000, 4096 positions: Touvron et al. 2023, table 1 / the HF config), trained under zero3 on 8
ranks in bf16 autocast at 4096 tokens per sample. Two global batches: 8 (one sample per rank) and
64 (eight per rank). Each ``perfkit fit`` runs in its own process, the activation-checkpointing
variant in a spawned one beside it (the command's default), as a user runs it; imports count.

Host memory: the peak RSS of the largest process of the command's tree (``RUSAGE_CHILDREN``'s
``ru_maxrss`` after it ended: the command and its spawned worker), and twice that as a bound on
the two together. Goal: under 60 s and under 4 GiB, with nothing materialised.

    python benchmarks/memory_fit_7b.py [--device mi300x] [--batch 8 --batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

LLAMA_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}
GOAL_S, GOAL_BYTES = 60.0, 4 * 2**30


def run(batch: int, device: str) -> dict:
    cmd = [sys.executable, "-m", "perfkit.cli", "fit", "hf:llama", "--seq-len", "4096", "--batch", str(batch),
           "--parallelism", "zero3", "--world-size", "8", "--precision", "bf16", "--device", device, "--json", "-"]
    for key, value in LLAMA_7B.items():
        cmd += ["--size", f"{key}={value}"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"perfkit fit failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    got = json.loads(done.stdout)
    got["wall_s"] = wall_s
    got["largest_process_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="mi300x")
    ap.add_argument("--batch", type=int, action="append")
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    ok = True
    for batch in args.batch or [8, 64]:
        r = run(batch, args.device)
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        rss = r["largest_process_rss_bytes"]
        print(f"batch {batch} ({r['batch_per_rank']} per rank) × 4096 tokens, zero3 × 8, bf16: "
              f"peak/rank {gib(r['predicted_peak_bytes'])} "
              f"(params {gib(r['predicted_parameters_bytes'])}, gathered {gib(r['predicted_gathered_parameters_bytes'])}, "
              f"optimizer {gib(r['predicted_optimizer_state_bytes'])}, activations {gib(r['predicted_activations_bytes'])}, "
              f"temporaries {gib(r['predicted_temporaries_bytes'])}); fits {r['device_memory_source'].split(' (')[0]}: "
              f"{r['fits']}; largest batch {r['largest_batch']}; with activation checkpointing: peak "
              f"{gib(r['other']['predicted_peak_bytes'])}, largest batch {r['other']['largest_batch']}")
        print(f"  wall {r['wall_s']:.1f} s (goal < {GOAL_S:.0f}: ratio {r['wall_s'] / GOAL_S:.2f}); largest process "
              f"RSS {gib(rss)}, both processes <= {gib(2 * rss)} (goal < 4 GiB: ratio {2 * rss / GOAL_BYTES:.2f})")
        ok &= r["wall_s"] < GOAL_S and 2 * rss < GOAL_BYTES
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
