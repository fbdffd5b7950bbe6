"""``perfkit compare``: two result folders, or one A/B sweep split by a column; judged point by point.

Loads the rows (:func:`load_rows`), hands them to :mod:`perfkit.analyse.compare`, and shows the
:class:`~perfkit.analyse.compare.Comparison` three ways: a terminal table, markdown that reads
well as a CI comment, and JSON. The exit code is the comparison's (0, 1, 3), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from ..analyse.compare import Comparison, compare_by, compare_frames
from ..core.errors import BadInputError

__all__ = ["add_compare_command", "run_compare", "load_rows", "render_terminal", "render_markdown",
           "to_json", "environment", "claims"]

HELP = """\
Did a change make it faster? Match the rows of BASE_DIR and NEW_DIR (two sweeps), or of one A/B
sweep's variants (DIR --by variant --base NAME), point by point: by notebook, the configuration's
parameters (less those a variant overrides), the row's descriptors (op, dtype, size, ...), any
--key columns, and the row's order among equal rows. Each point compares the raw samples of its
metric, one group per round. The default metric follows the row's workload: training and data
loading the step time (step_time_s), inference TTFT, TPOT and e2e latency (ttft_s, tpot_s,
e2e_latency_s), each a point of its own; other rows time_s, else their first X_s with samples.
--metric names one *_s or *_per_s column instead. A rate without samples of its own takes them
from the time it is the inverse of (decode_tokens_per_s from TPOT's); without one it is compared
without an interval. Every output names the metric of each point.

Verdict of a point: `slower` or `faster` when the change passes --threshold (default 5 %) AND is
significant: the Mann-Whitney U p-value after Holm's correction over all points compared is
below --alpha (0.05) and the 95 % CI of the ratio excludes 1. `same` when the whole CI lies
within the threshold. `inconclusive` otherwise: too few samples (fewer than 5 a side), or too
noisy to tell the threshold apart.

The CI holds both kinds of noise: within a run (a bootstrap: rounds resampled, then samples) and
between runs, which on shared GPU clusters is 2-5 %. Rounds (an A/B sweep's `rounds:`, each round
a run of its own) measure the spread between runs (Student's t over the rounds' medians); one
round on a side cannot, so its CI assumes --run-to-run (default 0.05) and a change under about
15 % comes out inconclusive, never a false `slower` from an unchanged build. Use rounds >= 3, or
state a quieter machine's spread (--run-to-run 0.01).

Points on one side only and points not ok on a side (failed, oom, skipped, ...) are listed, and
environment fingerprint fields that changed (torch, driver, device) are shown at the top.

Numerics beside speed: each point also says whether the new side computes what the base did
(`same`, `differs` with the largest deviation, `n/a` with why). Training rows: the loss at every
step within k x the per-step rtol of the looser precision of the pair (torch.testing's rtol: fp32
1.3e-6, fp16 and tf32 1e-3, bf16 1.6e-2, fp8 0.0625) at step k. Inference rows: the greedy token
ids equal. Kernel rows: within their rtol/atol of the reference. Rows that record no results
(GEMM, collectives) are n/a.

Exit codes: 0 no regression shown; 1 at least one point slower; 2 bad input (nothing compared);
3 no regression shown, but some point inconclusive, on one side only, or not compared (a side
not ok); 4 some point's numerics differ (checked first: a faster wrong result fails the gate),
unless --accept-numerics. With --strict a point on one side only or not compared exits 1.
"""

_MARK = {"slower": "🔴", "faster": "🟢", "same": "⚪", "inconclusive": "🟡"}
_NUM_MARK = {"same": "✅ same", "differs": "❌ differs", "n/a": "n/a"}


def add_compare_command(sub) -> None:
    """Register ``perfkit compare`` on the CLI's subparsers."""
    p = sub.add_parser("compare", help="did a change make it faster? point-by-point verdicts, exit 1 on slower",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base_dir", metavar="BASE_DIR", help="results of the base (a sweep's --out), or the A/B sweep with --by")
    p.add_argument("new_dir", metavar="NEW_DIR", nargs="?", help="results of the change (not with --by)")
    p.add_argument("--by", help="compare the values of this column within BASE_DIR (an A/B sweep: variant)")
    p.add_argument("--base", help="with --by: the value every other value is compared against")
    p.add_argument("--metric", help="the column to compare (*_s: lower is better, *_per_s: higher is better); "
                                    "default: by workload (step time; inference: TTFT, TPOT, e2e latency)")
    p.add_argument("--threshold", type=float, default=0.05, help="smallest change that counts, a fraction (default 0.05 = 5 %%)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm (default 0.05)")
    p.add_argument("--run-to-run", type=float, default=0.05, metavar="FRACTION",
                   help="how much two runs of the same build differ (σ of a run's median), assumed where a "
                        "side has one round and cannot measure it (default 0.05 = 5 %%, shared GPU clusters)")
    p.add_argument("--key", action="append", default=[], metavar="COL",
                   help="another column that tells points apart (repeatable)")
    p.add_argument("--accept-numerics", action="store_true",
                   help="numerics that differ are shown but do not fail the gate (default: exit 4)")
    p.add_argument("--strict", action="store_true",
                   help="a point on one side only, or not ok on a side, fails the gate: exit 1 (default 3)")
    p.add_argument("--markdown", metavar="FILE", help="also write the comparison as markdown (a CI comment)")
    p.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    p.add_argument("--advice", action="store_true",
                   help="with --markdown: add perfkit advise's table of the new side (what binds it now)")
    p.set_defaults(func=run_compare)


def load_rows(directory: str | Path) -> pd.DataFrame:
    """Every row under ``directory``; rows recorded before ``param_names`` existed get it from the
    sweep's ledger (its ``params`` of each configuration), so they still match by parameters."""
    from ..core.results import load

    frame = load(directory)
    if frame.empty:
        raise BadInputError(f"no results under {str(directory)!r}: is it a sweep's --out folder?")
    if "param_names" not in frame:
        frame["param_names"] = None
    missing = frame["param_names"].isna()
    if missing.any():
        from ..run.sweep.ledger import Ledger

        names = {cid: json.dumps(sorted(e.params)) for cid, e in Ledger(directory).state().items()}
        frame.loc[missing, "param_names"] = frame.loc[missing, "config_id"].map(names)
    return frame


def _check_args(args) -> None:
    """Bad input, found before anything is read: one line, exit 2."""
    if args.by is not None:
        if args.new_dir is not None:
            raise BadInputError("give NEW_DIR or --by, not both: --by compares the values of a column within BASE_DIR")
        if args.base is None:
            raise BadInputError(f"--by {args.by} needs --base VALUE: the value the others are compared against")
    else:
        if args.new_dir is None:
            raise BadInputError("give NEW_DIR, or --by COLUMN --base VALUE to compare the variants of one A/B sweep")
        if args.base is not None:
            raise BadInputError("--base needs --by COLUMN (with two folders, BASE_DIR is the base)")
    for d in (args.base_dir, args.new_dir):
        if d is not None and not Path(d).is_dir():
            raise BadInputError(f"results directory {d!r} does not exist (or is not a folder)")
    for flag, path in (("--markdown", args.markdown), ("--json", args.json)):
        if path and not Path(path).resolve().parent.is_dir():
            raise BadInputError(f"{flag} {path}: folder {str(Path(path).resolve().parent)!r} does not exist")
    if not (math.isfinite(args.run_to_run) and 0 <= args.run_to_run < 1):
        raise BadInputError(f"--run-to-run is a fraction (0.05 = 5 % between runs), got {args.run_to_run}")
    if args.advice and not args.markdown:
        raise BadInputError("--advice adds the advice to the --markdown file: give --markdown FILE too")


def _advice_markdown(args, new_side: pd.DataFrame) -> str:
    """``perfkit advise``'s table of the new side (NEW_DIR's rows, or those of --by that are not the base)."""
    from ..analyse.advice import advise
    from ..analyse.advice.rules import all_rules
    from .advice_text import render_markdown as advice_markdown

    where = f"{args.base_dir} ({args.by} != {args.base})" if args.by is not None else args.new_dir
    rows = new_side
    try:
        return "\n" + advice_markdown(advise(rows, all_rules()), directory=where)
    except BadInputError as e:  # no ok rows on the new side: the comparison above says why
        return f"\n### perfkit advise: `{where}`\n\nNo advice: {e.reason}\n"


def run_compare(args) -> int:
    """``perfkit compare``: compare, print, write the files asked for; the comparison's exit code."""
    _check_args(args)
    options = dict(metric=args.metric, threshold=args.threshold, alpha=args.alpha, key=tuple(args.key),
                   strict=args.strict, run_to_run=args.run_to_run, accept_numerics=args.accept_numerics)
    if args.by is not None:
        rows = load_rows(args.base_dir)
        c = compare_by(rows, by=args.by, base=args.base, **options)
        new_side = rows[rows[args.by].astype(str) != str(args.base)]
        title = f"{args.base_dir} by {args.by}"
    else:
        new_side = load_rows(args.new_dir)
        c = compare_frames(load_rows(args.base_dir), new_side, **options)
        title = f"base {args.base_dir} → new {args.new_dir}"
    print(render_terminal(c, title=title))
    if args.markdown:
        text = (render_markdown(c, title=title, environment=environment(new_side))
                + (_advice_markdown(args, new_side) if args.advice else ""))
        Path(args.markdown).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(c), indent=2) + "\n", encoding="utf-8")
    return c.exit_code


def _num(x: float, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _p(p: float) -> str:
    return "–" if not math.isfinite(p) else "<0.0001" if p < 1e-4 else f"{p:.2g}"


def _ratio(r) -> str:
    return f"{_num(r.ratio)} [{_num(r.ci_low)}, {_num(r.ci_high)}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), *(line(r) for r in rows)]


def _metric_of(r) -> str:
    """The metrics a point on one side only was measured on, in parentheses; empty when none."""
    return f" ({r.metric})" if isinstance(r.metric, str) and r.metric else ""


def _rule(c: Comparison) -> str:
    return (f"threshold ±{c.threshold * 100:g} %, alpha {c.alpha:g} after Holm over "
            f"{len(c.points)} points; ratio = new/base of the metric, with its 95 % CI: within runs "
            f"(bootstrap) and between them (the rounds' spread, or ±{c.run_to_run * 100:g} % assumed with one round)")


def _not_ok(c: Comparison) -> list[tuple]:
    """The not-ok list with the sides of one point, status and reason on one line ("base, new")."""
    merged: dict[tuple, list] = {}
    for r in c.not_ok.itertuples():
        entry = merged.setdefault((r.point, r.status, r.reason), [[], 0])
        entry[0].append(r.side)
        entry[1] = max(entry[1], r.configs)
    return [(", ".join(sides), *k, n) for k, (sides, n) in merged.items()]


def _checked(c: Comparison) -> bool:
    """Whether any point's numerics were checked: rows that record no results (GEMM, collectives)
    leave every point n/a, and the column would say nothing."""
    return bool(len(c.points)) and bool((c.points["numerics"] != "n/a").any())


def render_terminal(c: Comparison, *, title: str = "") -> str:
    """The comparison as plain text: env changes first, the table, the lists, notes, summary."""
    out = [f"perfkit compare: {title}" if title else "perfkit compare"]
    if len(c.env_changes):
        out.append("environment changed:")
        out += [f"  {r.field}: {r.base} → {r.new}" + (f"  ({r.side})" if len(c.new_labels) > 1 else "")
                for r in c.env_changes.itertuples()]
    out.append("")
    many = len(c.new_labels) > 1
    checked = _checked(c)
    rows = [[r.verdict, *([r.numerics] if checked else []), _ratio(r), _p(r.p_holm), f"{r.n_base}/{r.n_new}",
             f"{r.rounds_base}/{r.rounds_new}", r.metric, r.point + (f" ({r.new} vs {r.base})" if many else "")]
            for r in c.points.itertuples()]
    table = _table(["verdict", *(["numerics"] if checked else []), "new/base [95 % CI]", "p (Holm)", "n base/new",
                    "rounds", "metric", "point"], rows)
    out.append(table[0])
    for line, r in zip(table[1:], c.points.itertuples()):
        out.append(line)
        if r.verdict != "same":
            out.append(f"    {r.why}")
        if r.numerics == "differs":
            out.append(f"    numerics ({r.numerics_basis}): {r.numerics_why}")
    out.append(f"({_rule(c)})")
    if len(c.one_side):
        out += ["", "only on one side:"] + [f"  {r.side}: {r.point}" + _metric_of(r) for r in c.one_side.itertuples()]
    if len(c.not_ok):
        out += ["", "not ok:"] + [f"  {sides}: {point}: {status}" + (f" ×{n}" if n > 1 else "")
                                  + (f" — {reason}" if reason else "") for sides, point, status, reason, n in _not_ok(c)]
    if c.notes:
        out += ["", "notes:"] + [f"  - {n}" for n in c.notes]
    out += ["", c.summary]
    return "\n".join(out)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(x) for x in r) + " |" for r in rows)]


def _speedup(r) -> tuple[float, float, float]:
    """How many times faster the new side is, with its CI (a time's ratio inverted, a rate's kept)."""
    if r.lower_is_better:
        return 1 / r.ratio, 1 / r.ci_high, 1 / r.ci_low
    return r.ratio, r.ci_low, r.ci_high


def _numerics_phrase(r) -> str:
    if r.numerics == "same":
        return f"numerics within tolerance ({r.numerics_basis})"
    if r.numerics == "differs":
        return f"**numerics differ** ({r.numerics_basis}): {r.numerics_why}"
    return f"numerics not checked ({r.numerics_why})"


def claims(c: Comparison) -> list[str]:
    """The line an upstream PR quotes, per faster point: "1.80× faster (95 % CI 1.62–1.98×,
    step_time_s), numerics within tolerance (bf16 vs fp32, 5 steps)"."""
    out = []
    for r in c.points[c.points["verdict"] == "faster"].itertuples() if len(c.points) else ():
        x, lo, hi = _speedup(r)
        who = f" ({r.new} vs {r.base})" if len(c.new_labels) > 1 else ""
        out.append(f"`{r.point}`{who}: **{x:.2f}× faster** (95 % CI {lo:.2f}–{hi:.2f}×, {r.metric}), "
                   f"{_numerics_phrase(r)}")
    return out


_ENV_FIELDS = (("torch", "env_torch"), ("CUDA", "env_torch_cuda"), ("HIP", "env_torch_hip"), ("NCCL", "env_nccl"),
               ("perfkit", "env_perfkit"), ("git", "env_git_sha"), ("host", "env_hostname"))


def environment(rows: pd.DataFrame) -> str:
    """The environment the rows were measured in, one line: the devices (as the report's first
    screen says them), then each fingerprint field's values."""
    from .report_summary import devices_text

    parts = [f"device {devices_text(rows)}"] if "env_device_name" in rows else []
    for label, col in _ENV_FIELDS:
        values = [str(v) for v in dict.fromkeys(rows[col].dropna())] if col in rows else []
        if col == "env_git_sha":
            dirty = "env_git_dirty" in rows and rows["env_git_dirty"].fillna(False).astype(bool).any()
            values = [v[:10] + (" (uncommitted changes)" if dirty else "") for v in values]
        if values:
            parts.append(f"{label} {', '.join(values)}")
    return "; ".join(parts)


def render_markdown(c: Comparison, *, title: str = "", environment: str = "") -> str:
    """The comparison as GitHub-flavoured markdown: summary first, the claims a PR makes (each
    faster point with its numerics) and the environment, changes, then the details."""
    sides = ", ".join(f"`{n}`" for n in c.new_labels) + f" vs `{c.base_label}`"
    out = [f"### perfkit compare: {sides}", "", f"**{c.summary}**", ""]
    said = claims(c)
    if said:
        out += [f"- {line}" for line in said] + [""]
    if c.numerics_differ:
        verdict = ("shown, not failing the gate (--accept-numerics)" if c.accept_numerics
                   else "the gate fails (exit 4) whatever the speed")
        out += [f"❌ **{c.numerics_differ} point(s) compute something else than the base**: {verdict}.", ""]
    if environment:
        out += [f"<sub>Measured on: {_cell(environment)}</sub>", ""]
    out += [f"<sub>{_cell(title) + ' · ' if title else ''}{_rule(c)}</sub>", ""]
    if len(c.env_changes):
        many = len(c.new_labels) > 1
        out += ["**Environment changed**", ""]
        out += _md_table(["field", *(["side"] if many else []), c.base_label, "new" if many else c.new_labels[0]],
                         [[f"`{r.field}`", *([r.side] if many else []), r.base, r.new]
                          for r in c.env_changes.itertuples()]) + [""]
    checked = _checked(c)
    header = ["verdict", *(["numerics"] if checked else []), "point", "metric", "new/base (95 % CI)", "p (Holm)",
              "n base / new", "why"]

    def rows(frame):
        return [[f"{_MARK[r.verdict]} {r.verdict}",
                 *([_NUM_MARK[r.numerics] + (f" ({r.numerics_basis})" if r.numerics_basis else "")] if checked else []),
                 f"`{r.point}`" + (f" ({r.new})" if len(c.new_labels) > 1 else ""),
                 r.metric, _ratio(r), _p(r.p_holm), f"{r.n_base} / {r.n_new}",
                 r.why + (f"; numerics: {r.numerics_why}" if r.numerics == "differs" else "")]
                for r in frame.itertuples()]

    moved = (c.points["verdict"] != "same") | (c.points["numerics"] == "differs")
    changed, same = c.points[moved], c.points[~moved]
    if len(changed):
        out += _md_table(header, rows(changed)) + [""]
    if len(same):
        out += [f"<details><summary>{len(same)} points the same</summary>", ""]
        out += _md_table(header, rows(same)) + ["", "</details>", ""]
    if len(c.one_side):
        out += ["**Only on one side**", ""] + [f"- {r.side}: `{_cell(r.point)}`" + _metric_of(r)
                                               for r in c.one_side.itertuples()] + [""]
    if len(c.not_ok):
        out += ["**Not ok**", ""]
        out += _md_table(["side", "point", "status", "configs", "reason"],
                         [[sides, f"`{point}`", status, n, reason] for sides, point, status, reason, n in _not_ok(c)]) + [""]
    if c.notes:
        out += ["**Notes**", ""] + [f"- {_cell(n)}" for n in c.notes] + [""]
    return "\n".join(out)


def _records(frame: pd.DataFrame) -> list[dict]:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v.item() if hasattr(v, "item") else v
    return [{k: clean(v) for k, v in row.items()} for row in frame.to_dict("records")]


def to_json(c: Comparison) -> dict:
    """The comparison as JSON-ready data (NaN as null)."""
    return {"base": c.base_label, "new": list(c.new_labels), "metric": c.metric, "threshold": c.threshold,
            "alpha": c.alpha, "correction": c.correction, "strict": c.strict, "run_to_run": c.run_to_run,
            "accept_numerics": c.accept_numerics, "numerics_differ": c.numerics_differ, "claims": claims(c),
            "exit_code": c.exit_code,
            "summary": c.summary,
            "uncompared": c.uncompared, "points": _records(c.points), "one_side": _records(c.one_side),
            "not_ok": _records(c.not_ok), "env_changes": _records(c.env_changes), "notes": list(c.notes)}
