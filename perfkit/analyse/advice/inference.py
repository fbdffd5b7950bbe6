"""The advice rule of generation: a decode (or prefill) far below its roof with little work per
step waits on kernel launches and Python, not on the device (its threshold and source:
perfkit.analyse.advice.rules).

On the H200 (issue 44) ``hf:llama`` (6 layers, hidden 1024) decoded at 8.7 ms a token at batch 1:
0.65 % of its HBM roof, whose bytes take 57 µs. Such a step is tens of kernel launches from
Python per layer; the roof says what the device could do, not what the host lets it. The
remedy is the one generation servers use: CUDA graphs over a static KV cache (gpt-fast,
"Accelerating Generative AI with PyTorch II: GPT, Fast", PyTorch blog 2023: torch.compile with
a static KV cache, 25 -> 107 tokens/s on Llama-7B), or more work per launch (a larger batch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from .findings import Experiment, Finding, Rule, finite, flag, notebook_of, point_labels, rows_of

__all__ = ["LAUNCH_WORK_S", "launch_bound_generation"]

#: A step whose roof time (its bytes or FLOP at the roof) is under this is little work per launch
#: sequence: a few dozen kernels of a few µs each, about what the host needs to issue them.
LAUNCH_WORK_S = 1e-3


def _phase(row: pd.Series, phase: str) -> tuple[float, float] | None:
    """(fraction of the roof, roof time in seconds) of a row's ``decode`` (per token, TPOT) or
    ``prefill`` (TTFT's prefill step), or None where the row has no roofline point."""
    pct, time_s = row.get(f"{phase}_percent_of_roof"), row.get("tpot_s" if phase == "decode" else "prefill_time_s")
    if not (finite(pct) and finite(time_s)) or float(time_s) <= 0:
        return None
    fraction = float(pct) / 100.0
    return fraction, fraction * float(time_s)


def launch_bound_generation(ok: pd.DataFrame, rule: Rule) -> Iterable[Finding]:
    """One finding per inference configuration whose decode at its smallest batch runs under
    ``threshold`` of its roof while its roof time is under :data:`LAUNCH_WORK_S`."""
    rows = rows_of(ok, "inference", "decode_percent_of_roof", "tpot_s")
    if rows.empty:
        return
    labels = point_labels(ok)
    for config_id, group in rows.groupby("config_id", sort=False):
        group = group.sort_values("batch_size") if "batch_size" in group else group
        first = group.iloc[0]
        decode = _phase(first, "decode")
        if decode is None:
            continue
        fraction, roof_s = decode
        if fraction >= rule.threshold or roof_s >= LAUNCH_WORK_S:
            continue
        # Noise only adds time: the fastest token's fraction of the roof is the most it was seen to reach.
        samples = first.get("tpot_samples_s")
        fastest = (roof_s / float(np.min(samples)) if isinstance(samples, (list, np.ndarray)) and len(samples)
                   else math.nan)
        by_batch = {int(r["batch_size"]): round(float(r["decode_percent_of_roof"]), 3)
                    for _, r in group.iterrows() if finite(r.get("batch_size"))}
        prefill = _phase(first, "prefill")
        on_gpu = str(first.get("resolved_device") or first.get("device") or "").startswith(("cuda", "hip"))
        compiled = flag(first, "compile")
        if not compiled:
            experiment = Experiment(notebook=notebook_of(first), parameter="compile", current=False, proposed=True,
                                    also={"compile_mode": "reduce-overhead"} if on_gpu else {}, metric="tpot_s")
            what = ("compile the decode step" + (" and replay it as CUDA graphs (compile=True, "
                                                 "compile_mode='reduce-overhead')" if on_gpu else " (compile=True)"))
        else:
            experiment = None
            what = "it is compiled already: replay it as CUDA graphs over a static KV cache"
        yield Finding(
            rule=rule.name, constraint=rule.constraint, point=labels[group.index[0]], config_ids=(config_id,),
            cost_share=1 - fraction, confidence="high" if finite(fastest) and fastest < rule.threshold else "low",
            source=rule.source, robust=finite(fastest) and fastest < rule.threshold,
            evidence={"batch_size": int(first["batch_size"]) if finite(first.get("batch_size")) else None,
                      "decode_percent_of_roof": float(first["decode_percent_of_roof"]),
                      "decode_bound": first.get("decode_bound"), "tpot_s": float(first["tpot_s"]),
                      "decode_roof_time_s": roof_s, "fastest_token_fraction_of_roof": fastest,
                      "decode_percent_of_roof_by_batch": by_batch,
                      "prefill_percent_of_roof": prefill[0] * 100 if prefill else math.nan,
                      "ttft_s": float(first.get("ttft_s", math.nan)),
                      "kernels_per_step": "no trace recorded (inference rows have none)"},
            summary=(f"decode at batch {by_batch and min(by_batch)} takes {float(first['tpot_s']) * 1e3:.2f} ms a token, "
                     f"{fraction:.2%} of its {first.get('decode_bound') or ''} roof, whose bytes take "
                     f"{roof_s * 1e6:.0f} µs: the device waits on kernel launches and Python"
                     + (f"; the prefill reaches {prefill[0]:.1%} of its roof" if prefill else "")),
            advice=(f"{what}, as gpt-fast and the serving engines do; or give each launch more work (a larger "
                    f"batch: {by_batch} % of the roof by batch size)"),
            experiment=experiment)
