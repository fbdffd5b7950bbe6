"""What a trace keeps of each event of its ``traceEvents``, and as which columns.

The rules follow HTA's parser (``hta/common/trace_parser.py``), so that breakdowns can equal
HTA's; :mod:`perfkit.analyse.trace.events` says which events and fields, and why. Two ways in,
one set of rules: a run of events that msgspec decoded at once into small structs of the fields
read (:meth:`EventColumns.take_run`, a column of the run at a time), and one event as a dict
(:meth:`EventColumns.take`: the rest of a trace whose text cannot be cut into runs, and a run
with a value of an unexpected shape).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from perfkit.analyse.trace.json_source import JsonSource
from perfkit.core.errors import BadInputError

__all__ = ["EventColumns", "int_or"]

_SKIPPED_CATS = frozenset({"Trace", "python_function"})
_RECOMPUTE_MARK = "recompute_fn"  # torch/utils/checkpoint.py's recompute_fn: TraceLens's is_recompute roots
_OP_ARG_KEYS = (("Input Dims", "dims"), ("Input type", "types"), ("Input Strides", "strides"),
                ("Concrete Inputs", "concrete"))


def int_or(value, default: int = -1) -> int:
    """``int(value)``, or ``default`` where it is not a number (HTA's normalize_gpu_stream_numbers:
    ROCm's host streams say "0x0")."""
    if type(value) is int:
        return value
    try:
        return int(value)
    except (ValueError, TypeError):
        return default


# --- the fields read, for msgspec's typed decoder (every other field is skipped, not decoded) ---------
# Typed ``Any``: a value of an unexpected type is judged by the same code as the per-event path.

class _Args(msgspec.Struct, gc=False):
    stream: Any = -1
    correlation: Any = -1
    external_id: Any = msgspec.field(default=-1, name="External id")
    name: Any = None  # 'M' events: the process or thread name
    cuda_sync_kind: Any = msgspec.UNSET
    wait_on_stream: Any = -1
    wait_on_cuda_event_record_corr_id: Any = -1


class _OpArgs(_Args, gc=False):
    dims: Any = msgspec.field(default=msgspec.UNSET, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")
    strides: Any = msgspec.field(default=None, name="Input Strides")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")


_MISSING = float("nan")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = -1
    tid: Any = -1
    ts: Any = _MISSING  # NaN: the float columns take it as they are (a JSON null is None, also NaN there)
    dur: Any = _MISSING
    id: Any = None  # flow events
    args: _Args | None = None


class _OpEvent(_Event, gc=False):
    args: _OpArgs | None = None


_NO_ARGS = _OpArgs()
_TS, _DUR, _CAT, _NAME, _PID, _TID, _ARGS, _PH, _ID = map(
    attrgetter, ("ts", "dur", "cat", "name", "pid", "tid", "args", "ph", "id"))
_STREAM, _CORRELATION, _EXTERNAL_ID = map(attrgetter, ("stream", "correlation", "external_id"))
_INT, _NUMBER_OR_NONE = frozenset({int}), frozenset({int, float, type(None)})


def _put(column: array, values: np.ndarray) -> None:
    """Append a numpy array to an ``array.array`` column of the same item type (a copy of bytes)."""
    column.frombytes(np.ascontiguousarray(values, dtype=column.typecode).tobytes())


def _parsed_ints(values: list, normalise) -> np.ndarray:
    """``values`` as int64 as ``int()`` reads them (numbers truncated, numeric strings parsed),
    and through ``normalise`` where one is not (None, "0x0")."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array(list(map(normalise, values)), dtype=np.int64)


def _ints(values: list, normalise) -> np.ndarray:
    """``values`` as int64, each value that is not an int through ``normalise`` (as take() does)."""
    if set(map(type, values)) <= _INT:
        return np.array(values, dtype=np.int64)
    return np.array(list(map(normalise, values)), dtype=np.int64)


_DECODERS = {False: msgspec.json.Decoder(list[_Event]), True: msgspec.json.Decoder(list[_OpEvent])}
_GENERIC = msgspec.json.Decoder()


class _Columns:
    """Typed growable columns (``array.array`` keeps raw values, not Python objects)."""

    def __init__(self):
        self.name_id, self.cat_id = array("i"), array("i")
        self.ts, self.dur = array("d"), array("d")
        self.pid, self.tid = array("q"), array("q")
        self.stream, self.correlation = array("q"), array("q")
        self.external_id, self.index = array("q"), array("q")


class EventColumns:
    """What one trace's ``traceEvents`` keep: the columns, the name table and the side tables.

    Two ways in, with one set of rules: :meth:`take_run` for a run of events decoded together
    (a column at a time, in comprehensions), :meth:`take` for one event as a dict (the rest of a
    trace whose text :meth:`JsonSource.runs` cannot cut, and a run that has values of
    unexpected types).
    """

    def __init__(self, path: str, op_args: bool):
        self.path, self.op_args = path, op_args
        self.cols = _Columns()
        self.names: dict = {}
        self.other_ids: dict = {}  # string pids/tids ("Spans", "stream 7") as negative codes
        self.process_names: dict = {}
        self.thread_names: dict = {}
        self.args_of_ops: dict[int, dict] = {}
        self.sync_args: dict[int, tuple] = {}
        self.flows: dict[str, set] = {"s": set(), "f": set()}
        self.fractional = False  # some ts is fractional or missing: HTA's ts column is float, it rounds
        self.position = 0  # index in traceEvents of the next event
        self._decode = _DECODERS[op_args].decode

    def code(self, value) -> int:
        if type(value) is int:
            return value
        key = str(value)
        if key not in self.other_ids:
            self.other_ids[key] = -2 - len(self.other_ids)
        return self.other_ids[key]

    def decode_run(self, run) -> list:
        """The events of a run (the bytes of a JSON array); msgspec.DecodeError where it is not one."""
        try:
            return self._decode(run)
        except msgspec.ValidationError:
            return _GENERIC.decode(run)  # JSON, but some value of another shape: per event

    def take_run(self, events: list) -> None:
        if not events:
            return
        if type(events[0]) is not _Event and type(events[0]) is not _OpEvent:
            for ev in events:
                self.take(ev)
            return
        n, base = len(events), self.position
        self.position += n
        ts, dur, cat = list(map(_TS, events)), list(map(_DUR, events)), list(map(_CAT, events))
        ts_types, dur_types = set(map(type, ts)), set(map(type, dur))
        self.fractional = self.fractional or not ts_types <= _INT
        if not (ts_types | dur_types) <= _NUMBER_OR_NONE:
            bad = next(i for i, t, d in zip(range(base, base + n), ts, dur)
                       if type(t) not in _NUMBER_OR_NONE or type(d) not in _NUMBER_OR_NONE)
            raise BadInputError(f"{self.path}: traceEvents[{bad}] has a non-numeric ts or dur")
        # The same rules as take(), a column at a time: None becomes NaN in a float column.
        ts_us, dur_us = np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64)
        present = ~(np.isnan(ts_us) | np.isnan(dur_us))
        cat_of = {c: i for i, c in enumerate(dict.fromkeys(cat))}  # the run's categories, a code each
        cat_code = np.fromiter(map(cat_of.__getitem__, cat), dtype=np.int32, count=n)
        dropped = [i for c, i in cat_of.items() if c is None or c in _SKIPPED_CATS]
        keep = present & ~np.isin(cat_code, dropped)
        if "python_function" in cat_of:  # but activation checkpointing's recompute spans
            for i in np.flatnonzero(cat_code == cat_of["python_function"]).tolist():
                keep[i] = present[i] and _RECOMPUTE_MARK in events[i].name
        self._take_unkept(events, ~keep, cat_code == cat_of.get("ac2g", -1))
        rows = np.flatnonzero(keep)
        if not len(rows):
            return
        kept = list(map(events.__getitem__, rows.tolist())) if len(rows) < n else events
        c = self.cols
        row0 = len(c.ts)
        _put(c.ts, ts_us[rows])
        _put(c.dur, dur_us[rows])
        name = list(map(_NAME, kept))
        names = self.names
        for s in dict.fromkeys(name):  # first appearance order, each once
            if s not in names:
                names[s] = len(names)
        _put(c.name_id, np.fromiter(map(names.__getitem__, name), dtype=np.int32, count=len(rows)))
        kept_code = cat_code[rows]
        to_name = np.full(len(cat_of), -1, dtype=np.int32)
        categories = list(cat_of)  # by code
        for code in np.flatnonzero(np.bincount(kept_code, minlength=len(cat_of))).tolist():
            to_name[code] = names.setdefault(categories[code], len(names))
        _put(c.cat_id, to_name[kept_code])
        _put(c.pid, _ints(list(map(_PID, kept)), self.code))
        _put(c.tid, _ints(list(map(_TID, kept)), self.code))
        args = list(map(_ARGS, kept))
        if None in args:
            args = [a if a is not None else _NO_ARGS for a in args]
        _put(c.stream, _parsed_ints(list(map(_STREAM, args)), int_or))
        _put(c.correlation, _parsed_ints(list(map(_CORRELATION, args)), int_or))
        _put(c.external_id, _parsed_ints(list(map(_EXTERNAL_ID, args)), int_or))
        _put(c.index, rows + base)
        for category, store in (("cpu_op", self._take_op_args), ("cuda_sync", self._take_sync_args)):
            if category in cat_of and (category != "cpu_op" or self.op_args):
                at = np.flatnonzero(kept_code == cat_of[category]).tolist()
                store([row0 + i for i in at], [kept[i] for i in at], [args[i] for i in at])

    def _take_unkept(self, events: list, unkept: np.ndarray, flow: np.ndarray) -> None:
        """What events without a span still say: flows (``ac2g`` 's'/'f', by id) and names ('M')."""
        at = np.flatnonzero(unkept & flow).tolist()
        if at:
            ends = list(map(events.__getitem__, at))
            for ph, ids in self.flows.items():
                ids.update([i for p, i in zip(map(_PH, ends), map(_ID, ends)) if p == ph])
        others = list(map(events.__getitem__, np.flatnonzero(unkept & ~flow).tolist()))
        for e in [e for e, ph in zip(others, map(_PH, others)) if ph == "M"]:
            self._metadata(e.name, e.pid, e.tid, e.args.name if e.args is not None else None)

    def _take_op_args(self, rows: list, events: list, args: list) -> None:
        for row, a in zip(rows, args):
            if a.dims is not msgspec.UNSET:
                self.args_of_ops[row] = {"dims": a.dims, "types": a.types, "strides": a.strides,
                                         "concrete": a.concrete}

    def _take_sync_args(self, rows: list, events: list, args: list) -> None:
        for row, e, a in zip(rows, events, args):
            kind = e.name if a.cuda_sync_kind is msgspec.UNSET else a.cuda_sync_kind
            self.sync_args[row] = (str(kind), int_or(a.wait_on_stream), int_or(a.wait_on_cuda_event_record_corr_id))

    def take(self, ev) -> None:
        """One event, as a dict."""
        position = self.position
        self.position += 1
        if type(ev) is not dict:
            raise BadInputError(f"{self.path}: traceEvents[{position}] is not an event object")
        ts = ev.get("ts")
        if type(ts) is not int:
            self.fractional = True
        dur, cat = ev.get("dur"), ev.get("cat")
        if dur is None or cat is None or ts is None or (
                cat in _SKIPPED_CATS and not (cat == "python_function" and _RECOMPUTE_MARK in ev.get("name", ""))):
            ph = ev.get("ph")
            if ph == "M":
                args = ev.get("args")
                self._metadata(ev.get("name"), ev.get("pid"), ev.get("tid"),
                               args.get("name") if isinstance(args, dict) else None)
            elif cat == "ac2g" and ph in self.flows:
                self.flows[ph].add(ev.get("id"))
            return
        name = ev.get("name", "")
        c, names = self.cols, self.names
        row = len(c.ts)
        args = ev.get("args")
        if type(args) is dict:
            stream = int_or(args.get("stream", -1))
            corr = int_or(args.get("correlation", -1))
            ext = int_or(args.get("External id", -1))
            if self.op_args and cat == "cpu_op" and "Input Dims" in args:
                self.args_of_ops[row] = {short: args.get(key) for key, short in _OP_ARG_KEYS}
            if cat == "cuda_sync":
                self.sync_args[row] = (str(args.get("cuda_sync_kind", name)), int_or(args.get("wait_on_stream", -1)),
                                       int_or(args.get("wait_on_cuda_event_record_corr_id", -1)))
        else:
            stream = corr = ext = -1
        try:
            c.ts.append(ts)
            c.dur.append(dur)
        except TypeError:
            del c.ts[row:]
            raise BadInputError(f"{self.path}: traceEvents[{position}] has a non-numeric ts or dur") from None
        c.name_id.append(names.setdefault(name, len(names)))
        c.cat_id.append(names.setdefault(cat, len(names)))
        c.pid.append(self.code(ev.get("pid", -1)))
        c.tid.append(self.code(ev.get("tid", -1)))
        c.stream.append(stream)
        c.correlation.append(corr)
        c.external_id.append(ext)
        c.index.append(position)

    def _metadata(self, name, pid, tid, value) -> None:
        if value is None:
            return
        if name == "process_name":
            self.process_names[pid] = value
        elif name == "thread_name":
            self.thread_names[(pid, tid)] = value

    def read_events(self, src: JsonSource) -> None:
        """Consume the ``traceEvents`` array: runs of events while the text can be cut, then one
        event at a time."""
        src.expect("[")
        for run in src.runs(self.decode_run):
            self.take_run(run)
        if not src.array_done:
            for ev in src.items():
                self.take(ev)
