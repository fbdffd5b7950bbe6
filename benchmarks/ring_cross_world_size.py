"""Does the ring model fitted at one world size predict another? (issue 57, item 4's check)

perfkit predicts collectives at N ranks from an α–β fit at the world size the network was measured
at (:mod:`perfkit.analyse.network_model`: per-hop α and bus bandwidth, the ring's 2(p−1) or (p−1)
hops and busbw factor, Thakur, Rabenseifner & Gropp 2005). This measures gloo all-reduce and
all-gather on this machine at ``--fit-ws`` ranks and at ``--check-ws`` ranks, fits the network at
the first, predicts every size of the second, and prints predicted ÷ measured per size (the median
of each size's samples), with the load.

On the project's 2-core machines every rank beyond 2 shares a core: the measured side then holds
oversubscription that no network model has, and the table shows how much. On a real node, run it
with --check-ws at or under the core count (gloo) or over GPUs (``--backend nccl``).

    python benchmarks/ring_cross_world_size.py [--fit-ws 2] [--check-ws 3] [--max-bytes 4194304]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pandas as pd

from perfkit.analyse.network_model import network_from_rows
from perfkit.measuring.collectives.benchmark import CollectivesConfig, run_collectives

OPS = ("all_reduce", "all_gather")


def _rows(world_size: int, args) -> pd.DataFrame:
    cfg = CollectivesConfig(ops=OPS, min_bytes=args.min_bytes, max_bytes=args.max_bytes, factor=4,
                            inplace=(True, False), iters=args.iters, warmup_iters=5, check=False,
                            world_size=world_size, backend=args.backend, timeout_s=600)
    return pd.DataFrame(run_collectives(cfg))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit-ws", type=int, default=2, help="world size the network is fitted at (default 2)")
    p.add_argument("--check-ws", type=int, default=3, help="world size predicted and measured (default 3)")
    p.add_argument("--min-bytes", type=int, default=1 << 12)
    p.add_argument("--max-bytes", type=int, default=1 << 22)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backend", default="gloo")
    args = p.parse_args()
    load = os.getloadavg()
    fit_rows, check_rows = _rows(args.fit_ws, args), _rows(args.check_ws, args)
    model = network_from_rows(fit_rows, f"gloo at {args.fit_ws} ranks")
    print(f"fitted at {args.fit_ws} ranks: " + "; ".join(
        f"{op}: α {link.alpha_hop_s * 1e6:.1f} µs/hop, busbw {link.bus_bytes_per_s / 1e9:.2f} GB/s"
        for op, link in model.links.items()))
    print(f"{'op':<11} {'size':>9}  {'measured at ' + str(args.check_ws):>15}  {'predicted':>10}  pred/meas")
    ratios = {}
    for r in check_rows.itertuples():
        measured = float(np.median(r.time_samples_s))
        predicted = model.time_s(r.op, r.size_bytes, args.check_ws)
        ratios.setdefault(r.op, []).append(predicted / measured)
        print(f"{r.op:<11} {r.size_bytes / 1024:>7.0f} K  {measured * 1e6:>12.1f} µs  {predicted * 1e6:>7.1f} µs  "
              f"{predicted / measured:>8.3f}")
    for op, rs in ratios.items():
        print(f"{op}: predicted ÷ measured at {args.check_ws} ranks, median {np.median(rs):.3f} "
              f"(range {min(rs):.3f}–{max(rs):.3f}) over {len(rs)} sizes")
    # The control: the fit's own world size, where nothing is extrapolated.
    for op in OPS:
        own = [model.time_s(r.op, r.size_bytes, args.fit_ws) / float(np.median(r.time_samples_s))
               for r in fit_rows.itertuples() if r.op == op]
        print(f"{op}: predicted ÷ measured at the fitted {args.fit_ws} ranks (control), median {np.median(own):.3f} "
              f"(range {min(own):.3f}–{max(own):.3f})")
    print("notes: " + " | ".join(model.assumptions()))
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
