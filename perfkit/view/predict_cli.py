"""``perfkit predict``: a measured step replayed, then re-costed at other data-parallel degrees
and pipeline depths.

Reads a results directory's profiled configurations (their Kineto traces), checks the model by
replaying every traced step (:mod:`perfkit.analyse.step_graph`), then predicts each layout at
each world size from a one-rank configuration (:mod:`perfkit.analyse.predict`) with collective
times from ``--network`` (:mod:`perfkit.analyse.network_model`). Every prediction that lands on
a configuration the directory measured prints its error; one with no measured point says how far
it extrapolates. ``--layout pp`` re-costs a measured pipeline configuration's row instead
(:mod:`perfkit.analyse.predict_pipeline`): it needs no trace and no network.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..analyse.prediction import REPLAY_TOLERANCE, label
from ..core.errors import BadInputError

__all__ = ["add_predict_command", "run_predict"]

HELP = """\
How fast at N ranks, before you have them. From a one-rank profiled training step (train_step or
scaling notebooks with profile true) and the collectives of the target network, the step's
execution graph (host ops, GPU kernels per stream, launches, waits, collectives) is replayed with
DDP's gradient all-reduces or ZeRO-3's all-gathers and reduce-scatters added, each costed by the
ring formulas from the network's alpha-beta fit. Weak scaling: each rank's batch as measured.

--layout tp: the compute divided by the TP degree (norms, embeddings and the loss kept) and four
activation all-reduces a block (Megatron-LM), one replica's batch on every rank.

--network: an nccl-tests/rccl-tests output file of the target cluster, or a perfkit folder of
measured collectives (notebooks/collectives.ipynb). First, every traced step is replayed with its
measured durations: the replay error says how well the graph explains it.

--layout pp: from a measured pipeline configuration (train_step with parallelism pp), the step at
other pipeline depths (--world-sizes), microbatch counts (--microbatches) and schedules
(--schedule: GPipe, 1F1B, Interleaved1F1B): (v*m + p - 1) slots of one stage's compute and the
measured overhead per slot, plus the rest of the step; compute, bubble and overhead apart.
"""

def add_predict_command(sub, read_network, memory_checker) -> None:
    """Register ``perfkit predict``; ``read_network(path)`` reads ``--network`` and
    ``memory_checker(device, memory_bytes)`` makes the per-rank memory check (the CLI passes
    :func:`perfkit.ingest.network.read_network` and
    :func:`perfkit.measuring.training.fit_command.memory_checker`: a view imports neither)."""
    p = sub.add_parser("predict", help="predict DDP, ZeRO-3, TP and pipeline steps at other world sizes from measured ones",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", metavar="DIR", help="a results directory with profiled training configurations")
    p.add_argument("--world-sizes", required=True, metavar="N,N,...", help="ranks to predict at, e.g. 8,64,512")
    p.add_argument("--network", metavar="FILE|DIR",
                   help="nccl-tests/rccl-tests output, or a perfkit folder of measured collectives (ddp, zero3, tp)")
    p.add_argument("--network-intra", metavar="FILE|DIR",
                   help="the intra-node network (an nccl-tests/rccl-tests table run on one host: NVLink, xGMI) beside "
                        "--network's inter-node one: groups that fit in a node are costed on it")
    p.add_argument("--gpus-per-node", type=int, metavar="N",
                   help="GPUs a node (default: --network's ranks / hosts, as its '#  Rank' lines say)")
    p.add_argument("--layout", default="ddp,zero3", help="ddp, zero3, tp, pp, comma-separated (default ddp,zero3)")
    p.add_argument("--microbatches", metavar="M,M,...", help="pp: microbatch counts to predict (default: the base's); "
                   "each microbatch keeps the base's size")
    p.add_argument("--schedule", help="pp: GPipe, 1F1B or Interleaved1F1B (default: the base's)")
    p.add_argument("--stages-per-rank", type=int, help="pp: stages per rank for Interleaved1F1B (default: the base's)")
    p.add_argument("--trace", metavar="FILE", help="the base's trace, where DIR's rows point elsewhere (a copied folder)")
    p.add_argument("--config", metavar="ID", help="the base configuration (default: DIR's one-rank traced ones)")
    p.add_argument("--blocks", type=int, help="ZeRO-3 units besides the root, TP's blocks (default: the rows' layer count)")
    p.add_argument("--device", metavar="NAME", help="beside each prediction, the peak memory per rank on fake tensors "
                   "(as perfkit fit) against this device's memory (h100, mi300x...): a prediction that does not fit says so")
    p.add_argument("--memory-bytes", metavar="SIZE", help="the device's memory, where --device is not in the spec table")
    p.add_argument("--force", action="store_true",
                   help="predict from a base whose graph replays its traced steps more than 5 %% off (refused "
                        "otherwise, exit 2); every prediction from it is marked")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--record", action="store_true",
                   help="also add the predictions to DIR as rows (workload prediction): the report draws them "
                        "beside the measured points")
    p.set_defaults(func=run_predict, read_network=read_network, memory_checker=memory_checker)


def _ints(text: str, flag: str = "--world-sizes") -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise BadInputError(f"{flag} {text!r}: give positive integers, e.g. 8,64,512")
    return values


def run_predict(args) -> int:
    from ..analyse.predict import LAYOUTS
    from ..analyse.prediction import predict, record_predictions
    from ..core.results import load

    world_sizes = _ints(args.world_sizes)
    layouts = [x.strip() for x in str(args.layout).split(",") if x.strip()]
    if not layouts or any(x not in (*LAYOUTS, "pp") for x in layouts):
        raise BadInputError(f"--layout {args.layout!r}: choose from {', '.join((*LAYOUTS, 'pp'))}")
    microbatches = _ints(args.microbatches, "--microbatches") if args.microbatches else [None]
    if "pp" not in layouts and (args.microbatches or args.schedule or args.stages_per_rank):
        raise BadInputError("--microbatches, --schedule and --stages-per-rank are for --layout pp")
    data_parallel = [x for x in layouts if x != "pp"]
    if data_parallel and not args.network:
        raise BadInputError(f"--layout {','.join(data_parallel)} needs --network FILE|DIR (the collectives' times)")
    directory = Path(args.directory)
    if not directory.is_dir():
        raise BadInputError(f"{directory}: no such results directory")
    if args.trace and not Path(args.trace).is_file():
        raise BadInputError(f"--trace {args.trace}: no such trace file")
    if (args.network_intra or args.gpus_per_node) and not args.network:
        raise BadInputError("--network-intra and --gpus-per-node go with --network (the inter-node table)")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise BadInputError(f"--gpus-per-node {args.gpus_per_node}: a positive number of GPUs")
    network = args.read_network(args.network, args.network_intra, args.gpus_per_node) if data_parallel else None
    check = (args.memory_checker(args.device, args.memory_bytes)
             if args.device or args.memory_bytes else None)
    result = predict(load(directory), directory, layouts=layouts, world_sizes=world_sizes, network=network,
                     trace=args.trace, config=args.config, blocks=args.blocks, microbatches=microbatches,
                     schedule=args.schedule, stages_per_rank=args.stages_per_rank, memory_check=check,
                     force=args.force)
    if args.record and result["predictions"]:
        result["recorded"] = str(record_predictions(directory, result["predictions"],
                                                    network.source if network is not None else "-"))
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(_render(result))
    return 0


def _render(result: dict) -> str:
    lines = []
    if result["replay"]:
        lines.append("replay (each traced step with its measured durations; the model's own check):")
        for r in result["replay"]:
            lines.append(f"  {r['config_id']}/{r['run']} rank {r['rank']}: {r['steps']} steps, median "
                         f"{r['measured_ms']:.2f} ms, worst replay error {100 * r['replay_error']:+.2f} %")
        lines.append("")
    head = (f"{'layout':<14}{'ranks':>6}{'step ms':>10}{'tokens/s':>12}{'eff':>8}{'compute':>9}{'exposed':>9}"
            f"{'bubble':>8}{'comm':>8}{'measured':>10}{'error':>8}")
    lines += ["predicted (ms; exposed: communication (pp: and schedule overhead) on the critical path; eff: weak "
              "scaling (w, data parallel), strong scaling (s, TP), the share of the step a rank computes (b, pp)):", head]
    for p in result["predictions"]:
        err = f"{100 * p['error']:+.1f}%" if p["error"] is not None else "-"
        meas = f"{p['measured_ms']:.2f}" if p["measured_ms"] is not None else "-"
        tps = f"{p['tokens_per_s']:.4g}" if math.isfinite(p["tokens_per_s"]) else "-"
        lines.append(f"{label(p):<14}{p['world_size']:>6}{p['step_ms']:>10.2f}{tps:>12}{_efficiency(p):>8}"
                     f"{p['compute_ms']:>9.2f}{p['exposed_comm_ms']:>9.2f}{p['bubble_ms']:>8.2f}{p['comm_ms']:>8.2f}"
                     f"{meas:>10}{err:>8}")
        if p["extrapolation"]:
            lines.append(f"{'':13}! {p['extrapolation']}")
        if p.get("base_replay_error") is not None and abs(p["base_replay_error"]) > REPLAY_TOLERANCE:
            lines.append(f"{'':13}! FORCED: the base replays {100 * p['base_replay_error']:+.1f} % off its step")
        for m in p.get("message_sizes") or []:
            if m["outside"]:
                lines.append(f"{'':13}! {m['outside']} of {m['count']} {m['op']} messages outside the measured sizes: {m['flag']}")
        if p.get("measured_under_profiler"):
            unprof = p.get("measured_unprofiled_ms")
            lines.append(f"{'':13}measured: its traced steps (under the profiler, as the base's)"
                         + (f"; unprofiled {unprof:.2f} ms" if unprof else ""))
        if "fits" in p:
            peak = p["memory_peak_bytes_per_rank"]
            how = f" ({p['memory_method']})" if (p.get("memory_method") or "").startswith("analytic") else ""
            lines.append(f"{'':13}memory: " + (f"{peak / 2**30:.2f} GiB per rank of {p['memory_budget_bytes'] / 2**30:.1f} GiB: "
                                               + ("fits" if p["fits"] else "DOES NOT FIT") + how if peak is not None
                                               else f"not predicted ({p['memory_reason']})"))
    seen = []
    for p in result["predictions"]:
        seen += [a for a in p["assumptions"] if a not in seen]
    if result.get("recorded"):
        lines.append(f"recorded: {result['recorded']} (perfkit report draws it beside the measured points)")
    lines += ["", "assumptions:"] + [f"  - {a}" for a in result["network"] + seen + result["notes"]]
    lines.append("  - not modelled: TP x DP, pipeline x data parallelism, sequence parallelism, the wrappers' host work "
                 "beyond the base's, compute slowed by collectives sharing its cores or memory, stragglers")
    return "\n".join(lines)


def _efficiency(p: dict) -> str:
    for key, tag in (("weak_scaling_efficiency", "w"), ("strong_scaling_efficiency", "s"), ("busy_share", "b")):
        value = p.get(key)
        if isinstance(value, float) and math.isfinite(value):
            return f"{value:.2f} {tag}"
    return "-"
