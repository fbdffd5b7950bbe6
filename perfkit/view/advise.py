"""``perfkit advise``: the constraints that bind each configuration of a results folder, ranked,
with their evidence, the rule and its source, and what to try (rules: perfkit.analyse.advice)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..analyse.advice import Finding, advise
from ..analyse.advice.rules import select_rules
from ..core.errors import BadInputError
from .advice_text import render_markdown, render_rules, render_terminal, to_json

__all__ = ["add_advise_command", "run_advise", "advice_for_this_configuration"]

HELP = """\
For each configuration in DIR (a sweep's or run's --out folder), the constraints that bind it,
ranked by the share of its time each costs: input-bound, straggler, exposed communication,
pipeline bubble, memory headroom, latency-bound collectives, a GEMM far below the ceiling,
host/launch-bound, memory-bound ops, a precision the device beats. Each comes with the
numbers it read (its evidence), the rule and where its threshold comes from, how confident it is
(low: a noisy row, or evidence near the threshold), and what to try. A configuration whose every
row is noisy gets "rerun", never a constraint. Only ok rows are read.

Given trace files instead (a profiler trace from anywhere, perfkit's or not), the rules a trace
alone supports: exposed communication, an idle (host- or launch-bound) GPU, GEMM/attention/conv
far below their roof, activation checkpointing's recompute, exposed memcpy; each with its
evidence and source (perfkit.analyse.advice.trace).

Exit codes: 0 advice given (or nothing found to advise), 2 bad input (not a results folder, no ok
rows, an unknown rule).
"""


def add_advise_command(sub) -> None:
    """Register ``perfkit advise`` on the CLI's subparsers."""
    p = sub.add_parser("advise", help="what binds each configuration, the evidence, and what to try",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR|TRACE", nargs="?",
                   help="a results folder (a sweep's or run's --out), or a Kineto trace file (.json, .json.gz)")
    p.add_argument("more_traces", metavar="TRACE", nargs="*", help="more trace files, advised each on its own")
    p.add_argument("--rule", action="append", default=[], metavar="NAME",
                   help="only this rule (repeatable; perfkit advise --rules lists them)")
    p.add_argument("--rules", action="store_true", help="list the rules, their thresholds and sources, and exit")
    p.add_argument("--json", metavar="FILE", help="also write the advice as JSON ('-': print it instead of text)")
    p.add_argument("--markdown", metavar="FILE", help="also write the advice as markdown")
    p.add_argument("--spec", metavar="OUT.yaml",
                   help="write the A/B sweep spec that tests the top advice (current vs advised setting, the "
                        "configuration as it ran); with --top N, OUT-2.yaml... for the next")
    p.add_argument("--verify", action="store_true",
                   help="run that experiment into DIR/advice/<n>/ and report perfkit compare's verdict on it")
    p.add_argument("--top", type=int, default=1, metavar="N", help="how many pieces of advice --spec/--verify test (default 1)")
    p.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="rounds of each side in the experiment, interleaved (default 3; 5 or more to gate on it)")
    from ..run.sweep.cli import add_executor_arguments

    add_executor_arguments(p)  # where --verify runs the experiment: here, a Slurm job array, or Ray tasks
    p.set_defaults(func=run_advise)


def _check_args(args) -> None:
    if args.rules:
        return
    if args.dir is None:
        raise BadInputError("give a results folder: perfkit advise DIR (or --rules to list the rules)")
    if args.more_traces and not str(args.dir).endswith((".json", ".json.gz")):
        raise BadInputError(f"perfkit advise takes one results folder, or trace files: got {args.dir} and more")
    from .advise_trace import is_trace_path

    if is_trace_path(args.dir):
        if args.spec or args.verify or args.rule:
            raise BadInputError("--spec, --verify and --rule apply to a results folder, not to trace files")
        return
    if not Path(args.dir).is_dir():
        raise BadInputError(f"results directory {args.dir!r} does not exist (or is not a folder)")
    if args.executor != "local" and not args.verify:
        raise BadInputError("--executor says where --verify runs its experiments: give --verify too")
    for flag, path in (("--markdown", args.markdown), ("--json", args.json), ("--spec", args.spec)):
        if path and path != "-" and not Path(path).resolve().parent.is_dir():
            raise BadInputError(f"{flag} {path}: folder {str(Path(path).resolve().parent)!r} does not exist")
    if args.top < 1:
        raise BadInputError(f"--top must be at least 1, got {args.top}")
    if args.rounds < 1:
        raise BadInputError(f"--rounds must be at least 1, got {args.rounds}")


def run_advise(args) -> int:
    """``perfkit advise``: read, advise, print, write the files asked for."""
    _check_args(args)
    rules = select_rules(args.rule)  # an unknown name: exit 2 before anything is read
    if args.rules:
        print(render_rules(rules))
        return 0
    from .advise_trace import advise_traces, is_trace_path, write_outputs

    if is_trace_path(args.dir):
        paths = [args.dir, *args.more_traces]
        write_outputs(advise_traces(paths), paths, json_path=args.json, markdown_path=args.markdown)
        return 0
    from .compare import load_rows

    rows = load_rows(args.dir)
    findings = advise(rows, rules)
    data = to_json(findings, directory=args.dir, rows=rows)
    if args.json == "-":
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render_terminal(findings, directory=args.dir, rows=rows))
    if args.json and args.json != "-":
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(render_markdown(findings, directory=args.dir), encoding="utf-8")
    if args.spec:
        from .advise_followup import write_specs

        for path in write_specs(findings, Path(args.dir), Path(args.spec), top=args.top, rounds=args.rounds):
            print(f"experiment spec: {path} (perfkit sweep {path} --out DIR; perfkit compare DIR --by variant "
                  f"--base current)")
    if args.verify:
        return _verify(findings, args)
    return 0


def _verify(findings: list[Finding], args) -> int:
    from ..run.sweep.cli import executor_from_args
    from .advise_followup import experiments, verify

    executor = executor_from_args(args)
    if not experiments(findings, args.top):
        print("\nnothing to verify: no advice here comes with an experiment (a setting to change), so there is "
              "nothing to run; the findings above say what was seen")
        return 0
    print(f"\nverifying the top {args.top} piece(s) of advice, {args.rounds} rounds a side, into "
          f"{Path(args.dir) / 'advice'}/ ...", flush=True)
    for n, v in enumerate(verify(findings, Path(args.dir), top=args.top, rounds=args.rounds,
                                   executor=executor), 1):
        print(f"[{n}] {v.finding.constraint} in {v.finding.point}\n    {v.text}\n    rows: {v.folder}")
    return 0


def advice_for_this_configuration(rules: list[str] | None = None):
    """In a notebook, after its rows are recorded: what binds this configuration, from every row
    it recorded (its results file; in an interactive session, this kernel's), as a markdown table
    (``perfkit advise DIR`` says the same for a whole folder, with the experiments)."""
    from IPython.display import Markdown

    from ..core.results import current_context, load

    ctx = current_context()
    rows = load(ctx.results_path.parent, filters=[("config_id", "==", ctx.config_id)]) \
        if ctx.results_path.exists() else None
    if rows is None or rows.empty or not (rows["status"] == "ok").any():
        return Markdown("No ok rows recorded by this configuration yet: nothing to advise on.")
    findings = advise(rows, select_rules(rules))
    return Markdown(render_markdown(findings, directory=f"this configuration ({ctx.config_id})"))
