"""Rows of two sides matched into points, for :mod:`perfkit.analyse.compare` (the rules are
written there): each row's key, the metric and its raw samples, one side's and both sides' lists.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.errors import BadInputError
from . import numerics

__all__ = ["DESCRIPTORS", "WORKLOAD_METRICS", "TIMED_BY", "canon", "lower_is_better", "samples_column",
           "match_pair", "env_changes"]

DESCRIPTORS = (
    "op", "inplace", "dtype", "size", "m", "n", "k", "size_bytes", "world_size", "model",
    "batch_size", "precision", "parallelism", "seq_len", "mode", "kind", "level", "origin",
    "working_set_bytes", "family", "input_shapes", "impl", "shape",
)
"""Columns that say which point a row is, as perfkit's notebooks write them (gemm, roofline,
collectives, train_step, scaling, peaks, kernels)."""
WORKLOAD_METRICS = {
    "train_step": ("step_time_s",),
    "scaling": ("step_time_s",),
    # The step, its data wait included; loader_batch_time_s times the loader alone.
    "dataloader": ("step_time_s",),
    # vLLM's per-request latencies, each a point: TTFT (prefill), TPOT (decode), E2E. Not ITL: its
    # samples are token gaps pooled over requests (not independent draws) and its mean is TPOT.
    "inference": ("ttft_s", "tpot_s", "e2e_latency_s"),
}
"""What a row is judged on by default, by its ``workload`` (one point per metric the rows carry).
Rows of another workload: ``time_s``, else the first ``X_s`` with ``X_samples_s``, said in a note."""
_NOT_RESULTS = ("ceiling",)  # roofs a notebook measured to place its points: compared only with --metric
_STEP = "step_time_s"
TIMED_BY = {
    "train_step": dict.fromkeys(("samples_per_s", "tokens_per_s", "model_flop_per_s", "counted_flop_per_s"), _STEP),
    "scaling": dict.fromkeys(("samples_per_s", "tokens_per_s"), _STEP),
    # samples_per_s and bytes_per_s are the loader-only phase's: batch_size / its batch time.
    "dataloader": {"samples_per_s": "loader_batch_time_s", "bytes_per_s": "loader_batch_time_s",
                   "step_samples_per_s": _STEP},
    # analyse/inference.py: output rate over e2e, prefill rates over TTFT, the decode's over
    # (N - 1)·TPOT; the phases' FLOP/s and bytes/s over the phase's time (measuring/inference/generate.py).
    "inference": {"output_tokens_per_s": "e2e_latency_s",
                  **dict.fromkeys(("prefill_tokens_per_s", "prefill_samples_per_s", "prefill_flop_per_s",
                                   "prefill_bytes_per_s"), "ttft_s"),
                  **dict.fromkeys(("decode_tokens_per_s", "decode_flop_per_s", "decode_bytes_per_s",
                                   "decode_time_s"), "tpot_s")},
    "gemm": dict.fromkeys(("flop_per_s", "bytes_per_s"), "time_s"),
    "collectives": dict.fromkeys(("algbw_bytes_per_s", "busbw_bytes_per_s"), "time_s"),
}
"""Per workload, the timed column a rate is the inverse of (or a time without samples is
proportional to), by the row's definitions: where a metric without samples of its own gets them."""
_SIDE_TAGS = ("variant", "round", "variant_params")
_ENV_SKIP = ("env_json", "env_fingerprint_id")  # derived from the other env_* columns


def _plain(value):
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def canon(value):
    """A hashable, printable key value: lists as JSON, 8.0 as 8, missing as None."""
    value = _plain(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _names(text) -> tuple[str, ...] | None:
    """A JSON list of names (``param_names``, ``variant_params``); None when not recorded."""
    text = _plain(text)
    if isinstance(text, list):
        return tuple(text)
    if text is None or (not isinstance(text, str) and pd.isna(text)):
        return None
    return tuple(json.loads(text))


def _number(value) -> float | None:
    value = _plain(value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _array(value) -> np.ndarray | None:
    value = _plain(value)
    return np.asarray(value, dtype=float) if isinstance(value, list) and value else None


def _has(rows: pd.DataFrame, column: str) -> bool:
    return column in rows and rows[column].notna().any()


def samples_column(metric: str) -> str:
    """Where a metric's own raw samples are: ``X_samples_s`` of a time ``X_s``, ``X_per_s_samples``
    of a rate (unitless samples are ``<column>_samples``, as ``data_wait_share_samples``)."""
    return metric + "_samples" if metric.endswith("_per_s") else metric[:-2] + "_samples_s"


def _fallback_metric(rows: pd.DataFrame) -> str | None:
    """A row of no known workload: ``time_s``, else the first ``X_s`` with raw samples."""
    if _has(rows, "time_s") and _has(rows, "time_samples_s"):
        return "time_s"
    for col in rows.columns:
        if (col.endswith("_s") and not col.endswith(("_samples_s", "_per_s")) and _has(rows, col)
                and _has(rows, samples_column(col))):
            return col
    return None


def _workload(row) -> str | None:
    w = canon(row.get("workload"))
    return None if w is None else str(w)


def lower_is_better(metric: str) -> bool:
    if metric.endswith("_per_s"):
        return False
    if metric.endswith("_s"):
        return True
    raise BadInputError(f"metric {metric!r} has no unit that says which way is better: name a column "
                        f"ending in _s (a time: lower is better) or _per_s (a rate: higher is better)")


@dataclass(frozen=True)
class _Entry:
    """One row as a side of a point."""

    key: tuple
    pkey: tuple
    status: str
    reason: object
    samples: dict
    """Metric → raw samples (empty for a row that is not ``ok``)."""
    evidence: numerics.Evidence | None = None
    """What the row shows of its results (losses, greedy tokens, kernel errors), ``ok`` rows only."""


class _Matcher:
    """Matches one notebook's rows of a base and a new frame; gathers points and lists."""

    def __init__(self, notebook, base: pd.DataFrame, new: pd.DataFrame, *, metric, by, key, notes):
        self.notebook = notebook
        both = pd.concat([base, new], ignore_index=True)
        self.skip = {by, *_SIDE_TAGS} | {n for t in both.get("variant_params", pd.Series(dtype=object))
                                         .map(canon).dropna().unique() for n in (_names(t) or ())}
        # A descriptor one side never recorded (a column a newer perfkit added: inference rows'
        # ``model``) cannot tell its points apart: it would leave every point unmatched.
        self.dcols = [c for c in dict.fromkeys((*DESCRIPTORS, *key))
                      if c in base and c in new and c not in self.skip]
        self.metrics = self._metrics(both, metric, notes)
        self.derived, self.no_samples, self.dropped = Counter(), Counter(), 0
        if any(_names(t) is None for t in both.get("param_names", pd.Series([None])).unique()):
            notes.append(f"{notebook}: rows without param_names (recorded before perfkit recorded "
                         f"them): matched by descriptors and row order only")
        self.base, self.new = self._entries(base), self._entries(new)

    def _metrics(self, both: pd.DataFrame, metric, notes) -> dict:
        """Workload → the metrics its rows are judged on (``metric`` alone when given)."""
        nb, ok = self.notebook, both["status"].eq("ok").to_numpy()
        workloads = [_workload(r) for r in both.to_dict("records")]
        out = {}
        for w in dict.fromkeys(w for w, good in zip(workloads, ok) if good):
            rows = both[ok & np.array([x == w for x in workloads], dtype=bool)]
            if metric:
                out[w] = (metric,) if _has(rows, metric) else ()
            elif w in _NOT_RESULTS:
                out[w] = ()
            elif w in WORKLOAD_METRICS:
                out[w] = tuple(m for m in WORKLOAD_METRICS[w] if _has(rows, m))
                if not out[w]:
                    notes.append(f"{nb}: its {w} rows have none of {', '.join(WORKLOAD_METRICS[w])}; "
                                 f"not compared (pass --metric)")
            else:
                found = _fallback_metric(rows)
                out[w] = (found,) if found else ()
                what = f"rows of workload {w!r}" if w else "rows without a workload"
                notes.append(f"{nb}: {what} judged on {found} (time_s, else the first X_s with X_samples_s; "
                             f"--metric names another)" if found else
                             f"{nb}: {what} have no time column with raw samples (X_s with X_samples_s); "
                             f"not compared (pass --metric)")
        if metric and ok.any() and not any(out.values()):
            notes.append(f"{nb}: no column {metric}; its points are not compared (pass --metric)")
        return out

    def _samples(self, row, metric: str) -> np.ndarray | None:
        value = _number(row.get(metric))
        out = _array(row.get(samples_column(metric)))
        source = TIMED_BY.get(_workload(row), {}).get(metric)
        t = _array(row.get(samples_column(source))) if source else None
        t_mid = _number(row.get(source)) if source else None
        if out is not None:
            pass
        elif value is not None and t is not None and t_mid:
            # The same work each sample, timed: a rate is inverse to its time (rate_i = rate × t / t_i),
            # a time without samples proportional to it (decode time = (N − 1)·TPOT per generation).
            out = value * t_mid / t if metric.endswith("_per_s") else value * t / t_mid
            self.derived[(metric, source)] += 1
        elif value is not None:
            out = np.array([value])
            self.no_samples[metric] += 1
        else:
            return None
        good = np.isfinite(out) & (out > 0)
        self.dropped += int((~good).sum())
        return out[good] if good.any() else None

    def _entries(self, frame: pd.DataFrame) -> list[_Entry]:
        rows, out, seen = frame.to_dict("records"), [], defaultdict(int)
        for row in rows:
            params = _names(row.get("param_names")) or ()
            pkey = tuple((p, canon(row.get(p))) for p in sorted(params) if p not in self.skip)
            # A descriptor that is also a parameter (train_step's batch_size) is keyed as the
            # parameter: a failed configuration's status row carries it too, and must stay
            # descriptor-less to be matched on its parameters.
            dkey = tuple((c, v) for c in self.dcols if c not in params and (v := canon(row.get(c))) is not None)
            base_key = (pkey, dkey, row["config_id"])
            order = seen[base_key]  # counted over every row, so a row missing the metric shifts nothing
            seen[base_key] += 1
            samples = {}
            if row["status"] == "ok":
                for m in self.metrics.get(_workload(row), ()):
                    if (got := self._samples(row, m)) is not None:
                        samples[m] = got
                if not samples:
                    continue  # an ok row without these metrics measured something else
            out.append(_Entry(key=(pkey, dkey, order), pkey=pkey, status=row["status"],
                              reason=row.get("reason"), samples=samples,
                              evidence=numerics.evidence(row) if row["status"] == "ok" else None))
        return out

    def labels(self) -> dict[tuple, str]:
        """The shortest readable label per key: descriptors, parameters where they tell points apart."""
        entries = self.base + self.new
        values = defaultdict(set)
        for e in entries:
            for p, v in e.pkey:
                values[p].add(json.dumps(v, default=str))
        varying = {p for p, vs in values.items() if len(vs) > 1}
        by_d = defaultdict(set)
        for e in entries:
            if e.key[1]:
                by_d[(e.key[1], e.key[2])].add(e.pkey)
        params_needed = any(len(s) > 1 for s in by_d.values())
        repeated = {(e.key[0], e.key[1]) for e in entries if e.key[2] > 0}
        out = {}
        for e in entries:
            pkey, dkey, order = e.key
            d = dict(dkey)
            if "size" in d and all(d.get(x) == d["size"] for x in ("m", "n", "k")):
                d = {c: v for c, v in d.items() if c not in ("m", "n", "k")}  # a square GEMM: size says it
            parts = [f"{c}={v}" for c, v in d.items()]
            if params_needed or not dkey:
                parts += [f"{p}={v}" for p, v in pkey if p in varying and p not in d]
            if (pkey, dkey) in repeated:
                parts.append(f"#{order + 1}")
            out[e.key] = " ".join([str(self.notebook), *parts])
        return out


def env_changes(base: pd.DataFrame, new: pd.DataFrame, side: str) -> list[dict]:
    out = []
    for col in sorted({c for c in (*base.columns, *new.columns) if c.startswith("env_")} - set(_ENV_SKIP)):
        b = {str(canon(v)) for v in base.get(col, pd.Series(dtype=object)).dropna()}
        n = {str(canon(v)) for v in new.get(col, pd.Series(dtype=object)).dropna()}
        if b != n:
            out.append({"side": side, "field": col[4:], "base": ", ".join(sorted(b)) or "(not recorded)",
                        "new": ", ".join(sorted(n)) or "(not recorded)"})
    return out


def _metric_names(entries) -> str:
    return ", ".join(dict.fromkeys(m for e in entries for m in e.samples))


def _add_points(acc, ok_b, ok_n, info, *, base_label, new_label) -> None:
    """One point per metric both sides measured; a metric measured on one side only is listed."""
    for metric in dict.fromkeys(m for e in ok_b + ok_n for m in e.samples):
        groups_b = [e.samples[metric] for e in ok_b if metric in e.samples]
        groups_n = [e.samples[metric] for e in ok_n if metric in e.samples]
        if groups_b and groups_n:
            acc["points"].append((groups_b, groups_n, {**info, "base": base_label, "new": new_label,
                                                       "metric": metric,
                                                       "lower_is_better": lower_is_better(metric),
                                                       "evidence": ([e.evidence for e in ok_b if metric in e.samples],
                                                                    [e.evidence for e in ok_n if metric in e.samples])}))
        else:
            acc["one_side"].append({"side": base_label if groups_b else new_label, "point": info["point"],
                                    "notebook": info["notebook"], "metric": metric})


def _sample_notes(m: _Matcher, notes: list) -> None:
    nb = m.notebook
    for (metric, source), n in m.derived.items():
        how = f"{metric} × {source} / sample" if metric.endswith("_per_s") else f"{metric} × sample / {source}"
        notes.append(f"{nb}: {metric} has no samples of its own; {n} rows' samples derived from "
                     f"{samples_column(source)} as {how} (the timed work it is a rate of)")
    for metric, n in m.no_samples.items():
        notes.append(f"{nb}: {n} rows have no raw samples of {metric} (nor of a time it is the inverse of): "
                     f"compared without an interval, their single value counts as one sample")
    if m.dropped:
        notes.append(f"{nb}: {m.dropped} non-finite or non-positive samples dropped")


def match_pair(base, new, *, base_label, new_label, metric, by, key, notes, acc) -> int:
    """Match one pair of frames into ``acc`` (points as (base groups, new groups, info), ``one_side``,
    ``not_ok``, ``env``, ``uncompared``); returns how many points the two sides share."""
    shared = 0
    notebooks = sorted(set(base["notebook"]) | set(new["notebook"]))
    for nb in notebooks:
        m = _Matcher(nb, base[base["notebook"] == nb], new[new["notebook"] == nb],
                     metric=metric, by=by, key=key, notes=notes)
        labels = m.labels()
        sides = {base_label: m.base, new_label: m.new}
        by_key = {s: defaultdict(list) for s in sides}
        failed_p = {s: {e.pkey for e in es if e.status != "ok" and not e.key[1]} for s, es in sides.items()}
        all_p = {s: {e.pkey for e in es} for s, es in sides.items()}
        for s, es in sides.items():
            for e in es:
                by_key[s][e.key].append(e)
        for k in dict.fromkeys([*by_key[base_label], *by_key[new_label]]):
            eb, en = by_key[base_label].get(k, []), by_key[new_label].get(k, [])
            for s, es in ((base_label, eb), (new_label, en)):
                for e in es:
                    if e.status != "ok":
                        acc["not_ok"].append({"side": s, "point": labels[k], "status": e.status,
                                              "reason": None if canon(e.reason) is None else str(e.reason)})
            if not (eb and en):
                mine, other = (base_label, new_label) if eb else (new_label, base_label)
                failure_row = not k[1] and all(e.status != "ok" for e in eb + en)
                if failure_row and k[0] in all_p[other]:
                    continue  # a configuration that ended not ok, matched on its parameters: listed
                if k[0] not in failed_p[other]:
                    acc["one_side"].append({"side": mine, "point": labels[k], "notebook": nb,
                                            "metric": _metric_names(eb + en)})
                    continue
            shared += 1
            ok_b = [e for e in eb if e.status == "ok"]
            ok_n = [e for e in en if e.status == "ok"]
            if not (ok_b and ok_n):
                statuses = {e.status for e in eb + en}
                acc["uncompared"] += 0 if statuses == {"skipped"} and eb and en else 1
                continue
            _add_points(acc, ok_b, ok_n, {"point": labels[k], "notebook": nb},
                        base_label=base_label, new_label=new_label)
        _sample_notes(m, notes)
    acc["env"] += env_changes(base, new, new_label)
    return shared


