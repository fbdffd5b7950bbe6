"""``perfkit advise``'s findings as text, markdown (a CI comment: ``perfkit compare --advice`` adds
it) and JSON, and the list of rules."""

from __future__ import annotations

import json
import math

import pandas as pd

from ..analyse.advice import Finding, grouped_notes, is_note
from ..analyse.advice.rules import all_rules

__all__ = ["render_terminal", "render_markdown", "to_json", "render_rules"]


def _by_point(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.point, []).append(f)
    return out


def _share(f: Finding) -> str:
    return f"{f.cost_share:.0%}" if f.cost_share == f.cost_share else "-"


def _number(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return str(v)


def _evidence(f: Finding) -> str:
    return ", ".join(f"{k}={_number(v)}" for k, v in f.evidence.items())


def render_terminal(findings: list[Finding], *, directory, rows: pd.DataFrame) -> str:
    ok = int((rows["status"] == "ok").sum())
    n = rows["config_id"].nunique()
    lines = [f"perfkit advise {directory}: {ok} ok rows of {n} configuration{'s' if n != 1 else ''}"]
    if not findings:
        lines.append("  no rule found a constraint in these rows (perfkit advise --rules lists what is checked)")
    for point, fs in _by_point([f for f in findings if not is_note(f)]).items():
        lines.append(f"\n{point}")
        for rank, f in enumerate(fs, 1):
            tag = "binding" if rank == 1 and f.rule != "noisy" else f"#{rank}"
            lines.append(f"  {tag}: {f.constraint} ({_share(f)} of its time, {f.confidence} confidence) — {f.summary}")
            lines += _details(f)
    for rule, fs in grouped_notes(findings):
        what = next((r.description for r in all_rules() if r.name == rule), "")
        lines.append(f"\nnote (not a time cost): {fs[0].constraint} in {len(fs)} configuration"
                     f"{'s' if len(fs) != 1 else ''}: {what}")
        lines.append(f"      rule: {rule} — {fs[0].source}")
        for f in fs:
            lines.append(f"  {f.point}: {f.summary}  [configs {', '.join(f.config_ids)}]")
            if f.experiment is not None:
                lines.append(f"      experiment: {_experiment(f)}")
    return "\n".join(lines)


def _experiment(f: Finding) -> str:
    e = f.experiment
    also = "".join(f", {k}={v!r}" for k, v in e.also.items())
    return f"{e.parameter or e.env} {e.current!r} -> {e.proposed!r}{also} on {e.notebook}"


def _details(f: Finding) -> list[str]:
    lines = [f"      try: {f.advice}", f"      evidence: {_evidence(f)}  [configs {', '.join(f.config_ids)}]",
             f"      rule: {f.rule} — {f.source}"]
    if f.experiment is not None:
        lines.append(f"      experiment: {_experiment(f)}")
    return lines


def render_markdown(findings: list[Finding], *, directory) -> str:
    lines = [f"### perfkit advise: `{directory}`", ""]
    if not findings:
        return "\n".join(lines + ["No rule found a constraint in these rows."]) + "\n"
    lines += ["| configuration | # | constraint | share of time | confidence | evidence | try |",
              "|---|---|---|---|---|---|---|"]
    cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    for point, fs in _by_point([f for f in findings if not is_note(f)]).items():
        for rank, f in enumerate(fs, 1):
            lines.append(f"| {cell(point)} | {rank} | {cell(f.constraint)} | {_share(f)} | {f.confidence} | "
                         f"{cell(f.summary)} | {cell(f.advice)} |")
    for _, fs in grouped_notes(findings):
        points = "; ".join(f.point for f in fs)
        lines.append(f"| {cell(points)} | note | {cell(fs[0].constraint)} | - | {fs[0].confidence} | "
                     f"{cell(' / '.join(f.summary for f in fs))} | {cell(fs[0].advice)} |")
    return "\n".join(lines) + "\n"


def to_json(findings: list[Finding], *, directory, rows: pd.DataFrame) -> dict:
    from ..analyse.advice import findings_frame

    table = findings_frame(findings)
    records = json.loads(table.to_json(orient="records", default_handler=str))
    for rec, f in zip(records, findings):  # dataclasses as plain dicts, NaN as null
        rec["evidence"] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in f.evidence.items()}
    return {"directory": str(directory), "ok_rows": int((rows["status"] == "ok").sum()),
            "configurations": int(rows["config_id"].nunique()), "findings": records}


def render_rules(rules=None) -> str:
    rules = all_rules() if rules is None else rules
    lines = []
    for r in rules:
        lines.append(f"{r.name}  ({r.constraint}; threshold {r.threshold:g})\n    {r.description}\n    source: {r.source}")
    return "\n".join(lines)
