"""Did a change make it faster? Rows of two sides matched point by point, each point judged.

**Matching.** Points are matched within a notebook. A row's key is

1. its configuration's parameters (the columns named in ``param_names``), less the names an A/B
   variant overrides (``variant_params``, on either side), less ``by``, ``variant`` and ``round``;
2. the :data:`DESCRIPTORS` it has (the row-identity columns perfkit's notebooks write: ``op``,
   ``dtype``, ``size``, ...) and the caller's ``key`` columns;
3. its order among the rows of its configuration equal in all of the above, so a user's
   notebook without descriptors still matches row by row.

A point gathers, per side, one group of raw samples per configuration holding its key: one per
round of an A/B sweep (each round is a configuration of its own). A configuration that ended
not ``ok`` leaves a status row without descriptors: it is matched on the parameters alone,
covers the other side's points of those parameters, and is listed in ``not_ok`` (never
dropped); keys found on one side only are listed in ``one_side``, and count as not compared in
the exit code (3; 1 with ``strict``): a configuration that vanished must not pass the gate.

**Metric.** By default, by the row's ``workload``
(:data:`~perfkit.analyse.compare_match.WORKLOAD_METRICS`): training and data loading on the step
time, inference on TTFT, TPOT and e2e latency, each a point of its own; rows of another workload
on ``time_s``, else the first ``X_s`` with ``X_samples_s`` (said in a note). Any ``*_s`` (lower
is better) or ``*_per_s`` (higher is better) column may be named instead; every point carries
the metric it was judged on. Samples are the metric's own (``X_samples_s`` of a time,
``X_per_s_samples`` of a rate); without them, those of the time the row's definitions make it
the inverse of (:data:`~perfkit.analyse.compare_match.TIMED_BY`: ``decode_tokens_per_s`` from
TPOT's, a loader's ``step_samples_per_s`` from its step times) as metric × time / sample; else
the row's single value, compared without an interval (a note says so).

**Verdicts** come from :mod:`perfkit.analyse.ab_stats` (bootstrap CI over rounds widened to the
run-to-run interval, Mann–Whitney U, threshold AND significance), the p-values Holm-corrected over
every point compared. A point with one round a side cannot measure how much runs differ: its CI
holds the stated ``run_to_run`` spread (5 % unless told), and a note says how large a change that
lets it call.

**Numerics** (:mod:`perfkit.analyse.numerics`): every point also says whether the new side's
results are the base's: training losses step by step within the precision pair's tolerance,
inference's greedy tokens equal, a kernel within its tolerance of its reference — ``same``,
``differs`` (the largest deviation) or ``n/a`` (why). A point whose numerics differ fails the
gate with exit 4, however fast it is, unless ``accept_numerics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import math
from statistics import NormalDist

import numpy as np
import pandas as pd

from ..core.errors import BadInputError
from . import ab_stats, numerics
from .compare_match import DESCRIPTORS, canon, lower_is_better, match_pair

__all__ = ["DESCRIPTORS", "Comparison", "compare_frames", "compare_by"]

_POINT_COLUMNS = ("point", "notebook", "base", "new", "metric", "lower_is_better", "n_base", "n_new",
                  "rounds_base", "rounds_new", "median_base", "median_new", "ratio", "ci_low",
                  "ci_high", "p_value", "p_holm", "run_to_run", "run_to_run_df", "verdict", "why",
                  "numerics", "numerics_deviation", "numerics_basis", "numerics_why")
_VERDICT_ORDER = {"slower": 0, "inconclusive": 1, "faster": 2, "same": 3}


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Every matched point judged, and what could not be: one side only, not ``ok``, env changes."""

    points: pd.DataFrame
    """One row per compared point (columns: ``_POINT_COLUMNS``), slower first."""
    one_side: pd.DataFrame
    """Points found on one side only (or a metric of a point measured on one side only): side,
    point, notebook, metric."""
    not_ok: pd.DataFrame
    """Points not ``ok`` on a side: side, point, status, reason, configs (how many)."""
    env_changes: pd.DataFrame
    """Fingerprint fields whose values differ: side (the new label), field, base, new."""
    base_label: str
    new_labels: tuple[str, ...]
    metric: str | None
    """The metric asked for; None: each row's workload's (the ``metric`` of each point says which)."""
    threshold: float
    alpha: float
    correction: str = "holm"
    notes: tuple[str, ...] = ()
    uncompared: int = 0
    """Points matched on both sides but not compared because a side is not ``ok`` (a point
    ``skipped`` on both sides excepted: nothing was lost)."""
    strict: bool = False
    """A point not compared (on one side only, or not ``ok`` on a side) fails like a slower one."""
    run_to_run: float = ab_stats.RUN_TO_RUN
    """The spread between runs assumed where a point's rounds cannot measure it."""
    accept_numerics: bool = False
    """Points whose numerics differ do not fail the gate (they are still shown)."""

    @property
    def numerics_differ(self) -> int:
        """How many points' numerics differ."""
        return int((self.points["numerics"] == "differs").sum()) if len(self.points) else 0

    @property
    def exit_code(self) -> int:
        """4 if any point's numerics differ (unless ``accept_numerics``): a wrong result fails
        first, fast or not; else 1 if any point is slower (or, ``strict``, not compared); else 3
        if any is inconclusive, on one side only or not compared; else 0."""
        verdicts = set(self.points["verdict"]) if len(self.points) else set()
        missing = len(self.one_side) + self.uncompared
        if self.numerics_differ and not self.accept_numerics:
            return 4
        if "slower" in verdicts or (self.strict and missing):
            return 1
        return 3 if "inconclusive" in verdicts or missing else 0

    @property
    def summary(self) -> str:
        """One line: "2 slower, 5 same, 1 inconclusive (Holm over 8 points) → exit 1"."""
        counts = self.points["verdict"].value_counts() if len(self.points) else {}
        parts = [f"{counts[v]} {v}" for v in ("slower", "faster", "same", "inconclusive") if v in counts]
        if self.uncompared:
            parts.append(f"{self.uncompared} not compared (a side not ok)")
        if len(self.one_side):
            parts.append(f"{len(self.one_side)} on one side only")
        words = ", ".join(parts) or "no point compared"
        judged = self.points["numerics"].value_counts() if len(self.points) else {}
        checks = ", ".join(f"{judged[v]} {v}" for v in numerics.NUMERICS if v in judged)
        accepted = " (accepted)" if self.numerics_differ and self.accept_numerics else ""
        # Rows that record no results (GEMM, collectives) leave every point n/a: nothing to say then.
        checks = f"; numerics: {checks}{accepted}" if set(judged.keys()) - {"n/a"} else ""
        return f"{words} (Holm over {len(self.points)} points){checks} → exit {self.exit_code}"


def _check(threshold, alpha, metric, frames, key, run_to_run=ab_stats.RUN_TO_RUN) -> None:
    if not (math.isfinite(run_to_run) and 0 <= run_to_run < 1):
        raise BadInputError(f"run_to_run is a fraction (0.05 = 5 % from run to run), got {run_to_run}")
    if not 0 <= threshold < 1:
        raise BadInputError(f"threshold is a fraction (0.05 = 5 %), got {threshold}")
    if not 0 < alpha < 1:
        raise BadInputError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    columns = set().union(*(f.columns for f in frames))
    for k in key:
        if k not in columns:
            raise BadInputError(f"--key {k!r}: no such column in the rows")
    if metric is not None:
        if metric.endswith("_samples_s"):
            raise BadInputError(f"{metric} holds raw samples; name its metric instead: {metric[:-10]}_s")
        lower_is_better(metric)
        if metric not in columns:
            known = sorted(c for c in columns if c.endswith("_s") and not c.endswith("_samples_s")
                           and not c.startswith("env_"))
            raise BadInputError(f"unknown metric {metric!r}; columns that can be compared: {', '.join(known[:12])}")


def _finish(acc, *, base_label, new_labels, metric, threshold, alpha, notes, seed, strict,
            run_to_run, accept_numerics=False) -> Comparison:
    stats = [(ab_stats.compare_samples(b, n, seed=seed, run_to_run=run_to_run), info)
             for b, n, info in acc["points"]]
    checked = [numerics.judge(*info.pop("evidence")) for _, info in stats]
    p_holm = ab_stats.holm([c.p_value for c, _ in stats]) if stats else []
    judged, stated = [], []
    for (c, info), p, num in zip(stats, p_holm, checked):
        v, why = ab_stats.verdict(c, p_adjusted=p, lower_is_better=info["lower_is_better"],
                                  threshold=threshold, alpha=alpha)
        if c.run_to_run_df == 0 and c.n_base and c.n_new:
            stated.append(math.sqrt(1 / c.groups_base + 1 / c.groups_new))
        judged.append({**info, "n_base": c.n_base, "n_new": c.n_new, "rounds_base": c.groups_base,
                       "rounds_new": c.groups_new, "median_base": c.median_base, "median_new": c.median_new,
                       "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                       "p_holm": p, "run_to_run": c.run_to_run, "run_to_run_df": c.run_to_run_df,
                       "verdict": v, "why": why, "numerics": num.verdict,
                       "numerics_deviation": num.deviation, "numerics_basis": num.basis,
                       "numerics_why": num.why})
    if stated:
        # The smallest change such a point can call: its CI's run-to-run half-width, z·σ·√(1/k_b + 1/k_n).
        reach = math.exp(NormalDist().inv_cdf(0.975) * run_to_run * max(stated)) - 1
        notes.append(f"{len(stated)} of {len(judged)} points have too few rounds to measure run-to-run variation "
                     f"(fewer than 3 a side): their CI holds an assumed ±{run_to_run * 100:g} % spread between "
                     f"runs (--run-to-run), so a change under about {reach * 100:.0f} % is inconclusive there; an "
                     f"A/B sweep with rounds ≥ 3 measures the spread instead")
    points = pd.DataFrame(judged, columns=list(_POINT_COLUMNS))
    if len(points):
        worse = np.where(points["lower_is_better"], points["ratio"], 1 / points["ratio"])
        points = points.assign(_o=points["verdict"].map(_VERDICT_ORDER), _w=-worse)
        points = points.sort_values(["_o", "_w"], kind="stable").drop(columns=["_o", "_w"]).reset_index(drop=True)
    not_ok = pd.DataFrame(acc["not_ok"], columns=["side", "point", "status", "reason"])
    not_ok = (not_ok.fillna({"reason": ""}).groupby(["side", "point", "status", "reason"], sort=False)
              .size().rename("configs").reset_index())
    return Comparison(
        points=points, one_side=pd.DataFrame(acc["one_side"], columns=["side", "point", "notebook", "metric"]),
        not_ok=not_ok, env_changes=pd.DataFrame(acc["env"], columns=["side", "field", "base", "new"]),
        base_label=base_label, new_labels=tuple(new_labels), metric=metric, threshold=threshold,
        alpha=alpha, notes=tuple(dict.fromkeys(notes)), uncompared=acc["uncompared"], strict=strict,
        run_to_run=run_to_run, accept_numerics=accept_numerics)


def _prepared(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with a notebook name (rows recorded by hand have none), a status and a configuration."""
    missing = [c for c in ("status", "config_id") if c not in frame]
    if missing:
        raise BadInputError(f"these rows have no {' or '.join(missing)} column: are they perfkit results "
                            f"(perfkit.load)?")
    notebook = frame["notebook"] if "notebook" in frame else pd.Series(None, index=frame.index, dtype=object)
    return frame.assign(notebook=notebook.fillna("(no notebook)").astype(str))


def _acc() -> dict:
    return {"points": [], "one_side": [], "not_ok": [], "env": [], "uncompared": 0}


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, *, metric: str | None = None,
                   threshold: float = 0.05, alpha: float = 0.05, base_label: str = "base",
                   new_label: str = "new", key: Sequence[str] = (), seed: int = 0,
                   strict: bool = False, run_to_run: float = ab_stats.RUN_TO_RUN,
                   accept_numerics: bool = False) -> Comparison:
    """Two sets of rows (two sweeps, before and after) matched point by point and judged;
    ``strict``: a point not compared (one side only, not ok on a side) exits 1, not 3;
    ``run_to_run``: the spread between runs assumed where the rounds cannot measure it;
    ``accept_numerics``: numerics that differ are shown but do not fail the gate (exit 4)."""
    _check(threshold, alpha, metric, (base, new), key, run_to_run)
    base, new = _prepared(base), _prepared(new)
    notes = [f"{base_label} and {new_label} were measured at different times: drift between the runs "
             f"counts as a change (an A/B sweep interleaves the sides: compare DIR --by variant)"]
    for label, frame in ((base_label, base), (new_label, new)):
        if "variant" in frame and frame["variant"].nunique() > 1:
            notes.append(f"{label} holds variants {', '.join(map(str, frame['variant'].dropna().unique()))}, "
                         f"pooled here; compare them with --by variant")
    acc = _acc()
    shared = match_pair(base, new, base_label=base_label, new_label=new_label, metric=metric, by=None,
                         key=tuple(key), notes=notes, acc=acc)
    if not shared:
        raise BadInputError(f"{base_label} and {new_label} have no configuration in common "
                            f"(notebooks: {', '.join(map(str, base['notebook'].dropna().unique())) or 'none'} "
                            f"vs {', '.join(map(str, new['notebook'].dropna().unique())) or 'none'})")
    return _finish(acc, base_label=base_label, new_labels=(new_label,), metric=metric,
                   threshold=threshold, alpha=alpha, notes=notes, seed=seed, strict=strict,
                   run_to_run=run_to_run, accept_numerics=accept_numerics)


def compare_by(frame: pd.DataFrame, *, by: str, base: str, metric: str | None = None,
               threshold: float = 0.05, alpha: float = 0.05, key: Sequence[str] = (),
               seed: int = 0, strict: bool = False, run_to_run: float = ab_stats.RUN_TO_RUN,
               accept_numerics: bool = False) -> Comparison:
    """Every other value of column ``by`` (an A/B sweep's ``variant``) against ``base``."""
    if by not in frame:
        splits = [c for c in frame.columns if not c.startswith("env_") and frame[c].map(canon).nunique() in range(2, 21)
                  and not str(c).endswith(("_s", "_bytes", "_flop"))]
        raise BadInputError(f"no column {by!r} in the rows; columns that split them: {', '.join(splits[:10]) or 'none'}")
    values = frame[by].map(canon)
    labels = [str(v) for v in dict.fromkeys(values.dropna())]
    if str(base) not in labels:
        raise BadInputError(f"--base {base!r} is not a value of {by!r}; its values: {', '.join(labels)}")
    if len(labels) < 2:
        raise BadInputError(f"{by!r} has only the value {labels[0] if labels else 'none'}: nothing to compare against")
    _check(threshold, alpha, metric, (frame,), key, run_to_run)
    frame, notes, acc = _prepared(frame), [], _acc()
    text = values.map(lambda v: None if v is None else str(v))
    base_rows = frame[text == str(base)]
    new_labels = [v for v in labels if v != str(base)]
    for label in new_labels:
        match_pair(base_rows, frame[text == label], base_label=str(base), new_label=label, metric=metric,
                    by=by, key=tuple(key), notes=notes, acc=acc)
    if values.isna().any():
        notes.append(f"{int(values.isna().sum())} rows without a value of {by!r} were left out")
    return _finish(acc, base_label=str(base), new_labels=new_labels, metric=metric,
                   threshold=threshold, alpha=alpha, notes=notes, seed=seed, strict=strict,
                   run_to_run=run_to_run, accept_numerics=accept_numerics)
