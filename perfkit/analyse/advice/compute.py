"""The advice rules of how a step computes: host/launch-bound, memory-bound ops dominating the
step, compute-bound at a precision the device beats (their thresholds and sources:
perfkit.analyse.advice.rules)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from .findings import Experiment, Finding, Rule, confidence_of, finite, flag, notebook_of, point_labels, rows_of
from ..compare_match import canon
from ..roofline import STEP_OP
from ..trace.breakdown import SHORT_KERNEL_US

__all__ = ["host_bound", "memory_bound_ops", "precision_below_device", "precision_slower", "BITS"]

#: The faster precisions to try, by the precision a row ran, the smallest change first: fp32 → tf32
#: (no autocast, fp32 range) before bf16; bf16 → fp8 (torchao). Ceiling rows name dtypes so.
FASTER = {"fp32": ("tf32", "bf16"), "tf32": ("bf16",), "bf16": ("fp8",)}


# ------------------------------------------------------------------------------ host/launch-bound


def host_bound(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """A profiled step whose device sat idle for over ``threshold`` of the trace's window (HTA's
    idle time): the host does not issue work fast enough (Python, launches, synchronizations)."""
    labels = point_labels(ok)
    rows = ok[ok["trace_idle_share"].map(finite)] if "trace_idle_share" in ok else ok.iloc[0:0]
    for i, row in rows.iterrows():
        # HTA's idle time includes the wait for the batch: that share is the input rule's, and a
        # step idle on its input is told to add workers, not to compile (issue 44).
        data = float(row["trace_data_wait_share"]) if finite(row.get("trace_data_wait_share")) else 0.0
        idle = float(row["trace_idle_share"]) - data
        if idle < rule.threshold:
            continue
        compiled = flag(row, "compile")
        short = float(row["trace_short_kernel_share"]) if finite(row.get("trace_short_kernel_share")) else math.nan
        launches = (f"; {short:.0%} of its kernels run under {SHORT_KERNEL_US:g} µs, about what a launch "
                    "costs the host: launch-bound" if finite(short) and short >= 0.5 else "")
        if row.get("workload") == "train_step" and not compiled:
            experiment = Experiment(notebook=notebook_of(row), parameter="compile", current=False, proposed=True)
            what = ("fewer, larger kernels: torch.compile fuses the step's small ops (compile=True); "
                    "then CUDA graphs (compile_mode='reduce-overhead') remove the launches left")
        elif row.get("workload") == "train_step" and str(row.get("device", "")).startswith("cuda") \
                and (not isinstance(mode := row.get("compile_mode"), str) or mode == "default"):
            experiment = Experiment(notebook=notebook_of(row), parameter="compile_mode",
                                    current=mode if isinstance(mode, str) else None, proposed="reduce-overhead")
            what = "already compiled: replay the step as CUDA graphs (compile_mode='reduce-overhead')"
        elif finite(row.get("batch_size")):
            batch = int(row["batch_size"])
            experiment = Experiment(notebook=notebook_of(row), parameter="batch_size", current=batch,
                                    proposed=2 * batch, metric="samples_per_s")
            what = "give each launch more work: a larger batch (tb_plugin's advice for a low GPU utilization)"
        else:
            experiment, what = None, "give each launch more work (a larger batch) or fuse the step (torch.compile)"
        # Robust: the idle share is read off the trace's timeline, not a timed median, and a noisy
        # host only adds idle time (issue 55: the H200 hf:llama step, 57 % idle, got "rerun" alone).
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
            cost_share=idle, confidence=confidence_of(rule, idle, row), source=rule.source, robust=True,
            evidence={"host_idle_share": idle, "trace_idle_share": float(row["trace_idle_share"]),
                      "trace_data_wait_share": data, "trace_short_kernel_share": short,
                      "trace_top_kernel": row.get("trace_top_kernel"),
                      "trace_top_kernel_share": float(row.get("trace_top_kernel_share", math.nan)),
                      "compile": compiled},
            summary=(f"the device is idle {idle:.0%} of the profiled window, not counting its wait for data "
                     f"(threshold {rule.threshold:.0%}){launches}"),
            advice=what, experiment=experiment)


# ------------------------------------------------------------------------------ roofline


def _narrow(row: pd.Series, keys: tuple[str, ...]) -> dict:
    """The row's values of ``keys`` as a notebook takes them: plain Python, a whole float an int (a
    roofline row's batch_size is a float beside its ceiling rows' NaN; the notebook wants an int)."""
    out = {}
    for k in keys:
        if k in row and pd.notna(row[k]):
            v = row[k].item() if hasattr(row[k], "item") else row[k]
            out[k] = int(v) if isinstance(v, float) and v.is_integer() else v
    return out


def _step_rows(ok: pd.DataFrame) -> pd.DataFrame:
    rows = rows_of(ok, "roofline", "time_share")
    return rows[rows["op"] != STEP_OP] if "op" in rows else rows.iloc[0:0]


def memory_bound_ops(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """Memory-bound ops (under their memory roof on the roofline) that take over ``threshold`` of
    the step's time: the step moves bytes more than it computes; fusing them cuts the traffic."""
    ops = _step_rows(ok)
    if ops.empty or "bound" not in ops:
        return
    labels = point_labels(ok)
    for config_id, group in ops.groupby("config_id", sort=False):
        memory = group[group["bound"].map(lambda b: isinstance(b, str) and b != "compute")]
        share = float(memory["time_share"].sum())
        if share < rule.threshold:
            continue
        top = memory.nlargest(3, "time_share")
        first = group.iloc[0]
        narrow = _narrow(first, ("model", "batch_size", "precision"))
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[group.index[0]], config_ids=(config_id,),
            cost_share=share, confidence=confidence_of(rule, share, *[r for _, r in group.iterrows()]),
            source=rule.source, robust=False,
            evidence={"memory_bound_time_share": share, "memory_bound_ops": int(len(memory)),
                      "top_memory_bound_ops": [[r["op"], float(r["time_share"]), r["bound"]] for _, r in top.iterrows()]},
            summary=(f"{len(memory)} memory-bound ops take {share:.0%} of the step (the largest: "
                     + ", ".join(f"{r['op']} {float(r['time_share']):.0%}" for _, r in top.iterrows()) + ")"),
            advice=("fuse them: torch.compile turns chains of elementwise and normalization ops into one kernel "
                    "that reads and writes each tensor once. The roofline notebook cannot count a compiled step "
                    "(its counter sees no aten ops under torch.compile): the experiment times the same model, "
                    "batch and precision in the training step, compile=False against compile=True"),
            experiment=Experiment(notebook="train_step.ipynb", parameter="compile", current=False, proposed=True,
                                  narrow=narrow))


_ORIGINS = ("measured", "spec", "theoretical")
_HOW = {"tf32": "TF32 tensor cores for fp32 matmuls, nothing else changes",
        "bf16": "autocast; fp32 master weights and loss", "fp8": "torchao's float8 training; bf16 elsewhere"}


def _roofs(ok: pd.DataFrame) -> dict[tuple[str, str], float]:
    """The folder's compute roofs by (origin, dtype), the fastest of each."""
    if not {"kind", "workload", "origin", "dtype", "value"} <= set(ok.columns):
        return {}
    roofs = ok[(ok["workload"] == "ceiling") & (ok["kind"] == "compute") & ok["value"].map(finite)]
    return {(str(o), str(d)): float(v) for (o, d), v in roofs.groupby(["origin", "dtype"])["value"].max().items()}


def precision_below_device(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """Compute-bound ops at a precision whose roof the device beats by ``threshold`` x at another
    (the folder's compute roofs of the origin the points were placed against, measured or spec):
    the step's compute could run that much faster there."""
    ops = _step_rows(ok)
    folder_roofs = _roofs(ok)
    if ops.empty or "bound" not in ops or not folder_roofs:
        return
    labels = point_labels(ok)
    for config_id, group in ops.groupby("config_id", sort=False):
        first = group.iloc[0]
        precision = str(first.get("precision"))
        if precision not in FASTER:
            continue
        # The roofs the points were placed against: the configuration's own (a folder may hold
        # several machines' rows), else the folder's; measured ones or the spec sheet's, one origin.
        roofs = _roofs(ok[ok["config_id"] == config_id]) or folder_roofs
        placed = str(first.get("ceiling_origin") or "measured")
        # The first faster precision whose roof clears the threshold (a device without tf32 goes to
        # bf16), both roofs of one origin: the points' own where it has both, else the next that
        # does (a default run measures only its own precision's roof: issue 44, the spec sheet's or
        # the theoretical pair then say what the device does at the other).
        beaten = []
        for p in FASTER[precision]:
            origin = next((o for o in dict.fromkeys((placed, *_ORIGINS))
                           if finite(roofs.get((o, precision))) and finite(roofs.get((o, p)))), None)
            if origin is not None and roofs[(origin, p)] / roofs[(origin, precision)] >= rule.threshold:
                beaten.append((p, origin))
        if not beaten:
            continue
        proposed, origin = beaten[0]
        current_roof, faster_roof = roofs[(origin, precision)], roofs[(origin, proposed)]
        ratio = faster_roof / current_roof
        compute = group[group["bound"] == "compute"]
        share = float(compute["time_share"].sum())
        if ratio < rule.threshold or share <= 0:
            continue
        saving = share * (1 - 1 / ratio)  # the compute-bound time at the faster roof
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[group.index[0]], config_ids=(config_id,),
            cost_share=saving, confidence=confidence_of(rule, ratio, *[r for _, r in compute.iterrows()]),
            source=rule.source, robust=True,  # roofs and the bound of each op, not one timing
            evidence={"precision": precision, "compute_bound_time_share": share, "roof_origin": origin,
                      f"{precision}_roof_flop_per_s": current_roof, f"{proposed}_roof_flop_per_s": faster_roof,
                      "roof_ratio": ratio},
            summary=(f"compute-bound ops take {share:.0%} of the step at {precision}, and this device's {proposed} "
                     f"roof is {ratio:.1f}x its {precision} roof"),
            advice=(f"run the matmuls at {proposed} ({_HOW[proposed]}): up to {saving:.0%} of the step if the "
                    f"compute-bound ops reach the faster roof; check the loss trajectory stays where it was"),
            # The roofline notebook casts a model to fp64/fp32/bf16/fp16 and cannot run tf32 or fp8: the
            # training step runs every precision, narrowed to the roofline's model and batch.
            experiment=Experiment(notebook="train_step.ipynb", parameter="precision", current=precision,
                                  proposed=proposed, metric="samples_per_s",
                                  narrow=_narrow(first, ("model", "batch_size"))))


# ------------------------------------------------------------------------------ a lower precision that is slower

#: Bits of each precision's matmul operands: a lower one is expected to be at least as fast.
BITS = {"fp8": 8, "bf16": 16, "fp16": 16, "bf16-pure": 16, "tf32": 19, "fp32": 32}
#: The columns that make two training rows the same configuration but for their precision.
_SAME = ("model", "model_size", "batch_size", "seq_len", "parallelism", "world_size", "compile", "compile_mode",
         "activation_checkpointing", "device_name", "env_device_name")


def precision_slower(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """A training row at a lower precision whose step is over ``threshold`` x slower than the same
    configuration at a higher one (on the H200: fp8 3.2x slower than bf16 at batch 128, eager, with
    d_model 1024), said with why (the row's ``fp8_reason``; eager float8 where rows predate it)."""
    rows = rows_of(ok, "train_step", "step_time_s")
    if rows.empty or "precision" not in rows:
        return
    labels = point_labels(ok)
    same = [c for c in _SAME if c in rows]
    keys = rows[same].apply(lambda r: tuple(str(canon(v)) for v in r), axis=1) if same else pd.Series(0, rows.index)
    for _, group in rows.groupby(keys, sort=False):
        for i, row in group.iterrows():
            bits = BITS.get(str(row["precision"]))
            higher = group[group["precision"].map(lambda p: BITS.get(str(p), 0) > (bits or 99))]
            if bits is None or higher.empty:
                continue
            best = higher.loc[higher["step_time_s"].astype(float).idxmin()]
            ratio = float(row["step_time_s"]) / float(best["step_time_s"])
            if ratio < rule.threshold:
                continue
            precision, other = str(row["precision"]), str(best["precision"])
            why = row.get("fp8_reason") if isinstance(row.get("fp8_reason"), str) else None
            compiled = flag(row, "compile")
            if why is None and precision == "fp8" and not compiled:
                why = ("fp8 ran eager: torchao's float8 training is meant to run under torch.compile, which fuses "
                       "its scaling and casts")
            if not compiled:
                experiment = Experiment(notebook=notebook_of(row), parameter="compile", current=False, proposed=True)
                try_ = f"compile it (compile=True), or keep {other}, which is faster here"
            else:
                experiment = Experiment(notebook=notebook_of(row), parameter="precision", current=precision,
                                        proposed=other)
                try_ = f"keep {other} for this model size: the lower precision does not pay here"
            yield Finding(
                rule=rule.name, constraint=rule.constraint, point=labels[i], config_ids=(row["config_id"],),
                cost_share=1 - 1 / ratio, confidence=confidence_of(rule, ratio, row, best), source=rule.source,
                robust=True,  # two steps' medians far apart: noise of a few percent cannot reverse a 2x
                evidence={"precision": precision, "step_time_s": float(row["step_time_s"]), "faster_precision": other,
                          "faster_step_time_s": float(best["step_time_s"]), "slower_by": ratio, "compile": compiled,
                          "why": why or "not known from the rows", "faster_config_id": best["config_id"]},
                summary=(f"{precision} steps take {ratio:.1f}x as long as {other} in the same configuration"
                         + (f": {why}" if why else "")),
                advice=try_, experiment=experiment)
