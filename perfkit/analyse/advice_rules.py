"""perfkit's built-in advice rules (:mod:`perfkit.analyse.advice` runs and ranks them).

Each rule reads columns that perfkit's notebooks record, compares one number with its threshold,
and says where the threshold comes from. A rule finds nothing where its columns are absent: no
finding is ever made of evidence that is not in the rows.

=========================  ==================================================  =====================
rule                       evidence (columns)                                  threshold, source
=========================  ==================================================  =====================
input_bound                dataloader: data_wait_share (median of per-step     5 % of the step:
                           shares), prep/fetch stalls; train_step: per-step     tb_plugin's
                           data_time / (data_time + step_time)                 ``dataloader_ratio``
straggler                  scaling: rank_compute_time_s (analyse.scaling's     10 % of the step:
                           step_breakdown: slowest rank vs the others)         the noisy flag's bound
exposed_communication      scaling: step_time_s - compute_time_s - straggler   10 % of the step
pipeline_bubble            train_step: bubble_fraction(_predicted),            m >= 4 p: GPipe
                           n_microbatches, pp_stages                           (Huang et al. 2019)
collectives_latency_bound  collectives: alpha through the smallest and         alpha >= 1/2 of the
                           largest size's fastest samples (and commfit's fit)  largest size's time
gemm_below_ceiling         gemm: flop_per_s against the folder's compute       50 % of the ceiling
                           ceiling or its best GEMM of the dtype
noisy                      noisy (IQR over 10 % of the median)                 core.timing's flag
=========================  ==================================================  =====================
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from . import dataloading
from ..core.errors import BadInputError
from .advice import (Experiment, Finding, Rule, confidence_below, confidence_of, finite, flag, hashable,
                     is_noisy, notebook_of, point_labels, present, rows_of, shown)

__all__ = ["ENTRY_POINT_GROUP", "RULES", "all_rules", "select_rules"]

ENTRY_POINT_GROUP = "perfkit.advice_rules"
"""Where a package registers its own rules: each entry a :class:`~perfkit.analyse.advice.Rule`
or a list of them (``[project.entry-points."perfkit.advice_rules"]`` in its pyproject.toml)."""

# ------------------------------------------------------------------------------ input-bound


def _measured_workers(measured: pd.DataFrame, row: pd.Series) -> int | None:
    """The worker count :func:`perfkit.analyse.dataloading.recommend` chose for ``row``'s group
    (rows equal in its group keys), when the folder measured more than one setting there."""
    if measured.empty or "recommended_num_workers" not in measured:
        return None
    keys = [k for k in dataloading.GROUP_KEYS if k in measured and k in row]
    same = measured
    for k in keys:
        same = same[same[k].map(hashable).eq(hashable(row[k])) | (same[k].isna() & pd.isna(row[k]))]
    if len(same) != 1 or int(same["rows_compared"].iloc[0]) < 2:
        return None
    return int(same["recommended_num_workers"].iloc[0])


def _input_bound(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
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
                      "data_time_s": float(np.median(data)), "step_time_s": float(np.median(step))},
            summary=f"each step waits {np.median(data) * 1e3:.1f} ms for its batch, {share:.0%} of the step",
            advice=("overlap loading with compute: a DataLoader with worker processes and prefetch "
                    "(notebooks/dataloader.ipynb measures which num_workers reaches the step's ceiling)"))


# ------------------------------------------------------------------------------ scaling


def _breakdown(ok: pd.DataFrame) -> pd.DataFrame:
    from .scaling import step_breakdown

    rows = rows_of(ok, "scaling", "step_time_s", "compute_time_s")
    rows = rows[rows["world_size"] > 1] if len(rows) else rows
    return step_breakdown(rows) if len(rows) else rows


def _beyond_spread(time_s: float, iqr_s) -> bool:
    """A time larger than the row's own step-to-step spread (its IQR) is not that spread's doing."""
    return finite(iqr_s) and time_s > float(iqr_s)


def _straggler(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
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


def _exposed_communication(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
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
                 "fsdp": "prefetching the next all-gather (forward/backward prefetch) or a larger wrapping unit"}
        bucket = row.get("bucket_cap_mb")
        experiment = None
        if par == "ddp" and finite(bucket):
            experiment = Experiment(notebook=notebook_of(row), parameter="bucket_cap_mb", current=float(bucket),
                                    proposed=float(bucket) * 4, narrow={"world_sizes": [int(row["world_size"])]})
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


def _pipeline_bubble(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
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


# ------------------------------------------------------------------------------ collectives


def _fastest(rows: pd.DataFrame) -> float:
    """The fastest time seen at these rows' size: their raw samples' minimum, else their ``time_s``."""
    samples = [min(v) for v in rows.get("time_samples_s", pd.Series(dtype=object))
               if isinstance(v, (list, np.ndarray)) and len(v)]
    return float(min(samples)) if samples else float(rows["time_s"].min())


def _collectives_latency_bound(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """The latency's share of the largest message's time, t = alpha + S/beta through the smallest
    and the largest size at their *fastest* samples (noise only adds time, so those are nearest
    the link's own): share = 1 - (t_max - t_min)/t_max * S_max/(S_max - S_min), in [0, 1]. It is
    the alpha-beta fit's alpha over t_max with two points, and holds where noise leaves the fit
    bad; the fit (analyse/commfit.py) is given beside it when it describes the series."""
    from .commfit import DEFAULT_BY, fit_alpha_beta

    rows = rows_of(ok, "collectives", "size_bytes", "time_s")
    if rows.empty:
        return
    by = [c for c in DEFAULT_BY if c in rows]
    keys = [rows[c].map(lambda v: "" if not present(v) else hashable(v)) for c in by]
    for _, group in (rows.groupby(keys, sort=False) if by else [((), rows)]):
        s_min, s_max = float(group["size_bytes"].min()), float(group["size_bytes"].max())
        if s_max < 4 * s_min:
            continue  # sizes too close together to separate latency from bandwidth
        t_min, t_max = _fastest(group[group["size_bytes"] == s_min]), _fastest(group[group["size_bytes"] == s_max])
        share = min(1.0, max(0.0, 1 - (t_max - t_min) / t_max * s_max / (s_max - s_min)))
        if share < rule.threshold:
            continue
        fit = fit_alpha_beta(group).iloc[0]
        first = group.iloc[0]
        yield Finding(
            rule=rule.name, constraint=rule.constraint,
            point=(f"{notebook_of(first).removesuffix('.ipynb')} ({first.get('op')}"
                   f"{', in-place' if flag(first, 'inplace') else ''}, {shown(first.get('world_size'))} ranks)"),
            config_ids=tuple(dict.fromkeys(group["config_id"])), cost_share=share, source=rule.source,
            robust=True, confidence="low" if rule.near(share) else "high",
            evidence={"min_size_bytes": s_min, "max_size_bytes": s_max, "fastest_min_size_time_s": t_min,
                      "fastest_max_size_time_s": t_max, "latency_share_at_max_size": share,
                      "fit_alpha_s": float(fit["alpha_s"]) if fit["fit_ok"] and finite(fit["alpha_s"]) else math.nan,
                      "fit_note": fit["fit_note"]},
            summary=(f"a {int(s_max / s_min)}x larger message ({int(s_min)} -> {int(s_max)} B) takes "
                     f"{t_max * 1e6:.0f} us against {t_min * 1e6:.0f} us (fastest samples): {share:.0%} of the "
                     f"largest's time is per-call latency"),
            advice=("send fewer, larger messages: bucket gradients (DDP bucket_cap_mb, FSDP's flat parameters) "
                    "or coalesce small collectives; measure larger sizes to see the bandwidth regime"))


# ------------------------------------------------------------------------------ GEMM


def _gemm_below_ceiling(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    labels = point_labels(ok)
    rows = rows_of(ok, "gemm", "flop_per_s")
    if rows.empty:
        return
    ceilings = ok[(ok.get("workload") == "ceiling") & (ok.get("kind") == "compute")] if "kind" in ok else ok.iloc[0:0]
    for dtype, group in rows.groupby(rows["dtype"].fillna("?")):
        roof = ceilings[ceilings["dtype"] == dtype]["value"].max() if len(ceilings) else math.nan
        origin = "the folder's measured compute ceiling"
        if not finite(roof):
            if len(group) < 2:
                continue  # one GEMM and no ceiling: nothing to hold it against
            roof, origin = float(group["flop_per_s"].max()), "the fastest GEMM of this dtype in the folder"
        for i, row in group.iterrows():
            fraction = float(row["flop_per_s"]) / roof
            if fraction >= rule.threshold:
                continue
            # Noise only adds time: the fastest sample's rate is the most the GEMM was seen to reach.
            samples = row.get("time_samples_s")
            best = (fraction * float(row["time_s"]) / min(samples)
                    if finite(row.get("time_s")) and samples is not None and len(samples) else math.nan)
            robust = finite(best) and best < rule.threshold
            yield Finding(
                rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
                cost_share=1 - fraction, confidence=confidence_below(rule, fraction, row) if robust else "low",
                source=rule.source, robust=robust,
                evidence={"flop_per_s": float(row["flop_per_s"]), "ceiling_flop_per_s": float(roof),
                          "fraction_of_ceiling": fraction, "fastest_sample_fraction_of_ceiling": best,
                          "m": row.get("m"), "n": row.get("n"), "k": row.get("k")},
                summary=(f"reaches {fraction:.0%} of {origin} ({float(roof) / 1e9:.1f} GFLOP/s); its fastest "
                         f"sample {best:.0%}"),
                advice=("too small to fill the device: fixed per-call cost dominates. Batch such GEMMs (bmm, "
                        "grouped GEMM), fuse them (torch.compile) or grow the shapes"))


# ------------------------------------------------------------------------------ noise


def _noisy(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """One finding per point with noisy rows: how many of its rows, and the widest spread."""
    if "noisy" not in ok:
        return
    labels = point_labels(ok)
    flagged = ok["noisy"].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v))
    for point, rows in ok.groupby(labels, sort=False):
        noisy = rows[flagged[rows.index]]
        if noisy.empty:
            continue
        spreads = []
        for _, row in noisy.iterrows():
            metric = next((c for c in ("step_time_s", "time_s", "ttft_s", "loader_batch_time_s")
                           if finite(row.get(c)) and finite(row.get(f"{c.removesuffix('_s')}_iqr_s"))), None)
            if metric:
                spreads.append((float(row[f"{metric.removesuffix('_s')}_iqr_s"]) / float(row[metric]), metric))
        widest, metric = max(spreads) if spreads else (math.nan, None)
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=point,
            config_ids=tuple(dict.fromkeys(noisy["config_id"])), cost_share=math.nan, confidence="low",
            source=rule.source,
            evidence={"noisy_rows": len(noisy), "rows": len(rows), "widest_iqr_over_median": widest, "metric": metric},
            summary=(f"{len(noisy)} of its {len(rows)} rows {'is' if len(noisy) == 1 else 'are'} noisy"
                     + (f" (widest: {metric} IQR {widest:.0%} of the median)" if finite(widest) else "")),
            advice=("rerun with more samples (steps, min_run_time_s, iters) or rounds, on a quieter machine: a "
                    "noisy median cannot say what binds it"))


RULES: tuple[Rule, ...] = (
    Rule("input_bound", "input-bound", dataloading.INPUT_BOUND_SHARE,
         "pytorch/kineto tb_plugin RunProfileData.analyze: DataLoader > 5 % of the step -> more workers; "
         "Mohan et al., VLDB 2021 (DS-Analyzer) for fetch vs preprocessing stalls", _input_bound,
         "the step waits on its input"),
    Rule("straggler", "straggler", 0.10,
         "perfkit: a rank slower than the others by more than the noisy flag's 10 % spread "
         "(analyse/scaling.py step_breakdown)", _straggler, "one rank's compute is late and every rank waits"),
    Rule("exposed_communication", "exposed communication", 0.10,
         "perfkit: step - compute-only step (gradient sync disabled), less the straggler's wait "
         "(analyse/scaling.py step_breakdown)", _exposed_communication, "communication not hidden behind compute"),
    Rule("pipeline_bubble", "pipeline bubble", 4.0,
         "Huang et al., GPipe (NeurIPS 2019): the bubble is negligible when microbatches >= 4 x stages; "
         "bubble (p-1)/(v m+p-1), Narayanan et al. SC'21", _pipeline_bubble,
         "too few microbatches for the pipeline's depth"),
    Rule("collectives_latency_bound", "latency-bound collectives", 0.5,
         "Hockney alpha-beta model: below S_1/2 = alpha beta the per-call latency is over half the time "
         "(analyse/commfit.py)", _collectives_latency_bound, "messages too small for the link's bandwidth"),
    Rule("gemm_below_ceiling", "far below the compute ceiling", 0.5,
         "roofline (Williams et al., CACM 2009): attained FLOP/s against the measured compute roof",
         _gemm_below_ceiling, "a GEMM that reaches under half of what the device reaches"),
    Rule("noisy", "noisy measurement", 0.10,
         "perfkit core/timing.py: IQR over 10 % of the median flags a point noisy (DESIGN.md)", _noisy,
         "the measurement cannot tell: rerun"),
)


def all_rules() -> list[Rule]:
    """The built-in rules, then every rule a package registers under :data:`ENTRY_POINT_GROUP`."""
    from importlib.metadata import entry_points

    rules = list(RULES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        extra = loaded if isinstance(loaded, (list, tuple)) else [loaded]
        for rule in extra:
            if not isinstance(rule, Rule):
                raise BadInputError(f"entry point {ep.name!r} ({ep.value}) gives {type(rule).__name__}, "
                                    f"not a perfkit.analyse.advice.Rule")
            rules.append(rule)
    names = [r.name for r in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInputError(f"two advice rules are named {', '.join(twice)}: rename one (entry point group "
                            f"{ENTRY_POINT_GROUP})")
    return rules


def select_rules(names: Sequence[str] | None) -> list[Rule]:
    """The rules named (all when none): an unknown name is bad input, with the names there are."""
    rules = all_rules()
    if not names:
        return rules
    known = {r.name: r for r in rules}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadInputError(f"unknown advice rule {', '.join(map(repr, unknown))}: the rules are "
                            f"{', '.join(known)} (perfkit advise --rules)")
    return [known[n] for n in names]
