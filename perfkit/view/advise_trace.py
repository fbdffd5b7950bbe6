"""``perfkit advise TRACE...``: what binds a profiled step, from its Kineto trace alone (rules:
:mod:`perfkit.analyse.advice.trace`), printed as ``perfkit advise`` prints a folder's advice."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..core.errors import BadInputError

__all__ = ["is_trace_path", "advise_traces", "render_trace_advice"]


def is_trace_path(path: str) -> bool:
    return Path(path).is_file() and str(path).endswith((".json", ".json.gz"))


def advise_traces(paths: list[str]) -> list:
    """Every rank's findings of every trace file in ``paths``, each file's ranked."""
    from ..analyse.advice.trace import trace_findings
    from ..analyse.trace.events import read_trace
    from ..analyse.trace.ops import trace_ops
    from ..analyse.trace.timeline import gpu_kinds, gpu_timeline, main_window

    for p in paths:
        if not is_trace_path(p):
            raise BadInputError(f"{p}: not a trace file (.json or .json.gz); give trace files only, or one results folder")
    out = []
    for p in paths:
        ev = read_trace(p, op_args=True)
        window, rows = main_window(ev)
        if not len(rows):
            raise BadInputError(f"{p}: no GPU work in this trace; a CPU-only trace has no GPU timeline to advise on "
                                f"(perfkit trace {p} shows its top CPU operators)")
        kernels = rows[gpu_kinds(ev)[rows] == 0]
        out += trace_findings(Path(p).name, gpu_timeline(ev), trace_ops(ev, rows=rows, window=window),
                              np.asarray(ev.dur_us[kernels]))
    return out


def render_trace_advice(findings: list, paths: list[str]) -> str:
    from ..analyse.advice.trace import TRACE_RULES

    lines = [f"perfkit advise {' '.join(paths)}: from the trace alone (perfkit advise --rules lists the row rules; "
             f"these read the GPU timeline and the ops on the roof)"]
    if not findings:
        lines.append("  no rule found a constraint: " + "; ".join(f"{k} ({v[1]})" for k, v in TRACE_RULES.items()))
    point = None
    for rank, f in enumerate(findings, 1):
        if f.point != point:
            point, rank_in = f.point, 1
            lines.append(f"\n{point}")
        tag = "binding" if rank_in == 1 else f"#{rank_in}"
        rank_in += 1
        lines.append(f"  {tag}: {f.constraint} ({100 * f.cost_share:.1f} % of the step, {f.confidence} confidence)"
                     f" — {f.summary}")
        lines.append(f"      try: {f.advice}")
        lines.append("      evidence: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in f.evidence.items()))
        lines.append(f"      rule: {f.rule} — {f.source}")
    return "\n".join(lines)


def trace_advice_json(findings: list) -> dict:
    return {"findings": [asdict(f) for f in findings]}


def write_outputs(findings, paths, *, json_path, markdown_path) -> None:
    text = render_trace_advice(findings, paths)
    if json_path == "-":
        print(json.dumps(trace_advice_json(findings), indent=2, default=str))
    else:
        print(text)
    if json_path and json_path != "-":
        Path(json_path).write_text(json.dumps(trace_advice_json(findings), indent=2, default=str) + "\n", encoding="utf-8")
    if markdown_path:
        Path(markdown_path).write_text("```\n" + text + "\n```\n", encoding="utf-8")
