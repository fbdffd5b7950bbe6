"""Inference latency metrics from per-token timestamps, by vLLM's and optimum-benchmark's definitions.

Input: one row per timed generation of ``N`` tokens, ``N + 1`` host timestamps in seconds: the
start, then the moment each token was available (the device synchronized first). A batch of
``B`` sequences is ``B`` requests sharing these timestamps: their per-request values are equal,
so percentiles over requests equal percentiles over generations.

Definitions (vLLM ``benchmarks/serve.py``, ``calculate_metrics``; ``vllm bench serve``):

- **TTFT** per request: first token − start (queueing, prefill and the first sampling).
- **E2E latency** per request: last token − start.
- **TPOT** per request: ``(e2e − TTFT) / (output tokens − 1)``, requests with one token left
  out. The prefill is in TTFT and in e2e, so it cancels: TPOT is decode time per token.
- **ITL**: the gaps between consecutive tokens of a request, pooled over all requests (never
  the start-to-first-token gap: that is TTFT, vllm#7242). The mean ITL equals the mean TPOT
  when every request has as many tokens; ITL's percentiles show the spread TPOT averages away.
- **Output throughput**: all output tokens over the summed time (vLLM: total output tokens /
  benchmark duration), here ``B · N · R / Σ e2e`` over ``R`` generations.
- Percentiles: ``numpy.percentile``'s linear interpolation (vLLM's), via
  :class:`perfkit.core.timing.Measurement`.

optimum-benchmark (``scenarios/inference``): prefill = a generation of exactly one new token,
decode = generation − prefill, so ``decode_tokens_per_s = B · (N − 1) / (e2e − TTFT)`` in
tokens/s, and prefill throughput in samples/s, ``B / TTFT``, beside perfkit's
``prefill_tokens_per_s = B · P / TTFT`` (prompt tokens processed per second; the two differ by
the prompt length P, the unit mix-up the column names prevent).

Columns (SI seconds; each metric ``m`` of ``ttft``, ``tpot``, ``itl``, ``e2e_latency``):
``m_s`` (median), ``m_mean_s``, ``m_iqr_s``, ``m_p50_s``, ``m_p90_s``, ``m_p99_s`` and the raw
``m_samples_s``. :func:`e2e_consistency` checks ``e2e ≈ TTFT + (N − 1) · TPOT`` on the medians.
This module is pure numpy: timestamps in, columns out; it never touches a device.
"""

from __future__ import annotations

import math

import numpy as np

from perfkit.core.errors import BadInputError
from perfkit.core.timing import Measurement

__all__ = ["PERCENTILES", "request_metrics", "itl_samples", "metric_columns",
           "latency_metrics", "e2e_consistency"]

#: Percentiles reported for every metric (vLLM's ``--metric-percentiles`` default is 99; p50
#: and p90 are the usual service-level objectives beside it).
PERCENTILES = (50, 90, 99)


def _timestamps(timestamps_s) -> np.ndarray:
    stamps = np.asarray(timestamps_s, dtype=float)
    if stamps.ndim != 2 or stamps.shape[0] < 1 or stamps.shape[1] < 2:
        raise BadInputError("timestamps need one row per generation: the start, then one time per "
                            f"token (at least 2 columns); got shape {stamps.shape}")
    if not np.isfinite(stamps).all() or (np.diff(stamps, axis=1) < 0).any():
        raise BadInputError("timestamps must be finite and non-decreasing along each generation")
    return stamps


def request_metrics(timestamps_s) -> dict[str, np.ndarray]:
    """Per generation: ``ttft_s``, ``e2e_latency_s``, ``tpot_s`` (NaN with one output token) and
    ``output_tokens``, from ``timestamps_s`` (``[generations, N + 1]``)."""
    stamps = _timestamps(timestamps_s)
    n = stamps.shape[1] - 1
    ttft = stamps[:, 1] - stamps[:, 0]
    e2e = stamps[:, -1] - stamps[:, 0]
    tpot = (e2e - ttft) / (n - 1) if n > 1 else np.full_like(e2e, math.nan)
    return {"ttft_s": ttft, "e2e_latency_s": e2e, "tpot_s": tpot,
            "output_tokens": np.full(len(e2e), n)}


def itl_samples(timestamps_s) -> np.ndarray:
    """Gaps between consecutive tokens, pooled over generations (empty with one token each)."""
    stamps = _timestamps(timestamps_s)
    return np.diff(stamps[:, 1:], axis=1).ravel()


def metric_columns(name: str, samples) -> dict:
    """``name_s`` (median), mean, IQR, p50/p90/p99 and the raw samples of ``samples`` (seconds);
    NaN statistics and no samples when there are none (TPOT and ITL of one-token generations)."""
    values = [float(v) for v in np.asarray(samples, dtype=float).ravel() if not math.isnan(v)]
    cols = {f"{name}_s": math.nan, f"{name}_mean_s": math.nan, f"{name}_iqr_s": math.nan,
            **{f"{name}_p{q}_s": math.nan for q in PERCENTILES}, f"{name}_samples_s": values}
    if not values:
        return cols
    m = Measurement(samples_s=tuple(values), label=name)
    cols.update({f"{name}_s": m.median_s, f"{name}_mean_s": m.mean_s, f"{name}_iqr_s": m.iqr_s,
                 **{f"{name}_p{q}_s": m.percentile(q) for q in PERCENTILES}})
    return cols


def latency_metrics(timestamps_s, *, batch_size: int, prompt_len: int,
                    prefill_samples_s=None) -> dict:
    """Every latency and throughput column of an inference row (see the module docstring).

    ``prefill_samples_s``: times of separate one-token generations (optimum-benchmark's
    prefill), giving ``prefill_time_*`` columns, ``decode_time_s`` = median e2e − median
    prefill and ``e2e_prefill_consistency`` = (prefill + (N − 1) · TPOT) / e2e − 1, a check
    between independent measurements; without them ``decode_time_s`` is the median of
    e2e − TTFT per generation. ``noisy``: IQR/median of TTFT or TPOT above 0.1.
    """
    if batch_size < 1 or prompt_len < 1:
        raise BadInputError(f"batch_size and prompt_len must be >= 1, got {batch_size}, {prompt_len}")
    per = request_metrics(timestamps_s)
    n = int(per["output_tokens"][0])
    row = {}
    for name, samples in (("ttft", per["ttft_s"]), ("tpot", per["tpot_s"]),
                          ("itl", itl_samples(timestamps_s)), ("e2e_latency", per["e2e_latency_s"])):
        row.update(metric_columns(name, samples))
    ttft, e2e, tpot = row["ttft_s"], row["e2e_latency_s"], row["tpot_s"]
    decode = float(np.median(per["e2e_latency_s"] - per["ttft_s"]))
    prefill = math.nan
    if prefill_samples_s is not None and len(prefill_samples_s):
        row.update(metric_columns("prefill_time", prefill_samples_s))
        prefill = row["prefill_time_s"]
        decode = e2e - prefill
    row.update({
        "output_tokens": n,
        "timed_generations": len(per["ttft_s"]),
        "output_tokens_per_s": batch_size * n * len(per["e2e_latency_s"]) / float(per["e2e_latency_s"].sum()),
        "prefill_tokens_per_s": batch_size * prompt_len / ttft if ttft > 0 else math.nan,
        "prefill_samples_per_s": batch_size / ttft if ttft > 0 else math.nan,
        "decode_time_s": decode,
        "decode_tokens_per_s": batch_size * (n - 1) / decode if n > 1 and decode > 0 else math.nan,
        "noisy": any(Measurement(samples_s=tuple(s), label=k).noisy
                     for k, s in (("ttft", row["ttft_samples_s"]), ("tpot", row["tpot_samples_s"])) if s),
        "e2e_consistency": e2e_consistency(ttft, tpot, e2e, n),
        "e2e_prefill_consistency": e2e_consistency(prefill, tpot, e2e, n),
    })
    return row


def e2e_consistency(ttft_s: float, tpot_s: float, e2e_latency_s: float, output_tokens: int) -> float:
    """Relative gap ``(TTFT + (N − 1) · TPOT) / e2e − 1`` of medians (NaN with one token).

    0 for each single generation by TPOT's definition, so on medians of one run's generations a
    large value means they disagree (noise); with an independently timed prefill as TTFT it
    checks that the first token of a generation costs what a prefill alone does."""
    if output_tokens < 2 or not e2e_latency_s > 0 or math.isnan(ttft_s):
        return math.nan
    return (ttft_s + (output_tokens - 1) * tpot_s) / e2e_latency_s - 1.0
