"""The trace reader's two ways through ``traceEvents`` keep the same events.

``JsonSource.runs`` cuts the array into runs that msgspec decodes at once (where a cut lands
inside a string or a nested object, the decode fails and the cut moves back); ``items`` decodes
one event at a time with the json module. Everything read through runs must equal what the
per-event path reads: on real traces of every layout the corpus has (Kineto's, TraceLens's
indented one, HTA's single line, ROCm's), with op shapes and sync events, and on text built to
trap a cut: separators inside strings, nested objects, multi-byte characters across chunk
boundaries, values of unexpected types.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from perfkit.analyse.trace import json_source
from perfkit.analyse.trace.events import read_trace
from perfkit.analyse.trace.json_source import JsonSource
from perfkit.core.errors import BadInputError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference"
LAYOUTS = {  # one real trace per layout the corpus has
    "kineto, NVIDIA, sync events": "gpu-h200/trace/hf-llama-bf16-b16-rank0.json.gz",
    "single line (HTA-written)": "traces/trace_filter/sampled_rank-0.json.gz",
    "ROCm": "traces/amd_mi250/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "indented (TraceLens), shapes": "field-traces/tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "recompute spans": "field-traces/tracelens/mi300/resnet_act_checkpoint.json.gz",
}
COLUMNS = ("ts_us", "dur_us", "pid", "tid", "stream", "correlation", "external_id", "index", "flow_ids")


def _per_event(monkeypatch) -> None:
    """Read every event through items(): runs() cuts nothing."""
    monkeypatch.setattr(JsonSource, "runs", lambda self, decode: iter(()))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for col in COLUMNS:
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]
    assert [a.names[i] for i in a.cat_id] == [b.names[i] for i in b.cat_id]
    for field in ("op_args", "sync_args", "process_names", "thread_names", "distributed_info",
                  "device_properties", "rank", "origin_us", "rounded_to_us"):
        assert getattr(a, field) == getattr(b, field), field


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_runs_read_what_the_per_event_path_reads(layout, monkeypatch):
    path = SHARED / LAYOUTS[layout]
    if not path.is_file():
        pytest.skip(f"{path} absent (the reference corpus is read in place, never copied)")
    cut = read_trace(path, op_args=True)
    with monkeypatch.context() as m:
        _per_event(m)
        one_by_one = read_trace(path, op_args=True)
    _same(cut, one_by_one)
    assert len(cut) > 100


def _event(i: int, **over) -> dict:
    ev = {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 100.25 + i, "dur": 0.5,
          "args": {"stream": 7, "correlation": i, "External id": i}}
    ev.update(over)
    return ev


TRAPS = [
    _event(1, name='a "}, {" in a name'),
    _event(2, name="}, {\"ph\": \"X\"}"),
    _event(3, args={"stream": 7, "correlation": 3, "nested": [{"a": 1}, {"b": {"c": [{}]}}]}),
    _event(4, name="ünïcödé kernel ✓ 内核"),
    _event(5, args={"stream": "0x0", "correlation": "5", "External id": None}),  # ROCm's host stream
    _event(6, pid="Spans", tid="PyTorch Profiler"),
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 6, "pid": 0, "tid": 7, "ts": 106},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 6, "pid": 0, "tid": 7, "ts": 106.5, "bp": "e"},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 ✓"}},
    {"ph": "X", "cat": "python_function", "name": "torch/utils/checkpoint.py(1500): recompute_fn",
     "pid": 1, "tid": 1, "ts": 90, "dur": 30},
    {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 90, "dur": 3},
    {"ph": "i", "name": "instant", "ts": 3, "pid": 1, "tid": 1},
]


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("gz", [False, True])
def test_runs_survive_cuts_that_land_inside_strings_and_nested_objects(tmp_path, monkeypatch, indent, gz):
    events = [ev for i in range(40) for ev in ([_event(100 + i)] + TRAPS)]
    text = json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events,
                       "traceName": "t"}, indent=indent, ensure_ascii=False).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    monkeypatch.setattr(json_source, "_CHUNK_BYTES", 61)  # multi-byte characters split across chunks
    monkeypatch.setattr(json_source, "_RUN_CHARS", 700)  # a run of a few events: many cuts, many traps
    cut = read_trace(path, op_args=True)
    with monkeypatch.context() as m:
        _per_event(m)
        one_by_one = read_trace(path, op_args=True)
    _same(cut, one_by_one)
    names = [cut.names[i] for i in cut.name_id]
    assert names.count("ünïcödé kernel ✓ 内核") == 40 and names.count('a "}, {" in a name') == 40
    assert names.count("torch/utils/checkpoint.py(1500): recompute_fn") == 40 and "f" not in names
    assert cut.flow_ids.tolist() == [6] and cut.thread_names == {(0, 7): "stream 7 ✓"}
    assert len(cut) == 40 * 8  # per group: 7 kernels and the recompute span
    # And the runs were taken: every event came through a run, not the per-event path.
    decoded = []
    real = JsonSource.runs

    def counting(self, decode):
        for run in real(self, decode):
            decoded.append(len(run))
            yield run

    monkeypatch.setattr(JsonSource, "runs", counting)
    read_trace(path)
    assert sum(decoded) == len(events) and max(decoded) >= 3  # every event through runs, several at once


def test_a_run_with_a_value_of_another_shape_is_read_event_by_event(tmp_path, monkeypatch):
    events = [_event(i) for i in range(30)]
    events[12]["args"] = [1, 2]  # not an object: the typed decode refuses the run, take() reads it
    events[13]["ts"] = 113  # an int among floats
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    cut = read_trace(path)
    with monkeypatch.context() as m:
        _per_event(m)
        _same(cut, read_trace(path))
    assert len(cut) == 30 and cut.stream.tolist()[11:14] == [7, -1, 7]


def test_a_bad_value_in_a_run_is_named_by_its_index(tmp_path):
    events = [_event(i) for i in range(50)]
    events[37]["ts"] = "soon"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    with pytest.raises(BadInputError, match=r"traceEvents\[37\] has a non-numeric ts or dur"):
        read_trace(path)


try:
    from isal import isal_zlib
except ImportError:  # a platform without its wheel: the reader uses zlib, and says nothing
    isal_zlib = None
#: The inflaters the reader can use: ISA-L's where its wheel is installed (a dependency), else zlib.
INFLATERS = {"zlib": zlib, "isal": isal_zlib}


def _inflater(name: str):
    if INFLATERS[name] is None:
        pytest.skip("isal is not installed here (a dependency: make installs it)")
    return INFLATERS[name]


@pytest.mark.parametrize("inflater", list(INFLATERS))
def test_gzip_members_are_read_in_turn_and_a_cut_or_corrupt_file_is_bad_input(tmp_path, monkeypatch, inflater):
    monkeypatch.setattr(json_source, "_inflating", _inflater(inflater))
    text = json.dumps({"traceEvents": [_event(i) for i in range(300)]}, indent=1).encode()
    half = len(text) // 2
    two = tmp_path / "two.json.gz"
    two.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))  # as `cat a.gz b.gz`
    assert len(read_trace(two)) == 300
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(text)[:-100])
    flipped = bytearray(gzip.compress(text))
    flipped[-6] ^= 0xFF  # in the member's CRC-32 (its last 8 bytes: CRC, size): no longer its text's
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(flipped)
    for bad in (cut, corrupt):
        with pytest.raises(BadInputError, match="not a readable JSON trace") as err:
            read_trace(bad)
        assert "\n" not in str(err.value)


def test_isal_inflates_a_real_trace_to_the_same_events_as_zlib(monkeypatch):
    path = SHARED / LAYOUTS["recompute spans"]
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared reference corpus)")
    assert json_source._inflating is _inflater("isal")  # the reader's default where isal is installed
    fast = read_trace(path, op_args=True)
    monkeypatch.setattr(json_source, "_inflating", zlib)
    _same(fast, read_trace(path, op_args=True))
