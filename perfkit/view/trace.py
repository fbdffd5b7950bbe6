"""``perfkit trace``: where the time of a profiled run goes, from its Kineto/Chrome traces.

Finds the traces of the paths given (:func:`find_trace_sets`: trace files, folders of rank files,
results directories), runs :mod:`perfkit.analyse.trace.breakdown` on each set (all ranks of one
run together, as HTA analyses one trace folder) and shows the result as text or as one JSON
object whose records carry HTA's field names, so a user can check perfkit against HTA line by
line. ``--diff A B`` compares two traces with :func:`perfkit.analyse.trace.diff.trace_diff`.
The report's Traces section and ``notebooks/trace.ipynb`` use the same functions
(:mod:`perfkit.view.trace_report`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import BadInputError
from .trace_text import (BREAKDOWN_HELP, VIEWER_HINT, data_wait_by_rank, format_time, render_diff, render_text,  # noqa: F401
                         timeline_text)

__all__ = ["add_trace_command", "run_trace", "TraceSet", "TraceResult", "find_trace_sets", "analyse_set",
           "frames", "to_json", "render_text", "diff_to_json", "render_diff", "TRACE_PATH_ENV", "notebook_trace_path",
           "VIEWER_HINT", "HOW_TO_PROFILE", "BREAKDOWN_HELP", "format_time", "data_wait_by_rank", "timeline_text"]

HOW_TO_PROFILE = "perfkit run notebooks/train_step.ipynb --out runs/t -p profile True"

HELP = f"""\
Where does the time of a profiled run go? Kineto traces (torch.profiler's Chrome JSON, .json or
.json.gz) from NVIDIA or AMD GPUs, recorded by perfkit or not.

PATH: a trace file, a folder of one run's rank files (one multi-rank trace set), or a results
directory (every run under DIR/traces/<config_id>/<run>/). Make one with
`{HOW_TO_PROFILE}`.

Times are the trace's own, exact (--hta-rounding rounds them inward to whole microseconds as
Holistic Trace Analysis does, for parity with HTA). Per trace set, per rank:
""" + "".join(f"  {name:<13} {text}\n" for name, text in BREAKDOWN_HELP.items()) + f"""
Windows (--window): each ProfilerStep (the GPU work its host launched) and all steps together,
or, without steps, everything launched in the trace; and the whole trace. The op table covers
the steps (or what was launched). --link flow ties a kernel to its launch as TraceLens does
(through an ac2g flow event; ROCm draws none for hipMemsetAsync), for parity with TraceLens.
--json prints one object: timeline, op_categories, ops (every op call), op_shapes,
unexplained_kernels, and HTA's temporal, idle, kernel_types, overlap, top_kernels, data_wait.
--diff A B: the kernels (CPU ops on CPU traces) whose time per step changed most between two
traces, and those added or removed.
The traces themselves {VIEWER_HINT}.
Exit codes: 0 done; 2 bad input (a missing path, not a trace, a folder without traces).
"""

_TRACE_SUFFIXES = (".json", ".json.gz")
_PROGRESS_BYTES = 20 << 20  # smaller traces are read in about a second: no bar
_NAME_CHARS = 70


def add_trace_command(sub) -> None:
    """Register ``perfkit trace`` on the CLI's subparsers."""
    p = sub.add_parser("trace", help="where the time goes: HTA's breakdowns of profiler traces; --diff two traces",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH", help="trace files, run folders or results directories")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--steps", nargs=2, type=int, metavar=("A", "B"),
                   help="analyse ProfilerStep#A..#B only (default: every step but the last, as HTA)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="kernels (or changes with --diff) to list (default 10)")
    p.add_argument("--diff", action="store_true", help="compare two traces: PATH A (control) and PATH B (test)")
    p.add_argument("--window", choices=("auto", "steps", "launched", "trace"), default="auto",
                   help="the GPU timeline's windows (default auto: each step and all steps, else launched; and trace)")
    p.add_argument("--link", choices=("correlation", "flow"), default="correlation",
                   help="how a kernel is tied to its launch: its correlation id (default), or also an ac2g flow "
                        "as TraceLens requires")
    p.add_argument("--hta-rounding", action="store_true",
                   help="round every time inward to whole µs as HTA does (parity with HTA; default: exact)")
    p.set_defaults(func=run_trace)


@dataclass(frozen=True)
class TraceSet:
    """The trace files of one run, one per rank, analysed together."""

    label: str
    """How the set is named in the output: the file, or the folder of its rank files."""
    paths: tuple[Path, ...]


@dataclass(frozen=True)
class TraceResult:
    """The breakdowns of one :class:`TraceSet` (DataFrames with HTA's column names)."""

    trace: TraceSet
    breakdowns: dict
    """``temporal``, ``idle``, ``kernel_types``, ``overlap`` (:func:`~perfkit.analyse.trace.breakdown.breakdowns`)."""
    top_kernels: pd.DataFrame
    data_wait: pd.DataFrame
    events: int
    """Events kept from the files (all ranks)."""
    timeline: pd.DataFrame = None
    """:func:`perfkit.analyse.trace.timeline.gpu_timeline` of every rank."""
    ops: tuple = ()
    """One :class:`perfkit.analyse.trace.ops.TraceOps` per rank with GPU work."""

    @property
    def has_gpu(self) -> bool:
        return bool((self.breakdowns["temporal"]["kernel_time(us)"] > 0).any())


def _natural(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _is_trace_name(path: Path) -> bool:
    return path.name.endswith(_TRACE_SUFFIXES)


def find_trace_sets(paths) -> list[TraceSet]:
    """The trace sets of ``paths``: a file is one set; a folder's trace files (those under its
    ``traces/`` when it has one: a results directory) are one set per folder holding them.

    Checks every path before anything is read; raises :class:`BadInputError` (one line)."""
    sets: dict[tuple, TraceSet] = {}
    for given in map(Path, paths):
        if not given.exists():
            raise BadInputError(f"{given}: no such trace file or directory")
        if given.is_file():
            if not _is_trace_name(given):
                raise BadInputError(f"{given}: not a trace file (expected a Chrome/Kineto trace, .json or .json.gz)")
            sets.setdefault((given.resolve(),), TraceSet(label=str(given), paths=(given,)))
            continue
        root = given / "traces" if (given / "traces").is_dir() else given
        files = sorted((f for f in root.rglob("*") if f.is_file() and _is_trace_name(f)),
                       key=lambda f: (str(f.parent), _natural(f)))  # rank2 before rank10
        if not files:
            raise BadInputError(f"{given}: no trace files (*.json, *.json.gz) under {root}; "
                                f"profile a run first: {HOW_TO_PROFILE}")
        folders: dict[Path, list[Path]] = {}
        for f in files:
            folders.setdefault(f.parent, []).append(f)
        for folder, members in folders.items():
            key = tuple(m.resolve() for m in members)
            sets.setdefault(key, TraceSet(label=str(folder), paths=tuple(members)))
    return list(sets.values())


def _check_steps(steps) -> tuple[int, int] | None:
    if steps is None:
        return None
    first, last = steps
    if first > last:
        raise BadInputError(f"--steps {first} {last}: the first step comes after the last")
    return int(first), int(last)


def _read(paths, *, desc: str, **options) -> list:
    """Read trace files, with a bar over their bytes when someone watches (a terminal, JupyterLab)."""
    from ..analyse.trace.events import read_trace
    from ..core.progress import watched

    total = sum(p.stat().st_size for p in paths)
    if not watched() or total < _PROGRESS_BYTES:
        return [read_trace(p, **options) for p in paths]
    from tqdm.auto import tqdm

    out = []
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr) as bar:
        for p in paths:
            out.append(read_trace(p, **options))
            bar.update(p.stat().st_size)
    return out


def analyse_set(trace: TraceSet, *, steps: tuple[int, int] | None = None, top: int = 10, window: str = "auto",
                link: str = "correlation", hta_rounding: bool = False) -> TraceResult:
    """Read one trace set and compute its timeline, ops and breakdowns (raises :class:`BadInputError`
    on a bad file)."""
    from ..analyse.trace.breakdown import breakdowns, data_wait_share, top_kernels
    from ..analyse.trace.ops import trace_ops
    from ..analyse.trace.timeline import gpu_timeline, main_window

    events = _read(trace.paths, desc=f"reading {trace.label}", round_to_us=hta_rounding, op_args=True)
    ops = []
    for ev in events:
        name, rows = main_window(ev, link)
        if len(rows):
            ops.append(trace_ops(ev, link=link, rows=rows, window=name))
    return TraceResult(trace=trace, breakdowns=breakdowns(events, steps=steps),
                       top_kernels=top_kernels(events, top, steps=steps),
                       data_wait=data_wait_share(events, steps=steps), events=sum(len(e) for e in events),
                       timeline=gpu_timeline(events, window=window, link=link), ops=tuple(ops))


def _plain(value):
    """A JSON value: numpy scalars as Python numbers, NaN as null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{str(k): _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


_KEYS = ("temporal", "idle", "kernel_types", "overlap", "top_kernels", "data_wait")


def frames(results: list[TraceResult]) -> dict[str, pd.DataFrame]:
    """Every set's frames concatenated per key (:data:`_KEYS`), a ``trace`` column first naming the set."""
    out = {}
    for key in _KEYS:
        parts = []
        for r in results:
            frame = r.breakdowns[key] if key in r.breakdowns else {"top_kernels": r.top_kernels, "data_wait": r.data_wait}[key]
            parts.append(frame.assign(trace=r.trace.label)[["trace", *frame.columns]])
        full = [f for f in parts if len(f)]  # pandas warns on concatenating empty frames
        out[key] = pd.concat(full, ignore_index=True) if full else (parts[0] if parts else pd.DataFrame(columns=["trace"]))
    return out


def to_json(results: list[TraceResult]) -> dict:
    """One object: ``traces`` (each set's files) and, as lists of records each with its
    ``trace``, ``temporal``, ``idle``, ``kernel_types``, ``overlap`` (HTA's field names),
    ``top_kernels`` and ``data_wait`` (per ProfilerStep)."""
    out: dict = {"traces": [{"trace": r.trace.label, "files": [str(p) for p in r.trace.paths], "events": r.events,
                             "devices": [{"rank": o.rank, "window": o.window, **o.roof} for o in r.ops]}
                            for r in results]}
    out |= {"timeline": _records(pd.concat([r.timeline.assign(trace=r.trace.label) for r in results if len(r.timeline)])
                                 if any(len(r.timeline) for r in results) else pd.DataFrame())}
    for key, part in (("op_categories", lambda o: o.categories()), ("ops", lambda o: o.instances),
                      ("op_shapes", lambda o: o.shapes), ("unexplained_kernels", lambda o: o.unexplained)):
        frames_ = [part(o).assign(trace=r.trace.label, window=o.window) for r in results for o in r.ops]
        frames_ = [f for f in frames_ if len(f)]
        out[key] = _records(pd.concat(frames_, ignore_index=True)) if frames_ else []
    return out | {key: _records(frame) for key, frame in frames(results).items()}


def _diff_side(given: str) -> Path:
    """One trace of a ``--diff`` side: a file, or the lowest-rank file of one run folder."""
    sets = find_trace_sets([given])
    if len(sets) != 1:
        raise BadInputError(f"--diff compares two traces, but {given} holds {len(sets)} trace sets: give one "
                            f"trace file or one run folder (DIR/traces/<config_id>/<run>)")
    return sets[0].paths[0]


def diff_to_json(diff, *, control: Path, test: Path, device: str, top: int) -> dict:
    return {"control": str(control), "test": str(test), "device": device, "control_steps": diff.control_steps,
            "test_steps": diff.test_steps, "changed_most": _records(diff.changed_most),
            "changed_most_relative": _records(diff.changed_most_relative),
            "added": _records(diff.added.head(top)), "removed": _records(diff.removed.head(top)),
            "added_count": len(diff.added), "removed_count": len(diff.removed)}


def _op_diff(a, b, link: str):
    """The op-by-op comparison of two traces' main windows (None when either has no GPU work)."""
    from ..analyse.trace.op_diff import op_diff
    from ..analyse.trace.ops import trace_ops
    from ..analyse.trace.timeline import gpu_timeline, main_window

    sides = []
    for ev in (a, b):
        name, rows = main_window(ev, link)
        if not len(rows):
            return None
        timeline = gpu_timeline(ev, link=link)
        row = timeline[(timeline["window"] == name) & (timeline["kernels"] == "all")].iloc[0]
        sides.append((trace_ops(ev, link=link, rows=rows, window=name), row))
    return op_diff(sides[0][0], sides[1][0], control_timeline=sides[0][1], test_timeline=sides[1][1])


def _run_diff(args, steps) -> int:
    from ..analyse.trace.diff import trace_diff

    control, test = (_diff_side(p) for p in args.paths)
    a, b = _read([control, test], desc="reading traces", round_to_us=args.hta_rounding, op_args=True)
    # Kernels when either side ran some; a CPU-only pair compares its CPU operators.
    device = "gpu" if any((ev.stream != -1).any() for ev in (a, b)) else "cpu"
    diff = trace_diff(a, b, control_steps=steps, test_steps=steps, device=device, n=args.top)
    ops = _op_diff(a, b, args.link) if device == "gpu" else None
    if args.json:
        doc = diff_to_json(diff, control=control, test=test, device=device, top=args.top)
        if ops is not None:
            doc["op_diff"] = {"control_device": ops.control_device, "test_device": ops.test_device,
                              "timeline": _records(ops.timeline), "categories": _records(ops.categories),
                              "shapes": _records(ops.shapes), "only_control": _records(ops.only_control),
                              "only_test": _records(ops.only_test)}
        print(json.dumps(doc, indent=1))
    else:
        print(render_diff(diff, control=control, test=test, device=device, top=args.top, ops=ops))
    return 0


def run_trace(args) -> int:
    """``perfkit trace``: check the input, analyse every trace set, print; 0, or 2 (bad input)."""
    if args.top < 1:
        raise BadInputError(f"--top {args.top}: list at least 1")
    steps = _check_steps(args.steps)
    if args.diff:
        if len(args.paths) != 2:
            raise BadInputError(f"--diff compares two traces: give exactly two PATHs (control, test), got {len(args.paths)}")
        return _run_diff(args, steps)
    sets = find_trace_sets(args.paths)
    results = [analyse_set(s, steps=steps, top=args.top, window=args.window, link=args.link,
                           hta_rounding=args.hta_rounding) for s in sets]  # all read before anything prints
    print(json.dumps(to_json(results), indent=1) if args.json else render_text(results, top=args.top))
    return 0


#: The trace notebook's trace file or results directory when its ``path`` parameter is "" (how
#: the test suite points nbval, which cannot inject parameters, at a trace it made).
TRACE_PATH_ENV = "PERFKIT_TRACE_PATH"


def notebook_trace_path(path: str | os.PathLike) -> Path:
    """The trace notebook's path: ``path``, or ``$PERFKIT_TRACE_PATH`` when it is "".

    Missing, it says how to make a trace: the notebook never shows a made-up one."""
    given = str(path) or os.environ.get(TRACE_PATH_ENV, "")
    if not given:
        raise BadInputError(f"path is empty and ${TRACE_PATH_ENV} is not set: make a trace with "
                            f"`{HOW_TO_PROFILE}` and set path to runs/t (../runs/t from notebooks/)")
    if not Path(given).exists():
        raise BadInputError(f"{given!r} does not exist (looked in {Path(given).resolve()}): make a trace with "
                            f"`{HOW_TO_PROFILE}` and set path to its --out, or to one .json.gz trace file")
    return Path(given)
