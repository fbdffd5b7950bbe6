"""A streaming reader of Chrome/Kineto traces into compact columns.

``torch.profiler`` writes one JSON object per rank: ``traceEvents`` (every event) beside small
metadata (``distributedInfo``, ``deviceProperties``, ...). Holistic Trace Analysis (HTA 0.5.0,
``hta/common/trace_parser.py``) loads the whole text, every event as a dict, then a DataFrame of
every field and per-row ``apply`` passes; its peak memory is many times the file. This reader
takes the text a run of events at a time from :class:`~perfkit.analyse.trace.json_source.JsonSource`
(msgspec decodes a run at once into small structs of the fields read, skipping the rest), keeps
what the breakdowns use as numpy columns, a column of a run at a time, and lets the run go:
peak memory is the columns (72 bytes per kept event) plus a megabyte or two of text and events.
Text that cannot be cut into runs is read one event at a time, by the same rules (:mod:`~perfkit.analyse.trace.event_columns`).

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

import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from perfkit.analyse.trace.event_columns import EventColumns, int_or
from perfkit.analyse.trace.json_source import JsonSource
from perfkit.core.errors import BadInputError

__all__ = ["TraceEvents", "read_trace"]

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

    @cached_property
    def end_us(self) -> np.ndarray:
        """``ts_us + dur_us``, built once (callers index it per event in loops)."""
        return self.ts_us + self.dur_us


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
    src = JsonSource(path)
    try:
        return _read(src, round_to_us, op_args)
    finally:
        src.close()


def _read(src: JsonSource, round_to_us: bool = False, op_args: bool = False) -> TraceEvents:
    meta: dict = {}
    reader = EventColumns(src.path, op_args)
    saw_events = False
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
            reader.read_events(src)
        else:
            value = src.value()
            if key in _META_KEYS:
                meta[key] = value
        if src.expect(",}") == "}":
            break
    if not saw_events:
        raise BadInputError(f"{src.path}: no traceEvents list; not a Chrome/Kineto trace")

    cols = reader.cols
    ts = np.frombuffer(cols.ts, dtype=np.float64)
    dur = np.frombuffer(cols.dur, dtype=np.float64)
    rounded = reader.fractional and round_to_us
    if rounded:
        # HTA's round_down_time_stamps: inward to whole microseconds, end first.
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        dur = np.maximum(end - ts, 0.0)  # a sub-µs event rounded inward: no negative duration
    # Relative to the first event, as HTA aligns traces: epoch microseconds (~1.7e15) are near
    # 2**53, where float64 sums and fractional durations lose the sub-microsecond digits.
    origin = float(ts.min()) if len(ts) else 0.0
    info = meta.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = int_or(info.get("rank"), 0)
    props = meta.get("deviceProperties")
    return TraceEvents(
        path=src.path, rank=rank, names=tuple(reader.names),
        name_id=np.frombuffer(cols.name_id, dtype=np.int32),
        cat_id=np.frombuffer(cols.cat_id, dtype=np.int32),
        ts_us=ts - origin, dur_us=np.array(dur), origin_us=origin,
        pid=np.frombuffer(cols.pid, dtype=np.int64), tid=np.frombuffer(cols.tid, dtype=np.int64),
        stream=np.frombuffer(cols.stream, dtype=np.int64),
        correlation=np.frombuffer(cols.correlation, dtype=np.int64),
        external_id=np.frombuffer(cols.external_id, dtype=np.int64),
        index=np.frombuffer(cols.index, dtype=np.int64),
        rounded_to_us=rounded,
        process_names=reader.process_names, thread_names=reader.thread_names,
        distributed_info=info, device_properties=props if isinstance(props, list) else [],
        op_args=reader.args_of_ops, sync_args=reader.sync_args,
        flow_ids=np.array(sorted(i for i in reader.flows["s"] & reader.flows["f"] if type(i) is int),
                          dtype=np.int64),
    )
