"""The report's Comparison section: an A/B sweep's variants against its base, judged point by
point (:mod:`perfkit.analyse.compare`), as ``perfkit compare DIR --by variant`` judges them."""

from __future__ import annotations

import html

import pandas as pd

from .report import _CSS, Parts, _table_html, comparison_base

__all__ = ["comparison_of_variants", "comparison_section"]


def comparison_of_variants(rows: pd.DataFrame, all_rows: pd.DataFrame) -> Parts:
    """Every other variant against the base (:func:`comparison_base`): summary, plot, details."""
    from ..analyse.compare import compare_by
    from ..core.errors import BadInputError

    base = comparison_base(rows)
    try:
        comparison = compare_by(rows, by="variant", base=base)
    except BadInputError as exc:  # the rest of the report still stands
        return Parts((f"<p>No comparison of the variants against {html.escape(base)}: "
                      f"{html.escape(str(exc))}</p>",))
    return comparison_section(comparison, base_rule=True)


def comparison_section(comparison, *, base_rule: bool = False) -> Parts:
    """A :class:`perfkit.analyse.compare.Comparison` as the report shows it: what was compared and
    the verdict counts, environment changes and notes, the plot, then every point in words and
    the points on one side only or not ok. ``base_rule``: say how the base was chosen."""
    from .plots.compare import comparison_plot, comparison_table

    table = comparison_table(comparison.points)
    details = f"<h3>Per point</h3>{_table_html(table)}" if not table.empty else ""
    return Parts((_comparison_summary(comparison, base_rule),
                  comparison_plot(comparison.points, threshold=comparison.threshold),
                  details + _one_side_and_not_ok(comparison)))


def _comparison_summary(comparison, base_rule: bool) -> str:
    rule = " (the variant of the earliest-recorded row of round 1)" if base_rule else ""
    metrics = ", ".join(sorted(map(str, comparison.points["metric"].dropna().unique()))) or "none"
    metric = comparison.metric or f"{metrics} (each workload's default: step time; inference TTFT, TPOT, e2e)"
    against = ", ".join(comparison.new_labels)
    parts = [f"{_CSS}<p>Base <b>{html.escape(comparison.base_label)}</b>{rule} against "
             f"{html.escape(against)}; metric {html.escape(metric)}; threshold ±{comparison.threshold * 100:g} %, "
             f"significance {comparison.alpha:g} after {html.escape(comparison.correction.capitalize())} "
             f"correction over {len(comparison.points)} points.</p>",
             f"<p>Verdicts: {html.escape(comparison.summary)}.</p>"]
    if not comparison.env_changes.empty:
        parts.append('<p class="warn">⚠ The environment differs between the sides:</p>'
                     + _table_html(comparison.env_changes))
    if comparison.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in comparison.notes) + "</ul>")
    return "".join(parts)


def _one_side_and_not_ok(comparison) -> str:
    out = _CSS
    if not comparison.one_side.empty:
        out += f"<h3>Points on one side only</h3>{_table_html(comparison.one_side)}"
    if not comparison.not_ok.empty:
        out += f"<h3>Points not ok on a side (not compared)</h3>{_table_html(comparison.not_ok)}"
    return out
