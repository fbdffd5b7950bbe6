"""The report's Advice section: each configuration's binding constraint, its evidence and what to
try, first in the page, with the verdict of the experiment that tested it where ``perfkit advise
--verify`` ran one (``DIR/advice/<n>/verdict.json``)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from ..analyse.advice import advise, grouped_notes, is_note
from ..analyse.advice.rules import all_rules

__all__ = ["advised_rows", "advice_section", "verdicts"]


def advised_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows advice reads: the ``ok`` ones (none: no section)."""
    if "status" not in df or "config_id" not in df:
        return df.iloc[0:0]
    return df[df["status"] == "ok"]


def verdicts(results_dir: str | Path | None) -> dict[tuple[str, str], dict]:
    """(config_id, rule) -> the verdict ``perfkit advise --verify`` wrote for it."""
    if results_dir is None:
        return {}
    out = {}
    for path in sorted(Path(results_dir).glob("advice/*/verdict.json")):
        try:
            v = json.loads(path.read_text(encoding="utf-8"))
            out[v["config_id"], v["rule"]] = v
        except (OSError, ValueError, KeyError):
            continue  # a verify that was interrupted before writing it: no verdict to show
    return out


def advice_section(rows: pd.DataFrame, all_rows: pd.DataFrame, *, output=None, results_dir=None, findings=None):
    from .report import Parts, _CSS

    findings = advise(rows, all_rules()) if findings is None else findings
    tested = verdicts(results_dir)
    binding = {}
    for f in findings:
        if not is_note(f):
            binding.setdefault(f.point, f)
    notes = grouped_notes(findings)
    if not binding and not notes:
        return Parts((f"{_CSS}<p>No rule found a constraint in these rows (<code>perfkit advise --rules</code> "
                      f"lists what is checked).</p>",))
    head = ("<tr><th>configuration</th><th>binding constraint</th><th>share of its time</th><th>confidence</th>"
            "<th>what the rows show</th><th>try</th><th>tested</th></tr>")
    body = []
    for point, f in binding.items():
        share = f"{f.cost_share:.0%}" if f.cost_share == f.cost_share else "–"
        v = next((tested[c, f.rule] for c in f.config_ids if (c, f.rule) in tested), None)
        cells = [point, f.constraint, share, f.confidence, f.summary, f.advice,
                 v["text"] if v else ("perfkit advise --verify" if f.experiment is not None else "")]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    # A note (no time cost: memory headroom) once for every configuration it holds for, below the time costs.
    for _, fs in notes:
        listed = "".join(f"<li>{html.escape(f.point)}: {html.escape(f.summary)}</li>" for f in fs)
        where = (f"<details><summary>{len(fs)} configuration{'s' if len(fs) != 1 else ''}</summary>"
                 f"<ul>{listed}</ul></details>")
        shown = fs[0].summary + (f" (and {len(fs) - 1} more like it)" if len(fs) > 1 else "")
        cells = [f"note: {fs[0].constraint}", "not a time cost", fs[0].confidence, shown, fs[0].advice, ""]
        body.append(f'<tr class="note"><td>{where}</td>' + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    others = len(findings) - len(binding) - sum(len(fs) for _, fs in notes)
    note = (f"<p>{len(binding)} configurations with a binding constraint; {others} more findings below their "
            f"binding one; {len(notes)} note{'s' if len(notes) != 1 else ''} that cost no time, each on one line "
            f"(<code>perfkit advise DIR</code> lists every finding with its evidence and the rule's source).</p>")
    return Parts((f'{_CSS}{note}<table class="pk"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>',))
