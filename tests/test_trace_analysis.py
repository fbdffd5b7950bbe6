"""Comm/compute overlap from Kineto traces: a hand-made trace with exact answers, and a real one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfkit.core.errors import BadInputError
from perfkit.analyse.trace_analysis import (
    comm_compute_overlap,
    gpu_events,
    intersection_length,
    interval_union,
    load_trace,
    union_length,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES = REPO_ROOT.parent / "shared" / "reference" / "traces" / "trace_filter"

T0 = 1_700_000_000_000_000  # absolute ts in us, as large as real traces' epoch microseconds


def _x(cat, name, start, dur, stream, device=0):
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": T0 + start,
            "dur": dur, "args": {"device": device, "stream": stream}}


def _synthetic(rank=0, device=0):
    """Kernels on four streams (times in us from T0):

    compute stream 7:  [0,100)  [150,250)       compute stream 23: [50,120)
    comm stream 84:    [100,200)                comm stream 203:   [180,300)
    memcpy [310,320); plus CPU-side events (one named like NCCL) that must be ignored.
    """
    events = [
        {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": "GPU"}},
        _x("kernel", "sm80_gemm", 0, 100, 7, device),
        _x("kernel", "elementwise_kernel", 150, 100, 7, device),
        _x("kernel", "reduce_kernel", 50, 70, 23, device),
        _x("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 100, 100, 84, device),
        _x("kernel", "ncclDevKernel_SendRecv", 180, 120, 203, device),
        _x("gpu_memcpy", "Memcpy HtoD", 310, 10, 7, device),
        _x("user_annotation", "nccl:all_reduce", 90, 300, 1),
        _x("cpu_op", "aten::mm", 0, 400, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 0, 5, 1),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": events}


# Expected, by hand:
#   compute union [0,120) ∪ [150,250) = 120 + 100 = 220 us  (sum of durations would be 270)
#   comm union    [100,300)           = 200 us             (sum of durations would be 220)
#   overlap: [100,300) ∩ compute = [100,120) + [150,250) = 20 + 100 = 120 us
#   exposed comm = 200 - 120 = 80 us; busy = 200 + 220 - 120 = 300 us = |[0,300)|
#   span = first kernel start 0 to last kernel end 300 = 300 us; memcpy 10 us, outside all of it
EXPECTED_US = {"comm_time_s": 200, "compute_time_s": 220, "overlap_time_s": 120,
               "exposed_comm_time_s": 80, "gpu_busy_time_s": 300, "gpu_span_s": 300,
               "memory_op_time_s": 10}


def test_interval_helpers():
    assert interval_union([(5, 6), (1, 3), (0, 2), (3, 4)]) == [(0, 4), (5, 6)]
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4  # 3 + 1, not 2 + 2 + 1
    # (∪a = [0,4)) ∩ (∪b = [1,2) ∪ [3,10)) = 1 + 1
    assert intersection_length([(0, 4)], [(3, 10), (1, 2)]) == 2
    assert intersection_length([(0, 1)], [(1, 2)]) == 0  # touching is not overlapping
    assert intersection_length([], [(0, 1)]) == 0


def test_gpu_events_classifies_kernels():
    events = gpu_events(_synthetic())
    assert sorted(events["kind"]) == ["comm", "comm", "compute", "compute", "compute", "memory"]
    assert set(events.loc[events["kind"] == "comm", "stream"]) == {84, 203}


def test_synthetic_trace_exact_overlap(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_synthetic(rank=0)))
    gz = tmp_path / "rank1.pt.trace.json.gz"  # gzip is detected from the bytes, not the name
    gz.write_bytes(gzip.compress(json.dumps(_synthetic(rank=1, device=1)).encode()))

    out = comm_compute_overlap([gz, path])
    assert out["rank"].tolist() == [0, 1]  # from distributedInfo, sorted
    assert out["device"].tolist() == [0, 1]
    assert out["n_comm_kernels"].tolist() == [2, 2]
    assert out["n_compute_kernels"].tolist() == [3, 3]
    for column, us in EXPECTED_US.items():
        assert out[column].tolist() == pytest.approx([us * 1e-6] * 2, abs=1e-12), column


def test_rank_must_be_known(tmp_path):
    trace = _synthetic()
    del trace["distributedInfo"]
    with pytest.raises(BadInputError, match="no distributedInfo.rank"):
        comm_compute_overlap([trace])
    out = comm_compute_overlap({3: trace})
    assert out["rank"].tolist() == [3]
    assert out["comm_time_s"].iloc[0] == pytest.approx(200e-6, abs=1e-12)


def test_two_devices_in_one_trace_are_not_merged():
    trace = _synthetic(device=0)
    trace["traceEvents"] += _synthetic(device=1)["traceEvents"]
    out = comm_compute_overlap([trace])
    assert out["device"].tolist() == [0, 1]
    assert out["gpu_busy_time_s"].tolist() == pytest.approx([300e-6, 300e-6], abs=1e-12)


def test_not_a_trace(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"foo": 1}')
    with pytest.raises(BadInputError, match="no traceEvents"):
        load_trace(bad)
    cpu_only = {"distributedInfo": {"rank": 0}, "traceEvents": [_x("cpu_op", "aten::mm", 0, 1, 1)]}
    with pytest.raises(BadInputError, match="no GPU kernels"):
        comm_compute_overlap([cpu_only])


def test_real_two_rank_trace():
    paths = [TRACES / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    if not all(p.exists() for p in paths):
        pytest.skip(f"reference traces not found under {TRACES}")
    out = comm_compute_overlap(paths)
    us = {c: [round(v * 1e6, 3) for v in out[c]] for c in EXPECTED_US}
    # The README's author's numbers (union of kernel intervals, memcpy/memset left out) agree to
    # the microsecond. In these traces the kernels of one kind never run concurrently on two
    # streams, so union and sum of durations coincide here; the synthetic test covers the case
    # where they do not.
    assert us["comm_time_s"] == [396199, 379053]
    assert us["compute_time_s"] == [210320, 271973]
    assert us["overlap_time_s"] == [59216, 75530]
    assert us["exposed_comm_time_s"] == [336983, 303523]
    assert us["gpu_busy_time_s"] == [396199 + 210320 - 59216, 379053 + 271973 - 75530]
    # The README's "GPU activity" spans (1222847 and 1231186 us) end with a memcpy 29 us and
    # 4 us after the last kernel; gpu_span_s covers kernels only.
    assert us["gpu_span_s"] == [1222847 - 29, 1231186 - 4]
    assert out["n_comm_kernels"].tolist() == [10, 10]
    assert out["n_compute_kernels"].tolist() == [1144, 1094]
    assert out["device"].tolist() == [0, 1]
