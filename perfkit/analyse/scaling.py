"""Scaling efficiency and a per-step time breakdown: DataFrames in, DataFrames out.

Input: one row per measured point (one configuration at one world size), already reduced to the
point's median, e.g. rows of :func:`perfkit.core.results.load`. Column contract:

====================== ======== ==============================================================
column                 needed   meaning
====================== ======== ==============================================================
world_size             always   number of ranks N (int >= 1)
parallelism            always   the wrapper: ``"none"`` (plain module, only at world_size 1),
                                ``"ddp"``, ``"fsdp"``, ``"tp"``, ...
step_time_s            always   median step time of the point (> 0; NaN for a point that did
                                not produce one, e.g. status ``oom``)
global_batch_size      scaling  samples per step over all ranks
per_device_batch_size  scaling  samples per step per rank
samples_per_s          optional throughput X of the point
status                 optional rows whose status is not ``ok`` never serve as baselines
<group_by columns>     scaling  the other settings (precision, model, ...) that must match
compute_time_s         optional the same step with gradient synchronisation disabled (per step
                                the slowest rank, as for step_time_s)
rank_compute_time_s    optional each rank's median compute-only step time, a list of
                                world_size floats
optimizer_time_s       optional the optimizer step's share of the step (timed apart; part of
                                compute, never of communication), passed through
====================== ======== ==============================================================

:func:`scaling_efficiency` adds, against *both* one-device baselines (formulas.md, Scaling)
``X`` = ``none`` (parallelism "none", world_size 1: no wrapper) and ``X`` = ``wrapper`` (the
row's own parallelism at world_size 1, e.g. DDP on one rank, which isolates the wrapper's cost):

- ``scaling_mode``: ``strong`` (fixed global batch), ``weak`` (fixed per-device batch), or
  ``baseline`` for parallelism "none" rows. Baselines match on ``group_by``, and on
  ``global_batch_size`` (strong) or ``per_device_batch_size`` (weak).
- ``speedup_vs_X`` = T(1)/T(N). In weak scaling the work grows with N, so this equals the
  efficiency.
- ``efficiency_vs_X``: strong T(1)/(N·T(N)); weak T(1)/T(N).
- ``throughput_efficiency_vs_X`` = X(N)/(N·X(1)) from ``samples_per_s`` (valid for both modes;
  NaN when the column is absent).
- ``baseline_X_step_time_s`` (the T(1) used) and ``baseline_X_reason``: NaN/None when the
  baseline was found; otherwise the ratios are NaN and the reason says what is missing. A missing
  baseline is never replaced by another row.

:func:`step_breakdown` splits each step into three parts that add up to it::

    step_time_s = typical_rank_compute_time_s + straggler_time_s + exposed_comm_time_s

- ``exposed_comm_time_s`` = step_time_s − compute_time_s: the part of the step that gradient
  synchronisation adds, i.e. communication not hidden behind backward. The compute-only step
  runs the optimizer as the synchronised one does (FSDP's with zero gradients on its shards), so
  the optimizer is in compute, and ``optimizer_time_s`` says how much of it. Both times are the slowest
  rank's per step, so a straggler's extra compute is in both and cancels. Negative values are
  kept: they mean noise exceeds the communication cost.
- ``slowest_rank``, ``slowest_rank_compute_time_s`` and ``median_other_ranks_compute_time_s``
  (the median over the other ranks; for one rank, its own) from ``rank_compute_time_s``, and
  ``straggler_time_s`` = slowest_rank_compute_time_s − median_other_ranks_compute_time_s (0 for
  one rank): how long a typical rank idles at the collective waiting for the slowest one. The
  median of the *other* ranks, not of all: with two ranks the median of all is the midpoint of
  the two and would report half of the idle time.
- ``typical_rank_compute_time_s`` = compute_time_s − straggler_time_s: the compute a typical rank
  does per step.

Why compute and not step times per rank: in synchronous data parallelism every rank waits for the
others inside the gradient collective, so all ranks' *step* times are the same by construction
and their spread says nothing about stragglers. The compute-only step (no gradient sync, see
:mod:`perfkit.measuring.training.scaling_run`: DDP without its all-reduce, FSDP with its parameters kept
gathered and no reduce-scatter) lets each rank run at its own pace, with no collective to wait in.

Output columns are always present (NaN where an input is missing), so the schema does not depend
on which optional inputs a table has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfkit.core import checks
from perfkit.core.errors import BadInputError

__all__ = ["scaling_efficiency", "step_breakdown", "NO_WRAPPER"]

#: The ``parallelism`` value of a plain, unwrapped module.
NO_WRAPPER = "none"
_MODES = ("auto", "strong", "weak")
_BATCH_COLUMN = {"strong": "global_batch_size", "weak": "per_device_batch_size"}


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise BadInputError(
            f"{what} needs column(s) {', '.join(missing)}; got {', '.join(map(str, df.columns))}"
        )


def _hashable(value):
    """A dict key for a cell; NaN/None/NA all become None so missing settings match each other."""
    if value is None or (not isinstance(value, (list, tuple, np.ndarray)) and pd.isna(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def _validate_common(df: pd.DataFrame, what: str) -> None:
    _require(df, ["world_size", "parallelism", "step_time_s"], what)
    ws = df["world_size"]
    if ws.isna().any() or (ws < 1).any() or (ws != ws.round()).any():
        raise BadInputError(f"world_size must be integers >= 1, got {sorted(set(ws.tolist()))}")
    step = pd.to_numeric(df["step_time_s"])
    if (step <= 0).any() or np.isinf(step).any():
        raise BadInputError("step_time_s must be positive (or NaN for a point without a time)")
    bad = df[(df["parallelism"] == NO_WRAPPER) & (ws != 1)]
    if len(bad):
        raise BadInputError(
            f"parallelism {NO_WRAPPER!r} is only meaningful at world_size 1, "
            f"got world_size {sorted(set(bad['world_size'].tolist()))}"
        )


def _describe(key_names: Sequence[str], key: tuple) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in zip(key_names, key))


def _modes(df: pd.DataFrame, group_by: list[str], mode: str) -> pd.Series:
    """Per-row scaling mode: ``mode`` itself, or inferred per (group_by, parallelism) series."""
    out = pd.Series("baseline", index=df.index, dtype=object)
    wrapped = df["parallelism"] != NO_WRAPPER
    if mode != "auto":
        out[wrapped] = mode
        return out
    keys = group_by + ["parallelism"]
    for key, series in df[wrapped].groupby(keys, dropna=False, sort=False):
        # A fixed global batch means the same work is split over more ranks: strong scaling.
        # Checked first, so tensor parallel (every rank sees the whole batch) reads as strong.
        if series["global_batch_size"].nunique(dropna=False) == 1:
            out[series.index] = "strong"
        elif series["per_device_batch_size"].nunique(dropna=False) == 1:
            out[series.index] = "weak"
        else:
            key = key if isinstance(key, tuple) else (key,)
            raise BadInputError(
                f"cannot tell strong from weak scaling for {_describe(keys, key)}: neither "
                "global_batch_size nor per_device_batch_size is constant; pass mode= or add a "
                "batch column to group_by"
            )
    return out


def scaling_efficiency(
    points: pd.DataFrame, *, group_by: Sequence[str] = (), mode: str = "auto"
) -> pd.DataFrame:
    """Speedup and scaling efficiency of every point against both one-device baselines.

    ``group_by`` names the columns of the settings other than parallelism, world size and batch
    (precision, model size, ...): a point is only compared with a baseline that has the same
    values. ``mode`` is ``strong``, ``weak``, or ``auto`` (default): per (group_by, parallelism)
    series, strong if the global batch is constant, weak if the per-device batch is, else an
    error. Returns a copy of ``points`` with the columns of the module docstring added.
    """
    checks.one_of("mode", mode, _MODES)
    group_by = list(group_by)
    _validate_common(points, "scaling_efficiency")
    _require(points, ["global_batch_size", "per_device_batch_size", *group_by], "scaling_efficiency")
    df = points.copy()
    modes = _modes(df, group_by, mode)

    # One-device points by (parallelism, group_by..., batch column, batch value); at world_size 1
    # the global and per-device batch are the same, so either column identifies the baseline.
    singles: dict[tuple, list] = {}
    for idx, row in df[df["world_size"] == 1].iterrows():
        for column in _BATCH_COLUMN.values():
            key = (row["parallelism"], *(_hashable(row[g]) for g in group_by), column,
                   _hashable(row[column]))
            singles.setdefault(key, []).append(idx)
    for key, idxs in singles.items():
        if len(idxs) > 1:
            raise BadInputError(
                f"{len(idxs)} rows for one point (parallelism={key[0]!r}, world_size=1, "
                f"{_describe(group_by + [key[-2]], key[1:-2] + (key[-1],))}); reduce repeated "
                "runs to one row per point first"
            )

    has_status = "status" in df.columns
    has_throughput = "samples_per_s" in df.columns
    results: dict[str, list] = {}
    for idx, row in df.iterrows():
        row_mode = modes[idx]
        batch_column = _BATCH_COLUMN["strong" if row_mode == "baseline" else row_mode]
        n = int(row["world_size"])
        for label, parallelism in (("none", NO_WRAPPER), ("wrapper", row["parallelism"])):
            t1 = x1 = math.nan
            reason = None
            wanted = (parallelism, *(_hashable(row[g]) for g in group_by), batch_column,
                      _hashable(row[batch_column]))
            where = (f"parallelism={parallelism!r}, world_size=1, "
                     f"{_describe(group_by + [batch_column], wanted[1:-2] + (wanted[-1],))}")
            if label == "wrapper" and parallelism == NO_WRAPPER:
                reason = f"parallelism is {NO_WRAPPER!r}: there is no wrapper baseline"
            elif wanted not in singles:
                reason = f"no baseline row with {where}"
            else:
                base = df.loc[singles[wanted][0]]
                status = base["status"] if has_status else "ok"
                if status != "ok":
                    reason = f"baseline row with {where} has status {status!r}"
                elif pd.isna(base["step_time_s"]):
                    reason = f"baseline row with {where} has no step_time_s"
                else:
                    t1 = float(base["step_time_s"])
                    x1 = float(base["samples_per_s"]) if has_throughput else math.nan
            tn = float(row["step_time_s"])
            # formulas.md: speedup T(1)/T(N); strong efficiency T(1)/(N·T(N)); weak T(1)/T(N);
            # from throughput X(N)/(N·X(1)) in either mode.
            divisor = n if row_mode == "strong" else 1
            xn = float(row["samples_per_s"]) if has_throughput else math.nan
            for column, value in (
                (f"speedup_vs_{label}", t1 / tn),
                (f"efficiency_vs_{label}", t1 / (divisor * tn)),
                (f"throughput_efficiency_vs_{label}", xn / (n * x1)),
                (f"baseline_{label}_step_time_s", t1),
                (f"baseline_{label}_reason", reason),
            ):
                results.setdefault(column, []).append(value)
    df["scaling_mode"] = modes
    for column, values in results.items():
        dtype = object if column.endswith("reason") else float
        df[column] = pd.Series(values, index=df.index, dtype=dtype)
    return df


def _rank_times(value, world_size: int) -> np.ndarray | None:
    if _hashable(value) is None:  # None, NaN or NA: no per-rank times for this point
        return None
    times = np.asarray(value, dtype=float)
    if times.ndim != 1 or len(times) != world_size:
        raise BadInputError(
            f"rank_compute_time_s must hold one time per rank ({world_size}), "
            f"got {len(np.atleast_1d(times))}"
        )
    if not np.isfinite(times).all() or (times <= 0).any():
        raise BadInputError(
            f"rank_compute_time_s must be positive and finite, got {times.tolist()}")
    return times


def step_breakdown(points: pd.DataFrame) -> pd.DataFrame:
    """Typical compute, straggler idle and exposed communication per point (module docstring)."""
    _validate_common(points, "step_breakdown")
    df = points.copy()
    step = pd.to_numeric(df["step_time_s"]).astype(float)
    if "compute_time_s" in df.columns:
        compute = pd.to_numeric(df["compute_time_s"]).astype(float)
        if (compute <= 0).any():
            raise BadInputError("compute_time_s must be positive (or NaN)")
    else:
        compute = pd.Series(math.nan, index=df.index)
    df["compute_time_s"] = compute
    df["exposed_comm_time_s"] = step - compute

    medians, slowest, slowest_rank = [], [], []
    raw = df["rank_compute_time_s"] if "rank_compute_time_s" in df.columns else [None] * len(df)
    for value, n in zip(raw, df["world_size"]):
        times = _rank_times(value, int(n))
        if times is None:
            medians.append(math.nan)
            slowest.append(math.nan)
            slowest_rank.append(pd.NA)
        else:
            worst = int(times.argmax())
            others = np.delete(times, worst) if len(times) > 1 else times
            medians.append(float(np.median(others)))
            slowest.append(float(times[worst]))
            slowest_rank.append(worst)
    df["slowest_rank"] = pd.Series(slowest_rank, index=df.index, dtype="Int64")
    df["slowest_rank_compute_time_s"] = pd.Series(slowest, index=df.index, dtype=float)
    df["median_other_ranks_compute_time_s"] = pd.Series(medians, index=df.index, dtype=float)
    df["straggler_time_s"] = (df["slowest_rank_compute_time_s"]
                              - df["median_other_ranks_compute_time_s"])
    df["typical_rank_compute_time_s"] = compute - df["straggler_time_s"]
    return df
