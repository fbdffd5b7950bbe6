"""``perfkit predict`` as one call: a results folder's traced steps replayed, then each layout at
each world size, matched against what the folder measured.

:func:`predict` chooses the bases (a one-rank traced configuration per layout, a measured pipeline
for ``pp``), refuses a base whose graph does not replay its own steps within
:data:`REPLAY_TOLERANCE` (unless ``force``: then every prediction from it is marked), predicts each
traced step of the base (:mod:`perfkit.analyse.predict`, :mod:`perfkit.analyse.predict_pipeline`)
and keeps their median, and puts beside each prediction the measured step at the same point (the
traced one where the base's step was traced: like with like) or how far it extrapolates. The
command (:mod:`perfkit.view.predict_cli`), a notebook and the report call it; views only render
its result.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from perfkit.core.errors import BadInputError

__all__ = ["REPLAY_TOLERANCE", "label", "predict", "prediction_rows", "record_predictions"]

REPLAY_TOLERANCE = 0.05
"""A base whose graph replays a traced step further off than this is refused (``force`` marks it)."""

_ALIASES = {"ddp": ("ddp",), "zero3": ("zero3", "fsdp"), "tp": ("tp",)}
_BASES = {"ddp": ("ddp", "none"), "zero3": ("zero3", "fsdp", "none"), "tp": ("none",)}


def _batch(layout: str, per_rank: float, p: int) -> float:
    """The global batch of ``layout`` at ``p`` ranks: data parallelism multiplies the per-rank batch,
    TP's ranks share one replica's."""
    return per_rank if layout == "tp" else per_rank * p


def predict(rows: pd.DataFrame, directory: str | Path, *, layouts: list[str], world_sizes: list[int], network=None,
            trace: str | None = None, config: str | None = None, blocks: int | None = None,
            microbatches: list[int | None] | None = None, schedule: str | None = None,
            stages_per_rank: int | None = None, memory_check=None, force: bool = False) -> dict:
    """Every layout at every world size from ``directory``'s rows (``rows``, as loaded).

    Returns ``{"replay": [...], "predictions": [...], "network": [...], "notes": [...]}``: one
    replay line per traced run and rank, one entry per prediction (:func:`_entry`'s fields). A
    layout without a base is a note; bad input is one line of :class:`BadInputError`."""
    directory = Path(directory)
    predictions, notes, replays = [], [], []
    if "pp" in layouts:
        predictions += _pipeline(rows, directory, world_sizes, microbatches or [None], notes, config=config,
                                 schedule=schedule, stages_per_rank=stages_per_rank)
    data_parallel = [x for x in layouts if x != "pp"]
    if data_parallel:
        if network is None:
            raise BadInputError(f"--layout {','.join(data_parallel)} needs --network FILE|DIR (the collectives' times)")
        replays, dp = _data_parallel(rows, directory, data_parallel, world_sizes, network, memory_check, notes,
                                     trace=trace, config=config, blocks=blocks, force=force)
        predictions += dp
    return {"replay": replays, "predictions": predictions,
            "network": network.assumptions() if network is not None else [], "notes": notes}


def _facts(row: dict, blocks: int | None, notes: list[str]):
    from perfkit.analyse.predict import ModelFacts

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
    from perfkit.analyse.trace.runs import TracedRun, traced_runs

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


def _pipeline(rows: pd.DataFrame, directory: Path, world_sizes, microbatches, notes, *, config=None, schedule=None,
              stages_per_rank=None) -> list[dict]:
    """``--layout pp``: each (ranks, microbatches) from the base pipeline configuration."""
    from perfkit.analyse.pipeline_bubble import point_reason
    from perfkit.analyse.predict_pipeline import pipeline_base, predict_pipeline

    pp = rows[(rows.get("parallelism") == "pp") & (rows.get("status") == "ok")] if "parallelism" in rows else rows.iloc[:0]
    if config:
        pp = pp[pp["config_id"] == config]
    if pp.empty:
        raise BadInputError(f"{directory}: no ok pipeline configuration{' ' + config if config else ''} to "
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
            why = point_reason(schedule or base.schedule, p, m or base.microbatches)
            if why is not None:
                notes.append(f"pp at {p} ranks: not predicted: {why}")
                continue
            pred = predict_pipeline(base, ranks=p, microbatches=m, schedule=schedule,
                                    stages_per_rank=stages_per_rank)
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
            "weak_scaling_efficiency": pred.weak_scaling_efficiency,
            "strong_scaling_efficiency": pred.strong_scaling_efficiency, "busy_share": pred.busy_share,
            "compute_ms": pred.compute_s * 1e3,
            "exposed_comm_ms": pred.exposed_comm_s * 1e3, "comm_ms": pred.comm_s * 1e3,
            "bubble_ms": pred.bubble_s * 1e3, "collectives": pred.collectives,
            "measured_ms": measured * 1e3 if measured else None,
            "error": pred.step_s / measured - 1 if measured else None,
            "extrapolation": extrapolation if not measured else None, "assumptions": pred.assumptions,
            "base_replay_error": None, "message_sizes": [], "measured_comm_ms": None}


def _data_parallel(rows, directory, layouts, world_sizes, network, check, notes, *, trace=None, config=None,
                   blocks=None, force=False):
    """DDP, ZeRO-3 and TP from a one-rank trace (:mod:`perfkit.analyse.predict`), after the replay check."""
    from perfkit.analyse.predict import median_prediction, what_if
    from perfkit.analyse.step_graph import replay_error
    from perfkit.analyse.trace.graph import step_graphs

    if rows.empty or "trace_path" not in rows.columns:
        raise BadInputError(f"{directory}: no traced configurations: run train_step.ipynb with -p profile true")
    runs = [r for r in _traced(rows, directory, trace, config) if all(p.is_file() for p in r.paths)]
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
                            "replay_error": max((replay_error(g) for g in gs), key=abs),
                            "windows": [g.window for g in gs]})

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
        facts, per_rank = _facts(base.row, blocks, notes)
        gs = graphs[(base.config_id, base.run, 0)]
        worst = max((replay_error(g) for g in gs), key=abs)
        if abs(worst) > REPLAY_TOLERANCE:
            why = (f"{layout}: the base {base.config_id}/{base.run} replays {100 * worst:+.1f} % off its measured step "
                   f"(tolerance ±{100 * REPLAY_TOLERANCE:g} %): its graph does not explain the step")
            if not force:
                raise BadInputError(f"{why}; predictions from it are refused (--force shows them, marked)")
            notes.append(why + "; shown because of --force: do not act on these predictions")
        profiled_s = statistics.median(g.measured_us for g in gs) / 1e6
        measured_base = base.row.get("step_time_s")
        for p in world_sizes:
            pred = median_prediction([what_if(g, layout=layout, world_size=p, network=network, facts=facts) for g in gs])
            here = _at_point(rows, base.row, layout, p, per_rank)  # the configurations measured at this point
            targets = list(_at_point(traced_rows, base.row, layout, p, per_rank).index)  # those traced
            unprofiled = _measured(here)
            traced = [traced_ms[key] / 1e3 for key in targets]
            # Like with like: the base's graph ran under the profiler, so a target traced too is the check.
            measured = statistics.median(traced) if traced else unprofiled
            out = _entry(pred, f"{base.config_id}/{base.run}", measured, network.extrapolation(p))
            out["base_replay_error"] = worst
            out["message_sizes"] = pred.detail.get("message_sizes", [])
            out["measured_under_profiler"] = bool(traced)
            out["measured_unprofiled_ms"] = unprofiled * 1e3 if unprofiled else None
            out["measured_comm_ms"] = _measured_comm_ms([graphs[(c, r, 0)] for c, r in targets])
            if out["measured_comm_ms"] and out["comm_ms"] and out["measured_comm_ms"] > 1.5 * out["comm_ms"]:
                notes.append(f"{layout} at {p} ranks: the traced step's collectives took {out['measured_comm_ms']:.2f} ms, "
                             f"{out['measured_comm_ms'] / out['comm_ms']:.1f}x what the network costs them "
                             f"({out['comm_ms']:.2f} ms): the standalone measurement misses their cost inside the step "
                             "(a collective waiting for the slower rank, its threads sharing the ranks' cores, copies)")
            share = _thread_share_note(base.row, here, layout, p)
            if share and share not in notes:
                notes.append(share)
            if not measured:
                ws = sorted({int(w) for w in rows.get("world_size", pd.Series(dtype=float)).dropna()})
                near = min(ws, key=lambda w: abs(w - p)) if ws else None
                far = f"no measured {layout} point at {p} ranks" + (f"; the nearest measured world size is {near} ({p / near:g}x)" if near else "")
                out["extrapolation"] = "; ".join(x for x in (far, out["extrapolation"]) if x)
            if check is not None:
                out.update(check(base.row, parallelism=layout, world_size=p, batch_size=int(_batch(layout, per_rank, p))))
            predictions.append(out)
        notes.append(f"{layout}: base {base.config_id} ({base.row.get('parallelism')}, 1 rank, batch {per_rank:g}): profiled "
                     f"step {profiled_s * 1e3:.2f} ms (the median of {len(gs)})" + (f", unprofiled {float(measured_base) * 1e3:.2f} ms"
                                                         if isinstance(measured_base, float) and measured_base == measured_base else ""))
    return replays, predictions


def _thread_share_note(base: dict, target: pd.DataFrame, layout: str, p: int) -> str | None:
    """Where a CPU base computed with more or fewer threads than each rank of the measured target
    (``cpu_threads`` sums a run's ranks): weak scaling keeps a rank's compute as the base's, so the
    comparison holds only when the base had one rank's share of the cores."""
    if str(base.get("device", "")) != "cpu" or "cpu_threads" not in target or target.empty:
        return None
    mine = base.get("cpu_threads")
    theirs = pd.to_numeric(target["cpu_threads"], errors="coerce").dropna() / p
    if mine is None or mine != mine or theirs.empty or float(theirs.median()) == float(mine):
        return None
    return (f"{layout} at {p} ranks: the base computed with {mine:g} CPU threads, each measured rank with "
            f"{float(theirs.median()):g}: its compute is not a rank's (weak scaling keeps it), so the check is not like "
            f"with like; run the base on one rank's share of the cores (e.g. taskset -c 0 perfkit sweep ...)")


def _measured_comm_ms(graphs_of_runs: list[list]) -> float | None:
    """The median over traced steps of rank 0's communication time (gloo spans, NCCL/RCCL kernels)."""
    per_step = [sum(g.dur_us[i] for i in range(len(g)) if g.is_comm(i)) / 1e3 for gs in graphs_of_runs for g in gs]
    return statistics.median(per_step) if per_step else None


def record_predictions(directory: Path, predictions: list[dict], network_source: str) -> Path:
    """Append the predictions to ``DIR/results/predict-<digest>.parquet`` (one file per base and
    network; a rerun appends, with its own ``predicted_at``: nothing recorded is replaced)."""
    from perfkit.core.results import write_rows

    frame = prediction_rows(predictions, network_source)
    path = directory / "results" / f"{frame['config_id'].iloc[0]}.parquet"
    write_rows(frame, path)
    return path


def prediction_rows(predictions: list[dict], network_source: str) -> pd.DataFrame:
    """The predictions as rows (workload ``prediction``), as ``--record`` writes them and the
    report's and the notebook's plots read them."""
    import hashlib
    import time

    bases = sorted({p["base"] for p in predictions})
    digest = hashlib.sha256(json.dumps([bases, network_source]).encode()).hexdigest()[:12]
    now = time.time()
    return pd.DataFrame([{
        "workload": "prediction", "status": "ok", "config_id": f"predict-{digest}", "layout": label(p),
        "parallelism": p["layout"], "world_size": p["world_size"], "base_config": p["base"],
        "network_source": network_source, "predicted_at_unix_s": now,
        "predicted_step_time_s": p["step_ms"] / 1e3, "predicted_compute_time_s": p["compute_ms"] / 1e3,
        "predicted_exposed_comm_time_s": p["exposed_comm_ms"] / 1e3, "predicted_comm_time_s": p["comm_ms"] / 1e3,
        "predicted_bubble_time_s": p["bubble_ms"] / 1e3, "pp_schedule": p.get("schedule"),
        "measured_comm_time_s": p["measured_comm_ms"] / 1e3 if p.get("measured_comm_ms") else float("nan"),
        "n_microbatches": p.get("microbatches"),
        "predicted_tokens_per_s": p["tokens_per_s"],
        "predicted_weak_scaling_efficiency": p["weak_scaling_efficiency"],
        "predicted_strong_scaling_efficiency": p["strong_scaling_efficiency"], "predicted_busy_share": p["busy_share"],
        "base_replay_error": p["base_replay_error"] if p["base_replay_error"] is not None else float("nan"),
        "measured_step_time_s": (p["measured_ms"] / 1e3) if p["measured_ms"] is not None else float("nan"),
        "measured_under_profiler": bool(p.get("measured_under_profiler")),
        "prediction_error": p["error"] if p["error"] is not None else float("nan"),
        "extrapolation": p["extrapolation"], "assumptions": json.dumps(p["assumptions"]),
        "memory_peak_bytes_per_rank": p.get("memory_peak_bytes_per_rank"), "memory_fits": p.get("fits"),
        "message_size_flags": "; ".join(f"{m['outside']} of {m['count']} {m['op']}: {m['flag']}"
                                        for m in p.get("message_sizes") or [] if m["outside"]) or None,
    } for p in predictions])


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


def _measured(hit: pd.DataFrame) -> float | None:
    """The median unprofiled step of the ok rows of one point (:func:`_at_point`)."""
    if "step_time_s" not in hit:
        return None
    hit = hit[hit["step_time_s"].notna()]
    if "status" in hit:
        hit = hit[hit["status"] == "ok"]
    return float(hit["step_time_s"].median()) if len(hit) else None


def label(p: dict) -> str:
    """A prediction's layout as a table and the report name it: pp with its schedule and microbatches."""
    return f"pp {p['schedule']} m{p['microbatches']}" if p["layout"] == "pp" else p["layout"]
