"""Data-loading analyses: input-bound classification, DS-Analyzer stall arithmetic, the worker
recommendation, and the per-step breakdown. Pure pandas on :mod:`perfkit.measuring.data.loading`
rows (``workload == "dataloader"``).

**Data-wait share.** Per step, the time blocked in the loader's ``next()`` divided by the step's
wall time (``next()`` + host-to-device copy + compute). A row is ``input-bound`` when the median
of its per-step shares exceeds :data:`INPUT_BOUND_SHARE`, 5 %: the threshold above which
PyTorch's TensorBoard profiler plugin advised more DataLoader workers ("This run has high time
cost on input data loading. X% of the step time is in DataLoader. You could try to set
num_workers ...", ``RunProfileData.analyze`` in pytorch/kineto
``tb_plugin/torch_tb_profiler/profiler/data.py``: ``dataloader_ratio > 0.05``). The plugin took the
ratio of the mean DataLoader time to the mean step time; the median of per-step ratios is used
here so that one slow epoch start (workers starting) does not decide the verdict.

**Stall attribution** (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training",
VLDB 2021, DS-Analyzer): the same step timed three ways: with synthetic data already on the
device (the ingestion ceiling: compute only), with the dataset cached in memory (no fetch; decode,
collation and copy remain) and cold (from storage). Per step,
``prep_stall_s = cached - ceiling`` and ``fetch_stall_s = cold - cached``. Differences of medians
are kept signed: a small negative stall is noise and says so.

**Recommendation.** Within a group of rows that differ only in worker settings (the same
dataset, step and storage conditions: cold- and warm-cache rows, or two storage locations, are
two groups, never one where only the workers would seem to differ), the cheapest
setting whose step throughput reaches :data:`RECOMMEND_FRACTION` (95 %) of the best measured:
fewest ``num_workers``, then no pinning (pinned pages are a scarce, unswappable resource), then
the highest throughput.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pandas as pd

__all__ = ["INPUT_BOUND_SHARE", "RECOMMEND_FRACTION", "INPUT_BOUND", "COMPUTE_BOUND", "GROUP_KEYS",
           "STORAGE_KEYS", "WORKER_KEYS", "bound", "classify", "wait_shares", "stall_attribution",
           "recommend", "breakdown"]

#: Median data-wait share above which a step is input-bound (TensorBoard profiler plugin's 5 %).
INPUT_BOUND_SHARE = 0.05
#: The recommendation's target: this fraction of the best measured step throughput.
RECOMMEND_FRACTION = 0.95
INPUT_BOUND = "input-bound"
COMPUTE_BOUND = "compute-bound"
#: The settings a recommendation chooses among.
WORKER_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
               "multiprocessing_context")
#: The storage conditions of a row: where the dataset lay, whether eviction from the page cache
#: was asked and whether it happened (measured).
STORAGE_KEYS = ("cache_dir", "dataset_cache_dir", "dataset_filesystem", "evict_page_cache",
                "page_cache_evicted")
#: Rows equal in these (those present) are one group of a sweep: one recommendation each.
GROUP_KEYS = ("format", "n_samples", "sample_bytes", "rows_per_group", "decode_cost_s", "decode_clock",
              "fetch_delay_s", "batch_size", "model", "model_size", "step_compute_s", "shuffle",
              "resolved_device", *STORAGE_KEYS)


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def bound(share: float, threshold: float = INPUT_BOUND_SHARE) -> str | None:
    """``input-bound`` when ``share`` (a median data-wait share) exceeds ``threshold``, else
    ``compute-bound``; None when the share is unknown."""
    if _nan(share):
        return None
    return INPUT_BOUND if share > threshold else COMPUTE_BOUND


def classify(df: pd.DataFrame, threshold: float | None = None) -> pd.Series:
    """The bound of every row from its ``data_wait_share``, against ``threshold`` or else each
    row's ``input_bound_threshold`` (else :data:`INPUT_BOUND_SHARE`)."""
    if threshold is not None:
        limits = pd.Series(threshold, index=df.index)
    elif "input_bound_threshold" in df:
        limits = df["input_bound_threshold"].fillna(INPUT_BOUND_SHARE)
    else:
        limits = pd.Series(INPUT_BOUND_SHARE, index=df.index)
    return pd.Series([bound(s, t) for s, t in zip(df["data_wait_share"], limits)], index=df.index,
                     dtype=object)


def wait_shares(wait_s: Sequence[float], step_s: Sequence[float]) -> list[float]:
    """Per step, time blocked in ``next()`` ÷ the step's wall time (NaN for a zero-length step)."""
    if len(wait_s) != len(step_s):
        raise ValueError(f"{len(wait_s)} wait samples against {len(step_s)} step samples")
    return [w / s if s > 0 else math.nan for w, s in zip(wait_s, step_s)]


def stall_attribution(ceiling_s: float, cached_s: float, cold_s: float) -> dict:
    """DS-Analyzer's split of a cold step (seconds per step): ``prep_stall_s`` = cached − ceiling,
    ``fetch_stall_s`` = cold − cached, and each as a share of the cold step."""
    prep, fetch = cached_s - ceiling_s, cold_s - cached_s
    share = (lambda x: x / cold_s) if cold_s and cold_s > 0 else (lambda x: math.nan)
    return {"prep_stall_s": prep, "fetch_stall_s": fetch, "prep_stall_share": share(prep),
            "fetch_stall_share": share(fetch), "compute_share": share(ceiling_s)}



def _key(value):
    return "<none>" if _nan(value) else value


def recommend(df: pd.DataFrame, *, fraction: float = RECOMMEND_FRACTION,
              metric: str = "step_samples_per_s", by: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per group of ``ok`` rows (equal in ``by``, default the :data:`GROUP_KEYS` present):
    the cheapest worker setting reaching ``fraction`` of the group's best ``metric`` — among those,
    one whose step does not wait (``bound`` not ``input-bound``) when there is one: a setting with
    no slack left stalls the device at the first slow sample, however close its throughput.

    Columns: the group keys, ``recommended_<key>`` for each of :data:`WORKER_KEYS` present, the
    recommended row's ``metric`` and ``bound``, the best ``metric`` with its ``best_num_workers``
    and ``best_pin_memory``, ``fraction_of_best`` and ``rows_compared``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    rows = df[df["status"] == "ok"] if "status" in df else df
    rows = rows[rows[metric].notna()] if metric in rows else rows.iloc[0:0]
    keys = [k for k in (GROUP_KEYS if by is None else by) if k in rows]
    workers = [k for k in WORKER_KEYS if k in rows]
    out = []
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *(f"recommended_{k}" for k in workers)])
    groups = rows.groupby([rows[k].map(_key) for k in keys], sort=True) if keys else [((), rows)]
    for _, group in groups:
        best = group.loc[group[metric].idxmax()]
        good = group[group[metric] >= fraction * best[metric]].copy()
        good["_pin"] = good["pin_memory"].fillna(False).astype(bool) if "pin_memory" in good else False
        if "bound" in good and (good["bound"] == "compute-bound").any():
            good = good[good["bound"] == "compute-bound"]
        order = [c for c in ("num_workers", "_pin") if c in good] + [metric]
        chosen = good.sort_values(order, ascending=[True] * (len(order) - 1) + [False], kind="stable").iloc[0]
        out.append({**{k: chosen[k] for k in keys},
                    **{f"recommended_{k}": chosen[k] for k in workers},
                    f"recommended_{metric}": chosen[metric],
                    "recommended_bound": chosen.get("bound"),
                    f"best_{metric}": best[metric],
                    "best_num_workers": best.get("num_workers"),
                    "best_pin_memory": best.get("pin_memory"),
                    "fraction_of_best": chosen[metric] / best[metric],
                    "target_fraction": fraction,
                    "rows_compared": len(group)})
    return pd.DataFrame(out)


def breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Per row, the mean step (``mean_step_time_s``) split into ``mean_data_wait_s`` and
    ``mean_compute_s`` (everything after ``next()``: copy and compute), from the per-step samples,
    so the two add up to the mean step."""
    out = []
    for waits, steps in zip(df["data_wait_samples_s"], df["step_time_samples_s"]):
        waits, steps = list(waits) if waits is not None else [], list(steps) if steps is not None else []
        if not steps or len(waits) != len(steps):
            out.append({"mean_data_wait_s": math.nan, "mean_compute_s": math.nan, "mean_step_time_s": math.nan})
            continue
        wait = statistics.fmean(waits)
        step = statistics.fmean(steps)
        out.append({"mean_data_wait_s": wait, "mean_compute_s": step - wait, "mean_step_time_s": step})
    return pd.DataFrame(out, index=df.index)
