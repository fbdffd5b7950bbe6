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
import statistics
from pathlib import Path

import pandas as pd

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

_ALIASES = {"ddp": ("ddp",), "zero3": ("zero3", "fsdp"), "tp": ("tp",)}
_BASES = {"ddp": ("ddp", "none"), "zero3": ("zero3", "fsdp", "none"), "tp": ("none",)}


def _batch(layout: str, per_rank: float, p: int) -> float:
    """The global batch of ``layout`` at ``p`` ranks: data parallelism multiplies the per-rank batch,
    TP's ranks share one replica's."""
    return per_rank if layout == "tp" else per_rank * p


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


def _facts(row: dict, blocks: int | None, notes: list[str]):
    from ..analyse.predict import ModelFacts

    def num(name):
        value = row.get(name)
        return float(value) if isinstance(value, (int, float)) and value == value else None

    if num("n_params") is None:
        raise BadInputError(f"{row.get('config_id')}: its rows have no n_params: not a training configuration")
    layers = blocks or num("model_num_hidden_layers") or num("model_n_layers")
    if layers is None:
        layers = 1
        if not any(n.startswith("blocks:") for n in notes):
            notes.append("blocks: the rows do not say how many (model_n_layers, model_num_hidden_layers); ZeRO-3 "
                         "costed as the root and one block: pass --blocks N")
    precision = str(row.get("precision"))
    half = ("bfloat16", "float16")
    param_bytes = 2 if precision == "bf16-pure" or row.get("fsdp_param_dtype") in half else 4
    grad_bytes = 2 if precision == "bf16-pure" or row.get("fsdp_reduce_dtype") in half else 4
    per_rank = num("batch_size") / (num("world_size") or 1)
    tokens = per_rank * (num("seq_len") or 1)
    hidden = num("model_hidden_size") or num("model_d_model") or num("model_n_embd")
    act_bytes = 2 if precision in ("bf16", "fp16", "bf16-pure", "fp8") else 4
    return ModelFacts(hidden_size=int(hidden) if hidden else None, act_bytes=act_bytes, n_params=int(num("n_params")), n_params_non_embedding=int(num("n_params_non_embedding") or 0) or None,
                      n_blocks=int(layers) if layers else None, param_bytes=param_bytes, grad_bytes=grad_bytes,
                      bucket_cap_mb=num("bucket_cap_mb") or 25.0, tokens_per_rank=tokens), per_rank


def _traced(rows: pd.DataFrame, directory: Path, trace: str | None, config: str | None):
    from .trace_report import TracedRun, traced_runs

    runs = traced_runs(rows, directory)
    if config:
        runs = [r for r in runs if r.config_id == config]
    if trace:
        if len({r.config_id for r in runs}) != 1:
            raise BadInputError(f"--trace {trace}: name its configuration with --config (traced in {directory}: "
                                f"{', '.join(sorted({r.config_id for r in runs})) or 'none'})")
        r = runs[0]
        runs = [TracedRun(config_id=r.config_id, run=r.run, paths=(Path(trace),), row=r.row)]
    return runs


def run_predict(args) -> int:
    from ..analyse.predict import LAYOUTS
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
    network = args.read_network(args.network) if data_parallel else None
    check = (args.memory_checker(args.device, args.memory_bytes)
             if args.device or args.memory_bytes else None)
    rows = load(directory)
    predictions, notes, replays = [], [], []
    if "pp" in layouts:
        predictions += _pipeline(rows, directory, args, world_sizes, microbatches, notes)
    if data_parallel:
        replays, dp = _data_parallel(rows, directory, args, data_parallel, world_sizes, network, check, notes)
        predictions += dp
    result = {"replay": replays, "predictions": predictions,
              "network": network.assumptions() if network is not None else [], "notes": notes}
    if args.record and predictions:
        result["recorded"] = str(_record(directory, predictions, network.source if network is not None else "-"))
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(_render(result))
    return 0


def _pipeline(rows: pd.DataFrame, directory: Path, args, world_sizes, microbatches, notes) -> list[dict]:
    """``--layout pp``: each (ranks, microbatches) from the base pipeline configuration."""
    from ..analyse.pipeline_bubble import point_reason
    from ..analyse.predict_pipeline import pipeline_base, predict_pipeline

    pp = rows[(rows.get("parallelism") == "pp") & (rows.get("status") == "ok")] if "parallelism" in rows else rows.iloc[:0]
    if args.config:
        pp = pp[pp["config_id"] == args.config]
    if pp.empty:
        raise BadInputError(f"{directory}: no ok pipeline configuration{' ' + args.config if args.config else ''} to "
                            "predict from: run train_step.ipynb with -p parallelism pp")
    # The base: the most ranks, then the most microbatches (the most of the schedule measured).
    candidates = pp.sort_values(["world_size", "n_microbatches", "config_id"], ascending=[False, False, True])
    row = candidates.groupby("config_id", sort=False).median(numeric_only=True).iloc[0].to_dict()
    first = candidates.iloc[0].to_dict()
    row.update({k: first[k] for k in ("config_id", "parallelism", "pp_schedule", "model", "precision") if k in first})
    base = pipeline_base(row)
    out = []
    for p in world_sizes:
        for m in microbatches:
            why = point_reason(args.schedule or base.schedule, p, m or base.microbatches)
            if why is not None:
                notes.append(f"pp at {p} ranks: not predicted: {why}")
                continue
            pred = predict_pipeline(base, ranks=p, microbatches=m, schedule=args.schedule,
                                    stages_per_rank=args.stages_per_rank)
            d = pred.detail
            measured = _measured_pp(rows, first, p, d["microbatches"], d["schedule"], base.microbatch_size)
            entry = _entry(pred, f"{base.config_id}/pp", measured, None)
            entry.update(schedule=d["schedule"], microbatches=d["microbatches"])
            if not measured:
                entry["extrapolation"] = (f"no measured {d['schedule']} point at {p} ranks and {d['microbatches']} "
                                          f"microbatches; the base has {base.ranks} ranks and {base.microbatches}")
            out.append(entry)
    notes.append(f"pp: base {base.config_id} (median of its rows: step {base.step_s * 1e3:.2f} ms, window "
                 f"{base.window_s * 1e3:.2f} ms)")
    if str(first.get("device")) == "cpu" and any(e["world_size"] != base.ranks for e in out):
        notes.append(f"pp: the base ran on CPU, its {base.ranks} rank(s) sharing the host's cores: a stage's compute there "
                     "is not what it costs on a device of its own, so predictions at other rank counts hold for ranks "
                     "with a device each, not for more ranks on this host")
    return out


def _measured_pp(rows, base: dict, p: int, m: int, schedule: str, microbatch: float) -> float | None:
    same = _same_workload(rows[(rows.get("parallelism") == "pp") & (rows.get("status") == "ok")], base)
    hit = same[(same["world_size"] == p) & (same["n_microbatches"] == m) & (same["pp_schedule"] == schedule)
               & (same["batch_size"] == round(microbatch * m))]
    hit = hit[hit["step_time_s"].notna()]
    return float(hit["step_time_s"].median()) if len(hit) else None


def _entry(pred, base: str, measured: float | None, extrapolation: str | None) -> dict:
    return {"layout": pred.layout, "world_size": pred.world_size, "base": base,
            "step_ms": pred.step_s * 1e3, "tokens_per_s": pred.tokens_per_s,
            "scaling_efficiency": pred.scaling_efficiency, "compute_ms": pred.compute_s * 1e3,
            "exposed_comm_ms": pred.exposed_comm_s * 1e3, "comm_ms": pred.comm_s * 1e3,
            "bubble_ms": pred.bubble_s * 1e3, "collectives": pred.collectives,
            "measured_ms": measured * 1e3 if measured else None,
            "error": pred.step_s / measured - 1 if measured else None,
            "extrapolation": extrapolation if not measured else None, "assumptions": pred.assumptions}


def _data_parallel(rows, directory, args, layouts, world_sizes, network, check, notes):
    """DDP, ZeRO-3 and TP from a one-rank trace (:mod:`perfkit.analyse.predict`), after the replay check."""
    from ..analyse.predict import what_if
    from ..analyse.step_graph import replay_error, step_graphs

    if rows.empty or "trace_path" not in rows.columns:
        raise BadInputError(f"{directory}: no traced configurations: run train_step.ipynb with -p profile true")
    runs = [r for r in _traced(rows, directory, args.trace, args.config) if all(p.is_file() for p in r.paths)]
    if not runs:
        raise BadInputError(f"{directory}: no trace files found for its traced rows (moved? pass --trace FILE --config ID)")

    replays = []
    graphs = {}
    for r in runs:
        for rank, path in enumerate(r.paths):
            gs = step_graphs(path)
            graphs[(r.config_id, r.run, rank)] = gs
            replays.append({"config_id": r.config_id, "run": r.run, "rank": rank, "steps": len(gs),
                            "measured_ms": statistics.median(g.measured_us for g in gs) / 1e3,
                            "replay_error": max((replay_error(g) for g in gs), key=abs)})

    # A traced configuration's step under the profiler: per step the slowest rank, the median step.
    traced_ms = {}
    for r in runs:
        per_rank = [graphs[(r.config_id, r.run, k)] for k in range(len(r.paths))]
        steps = [max(g.measured_us for g in same) for same in zip(*per_rank)]
        if steps:
            traced_ms[(r.config_id, r.run)] = statistics.median(steps) / 1e3
    traced_rows = pd.DataFrame([r.row for r in runs if (r.config_id, r.run) in traced_ms],
                               index=pd.Index([(r.config_id, r.run) for r in runs if (r.config_id, r.run) in traced_ms],
                                              tupleize_cols=False), dtype=object)
    predictions = []
    for layout in layouts:
        bases = [r for r in runs if int(r.row.get("world_size") or 1) == 1
                 and str(r.row.get("parallelism")) in _BASES[layout]]
        bases.sort(key=lambda r: _BASES[layout].index(str(r.row.get("parallelism"))))
        if not bases:
            notes.append(f"{layout}: no one-rank traced configuration to predict from")
            continue
        base = bases[0]
        facts, per_rank = _facts(base.row, args.blocks, notes)
        gs = graphs[(base.config_id, base.run, 0)]
        profiled_s = statistics.median(g.measured_us for g in gs) / 1e6
        measured_base = base.row.get("step_time_s")
        for p in world_sizes:
            preds = sorted((what_if(g, layout=layout, world_size=p, network=network, facts=facts) for g in gs),
                           key=lambda x: x.step_s)
            pred = preds[len(preds) // 2]
            unprofiled = _measured(rows, base.row, layout, p, per_rank)
            traced = [traced_ms[key] / 1e3 for key in _at_point(traced_rows, base.row, layout, p, per_rank).index]
            # Like with like: the base's graph ran under the profiler, so a target traced too is the check.
            measured = statistics.median(traced) if traced else unprofiled
            out = _entry(pred, f"{base.config_id}/{base.run}", measured, network.extrapolation(p))
            out["measured_under_profiler"] = bool(traced)
            out["measured_unprofiled_ms"] = unprofiled * 1e3 if unprofiled else None
            if not measured:
                ws = sorted({int(w) for w in rows.get("world_size", pd.Series(dtype=float)).dropna()})
                near = min(ws, key=lambda w: abs(w - p)) if ws else None
                far = f"no measured {layout} point at {p} ranks" + (f"; the nearest measured world size is {near} ({p / near:g}x)" if near else "")
                out["extrapolation"] = "; ".join(x for x in (far, out["extrapolation"]) if x)
            if check is not None:
                out.update(check(base.row, parallelism=layout, world_size=p, batch_size=int(_batch(layout, per_rank, p))))
            predictions.append(out)
        notes.append(f"{layout}: base {base.config_id} ({base.row.get('parallelism')}, 1 rank, batch {per_rank:g}): profiled "
                     f"step {profiled_s * 1e3:.2f} ms" + (f", unprofiled {float(measured_base) * 1e3:.2f} ms"
                                                         if isinstance(measured_base, float) and measured_base == measured_base else ""))
    return replays, predictions


def _record(directory: Path, predictions: list[dict], network_source: str) -> Path:
    """Append the predictions to ``DIR/results/predict-<digest>.parquet`` (one file per base and
    network; a rerun appends, with its own ``predicted_at``: nothing recorded is replaced)."""
    import hashlib
    import time

    from ..core.results import write_rows

    bases = sorted({p["base"] for p in predictions})
    digest = hashlib.sha256(json.dumps([bases, network_source]).encode()).hexdigest()[:12]
    now = time.time()
    frame = pd.DataFrame([{
        "workload": "prediction", "status": "ok", "config_id": f"predict-{digest}", "layout": _label(p),
        "parallelism": p["layout"], "world_size": p["world_size"], "base_config": p["base"],
        "network_source": network_source, "predicted_at_unix_s": now,
        "predicted_step_time_s": p["step_ms"] / 1e3, "predicted_compute_time_s": p["compute_ms"] / 1e3,
        "predicted_exposed_comm_time_s": p["exposed_comm_ms"] / 1e3, "predicted_comm_time_s": p["comm_ms"] / 1e3,
        "predicted_bubble_time_s": p["bubble_ms"] / 1e3, "pp_schedule": p.get("schedule"),
        "n_microbatches": p.get("microbatches"),
        "predicted_tokens_per_s": p["tokens_per_s"], "predicted_scaling_efficiency": p["scaling_efficiency"],
        "measured_step_time_s": (p["measured_ms"] / 1e3) if p["measured_ms"] is not None else float("nan"),
        "measured_under_profiler": bool(p.get("measured_under_profiler")),
        "prediction_error": p["error"] if p["error"] is not None else float("nan"),
        "extrapolation": p["extrapolation"], "assumptions": json.dumps(p["assumptions"]),
        "memory_peak_bytes_per_rank": p.get("memory_peak_bytes_per_rank"), "memory_fits": p.get("fits"),
    } for p in predictions])
    path = directory / "results" / f"predict-{digest}.parquet"
    write_rows(frame, path)
    return path


#: What makes two rows the same workload (compared as text: ``model_size`` is a mapping).
_WORKLOAD = ("model", "model_size", "seq_len", "precision")


def _same_workload(rows: pd.DataFrame, base: dict) -> pd.DataFrame:
    """The rows of the base's model, size, sequence length and precision (those the base has)."""
    for col in _WORKLOAD:
        value = base.get(col)
        if col in rows and value is not None and value == value:
            rows = rows[rows[col].astype(str) == str(value)]
    return rows


def _at_point(rows: pd.DataFrame, base: dict, layout: str, p: int, per_rank: float) -> pd.DataFrame:
    """The rows of the base's workload that ran ``layout`` at ``p`` ranks with its per-rank batch."""
    same = _same_workload(rows, base)
    if any(c not in same for c in ("world_size", "parallelism", "batch_size")):
        return same.iloc[:0]
    return same[(same["world_size"] == p) & same["parallelism"].isin(_ALIASES[layout])
                & (same["batch_size"] == _batch(layout, per_rank, p))]


def _measured(rows: pd.DataFrame, base: dict, layout: str, p: int, per_rank: float) -> float | None:
    hit = _at_point(rows, base, layout, p, per_rank)
    if "step_time_s" not in hit:
        return None
    hit = hit[hit["step_time_s"].notna()]
    if "status" in hit:
        hit = hit[hit["status"] == "ok"]
    return float(hit["step_time_s"].median()) if len(hit) else None


def _render(result: dict) -> str:
    lines = []
    if result["replay"]:
        lines.append("replay (each traced step with its measured durations; the model's own check):")
        for r in result["replay"]:
            lines.append(f"  {r['config_id']}/{r['run']} rank {r['rank']}: {r['steps']} steps, median "
                         f"{r['measured_ms']:.2f} ms, worst replay error {100 * r['replay_error']:+.1f} %")
        lines.append("")
    head = (f"{'layout':<14}{'ranks':>6}{'step ms':>10}{'tokens/s':>12}{'eff':>6}{'compute':>9}{'exposed':>9}"
            f"{'bubble':>8}{'comm':>8}{'measured':>10}{'error':>8}")
    lines += ["predicted (ms; exposed: communication (pp: and schedule overhead) on the critical path):", head]
    for p in result["predictions"]:
        err = f"{100 * p['error']:+.1f}%" if p["error"] is not None else "-"
        meas = f"{p['measured_ms']:.2f}" if p["measured_ms"] is not None else "-"
        tps = f"{p['tokens_per_s']:.4g}" if math.isfinite(p["tokens_per_s"]) else "-"
        lines.append(f"{_label(p):<14}{p['world_size']:>6}{p['step_ms']:>10.2f}{tps:>12}{p['scaling_efficiency']:>6.2f}"
                     f"{p['compute_ms']:>9.2f}{p['exposed_comm_ms']:>9.2f}{p['bubble_ms']:>8.2f}{p['comm_ms']:>8.2f}"
                     f"{meas:>10}{err:>8}")
        if p["extrapolation"]:
            lines.append(f"{'':13}! {p['extrapolation']}")
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


def _label(p: dict) -> str:
    """A prediction's layout as a table and the report name it: pp with its schedule and microbatches."""
    return f"pp {p['schedule']} m{p['microbatches']}" if p["layout"] == "pp" else p["layout"]
