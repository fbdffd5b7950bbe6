"""nccl-tests and rccl-tests stdout as perfkit's collectives rows.

The table every ``*_perf`` binary prints (``all_reduce_perf -b 8 -e 8G -f 2``), in every format
generation of ``shared/reference/native/README.md``: before v2.13 (an ``error`` column, no
``agg iters``), v2.13+ (``#wrong``, a ``root`` column), v2.16.7+ (``# Collective test
starting: <binary>``), v2.17.4+ (a ``# nccl-tests version`` line), and rccl-tests' variants (a
``rccl-tests: Version`` line, rank lines without ``Group``); and rccl-tests' ``--output_file``
JSON lines (one object per size and form: ``name``, ``size``, ``time`` in µs, ``algBw``,
``busBw``, ``#wrong``, ``gpus``; rccl-tests PR #93). nccl-tests' own ``-J`` JSON (v2.17.3+) is
refused with that reason: no real file of it was found to test a reader on. One row per table line and form
(out-of-place, in-place), in the columns of :mod:`perfkit.measuring.collectives.benchmark`:

- ``time_s`` is nccl-tests' time (the mean over its ``iters``, printed in µs);
- ``algbw_bytes_per_s`` and ``busbw_bytes_per_s`` are **perfkit's**, recomputed from the size,
  the time and :func:`perfkit.core.formulas.busbw_factor` at the run's world size; nccl-tests'
  own printed values are kept beside them (``*_reported_bytes_per_s``), and every row's two
  busbw must agree within what the printed digits allow, or the file is refused (a wrong world
  size, a wrong collective, a corrupt line);
- ``wrong_elements`` is ``#wrong`` (None where the check was off: ``N/A``, or the old ``error``).

A file may hold several runs one after another (a loop over the binaries), each read with its
own collective, world size, version and header (``run_index``), and lines may carry a
launcher's prefix (``srun -l``'s ``0: ``, ``mpirun --tag-output``'s ``[1,0]<stdout>:``).

The collective is the binary the file names; a file older than v2.16.7 names none, and it is
inferred where one collective alone fits the columns and the busbw/algbw ratio (``all_reduce``
at 2(n−1)/n), else the caller passes it (``op=``). A run that did not finish (no
``# Avg bus bandwidth`` line: a hang, a crash, a cut log) is refused unless ``partial=True``,
which keeps its rows marked ``failed`` with the reason; rows with ``#wrong`` > 0 are ``failed``.
"""

from __future__ import annotations

import math
import re

from perfkit.core.errors import BadInputError
from perfkit.core.formulas import COLLECTIVES, busbw_factor, message_bytes
from perfkit.ingest.parsed import ParsedRun, json_records

__all__ = ["parse", "BINARIES", "DTYPES"]

#: nccl-tests binaries and the collective each measures (perfkit's names).
BINARIES = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
            "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast",
            "alltoall_perf": "all_to_all", "sendrecv_perf": "send_recv"}
#: nccl-tests' type names: (torch dtype name, bytes per element).
DTYPES = {"int8": ("int8", 1), "char": ("int8", 1), "uint8": ("uint8", 1), "int32": ("int32", 4),
          "int": ("int32", 4), "uint32": ("uint32", 4), "int64": ("int64", 8), "uint64": ("uint64", 8),
          "half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8),
          "bfloat16": ("bfloat16", 2), "f8e4m3": ("float8_e4m3fn", 1), "f8e5m2": ("float8_e5m2", 1)}
_REDUCING = ("all_reduce", "reduce_scatter")

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                   r"\[[^\]]*\]\s+(.*?)\s*$")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"^#\s*(nccl|rccl)-tests version\s+(\S+)(?:.*nccl-library=(\d+))?")
_RCCL_VERSION = re.compile(r"^rccl-tests: Version\s*(\S*)")
_LIB_VERSION = re.compile(r"(?:NCCL|RCCL) version\s*:?\s*([0-9][^\s]*)")
_ITERS = re.compile(r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)")
_FAILURE = re.compile(r"Test (?:\w+ )?failure|[Ff]ailed|error|Error|Abort")
_FAILURE_TEXT = re.compile(r"(?:\S+:\s*)?Test (?:\w+ )?failure.*")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _nccl_version(code: str) -> str:
    """NCCL_VERSION_CODE (major·10000 + minor·100 + patch since 2.9) as ``2.29.2``."""
    n = int(code)
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}" if n >= 20900 else f"{n // 1000}.{n // 100 % 10}.{n % 100}"


def _columns(header: str) -> list[str]:
    """The table's leading columns (before the out-of-place time): size, count, type, [redop], [root]."""
    names = header.lstrip("#").split()
    return names[:names.index("time")]


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def _failure(line: str) -> str:
    """The failure message of a line (the ``host: Test CUDA failure ...`` part where a row was cut)."""
    m = _FAILURE_TEXT.search(line)
    return (m.group(0) if m else line).strip()


def _split_row(line: str, leading: list[str]) -> dict | None:
    """One table line as {column: text}, or None if it is not a complete row. The two forms'
    four columns (time, algbw, busbw, #wrong|error) are read from the right, so a blank column
    before them (an old alltoall's empty ``redop``) does not shift them."""
    tokens = line.split()
    if len(tokens) < 3 + 8 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    forms, head = tokens[-8:], tokens[:-8]
    if not all(re.fullmatch(_NUMBER, t) for i, t in enumerate(forms) if i % 4 != 3):
        return None
    cells = dict(zip(leading, head)) if len(head) == len(leading) else None
    if cells is None:  # a blank column: size, count and type lead, root (an int) is last
        cells = {"size": head[0], "count": head[1], "type": head[2]}
        if "root" in leading and len(head) > 3 and re.fullmatch(r"-?\d+", head[-1]):
            cells["root"] = head[-1]
    for i, form in enumerate(("oop", "ip")):
        cells.update({f"{form}_{k}": v for k, v in zip(("time", "algbw", "busbw", "wrong"), forms[4 * i: 4 * i + 4])})
    return cells


def _infer_op(leading: list[str], cells: dict, world_size: int, source: str, hint: str | None = None) -> str:
    """The collective of a file that does not name it: the one whose busbw/algbw factor at this
    world size and whose columns fit (a redop: a reduction; a root: broadcast); ``hint`` (a
    file of several runs' ``--op``) picks among several that fit, and must be one of them."""
    algbw, busbw = float(cells["oop_algbw"]), float(cells["oop_busbw"])
    candidates = []
    for op in COLLECTIVES:
        if op == "send_recv":
            continue
        factor = busbw_factor(op, world_size)
        if abs(busbw - algbw * factor) > 0.006 + 0.006 * factor:
            continue
        has_root = "root" in leading and cells.get("root", "-1") != "-1"
        if (op == "broadcast") != has_root:
            continue
        reduces = cells.get("redop") not in (None, "", "none")  # absent or blank: no reduction
        if reduces != (op in _REDUCING):
            continue
        candidates.append(op)
    if not candidates:
        raise BadInputError(f"{source} does not name its collective (no '# Collective test starting:' line, "
                            f"before nccl-tests 2.16.7), and at the {world_size} ranks it lists no collective's "
                            "busbw/algbw fits: pass the run's --world-size (a cut rank list?) and --op")
    if hint is not None and len(candidates) > 1:
        if hint not in candidates:
            raise BadInputError(f"{source} does not name its collective, and its columns and busbw/algbw fit "
                                f"{', '.join(candidates)}, not --op {hint}")
        return hint
    if len(candidates) > 1:
        raise BadInputError(f"{source} does not name its collective (no '# Collective test starting:' line, "
                            f"before nccl-tests 2.16.7), and its columns and busbw/algbw fit {', '.join(candidates)}: "
                            "pass --op")
    return candidates[0]


def _check_busbw(row: dict, printed_busbw: str, time_text: str, where: str) -> None:
    """perfkit's busbw and nccl-tests' printed one agree within the printed digits (the time's
    last digit, the busbw's last digit), or the world size or collective is not the run's."""
    printed = float(printed_busbw)
    step = 10.0 ** -_decimals(printed_busbw)
    mine = row["busbw_bytes_per_s"] / 1e9
    time_rel = 0.5 * 10.0 ** -_decimals(time_text) / float(time_text) if float(time_text) > 0 else 0.0
    if abs(mine - printed) > 0.5 * step + mine * time_rel + 1e-9:
        raise BadInputError(f"{where}: nccl-tests printed busbw {printed_busbw} GB/s, and {row['op']} of "
                            f"{row['size_bytes']} B in {time_text} us on {row['world_size']} ranks is "
                            f"{mine:.4f} GB/s: the world size or the collective is not this run's "
                            "(pass --world-size or --op)")


#: What launchers put before every line: ``srun -l``'s task number (``0: ``), ``mpirun
#: --tag-output``'s ``[job,rank]<stdout>:``. A table row never starts so (its size has no colon).
_LAUNCHER_PREFIX = re.compile(r"^(?:\s*\d+: ?|\[\d+,\d+\]<std(?:out|err)>: ?)")
#: Lines that open a run's output: each binary of a loop over them prints these again.
_OPENS_A_RUN = re.compile(r"^#\s*(?:nccl-tests version|Collective test starting:|nThread\s)|^rccl-tests: Version")


def _without_launcher_prefixes(text: str) -> str:
    """``text`` without a launcher's per-line prefix, where most lines carry one."""
    lines = text.splitlines()
    marked = [bool(_LAUNCHER_PREFIX.match(line)) for line in lines if line.strip()]
    if not marked or sum(marked) < len(marked) / 2:
        return text
    return "\n".join(_LAUNCHER_PREFIX.sub("", line, count=1) for line in lines)


class _RunFailed(BadInputError):
    """A run that stopped before its table (a CUDA error, a busy device): in a file of several runs,
    a failed run of its own; alone, the file's one-line error."""


def _runs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each run in ``text``: a line that opens a run's output
    (:data:`_OPENS_A_RUN`) after a table header starts the next run (what ``for b in *_perf; do
    $b ...; done > log`` writes), and so does one of a kind the current run has already opened with
    (a binary that crashed before its table: its lines would otherwise merge into the next run's)."""
    runs, start, current, seen_header, opened = [], 1, [], False, set()
    for number, line in enumerate(text.splitlines(), start=1):
        m = _OPENS_A_RUN.match(line)
        kind = m.group(0).split()[-1] if m else None
        if m and (seen_header or kind in opened):
            runs.append((start, "\n".join(current)))
            start, current, seen_header, opened = number, [], False, set()
        if kind:
            opened.add(kind)
        current.append(line)
        seen_header = seen_header or (line.startswith("#") and " size " in f" {line.lstrip('#')} "
                                      and "count" in line and "time" in line)
    runs.append((start, "\n".join(current)))
    return runs


def parse(text: str, *, op: str | None = None, world_size: int | None = None, partial: bool = False,
          source: str = "the file") -> ParsedRun:
    """Read nccl-tests/rccl-tests stdout (module docstring): one run, or several one after another
    (a loop over the binaries: each its own collective, world size, version and header; its rows
    carry ``run_index``, and ``parts`` holds each run with its own facts), with or without a
    launcher's line prefixes (``srun -l``, ``mpirun --tag-output``). ``op``: the collective,
    where a run does not name it; ``world_size``: the ranks, where a run's rank list is cut;
    ``partial``: keep the rows of a run that did not finish, marked ``failed``."""
    if op is not None and op not in COLLECTIVES:
        raise BadInputError(f"--op {op!r}: one of {', '.join(COLLECTIVES)}")
    if not text.strip():
        raise BadInputError(f"{source} is empty")
    text = _without_launcher_prefixes(text)
    if text.lstrip().startswith(("{", "[")):
        return _parse_json_lines(text, op=op, world_size=world_size, source=source)
    runs = [(start, body) for start, body in _runs(text) if body.strip()]
    if len(runs) == 1:
        return _parse_run(runs[0][1], op=op, world_size=world_size, partial=partial, source=source)
    parts = []
    for index, (start, body) in enumerate(runs, start=1):
        where = f"{source} (run {index} of {len(runs)}, from line {start})"
        try:
            part = _parse_run(body, op=op, world_size=world_size, partial=partial, op_is_hint=True,
                              source=where, first_line=start)
        except _RunFailed as exc:  # one binary that failed: a run of its own, reported, not the others lost
            parts.append(ParsedRun(rows=[], facts={}, finished=False, reason=exc.reason))
            continue
        for row in part.rows:
            row["run_index"] = index
        parts.append(part)
    unfinished = [p for p in parts if not p.finished]
    if len(unfinished) == len(parts):
        raise BadInputError(f"{source}: every one of its {len(parts)} runs failed: {unfinished[0].reason}")
    return ParsedRun(rows=[r for p in parts for r in p.rows], facts=next(p.facts for p in parts if p.finished), parts=parts,
                     finished=not unfinished, reason=unfinished[0].reason if unfinished else None)


def _parse_run(text: str, *, op: str | None, world_size: int | None, partial: bool, source: str,
               first_line: int = 1, op_is_hint: bool = False) -> ParsedRun:
    """One run's stdout (``first_line``: where it starts in the file, for the line numbers said;
    ``op_is_hint``: the run is one of several, and ``op`` only settles an unnamed collective that
    more than one fits: applied as given to every run, it would label a reduce_scatter run of a
    legacy log all_gather, whose busbw factor and message size are the same)."""
    facts: dict = {"backend": "nccl"}
    ranks: dict[int, tuple[str, str]] = {}
    named_op = iters = leading = None
    rows_cells: list[tuple[int, dict]] = []
    failures: list[str] = []
    finished = False
    pending: tuple[int, str] | None = None  # a row-like line that did not parse
    for number, raw in enumerate(text.splitlines(), start=first_line):
        line = raw.rstrip()
        if m := _VERSION.match(line):
            facts["backend"], facts["tool_version"] = m.group(1), m.group(2)
            if m.group(3):
                facts["nccl"] = _nccl_version(m.group(3))
        elif m := _RCCL_VERSION.match(line):
            facts["backend"], facts["tool_version"] = "rccl", m.group(1) if re.search(r"\w", m.group(1)) else None
        elif m := _STARTING.match(line):
            if m.group(1) not in BINARIES:
                raise BadInputError(f"{source} line {number}: {m.group(1)} is not a collective perfkit reads "
                                    f"({', '.join(BINARIES)})")
            named_op = BINARIES[m.group(1)]
        elif m := _RANK.match(line):
            ranks[int(m.group(1))] = (m.group(2), m.group(3))
        elif m := _ITERS.search(line):
            iters = (int(m.group(1)), int(m.group(2)))
        elif line.startswith("#") and " size " in f" {line.lstrip('#')} " and "count" in line and "time" in line:
            leading = _columns(line)
        elif line.startswith("# Avg bus bandwidth"):
            finished = True
        elif (m := _LIB_VERSION.search(line)) and "nccl" not in facts:
            facts["nccl"] = m.group(1).split("+")[0]
        elif leading is not None and not line.startswith("#") and line.strip():
            cells = _split_row(line, leading)
            if cells is not None and pending is None:
                rows_cells.append((number, cells))
            elif cells is None and re.match(r"^\s*\d+\s+\d+\s+\w+", line) and pending is None:
                pending = (number, line.strip())  # a cut row: a failure or the end must follow
                if _FAILURE.search(line):
                    failures.append(_failure(line))
            elif _FAILURE.search(line) and "NCCL INFO" not in line:
                failures.append(_failure(line))
            elif pending is not None and cells is not None:
                raise BadInputError(f"{source} line {pending[0]}: not a row of nccl-tests' table: {pending[1][:80]!r}")
        elif _FAILURE.search(line) and "NCCL INFO" not in line and not line.startswith("#"):
            failures.append(_failure(line))
    if leading is None and failures and (ranks or facts.get("tool_version")):
        raise _RunFailed(f"{source}: the run failed before its table: {failures[0][:160]}")
    if leading is None:
        raise BadInputError(f"{source} is not nccl-tests output: no table header "
                            "('#  size  count  type ... time  algbw  busbw') in it")
    n = world_size or len(ranks)
    if n < 1:
        raise BadInputError(f"{source}: no '#  Rank' lines to count the ranks: pass --world-size")
    reason = None
    if not finished:
        what = failures[0][:160] if failures else "the output stops" + (" after the table header" if not rows_cells else "")
        reason = (f"the run did not finish ({what}; no '# Avg bus bandwidth' line)"
                  + (f": {len(rows_cells)} rows before it" if rows_cells else ""))
        if not rows_cells:
            raise BadInputError(f"{source}: no result rows: {reason}")
        if not partial:
            raise BadInputError(f"{source}: {reason}; its rows are not a complete run (--partial imports "
                                "them marked failed)")
    if named_op and op and op != named_op and not op_is_hint:
        raise BadInputError(f"{source} is {named_op}'s output (its '# Collective test starting' line), not {op}'s")
    if named_op:
        op = named_op
    elif op is None or op_is_hint:  # one of several runs: --op only picks among what fits each
        op = _infer_op(leading, rows_cells[-1][1], n, source, hint=op)
    hosts = sorted({h for h, _ in ranks.values()})
    devices = sorted({d for _, d in ranks.values()})
    facts.update({"device": "cuda", "device_kind": "rocm" if facts["backend"] == "rccl" else "cuda",
                  "device_name": devices[0] if len(devices) == 1 else ", ".join(devices) or None,
                  "device_count": n, "hostname": ", ".join(hosts) or None, "hosts": len(hosts) or None})
    rows = [_row(cells, op, n, iters, f"{source} line {number}", number) for number, cells in rows_cells]
    rows = [r for pair in rows for r in pair]
    for r in rows:
        if not finished:
            r["status"], r["reason"] = "failed", reason
        elif r["wrong_elements"]:
            r["status"], r["reason"] = "failed", f"nccl-tests counted {r['wrong_elements']} wrong elements"
        else:
            r["status"], r["reason"] = "ok", None
    return ParsedRun(rows=rows, facts=facts, finished=finished, reason=reason)


def _row(cells: dict, op: str, n: int, iters, where: str, line: int) -> list[dict]:
    dtype, elem = DTYPES.get(cells["type"], (cells["type"], None))
    size, count = int(cells["size"]), int(cells["count"])
    if elem is not None and size != message_bytes(op, count, elem, n):
        raise BadInputError(f"{where}: {count} {cells['type']} elements of {op} on {n} ranks are "
                            f"{message_bytes(op, count, elem, n)} B, the row says {size} B: the world size or "
                            "the collective is not this run's (pass --world-size or --op)")
    out = []
    for form, inplace in (("oop", False), ("ip", True)):
        time_text = cells[f"{form}_time"]
        time_s = float(time_text) * 1e-6
        wrong_text = cells[f"{form}_wrong"]
        algbw = size / time_s if time_s > 0 else math.nan
        row = {"workload": "collectives", "op": op, "inplace": inplace, "size_bytes": size, "count": count,
               "dtype": dtype, "redop": cells.get("redop"), "root": int(cells["root"]) if "root" in cells else None,
               "world_size": n, "time_s": time_s,
               "warmup_iters": iters[0] if iters else None, "iters": iters[1] if iters else None,
               "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * busbw_factor(op, n),
               "algbw_reported_bytes_per_s": float(cells[f"{form}_algbw"]) * 1e9,
               "busbw_reported_bytes_per_s": float(cells[f"{form}_busbw"]) * 1e9,
               "wrong_elements": int(wrong_text) if wrong_text.isdigit() else None, "source_line": line}
        if time_s > 0:
            _check_busbw(row, cells[f"{form}_busbw"], time_text, where)
        out.append(row)
    return out


#: rccl-tests' JSON ``name`` -> perfkit's collective.
_JSON_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "broadcast": "broadcast", "alltoall": "all_to_all", "sendrecv": "send_recv"}


def _parse_json_lines(text: str, *, op, world_size, source: str) -> ParsedRun:
    objects = json_records(text, source)
    if any(isinstance(o, dict) and "results" in o and "version" in o for o in objects):
        raise BadInputError(f"{source} is nccl-tests' own -J JSON, which perfkit does not read yet: import "
                            "the run's stdout instead")
    rows = []
    for i, obj in enumerate(objects, start=1):
        need = ("name", "size", "time", "busBw", "inPlace", "type")
        if not isinstance(obj, dict) or any(k not in obj for k in need):
            raise BadInputError(f"{source} is not nccl-tests output: its JSON record {i} is not an rccl-tests "
                                f"result (needs {', '.join(need)})")
        name = _JSON_NAMES.get(str(obj["name"]).lower())
        if name is None:
            raise BadInputError(f"{source} record {i}: {obj['name']!r} is not a collective perfkit reads")
        if op is not None and op != name:
            raise BadInputError(f"{source} is {name}'s output (its records' name), not {op}'s")
        n = world_size or int(obj.get("gpus") or 0)
        if n < 1:
            raise BadInputError(f"{source} record {i}: no 'gpus' to count the ranks: pass --world-size")
        dtype, elem = DTYPES.get(obj["type"], (obj["type"], None))
        size, time_s = int(obj["size"]), float(obj["time"]) * 1e-6
        algbw = size / time_s if time_s > 0 else math.nan
        wrong = str(obj.get("#wrong", ""))
        row = {"workload": "collectives", "op": name, "inplace": bool(int(obj["inPlace"])), "size_bytes": size,
               "count": size // elem if elem else None, "dtype": dtype, "redop": obj.get("redop"), "root": obj.get("root"),
               "world_size": n, "time_s": time_s, "warmup_iters": None, "iters": None,
               "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": algbw * busbw_factor(name, n),
               "algbw_reported_bytes_per_s": float(obj["algBw"]) * 1e9 if "algBw" in obj else None,
               "busbw_reported_bytes_per_s": float(obj["busBw"]) * 1e9,
               "wrong_elements": int(wrong) if wrong.isdigit() else None, "source_line": i}
        # Unrounded numbers: the two busbw agree to floating-point precision, or n is not the run's.
        if time_s > 0 and not math.isclose(row["busbw_bytes_per_s"], row["busbw_reported_bytes_per_s"], rel_tol=1e-6):
            raise BadInputError(f"{source} record {i}: busBw {obj['busBw']} GB/s is not {name} of {size} B in "
                                f"{obj['time']} us on {n} ranks ({row['busbw_bytes_per_s'] / 1e9:.6g} GB/s)")
        row["status"], row["reason"] = (("failed", f"rccl-tests counted {row['wrong_elements']} wrong elements")
                                        if row["wrong_elements"] else ("ok", None))
        rows.append(row)
    if not rows:
        raise BadInputError(f"{source}: no records")
    facts = {"backend": "rccl", "device": "cuda", "device_kind": "rocm", "device_count": rows[0]["world_size"]}
    return ParsedRun(rows=rows, facts=facts)
