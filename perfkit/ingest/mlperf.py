"""MLPerf Training result logs (``:::MLLOG`` lines, mlperf-logging) as one time-to-train row.

The result is MLPerf's own: ``time_to_train_s`` = ``run_stop`` − ``run_start`` (their ``time_ms``),
the clock the rules time, and ``status`` ``ok`` only where ``run_stop`` says ``success``. Beside it:
``init_time_s`` (``init_start`` to ``init_stop``), the submission (``submission_*``), every
scalar logged before ``run_start`` (hyperparameters) as ``mlperf_<key>``, the evaluations as
``eval_accuracy_samples`` with their ``samples_count``, the final ``eval_accuracy`` (a log of
several evaluation metrics, told apart by ``metadata.metric``: a series each, ``eval_fid_samples``,
``eval_clip_samples``; a ``null`` value NaN), and the
``tracked_stats`` throughput per block as ``throughput_samples`` (the submitter's unit,
samples per second for most benchmarks). A log without ``run_stop`` did not finish: refused.
"""

from __future__ import annotations

import json
import math
import statistics

from perfkit.core.errors import BadInputError
from perfkit.ingest.parsed import ParsedRun

__all__ = ["parse"]

_PREFIX = ":::MLLOG"


def _number(value) -> float:
    """A logged value as a float; NaN where it is ``null`` (an evaluation that produced none)."""
    return math.nan if value is None else float(value)


def parse(text: str, *, source: str = "the file"):
    """Read one MLPerf Training result log (module docstring) into a ParsedRun."""
    events = []
    for number, line in enumerate(text.splitlines(), start=1):
        at = line.find(_PREFIX)
        if at < 0:
            continue  # the submitter's own output between the log lines
        try:
            event = json.loads(line[at + len(_PREFIX):])
        except json.JSONDecodeError as err:
            raise BadInputError(f"{source} line {number}: a {_PREFIX} line whose JSON does not parse ({err.msg})") from None
        if not isinstance(event, dict) or "key" not in event or "time_ms" not in event:
            raise BadInputError(f"{source} line {number}: a {_PREFIX} line without 'key' and 'time_ms'")
        events.append(event)
    if not events:
        raise BadInputError(f"{source} is not an MLPerf result log: no {_PREFIX} lines")
    first = {}
    for e in events:
        first.setdefault(e["key"], e)
    for key in ("run_start", "run_stop"):
        if key not in first:
            raise BadInputError(f"{source}: no {key} event: the run did not {'start' if key == 'run_start' else 'finish'}")
    start, stop = first["run_start"], first["run_stop"]
    run_status = (stop.get("metadata") or {}).get("status")
    row = {"workload": "mlperf_training", "benchmark": first.get("submission_benchmark", {}).get("value"),
           "time_to_train_s": (stop["time_ms"] - start["time_ms"]) / 1e3,
           "run_stop_status": run_status,
           "status": "ok" if run_status == "success" else "failed",
           "reason": None if run_status == "success" else f"run_stop status {run_status!r}, not 'success'"}
    if "init_start" in first and "init_stop" in first:
        row["init_time_s"] = (first["init_stop"]["time_ms"] - first["init_start"]["time_ms"]) / 1e3
    for e in events:
        if e["time_ms"] > start["time_ms"] or e["key"] in ("run_start", "init_start", "init_stop"):
            continue
        value = e.get("value")
        if isinstance(value, (str, int, float, bool)):
            name = e["key"] if e["key"].startswith("submission_") else f"mlperf_{e['key']}"
            row.setdefault(name, value)
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    metrics = list(dict.fromkeys((e.get("metadata") or {}).get("metric") for e in evals))
    if len(metrics) > 1:
        # Stable Diffusion logs FID and CLIP at each evaluation, told apart by metadata.metric: a
        # series each (one series of both interleaved was no metric at all).
        for metric in metrics:
            mine = [e for e in evals if (e.get("metadata") or {}).get("metric") == metric]
            name = f"eval_{str(metric).lower()}"
            row[f"{name}_samples"] = [_number(e.get("value")) for e in mine]
            row[f"{name}_samples_count"] = [(e.get("metadata") or {}).get("samples_count") for e in mine]
            row[name] = row[f"{name}_samples"][-1]
        row["eval_metrics"] = [str(m) for m in metrics]
        row["eval_accuracy"] = None
    else:
        row["eval_accuracy_samples"] = [_number(e.get("value")) for e in evals]
        row["eval_samples_count"] = [(e.get("metadata") or {}).get("samples_count") for e in evals]
        row["eval_accuracy"] = row["eval_accuracy_samples"][-1] if evals else None
    throughput = [e["value"]["throughput"] for e in events
                  if e["key"] == "tracked_stats" and isinstance(e.get("value"), dict) and "throughput" in e["value"]]
    row["throughput_samples"] = throughput
    row["throughput"] = statistics.median(throughput) if throughput else None
    row["samples_count"] = (stop.get("metadata") or {}).get("samples_count")
    facts = {"engine": "mlperf", "device_name": row.get("submission_platform")}
    return ParsedRun(rows=[row], facts=facts)
