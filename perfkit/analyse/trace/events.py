"""A streaming reader of Chrome/Kineto traces into compact columns.

``torch.profiler`` writes one JSON object per rank: ``traceEvents`` (every event) beside small
metadata (``distributedInfo``, ``deviceProperties``, ...). Holistic Trace Analysis (HTA 0.5.0,
``hta/common/trace_parser.py``) loads the whole text, every event as a dict, then a DataFrame of
every field and per-row ``apply`` passes; its peak memory is many times the file. This reader
decompresses in chunks and decodes one event at a time with the C scanner of :mod:`json`
(no streaming JSON library is needed), keeping only what the breakdowns use, as numpy columns:
peak memory is the columns (72 bytes per kept event) plus a few chunks of text.

What is kept follows HTA's parser so the breakdowns can equal HTA's (``_compress_df``):

- events that have a ``dur`` and a ``cat``, except ``cat == "Trace"`` (HTA drops the others);
  ``python_function`` events are left out too, but for activation checkpointing's recompute
  (``torch/utils/checkpoint.py(...): recompute_fn``, the span TraceLens marks recompute under);
- ``args.stream`` as HTA normalises it: ``int(value)``, or -1 when missing or not a number
  (ROCm's runtime events say ``"0x0"``, which becomes -1: host side);
- ``args.correlation`` and ``args["External id"]`` (-1 when missing);
- timestamps are exact: the trace's fractional microseconds, as written. HTA rounds every event
  inward to whole microseconds when any ``ts`` is fractional (``ts = ceil(ts)``,
  ``end = floor(ts + dur)``; pytorch/pytorch#122425): on an inference trace of 1–5 µs kernels that
  loses a sixth of the GPU time (bert-small on an MI300X: 388.3 → 326 µs). ``round_to_us=True``
  does as HTA does, for parity with HTA itself; a sub-microsecond event it would give a negative
  duration keeps none (0), so no interval ends before it starts.
- with ``op_args=True``, each ``cpu_op``'s recorded shapes (``record_shapes``): ``Input Dims``,
  ``Input type``, ``Input Strides`` and ``Concrete Inputs``, in :attr:`TraceEvents.op_args`.

Metadata: ``process_name``/``thread_name`` ('M' events), ``distributedInfo`` and
``deviceProperties``. The rank is ``distributedInfo.rank``, or 0 when absent (HTA's default).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import zlib
from array import array
from dataclasses import dataclass, field

import numpy as np

from perfkit.core.errors import BadInputError

__all__ = ["TraceEvents", "read_trace"]

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK_BYTES = 4 << 20
_MAX_VALUE_CHARS = 64 << 20  # one JSON value (an event, a metadata block) larger than this is not a trace
_WS = re.compile(r"[ \t\n\r]*")
_SKIPPED_CATS = frozenset({"Trace", "python_function"})
_RECOMPUTE_MARK = "recompute_fn"  # torch/utils/checkpoint.py's recompute_fn: TraceLens's is_recompute roots
_OP_ARG_KEYS = (("Input Dims", "dims"), ("Input type", "types"), ("Input Strides", "strides"),
                ("Concrete Inputs", "concrete"))
_META_KEYS = ("distributedInfo", "deviceProperties")


@dataclass(frozen=True, eq=False)
class TraceEvents:
    """The kept events of one trace file, one numpy column each (row ``i`` is one event).

    ``ts_us`` are microseconds since ``origin_us`` (the earliest kept event's trace timestamp),
    ``dur_us`` microseconds (both after HTA's rounding when it applies);
    ``name_id``/``cat_id`` index ``names``; ``index`` is the event's position in
    ``traceEvents`` (HTA's ``index``), which orders events as the file does. ``names`` holds
    event names and categories alike.
    """

    path: str
    rank: int
    names: tuple[str, ...]
    name_id: np.ndarray
    cat_id: np.ndarray
    ts_us: np.ndarray
    dur_us: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    index: np.ndarray
    origin_us: float
    rounded_to_us: bool
    """True when HTA's inward rounding to whole microseconds was applied."""
    process_names: dict = field(default_factory=dict)
    thread_names: dict = field(default_factory=dict)
    distributed_info: dict = field(default_factory=dict)
    device_properties: list = field(default_factory=list)
    flow_ids: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    """Sorted ids of the ``ac2g`` flows the trace draws from a launch to its GPU event with both
    ends (``ph`` ``s`` and ``f``): TraceLens links a kernel to its launch only through one."""
    op_args: dict = field(default_factory=dict)
    """Row → ``{"dims", "types", "strides", "concrete"}`` of each ``cpu_op`` with recorded shapes
    (read with ``op_args=True``; empty otherwise)."""
    sync_args: dict = field(default_factory=dict)
    """Row → ``(cuda_sync_kind, wait_on_stream, wait_on_cuda_event_record_corr_id)`` of each
    ``cuda_sync`` event (Kineto records them with ``experimental_config`` sync events, or by
    default since PyTorch 2.4 on CUDA): which stream and which ``cudaEventRecord`` a wait or a
    synchronisation waited for (-1 where the trace does not say)."""

    def __len__(self) -> int:
        return len(self.ts_us)

    def ids_of(self, predicate) -> np.ndarray:
        """Sorted ids of the names (or categories) for which ``predicate(name)`` is true."""
        return np.array([i for i, s in enumerate(self.names) if predicate(s)], dtype=np.int32)

    @property
    def end_us(self) -> np.ndarray:
        return self.ts_us + self.dur_us


class _Source:
    """Decompressed text of a trace file, read in chunks, with a cursor over a sliding buffer."""

    def __init__(self, path: str):
        self.path = path
        raw = open(path, "rb")
        if raw.read(2) == _GZIP_MAGIC:
            import gzip

            raw.seek(0)
            raw = gzip.GzipFile(fileobj=raw, mode="rb")
        else:
            raw.seek(0)
        self._file = raw
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self._scan = json.scanner.make_scanner(json.JSONDecoder())

    def close(self) -> None:
        self._file.close()

    def _fill(self, min_ahead: int) -> None:
        if self.pos > len(self.buf) // 2:  # drop what was consumed, keep the rest
            self.buf, self.pos = self.buf[self.pos:], 0
        while not self.eof and len(self.buf) - self.pos < min_ahead:
            try:
                chunk = self._file.read(_CHUNK_BYTES)
                text = self._decoder.decode(chunk, final=not chunk)
            except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
                raise BadInputError(f"{self.path}: not a readable JSON trace ({err})") from None
            self.eof = not chunk
            self.buf += text

    def skip_ws(self) -> str:
        """The next non-blank character ('' at the end), without consuming it."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return self.buf[self.pos:self.pos + 1]
            self._fill(1)

    def expect(self, chars: str) -> str:
        c = self.skip_ws()
        if not c or c not in chars:
            raise BadInputError(f"{self.path}: not a Chrome/Kineto JSON trace (expected one of {chars!r} "
                                f"at character {self.pos}, found {c!r})")
        self.pos += 1
        return c

    def value(self):
        """Decode the JSON value at the cursor, reading more text until it is complete."""
        self.skip_ws()
        ahead = 1 << 16
        while True:
            self._fill(ahead)
            try:
                obj, end = self._scan(self.buf, self.pos)
            except (StopIteration, ValueError):
                # Incomplete in the buffer, or malformed: read more unless there is no more.
                if self.eof or ahead > _MAX_VALUE_CHARS:
                    raise BadInputError(f"{self.path}: not a valid JSON trace (bad value at "
                                        f"character {self.pos})") from None
                ahead *= 4
                continue
            if end == len(self.buf) and not self.eof:
                ahead *= 4  # a number may go on in the next chunk
                continue
            self.pos = end
            return obj

    def items(self):
        """The values of the JSON array whose '[' was just consumed, one at a time; consumes the ']'.

        The fast path scans straight from the buffer; whatever fails there (the buffer ends
        inside a value, or the text is malformed) goes through :meth:`value`, which reads on.
        """
        scan, ws = self._scan, _WS.match
        if self.skip_ws() == "]":
            self.pos += 1
            return
        while True:
            buf = self.buf
            try:
                obj, end = scan(buf, self.pos)
            except (StopIteration, ValueError):
                obj = self.value()
                buf, end = self.buf, self.pos
            yield obj
            pos = ws(buf, end).end()
            c = buf[pos:pos + 1]
            if c == ",":
                self.pos = ws(buf, pos + 1).end()
            elif c == "]":
                self.pos = pos + 1
                return
            else:  # the buffer ended (or the text is malformed): the slow path decides
                self.pos = pos
                if self.expect(",]") == "]":
                    return
                self.skip_ws()


def _stream_of(value) -> int:
    if type(value) is int:
        return value
    try:  # HTA: normalize_gpu_stream_numbers, int() or -1
        return int(value)
    except (ValueError, TypeError):
        return -1


def _int_or(value, default: int = -1) -> int:
    if type(value) is int:
        return value
    try:
        return int(value)
    except (ValueError, TypeError):
        return default


class _Columns:
    """Typed growable columns (``array.array`` keeps raw values, not Python objects)."""

    def __init__(self):
        self.name_id, self.cat_id = array("i"), array("i")
        self.ts, self.dur = array("d"), array("d")
        self.pid, self.tid = array("q"), array("q")
        self.stream, self.correlation = array("q"), array("q")
        self.external_id, self.index = array("q"), array("q")


def read_trace(path: str | os.PathLike, *, round_to_us: bool = False, op_args: bool = False) -> TraceEvents:
    """The kept events of the trace at ``path`` (plain or gzipped JSON, detected from the bytes).

    Times are exact; ``round_to_us=True`` rounds them inward to whole microseconds as HTA does
    (for parity with HTA itself, never the default). ``op_args=True`` keeps each ``cpu_op``'s
    recorded shapes and dtypes (:attr:`TraceEvents.op_args`), what an op-level roofline needs.

    Raises :class:`BadInputError` (one line) for a file that is not a Chrome/Kineto trace.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "a directory, not a trace file" if os.path.isdir(path) else "no such trace file"
        raise BadInputError(f"{path}: {what}")
    src = _Source(path)
    try:
        return _read(src, round_to_us, op_args)
    finally:
        src.close()


def _read(src: _Source, round_to_us: bool = False, op_args: bool = False) -> TraceEvents:
    meta: dict = {}
    cols = _Columns()
    names: dict[str, int] = {}
    other_ids: dict[str, int] = {}  # string pids/tids ("Spans", "stream 7") as negative codes
    process_names: dict = {}
    thread_names: dict = {}
    saw_events = False
    any_fractional_ts = False
    args_of_ops: dict[int, dict] = {}
    sync_args: dict[int, tuple] = {}
    flows: dict[str, set] = {"s": set(), "f": set()}
    src.expect("{")
    if src.skip_ws() == "}":
        raise BadInputError(f"{src.path}: empty JSON object; no traceEvents, not a Chrome/Kineto trace")
    while True:
        key = src.value()
        if not isinstance(key, str):
            raise BadInputError(f"{src.path}: not a Chrome/Kineto JSON trace")
        src.expect(":")
        if key == "traceEvents":
            saw_events = True
            any_fractional_ts |= _read_events(src, cols, names, other_ids, process_names, thread_names,
                                              args_of_ops if op_args else None, flows, sync_args)
        else:
            value = src.value()
            if key in _META_KEYS:
                meta[key] = value
        if src.expect(",}") == "}":
            break
    if not saw_events:
        raise BadInputError(f"{src.path}: no traceEvents list; not a Chrome/Kineto trace")

    ts = np.frombuffer(cols.ts, dtype=np.float64)
    dur = np.frombuffer(cols.dur, dtype=np.float64)
    if any_fractional_ts and round_to_us:
        # HTA's round_down_time_stamps: inward to whole microseconds, end first.
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        dur = np.maximum(end - ts, 0.0)  # a sub-µs event rounded inward: no negative duration
    # Relative to the first event, as HTA aligns traces: epoch microseconds (~1.7e15) are near
    # 2**53, where float64 sums and fractional durations lose the sub-microsecond digits.
    origin = float(ts.min()) if len(ts) else 0.0
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = _int_or(info.get("rank"), 0)
    props = meta.get("deviceProperties")
    return TraceEvents(
        path=src.path, rank=rank, names=tuple(names),
        name_id=np.frombuffer(cols.name_id, dtype=np.int32),
        cat_id=np.frombuffer(cols.cat_id, dtype=np.int32),
        ts_us=ts - origin, dur_us=np.array(dur), origin_us=origin,
        pid=np.frombuffer(cols.pid, dtype=np.int64), tid=np.frombuffer(cols.tid, dtype=np.int64),
        stream=np.frombuffer(cols.stream, dtype=np.int64),
        correlation=np.frombuffer(cols.correlation, dtype=np.int64),
        external_id=np.frombuffer(cols.external_id, dtype=np.int64),
        index=np.frombuffer(cols.index, dtype=np.int64),
        rounded_to_us=any_fractional_ts and round_to_us,
        process_names=process_names, thread_names=thread_names,
        distributed_info=info, device_properties=props if isinstance(props, list) else [],
        op_args=args_of_ops, sync_args=sync_args,
        flow_ids=np.array(sorted(i for i in flows["s"] & flows["f"] if type(i) is int), dtype=np.int64),
    )


def _read_events(src, cols, names, other_ids, process_names, thread_names, args_of_ops=None,
                 flows=None, sync_args=None) -> bool:
    """Consume the ``traceEvents`` array into ``cols`` (and each ``cpu_op``'s shapes into
    ``args_of_ops`` when given); True when some ts is fractional or missing."""
    src.expect("[")
    fractional = False
    name_id, cat_id = cols.name_id.append, cols.cat_id.append
    ts_a, dur_a, pid_a, tid_a = cols.ts.append, cols.dur.append, cols.pid.append, cols.tid.append
    stream_a, corr_a = cols.stream.append, cols.correlation.append
    ext_a, index_a = cols.external_id.append, cols.index.append

    def code(value) -> int:
        if type(value) is int:
            return value
        key = str(value)
        if key not in other_ids:
            other_ids[key] = -2 - len(other_ids)
        return other_ids[key]

    for position, ev in enumerate(src.items()):
        if type(ev) is not dict:
            raise BadInputError(f"{src.path}: traceEvents[{position}] is not an event object")
        ts = ev.get("ts")
        if type(ts) is not int:
            fractional = True  # a float (or missing) ts makes HTA's ts column float: it rounds
        dur, cat = ev.get("dur"), ev.get("cat")
        if dur is None or cat is None or ts is None or (
                cat in _SKIPPED_CATS and not (cat == "python_function" and _RECOMPUTE_MARK in ev.get("name", ""))):
            ph = ev.get("ph")
            if ph == "M":
                _metadata(ev, process_names, thread_names)
            elif cat == "ac2g" and flows is not None and ph in flows:
                flows[ph].add(ev.get("id"))
            continue
        name = ev.get("name", "")
        nid = names.get(name)
        if nid is None:
            nid = names[name] = len(names)
        cid = names.get(cat)
        if cid is None:
            cid = names[cat] = len(names)
        args = ev.get("args")
        if type(args) is dict:
            stream = _stream_of(args.get("stream", -1))
            corr = _int_or(args.get("correlation", -1))
            ext = _int_or(args.get("External id", -1))
        else:
            stream = corr = ext = -1
        if args_of_ops is not None and cat == "cpu_op" and type(args) is dict and "Input Dims" in args:
            args_of_ops[len(cols.ts)] = {short: args.get(key) for key, short in _OP_ARG_KEYS}
        if sync_args is not None and cat == "cuda_sync" and type(args) is dict:
            sync_args[len(cols.ts)] = (str(args.get("cuda_sync_kind", name)), _int_or(args.get("wait_on_stream", -1)),
                                       _int_or(args.get("wait_on_cuda_event_record_corr_id", -1)))
        try:
            ts_a(ts)
            dur_a(dur)
        except TypeError:
            raise BadInputError(f"{src.path}: traceEvents[{position}] has a non-numeric ts or dur") from None
        name_id(nid)
        cat_id(cid)
        pid_a(code(ev.get("pid", -1)))
        tid_a(code(ev.get("tid", -1)))
        stream_a(stream)
        corr_a(corr)
        ext_a(ext)
        index_a(position)
    return fractional


def _metadata(ev: dict, process_names: dict, thread_names: dict) -> None:
    args = ev.get("args")
    if not isinstance(args, dict) or "name" not in args:
        return
    if ev.get("name") == "process_name":
        process_names[ev.get("pid")] = args["name"]
    elif ev.get("name") == "thread_name":
        thread_names[(ev.get("pid"), ev.get("tid"))] = args["name"]
