"""``perfkit predict``'s what-if against this machine's measurements (issue 48).

From one-rank profiled steps and the gloo collectives measured here (``collectives.ipynb``), DDP
and ZeRO-3 at 2 ranks are predicted and compared with their own profiled 2-rank steps (like with
like: the slowest rank's traced step), for two models:

- ``transformer``: perfkit's built-in one, real CPU compute: the two ranks share the two cores with
  their gloo threads, which no one-rank trace can show;
- ``device_like`` (``tests/_user_models.py``): each block's compute is a sleep (5 ms forward, 10 ms
  backward), the host idle while a "device" works, as on a GPU: what the prediction can hold to.

ZeRO-3 is predicted from a one-rank ZeRO-3 (FSDP2) step where there is one, else from the plain
step. The one-rank configurations run on one rank's share of the cores (half of them, by affinity:
each of the 2 ranks computes with one thread of two cores), since weak scaling keeps a rank's
compute as the base's; ``perfkit predict`` says where a base had another share. Prints how much two
processes computing at once slow each other here, each prediction, its measured point and the
error, and the load; with ``--reps N`` the whole measurement N times over (fresh sweeps each time), then each error's min, median and max.
Leave the machine otherwise idle: the ranks share its cores.

    python benchmarks/predict_check.py [--out DIR] [--reps N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
_PROFILE = {"steps": 10, "warmup_steps": 3, "profile": True, "profile_active_steps": 4, "device": "cpu"}
_MODELS = {
    "transformer": {"model": "transformer", "seq_len": 64},
    "device_like": {"model": "_user_models:device_like", "model_path": str(REPO / "tests")},
}
_CONFIGS = [{"parallelism": "none", "world_size": 1, "batch_size": 8},
            {"parallelism": "zero3", "world_size": 1, "batch_size": 8},
            {"parallelism": "ddp", "world_size": 2, "batch_size": 16},
            {"parallelism": "zero3", "world_size": 2, "batch_size": 16}]


def _perfkit(*args: str, cpus: set[int] | None = None) -> subprocess.CompletedProcess:
    """``perfkit ARGS``; on ``cpus`` only where given (its sweep slots then see only those cores)."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.run([sys.executable, "-m", "perfkit.cli", *args], capture_output=True, text=True, check=True,
                          preexec_fn=pin)


def _rank_share(world_size: int) -> set[int]:
    """The cores one of ``world_size`` ranks has on this machine: the first 1/world_size of them."""
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:max(1, len(cpus) // world_size)])


def _once(out: Path) -> dict[tuple[str, str], float]:
    print(f"load: {os.getloadavg()[0]:.2f} (1 min); folders under {out}")
    net = out / "net"
    _perfkit("run", str(REPO / "notebooks" / "collectives.ipynb"), "--out", str(net),
             "-p", "ops", "['all_reduce', 'all_gather', 'reduce_scatter']", "-p", "max_bytes", "4194304")
    print(f"{'model':<13}{'layout':<7}{'predicted ms':>13}{'measured ms':>13}{'error':>9}{'comm costed':>13}{'comm in step':>14}")
    errors = {}
    for name, model in _MODELS.items():
        for ranks in (1, 2):
            spec = out / f"{name}-{ranks}.yaml"
            spec.write_text(yaml.safe_dump({"notebook": str(REPO / "notebooks" / "train_step.ipynb"),
                                            "parameters": {**model, **_PROFILE},
                                            "configs": [c for c in _CONFIGS if c["world_size"] == ranks]}))
            _perfkit("sweep", str(spec), "--out", str(out / name), "--quiet",
                     cpus=_rank_share(max(c["world_size"] for c in _CONFIGS)) if ranks == 1 else None)
        result = json.loads(_perfkit("predict", str(out / name), "--network", str(net), "--world-sizes", "2",
                                     "--blocks", "4" if name == "device_like" else "2", "--json").stdout)
        for p in result["predictions"]:
            measured = p["measured_ms"]
            err = f"{100 * p['error']:+.1f} %" if p["error"] is not None else "-"
            in_step = f"{p['measured_comm_ms']:.2f}" if p.get("measured_comm_ms") else "-"
            print(f"{name:<13}{p['layout']:<7}{p['step_ms']:>13.2f}{measured if measured is None else round(measured, 2)!s:>13}"
                  f"{err:>9}{p['comm_ms']:>13.2f}{in_step:>14}")
            if p["error"] is not None:
                errors[(name, p["layout"])] = p["error"]
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    return errors


def _rate(cpu: int, kind: str, out) -> None:
    """Iterations a second of one thread on ``cpu``: a 256² matmul (cache-resident compute) or a
    16 MB in-place multiply (memory-bound)."""
    import torch

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    a, b, x = torch.randn(256, 256), torch.randn(256, 256), torch.randn(4_000_000)
    step = (lambda: a @ b) if kind == "matmul" else (lambda: x.mul_(1.0000001))
    for _ in range(20):
        step()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        step()
        n += 1
    out.put(n / (time.perf_counter() - t0))


def _sharing() -> None:
    """How much slower two processes on two cores each compute than one alone: what a one-rank
    base cannot show about ranks that share a CPU (its memory bandwidth and last-level cache)."""
    import multiprocessing as mp

    ctx, cpus = mp.get_context("fork"), sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        return
    for kind in ("matmul", "memory"):
        out = ctx.Queue()
        rates = []
        for group in ([cpus[0]], cpus):  # one process alone, then one on each core at once
            procs = [ctx.Process(target=_rate, args=(c, kind, out)) for c in group]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
            rates.append([out.get() for _ in procs])
        (alone,), together = rates
        print(f"  {kind:<7} two processes at once: the slower took {alone / min(together):.2f}x as long as one alone")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where the sweeps go (default: a temporary folder)")
    parser.add_argument("--reps", type=int, default=1, help="repeat the whole measurement this many times")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="perfkit-predict-check-"))
    print("sharing the CPU (a one-rank base computes alone; two ranks compute at once):")
    _sharing()
    runs = [_once(out / f"rep{k}" if args.reps > 1 else out) for k in range(1, args.reps + 1)]
    if args.reps > 1:
        print(f"over {args.reps} repetitions (goal: within ±15 %):")
        for key in runs[0]:
            errs = sorted(100 * r[key] for r in runs if key in r)
            print(f"  {key[0]:<13}{key[1]:<7} min {errs[0]:+.1f} %  median {statistics.median(errs):+.1f} %  max {errs[-1]:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
