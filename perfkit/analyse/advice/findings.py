"""What binds each configuration, and what to try: rules of the rows, run and ranked.

A **rule** (:class:`Rule`) is a small function of a folder's rows with a threshold and the
source its threshold comes from; it returns **findings** (:class:`Finding`), each naming the
configurations it read (``config_ids``), its evidence as numbers, what to try, and where it can,
the experiment that tests the advice (:class:`Experiment`: a parameter or an environment variable
and the values to compare). The built-in rules, and those packages add by entry point, are
gathered by :mod:`perfkit.analyse.advice.rules` (which imports this module, never the reverse).

**Ranking.** Every finding states ``cost_share``: the part of the configuration's time the
constraint costs by its own evidence (the data-wait share of a step, the bubble fraction, the
straggler's delay over the step, the latency's share of a collective's time, ...), so findings of
different rules rank on one scale; the top one is the configuration's binding constraint.

**Confidence.** ``high`` when the evidence comes from steady rows; ``low`` when a row it read is
flagged ``noisy`` (its IQR over 10 % of its median) or the evidence sits within a factor
:data:`NEAR_THRESHOLD` of the threshold. A configuration whose every row is noisy gets one
finding, the ``noisy`` rule's "rerun with more samples", and no constraint: a noisy median cannot
say what binds it, unless the finding is ``robust``: its evidence holds at the favourable end of
its raw samples as well (noise only adds time: if even the fastest sample is far below the roof,
the median's noise did not put it there).
Rows that are not ``ok`` give no evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from ...core.errors import BadInputError
from ..compare_match import canon

__all__ = ["NEAR_THRESHOLD", "Experiment", "Finding", "Rule", "advise", "findings_frame", "is_note", "grouped_notes",
           # for rules (perfkit.analyse.advice.rules and a package's own)
           "finite", "flag", "is_noisy", "noisy_mask", "present", "rows_of", "notebook_of", "confidence_of",
           "confidence_below", "point_labels"]

_LABEL = "_advice_point"  # the column advise() keeps point_labels in while the rules run
NEAR_THRESHOLD = 1.5
"""Evidence under this factor of its rule's threshold is ``low`` confidence: one noisy sample
could move it across."""


@dataclass(frozen=True)
class Experiment:
    """The follow-up that tests a piece of advice: ``parameter`` (a notebook parameter) or
    ``env`` (an environment variable) at ``current`` against ``proposed`` (values as the notebook
    takes them; env values as strings)."""

    notebook: str
    parameter: str | None = None
    env: str | None = None
    current: object = None
    proposed: object = None
    metric: str | None = None
    """The column the follow-up is judged on; None: the workload's (``perfkit compare``'s
    default). A change of batch size is judged on ``samples_per_s``: its step time grows."""
    narrow: dict = field(default_factory=dict)
    """Parameter values that narrow the configuration to the finding's row where it measured
    several (a scaling run's ``world_sizes: [2]``); the rest of it runs as it ran."""
    also: dict = field(default_factory=dict)
    """More parameters the advised side changes with ``parameter`` (checkpointing is advised
    together with the larger batch it makes room for)."""


@dataclass(frozen=True)
class Finding:
    """One constraint found in one configuration (or one group of rows, e.g. a size sweep)."""

    rule: str
    constraint: str
    point: str
    """The configuration in words: notebook and the parameters that tell it apart."""
    config_ids: tuple[str, ...]
    cost_share: float
    """The part of the point's time this constraint costs, 0..1 (NaN: not a time share)."""
    evidence: dict
    """The numbers the rule read, by column name."""
    summary: str
    advice: str
    confidence: str = "high"
    source: str = ""
    experiment: Experiment | None = None
    robust: bool = False
    """True when the evidence holds at the favourable end of its raw samples too (the fastest
    GEMM sample still far below the ceiling, every step's data wait over the threshold, the low
    end of alpha's interval binding), or when the rule reads the configuration, not a timing
    (m < 4p microbatches): such a finding stands on noisy rows."""


@dataclass(frozen=True)
class Rule:
    """A rule: ``check(rows, rule)`` returns findings on the ``ok`` rows of one folder (never
    rows that are not ``ok``). ``threshold`` is the rule's own number, ``source`` where it is from."""

    name: str
    constraint: str
    threshold: float
    source: str
    check: Callable[[pd.DataFrame, "Rule"], Iterable[Finding]]
    description: str = ""

    def near(self, value: float) -> bool:
        """Whether ``value`` (in the threshold's units, larger is worse) is within
        :data:`NEAR_THRESHOLD` of the threshold."""
        return value < self.threshold * NEAR_THRESHOLD


def noisy_mask(ok: pd.DataFrame) -> pd.Series:
    """Which rows are flagged noisy (a missing flag is not a noisy row)."""
    if "noisy" not in ok:
        return pd.Series(False, index=ok.index)
    return ok["noisy"].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v))


def _noisy_configs(ok: pd.DataFrame) -> set[str]:
    """Configurations whose every row is flagged noisy."""
    per_config = noisy_mask(ok).groupby(ok["config_id"]).all()
    return set(per_config[per_config].index)


def advise(rows: pd.DataFrame, rules: Sequence[Rule]) -> list[Finding]:
    """Every rule's findings on the ``ok`` rows, ranked: per point, the largest cost first
    (``rules``: :func:`perfkit.analyse.advice.rules.all_rules`, or some of them).

    On a configuration whose every row is noisy only ``robust`` findings stand beside the
    ``noisy`` rule's "rerun"."""
    if "status" not in rows or "config_id" not in rows:
        raise BadInputError("these rows have no status or config_id column: are they perfkit results (perfkit.load)?")
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        raise BadInputError(f"no ok rows to advise on ({len(rows)} rows, statuses: "
                            f"{', '.join(sorted(rows['status'].astype(str).unique()))})")
    noisy_only = _noisy_configs(ok)
    ok = ok.copy()  # one block: a loaded folder's frame is fragmented, and a column is added
    ok[_LABEL] = point_labels(ok)  # once: every rule names its points by them
    found: list[Finding] = []
    for rule in rules:
        for f in rule.check(ok, rule):
            if rule.name != "noisy" and not f.robust and set(f.config_ids) <= noisy_only:
                continue  # a noisy median cannot say what binds it: the noisy rule says rerun
            found.append(f)
    order = {p: i for i, p in enumerate(dict.fromkeys(f.point for f in found))}
    return sorted(found, key=lambda f: (order[f.point], _rank_key(f)))


def is_note(f: Finding) -> bool:
    """A finding that costs no measured time (``cost_share`` NaN: memory headroom, a configuration's
    shape): never a point's binding constraint, and said once for every point it holds for
    (:func:`grouped_notes`). On the H200 folder one headroom note was "binding" in 8 of 14 points."""
    return not finite(f.cost_share) and f.rule != "noisy"


def grouped_notes(findings: Sequence[Finding]) -> list[tuple[str, list[Finding]]]:
    """The notes (:func:`is_note`) by rule, in the order first seen: ``[(rule name, findings)]``."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        if is_note(f):
            groups.setdefault(f.rule, []).append(f)
    return list(groups.items())


def _rank_key(f: Finding) -> tuple:
    cost = f.cost_share if f.cost_share == f.cost_share else -1.0  # NaN last
    return (f.rule == "noisy", -cost, f.confidence != "high")


def findings_frame(findings: Sequence[Finding]) -> pd.DataFrame:
    """The findings as a table, one row each, ``rank`` 1 = the point's binding constraint."""
    records = []
    rank_in_point: dict[str, int] = {}
    for f in findings:
        rank_in_point[f.point] = rank_in_point.get(f.point, 0) + 1
        d = asdict(f)
        d["config_ids"] = list(f.config_ids)
        d["rank"] = rank_in_point[f.point]
        d["note"] = is_note(f)
        records.append(d)
    columns = ["point", "rank", "rule", "constraint", "cost_share", "confidence", "robust", "summary", "advice",
               "evidence", "source", "config_ids", "experiment", "note"]
    return pd.DataFrame(records, columns=columns)


# ------------------------------------------------------------------ what the rules share


def finite(value) -> bool:
    """A real number that is not NaN or inf (column values may be None, NaN or pd.NA)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


_LABEL_SKIP = {"device", "seed", "steps", "warmup_steps", "profile", "profile_active_steps", "timeout_s"}


def point_labels(ok: pd.DataFrame) -> pd.Series:
    """Each row's configuration in words: its notebook and the parameters that differ between
    that notebook's configurations in the folder (all of them when it has one configuration)."""
    if _LABEL in ok:
        return ok[_LABEL]  # computed once by :func:`advise`
    labels = pd.Series("", index=ok.index, dtype=object)
    notebooks = ok["notebook"].fillna("(no notebook)") if "notebook" in ok else pd.Series("rows", index=ok.index)
    for nb, rows in ok.groupby(notebooks, sort=False):
        names = set()
        for text in rows.get("param_names", pd.Series(dtype=object)).dropna():
            names.update(json.loads(text) if isinstance(text, str) else list(text))
        names = sorted(n for n in names if n in rows and n not in _LABEL_SKIP)
        varying = [n for n in names if rows[n].map(canon).nunique(dropna=False) > 1] or names[:4]
        for i, row in rows.iterrows():
            values = ", ".join(f"{n}={canon(row[n])}" for n in varying if present(row[n]))
            labels[i] = f"{str(nb).removesuffix('.ipynb')}" + (f" ({values})" if values else "")
    return labels






def present(v) -> bool:
    return isinstance(v, (list, tuple, np.ndarray)) or not pd.isna(v)




def rows_of(ok: pd.DataFrame, workload: str, *columns: str) -> pd.DataFrame:
    rows = ok[ok["workload"] == workload] if "workload" in ok else ok.iloc[0:0]
    for c in columns:
        if c not in rows:
            return rows.iloc[0:0]
        rows = rows[rows[c].map(lambda v: isinstance(v, (list, np.ndarray)) or finite(v))]
    return rows


def flag(row: pd.Series, column: str) -> bool:
    """A boolean column's value, False where it is missing (NaN is not True here)."""
    value = row.get(column)
    return isinstance(value, (bool, np.bool_)) and bool(value)


def is_noisy(row: pd.Series) -> bool:
    return flag(row, "noisy")


def confidence_of(rule: Rule, value: float, *rows: pd.Series) -> str:
    noisy = any(is_noisy(r) for r in rows)
    return "low" if noisy or rule.near(value) else "high"


def confidence_below(rule: Rule, fraction: float, row: pd.Series) -> str:
    """As :func:`confidence_of` for a rule whose evidence is bad when small (a fraction of a roof)."""
    near = fraction * NEAR_THRESHOLD > rule.threshold
    return "low" if near or is_noisy(row) else "high"


def notebook_of(row: pd.Series) -> str:
    return str(row.get("notebook") or "")
