"""vLLM's serving benchmark results as perfkit's inference rows.

``vllm bench serve --save-result`` (and ``benchmarks/benchmark_serving.py`` before it) writes one
JSON object per run: vLLM ≈0.6 (``*_latency_ms``, ``input_throughput``), ≈0.9 (runs appended one
per line, user ``--metadata`` keys mixed in, the key ``"request_goodput:"`` with its colon) and
0.25 (``e2el``, ``failed``, ``max_output_tokens_per_s``); ``vllm bench sweep`` leaves one such file
per run (``run=N.json``; its ``summary.json`` repeats them and is not read). One row per run:

- latencies in perfkit's inference columns, in seconds: ``{ttft,tpot,itl,e2e_latency}_s`` is
  vLLM's median, ``*_mean_s``, ``*_std_s`` and ``*_pNN_s`` its mean, std and percentiles, under
  vLLM's own definitions, which perfkit's analysis already follows (:mod:`perfkit.analyse.inference`);
- the per-request arrays where the file has them, as raw samples (``ttft_samples_s``, ``itl_samples_s``);
- throughput: ``requests_per_s``, ``output_tokens_per_s``, ``input_tokens_per_s``,
  ``tokens_per_s``, ``peak_output_tokens_per_s``, ``goodput_requests_per_s``;
- the load: ``request_rate_per_s`` (inf for "all at once"), ``max_concurrency``, and, for the
  report's axes, ``prompt_len`` (mean prompt tokens of the completed requests) and
  ``batch_size`` (``max_concurrency``: the most requests in flight, None when unbounded);
- everything else the file says that is a scalar, as ``vllm_<key>`` (the model, the backend,
  ``--metadata``).

A run whose every request failed (vLLM exits 0 and writes 0.0 for every latency) is ``failed``
with its latencies NaN: a 0 ms TTFT there is no measurement.
"""

from __future__ import annotations

import math
import re
import statistics

from perfkit.core.errors import BadInputError
from perfkit.ingest.parsed import ParsedRun, json_records

__all__ = ["parse", "METRICS"]

#: vLLM's metric names -> perfkit's (``e2el`` since 0.7, ``latency`` before it).
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e_latency", "latency": "e2e_latency"}
_STAT = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|latency)_ms$")
_THROUGHPUT = {"request_throughput": "requests_per_s", "output_throughput": "output_tokens_per_s",
               "input_throughput": "input_tokens_per_s", "total_token_throughput": "tokens_per_s",
               "max_output_tokens_per_s": "peak_output_tokens_per_s", "request_goodput": "goodput_requests_per_s"}
_COUNTS = ("num_prompts", "completed", "failed", "total_input_tokens", "total_output_tokens",
           "max_concurrency", "max_concurrent_requests", "run_number")
_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def _objects(text: str, source: str) -> list[dict]:
    """The file's result objects: one JSON object, or one per line (appended runs)."""
    objects = json_records(text, source)
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict) or not any(_STAT.match(k) for k in obj):
            raise BadInputError(f"{source} is not a vLLM benchmark result: object {i + 1} has no "
                                "'<mean|median|pNN>_<ttft|tpot|itl>_ms' keys")
    return objects


def _rate(value) -> float:
    if value in ("inf", "Infinity", None):
        return math.inf if value is not None else math.nan
    return float(value)


def _succeeded(obj: dict) -> list[bool]:
    """Which of the file's per-request entries are of successful requests: an empty ``errors``
    entry (vLLM's ``RequestFuncOutput.error`` is "" unless the request failed); all of them where
    the file keeps no errors."""
    n = max((len(obj[k]) for k in ("ttfts", "itls", "output_lens") if isinstance(obj.get(k), list)), default=0)
    errors = obj.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        return [not e for e in errors]
    return [True] * n


def _row(obj: dict) -> dict:
    obj = {k.rstrip(":"): v for k, v in obj.items()}  # "request_goodput:" (vLLM ≈0.9)
    completed = obj.get("completed")
    row: dict = {"workload": "inference", "engine": "vllm"}
    for key, value in obj.items():
        if m := _STAT.match(key):
            stat, metric = m.groups()
            name = METRICS[metric]
            column = {"median": f"{name}_s", "mean": f"{name}_mean_s", "std": f"{name}_std_s"}.get(
                stat, f"{name}_{stat.replace('.', '_')}_s")
            row[column] = None if value is None else float(value) / 1e3
        elif key in _THROUGHPUT:
            row[_THROUGHPUT[key]] = None if value is None else float(value)
        elif key in _COUNTS:
            row[key] = None if value is None else int(value)
        elif key == "request_rate":
            row["request_rate_per_s"] = _rate(value)
        elif key == "duration":
            row["duration_s"] = float(value)
        elif key not in _ARRAYS and (value is None or isinstance(value, (str, int, float, bool))):
            row[f"vllm_{key}"] = value
    # vLLM saves every request's ttft, itls and output length, a failed one's as its defaults (ttft
    # 0.0, no itls, length 0) beside its error text; its medians and means are of the successful
    # requests only (calculate_metrics reads outputs[i].success): so are the samples kept here.
    ok = _succeeded(obj)
    if "ttfts" in obj:
        row["ttft_samples_s"] = [float(x) for x, good in zip(obj["ttfts"], ok) if good]
    if "itls" in obj:
        row["itl_samples_s"] = [float(x) for request, good in zip(obj["itls"], ok) if good for x in request]
    if "output_lens" in obj:
        row["output_len_samples"] = [int(x) for x, good in zip(obj["output_lens"], ok) if good]
    row["failed_requests"] = (int(obj["failed"]) if isinstance(obj.get("failed"), (int, float))
                              else ok.count(False) if "errors" in obj else None)
    row["model"] = obj.get("model_id")
    row["prompt_len"] = (round(obj["total_input_tokens"] / completed)
                         if completed and obj.get("total_input_tokens") is not None else None)
    row["batch_size"] = row.get("max_concurrency")
    if not completed:
        row["status"] = "failed"
        row["reason"] = (f"every request failed (completed {completed}, failed {obj.get('failed')}): vLLM "
                         "wrote 0 for its latencies and throughputs, which are not measurements")
        for column in list(row):
            if column.endswith("_s") and column != "request_rate_per_s" and row[column] is not None:
                row[column] = math.nan
    else:
        row["status"], row["reason"] = "ok", None
    return row


def parse(text: str, *, source: str = "the file"):
    """Read one vLLM benchmark result file (module docstring) into a ParsedRun."""
    objects = _objects(text, source)
    rows = [_row(obj) for obj in objects]
    facts = {"engine": "vllm"}  # a result file names no device, host or vLLM version
    for r in rows:
        samples = r.get("ttft_samples_s")
        if samples and r["status"] == "ok" and r.get("ttft_s") is not None:
            # The file's median is of these very requests: a mismatch is a corrupt or mixed file.
            if not math.isclose(statistics.median(samples), r["ttft_s"], rel_tol=1e-9, abs_tol=1e-12):
                raise BadInputError(f"{source}: median of its ttfts {statistics.median(samples):.6g} s is not its "
                                    f"median_ttft_ms {r['ttft_s'] * 1e3:.6g}")
    return ParsedRun(rows=rows, facts=facts)
