"""The advice rules of training and data loading: input-bound, straggler, exposed communication,
pipeline bubble, memory headroom (their thresholds and sources: perfkit.analyse.advice.rules)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from .. import dataloading
from .findings import (Experiment, Finding, Rule, confidence_of, finite, flag, is_noisy, notebook_of, point_labels,
                     rows_of)
from ..compare_match import canon

__all__ = ["input_bound", "straggler", "exposed_communication", "pipeline_bubble", "memory_headroom"]


# ------------------------------------------------------------------------------ input-bound


def _measured_workers(measured: pd.DataFrame, row: pd.Series) -> int | None:
    """The worker count :func:`perfkit.analyse.dataloading.recommend` chose for ``row``'s group
    (rows equal in its group keys), when the folder measured more than one setting there."""
    if measured.empty or "recommended_num_workers" not in measured:
        return None
    keys = [k for k in dataloading.GROUP_KEYS if k in measured and k in row]
    same = measured
    for k in keys:
        key = canon(row[k])  # canon: NaN and None are one key, 8.0 is 8
        same = same[same[k].map(lambda v: canon(v) == key)]
    if len(same) != 1 or int(same["rows_compared"].iloc[0]) < 2:
        return None
    return int(same["recommended_num_workers"].iloc[0])


#: A training row's data time that measured no input pipeline: perfkit drawing its own batch.
SYNTHETIC = "perfkit's synthetic batch"


def data_source(row: pd.Series) -> str:
    """What a ``train_step`` row's ``data_time_s`` measured (its ``data_source`` column; rows
    written before it: from ``data_delay_s`` and the model): ``data_delay_s`` (a simulated slow
    pipeline), ``the entry point's make_batch`` (a user's own batches), or :data:`SYNTHETIC` (the
    built-in, Hugging Face and torchvision models' random batch drawn on the host: no loader, no
    worker to add; on the H200, 4.1 ms of a 34 ms step once read as input-bound)."""
    if isinstance(row.get("data_source"), str):
        return row["data_source"]
    if finite(row.get("data_delay_s")) and float(row["data_delay_s"]) > 0:
        return "data_delay_s"
    model = str(row.get("model") or "")
    if ":" in model and not model.startswith(("hf:", "torchvision:")):
        return "the entry point's make_batch"
    return SYNTHETIC


def input_bound(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    loader = rows_of(ok, "dataloader", "data_wait_share", "step_time_s")
    measured = dataloading.recommend(loader) if len(loader) else pd.DataFrame()
    for i, row in loader.iterrows():
        share = float(row["data_wait_share"])
        if share <= rule.threshold:
            continue
        prep, fetch = row.get("prep_stall_s"), row.get("fetch_stall_s")
        evidence = {"data_wait_share": share, "step_time_s": float(row["step_time_s"]),
                    "data_wait_s": float(row.get("data_wait_s", math.nan)),
                    "num_workers": int(row.get("num_workers") or 0)}
        if finite(prep) and finite(fetch):
            evidence.update(prep_stall_s=float(prep), fetch_stall_s=float(fetch))
        workers = evidence["num_workers"]
        cores = int(row["env_cpu_cores_counted"]) if finite(row.get("env_cpu_cores_counted")) else None
        proposed = 2 if workers == 0 else 2 * workers
        if cores is not None:
            evidence["cpu_cores"] = cores
            proposed = min(proposed, cores) if workers < cores else None
        if finite(fetch) and finite(prep) and fetch > prep:
            what = ("fetching from storage is the larger stall (DS-Analyzer): cache the dataset, move it to "
                    "faster storage, or raise prefetch_factor")
        elif proposed is None:
            what = (f"{workers} workers already use the {cores} cores here: decoding is CPU-bound; make it cheaper "
                    f"(decode once and store the decoded form, decode on the device) or give the job more cores")
        else:
            what = (f"decode and collation run {'in the training process' if workers == 0 else f'on {workers} workers'}:"
                    f" try num_workers={proposed}")
        better = _measured_workers(measured, row)
        if better is not None and better != workers:
            what += f" (this folder measured num_workers={better} as the cheapest setting within 95 % of the best)"
        shares = row.get("data_wait_share_samples")
        robust = shares is not None and len(shares) > 0 and float(np.percentile(shares, 10)) > rule.threshold
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=share, evidence=evidence, confidence=confidence_of(rule, share, row), source=rule.source,
            robust=robust,
            summary=f"the step waits on data {share:.0%} of its time (threshold {rule.threshold:.0%})",
            advice=what,
            experiment=Experiment(notebook=notebook_of(row), parameter="num_workers", current=workers, proposed=proposed,
                                  ) if proposed is not None else None)
    steps = rows_of(ok, "train_step", "data_time_samples_s", "step_time_samples_s")
    for i, row in steps.iterrows():
        if data_source(row) == SYNTHETIC:
            continue  # no loader to add workers to: the time is perfkit drawing its own batch
        data = np.asarray(row["data_time_samples_s"], dtype=float)
        step = np.asarray(row["step_time_samples_s"], dtype=float)
        if len(data) != len(step) or not len(data):
            continue
        shares = data / (data + step)
        share = float(np.median(shares))
        if share <= rule.threshold:
            continue
        robust = float(np.percentile(shares, 10)) > rule.threshold  # nine steps in ten wait past it
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=share, confidence=confidence_of(rule, share, row), source=rule.source, robust=robust,
            evidence={"data_wait_share": share, "data_wait_share_p10": float(np.percentile(shares, 10)),
                      "data_time_s": float(np.median(data)), "step_time_s": float(np.median(step)),
                      "data_source": data_source(row)},
            summary=f"each step waits {np.median(data) * 1e3:.1f} ms for its batch, {share:.0%} of the step",
            advice=("overlap loading with compute: a DataLoader with worker processes and prefetch "
                    "(notebooks/dataloader.ipynb measures which num_workers reaches the step's ceiling)"))


# ------------------------------------------------------------------------------ scaling


def _breakdown(ok: pd.DataFrame) -> pd.DataFrame:
    from ..scaling import step_breakdown

    rows = rows_of(ok, "scaling", "step_time_s", "compute_time_s")
    rows = rows[rows["world_size"] > 1] if len(rows) else rows
    return step_breakdown(rows) if len(rows) else rows


def _beyond_spread(time_s: float, iqr_s) -> bool:
    """A time larger than the row's own step-to-step spread (its IQR) is not that spread's doing."""
    return finite(iqr_s) and time_s > float(iqr_s)


def straggler(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    for i, row in _breakdown(ok).iterrows():
        late = row.get("straggler_time_s")
        if not finite(late):
            continue
        share = float(late) / float(row["step_time_s"])
        if share <= rule.threshold:
            continue
        r = int(row["slowest_rank"])
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=share, confidence=confidence_of(rule, share, row), source=rule.source,
            robust=_beyond_spread(float(late), row.get("compute_time_iqr_s")),
            evidence={"slowest_rank": r, "slowest_rank_compute_time_s": float(row["slowest_rank_compute_time_s"]),
                      "median_other_ranks_compute_time_s": float(row["median_other_ranks_compute_time_s"]),
                      "straggler_time_s": float(late), "step_time_s": float(row["step_time_s"])},
            summary=(f"rank {r} computes {float(late) * 1e3:.1f} ms longer per step than the others' median, "
                     f"{share:.0%} of the step, and every rank waits for it"),
            advice=(f"look at rank {r}'s device and host (clocks, thermals, another process on its cores, an "
                    f"uneven data shard): the others idle while it finishes"))


def exposed_communication(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    for i, row in _breakdown(ok).iterrows():
        late = float(row["straggler_time_s"]) if finite(row.get("straggler_time_s")) else 0.0
        exposed = float(row["exposed_comm_time_s"])
        share = max(0.0, exposed - late) / float(row["step_time_s"])  # a straggler's wait is its own finding
        if share <= rule.threshold:
            continue
        par = row.get("parallelism")
        knobs = {"ddp": "a larger bucket_cap_mb (fewer, larger all-reduces), gradient_as_bucket_view, or an "
                        "fp16/bf16 compression comm_hook",
                 "fsdp": "prefetching more all-gathers ahead (fsdp_prefetch: forward and backward) or a larger "
                         "wrapping unit"}
        bucket, prefetch = row.get("bucket_cap_mb"), row.get("fsdp_prefetch")
        experiment = None
        narrow = {"world_sizes": [int(row["world_size"])]}
        if par == "ddp" and finite(bucket):
            experiment = Experiment(notebook=notebook_of(row), parameter="bucket_cap_mb", current=float(bucket),
                                    proposed=float(bucket) * 4, narrow=narrow)
        elif par == "fsdp":
            current = int(prefetch) if finite(prefetch) else 1  # rows from before the parameter: FSDP2's own
            experiment = Experiment(notebook=notebook_of(row), parameter="fsdp_prefetch", current=current,
                                    proposed=current + 1, narrow=narrow)
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=share, confidence=confidence_of(rule, share, row), source=rule.source,
            robust=_beyond_spread(exposed - late, row.get("step_time_iqr_s")),
            evidence={"step_time_s": float(row["step_time_s"]), "compute_time_s": float(row["compute_time_s"]),
                      "exposed_comm_time_s": exposed, "straggler_time_s": late},
            summary=(f"{(exposed - late) * 1e3:.1f} ms of each step is communication not hidden behind compute, "
                     f"{share:.0%} of the step"),
            advice=f"overlap more of it: {knobs.get(par, 'overlap communication with compute')}",
            experiment=experiment)


# ------------------------------------------------------------------------------ pipeline


def _microbatches_for(batch: int, target: int, current: int) -> int | None:
    """The smallest divisor of ``batch`` >= ``target`` (each microbatch the same size), else the
    largest above ``current``; None when there is none."""
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    above = [d for d in divisors if d >= target]
    if above:
        return above[0]
    more = [d for d in divisors if d > current]
    return more[-1] if more else None


def pipeline_bubble(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    rows = rows_of(ok, "train_step", "n_microbatches", "pp_stages")
    for i, row in rows.iterrows():
        m, p = int(row["n_microbatches"]), int(row["pp_stages"])
        v = int(row["stages_per_rank"]) if finite(row.get("stages_per_rank")) else 1  # pp_stages = ranks x v
        ranks = max(1, p // max(1, v))
        if v * m >= rule.threshold * ranks:
            continue
        measured, predicted = row.get("bubble_fraction"), row.get("bubble_fraction_predicted")
        share = float(measured) if finite(measured) else float(predicted) if finite(predicted) else math.nan
        target = math.ceil(rule.threshold * ranks / v)
        proposed = _microbatches_for(int(row["batch_size"]), target, m) if finite(row.get("batch_size")) else None
        after = (ranks - 1) / (v * proposed + ranks - 1) if proposed else math.nan
        advice = (f"n_microbatches={proposed} (predicted bubble {after:.0%})" if proposed else
                  f"a batch divisible into >= {target} microbatches")
        if v == 1:
            advice += ", or an interleaved schedule (Interleaved1F1B: v stages per rank divide the bubble by v)"
        evidence = {"n_microbatches": m, "pipeline_ranks": ranks, "stages_per_rank": v,
                    "bubble_fraction": float(measured) if finite(measured) else math.nan,
                    "bubble_fraction_predicted": float(predicted) if finite(predicted) else math.nan}
        note = row.get("bubble_fraction_reason")
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=share, evidence=evidence, source=rule.source, robust=True,  # m < 4p is the configuration
            confidence="low" if (isinstance(note, str) and note) or is_noisy(row) else "high",
            summary=(f"{v * m} microbatch slots on {ranks} pipeline ranks: the bubble is "
                     f"{share:.0%} of the step (predicted {evidence['bubble_fraction_predicted']:.0%})"),
            advice=f"more microbatches per step: {advice}",
            experiment=Experiment(notebook=notebook_of(row), parameter="n_microbatches", current=m, proposed=proposed,
) if proposed else None)


# ------------------------------------------------------------------------------ memory


def _checkpointing_buys_room(row: pd.Series, rule: Rule, label: str, batch: int, edge: int, step: int):
    """The batch is near its edge, but checkpointing each block's activations would let it grow."""
    edge_ac = row.get("max_batch_size_predicted_checkpointed")
    if not finite(edge_ac) or int(edge_ac) / batch < rule.threshold:
        return None
    proposed = min(int(edge_ac), 2 * batch) // step * step
    if proposed <= max(batch, edge):
        return None
    return Finding(
        rule=rule.name, constraint=rule.constraint, point=label, config_ids=(row["config_id"],),
        cost_share=math.nan, robust=True, source=rule.source,
        confidence="low" if isinstance(row.get("activation_bytes_reason"), str) else "high",
        evidence={"batch_size": batch, "max_batch_size_predicted": edge,
                  "max_batch_size_predicted_checkpointed": int(edge_ac),
                  "activation_bytes_predicted": float(row.get("activation_bytes_predicted", math.nan)),
                  "memory_budget_bytes": float(row["memory_budget_bytes"])},
        summary=(f"batch {batch} is near the predicted edge ({edge}); with activation checkpointing the "
                 f"edge is {int(edge_ac)}"),
        advice=(f"checkpoint each block's activations (activation_checkpointing=True: about a third more "
                f"compute) and grow the batch to {proposed}; worth it when the larger batch raises throughput "
                f"more than the recomputation costs"),
        experiment=Experiment(notebook=notebook_of(row), parameter="activation_checkpointing", current=False,
                              proposed=True, also={"batch_size": proposed}, metric="samples_per_s"))


def _edge_source(row: pd.Series) -> str:
    """Which prediction ``max_batch_size_predicted`` is: rows before issue 43 had the analytic one only."""
    source = row.get("max_batch_size_predicted_source")
    return source if isinstance(source, str) else "analytic model"


def memory_headroom(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    rows = rows_of(ok, "train_step", "batch_size", "max_batch_size_predicted", "memory_budget_bytes")
    for i, row in rows.iterrows():
        batch, edge = int(row["batch_size"]), int(row["max_batch_size_predicted"])
        room = edge / batch
        step = int(row["dp_size"]) if finite(row.get("dp_size")) else 1
        if room < rule.threshold:
            if not flag(row, "activation_checkpointing") and (
                    found := _checkpointing_buys_room(row, rule, labels[i], batch, edge, step)):
                yield found
            continue
        if row.get("parallelism") == "pp" and finite(row.get("n_microbatches")):
            step = int(row["n_microbatches"])
        proposed = min(edge, 4 * batch) // step * step
        peak = row.get("peak_mem_bytes_per_rank")
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=math.nan, robust=True,  # a prediction from shapes and the budget, not a timing
            confidence="low" if isinstance(row.get("activation_bytes_reason"), str) else "high", source=rule.source,
            evidence={"batch_size": batch, "max_batch_size_predicted": edge,
                      "max_batch_size_predicted_source": _edge_source(row),
                      "max_batch_size_predicted_analytic": float(row.get("max_batch_size_predicted_analytic", math.nan)),
                      "memory_budget_bytes": float(row["memory_budget_bytes"]),
                      "model_state_bytes_predicted": float(row.get("model_state_bytes_predicted", math.nan)),
                      "activation_bytes_predicted": float(row.get("activation_bytes_predicted", math.nan)),
                      "peak_mem_bytes_per_rank": float(peak[0] if isinstance(peak, (list, np.ndarray)) else peak)
                      if peak is not None and (isinstance(peak, (list, np.ndarray)) or finite(peak)) else math.nan},
            summary=(f"batch {batch} uses a {1 / room:.0%} share of the batch the memory is predicted to hold "
                     f"({edge}, by the {_edge_source(row)}, in {row.get('memory_budget_source')})"),
            advice=(f"grow the batch toward the predicted edge (batch_size={proposed} is {proposed // batch}x) while the "
                    f"step is not yet saturated: throughput rises and the fixed per-step costs spread (retune the "
                    f"learning rate); or spend the memory on a larger model or fewer checkpointed layers"),
            experiment=Experiment(notebook=notebook_of(row), parameter="batch_size", current=batch, proposed=proposed,
                                  metric="samples_per_s") if proposed > batch else None)
