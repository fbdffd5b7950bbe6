"""Memory snapshots (issue 30, item 4): the summary computed in Python, the CLI, the CPU's skip.

The recording itself needs CUDA/ROCm (tests/test_gpu.py runs it, with an OOM, on a GPU node).
Here the summary reads snapshots of the same schema made two ways: by torch's own converter from
a real profiled CPU run (``torch.cuda._memory_viz._profile_to_snapshot``, what memory_viz's
"profile_plot" draws), and written out by hand for what only a GPU's ring makes (events before
the window, an ``oom`` event), following ``torch.cuda.memory._snapshot``'s documented schema.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from perfkit.analyse.memory_snapshot import format_summary, load, stack_name, summarize
from perfkit.core.errors import BadInputError

MiB = 2**20


def _grow_activations():
    return torch.ones(MiB, dtype=torch.float32)  # 4 MiB, held across the peak


def _small_then_free():
    tmp = torch.zeros(3 * MiB // 4, dtype=torch.float32)  # 3 MiB, freed before the peak
    del tmp


def _scripted_profile():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        _small_then_free()
        kept = _grow_activations()
        extra = torch.ones(MiB // 2, dtype=torch.float32)  # the peak: 4 + 2 MiB live
        del extra
        del kept
    return prof


@pytest.fixture(scope="module")
def profiled_snapshot():
    from torch.cuda._memory_viz import _profile_to_snapshot

    return _profile_to_snapshot(_scripted_profile())


def test_the_peak_of_a_real_profiled_run_and_the_function_holding_most_at_it(profiled_snapshot):
    summary = summarize(profiled_snapshot, top=3)
    # Live at the peak: the 4 MiB kept by _grow_activations and the 2 MiB "extra"; the 3 MiB and
    # 1 MiB temporaries were freed before. Nothing predates the window, nothing is left at the end.
    assert summary.peak_allocated_bytes == 6 * MiB
    assert summary.bytes_before_window == 0 and summary.allocated_at_end_bytes == 0
    top = summary.top_at_peak[0]
    assert top.bytes == 4 * MiB and "_grow_activations" in top.stack, summary.top_at_peak
    assert summary.top_at_peak[1].bytes == 2 * MiB
    assert sum(s.bytes for s in summary.top_at_peak) == summary.peak_allocated_bytes
    assert "_small_then_free" not in " ".join(s.stack for s in summary.top_at_peak)


def _frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TORCH_LINEAR = _frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 134, "forward")
MODEL = _frame("/home/me/model.py", 42, "forward")
OPTIM = _frame("/venv/lib/python3.11/site-packages/torch/optim/adamw.py", 200, "_init_group")


def _gpu_ring_snapshot():
    """A GPU's snapshot whose ring dropped its oldest events: 10 MiB (at 0x100) were allocated
    before the window; the window frees them, allocates and frees, then runs out of memory."""
    events = [
        {"action": "alloc", "addr": 0x200, "size": 8 * MiB, "stream": 0, "frames": [TORCH_LINEAR, MODEL]},
        {"action": "free_requested", "addr": 0x100, "size": 10 * MiB, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 0x100, "size": 10 * MiB, "stream": 0, "frames": []},
        {"action": "alloc", "addr": 0x300, "size": 2 * MiB, "stream": 0, "frames": [OPTIM]},
        {"action": "oom", "size": 64 * MiB, "stream": 0, "device_free": 3 * MiB, "frames": [TORCH_LINEAR, MODEL]},
    ]
    segment = {"device": 0, "address": 0x0, "total_size": 32 * MiB, "stream": 0, "segment_type": "large",
               "allocated_size": 15 * MiB, "active_size": 15 * MiB,
               "blocks": [{"address": 0x50, "size": 5 * MiB, "requested_size": 5 * MiB,
                           "state": "active_allocated", "frames": [OPTIM]},
                          {"address": 0x200, "size": 8 * MiB, "requested_size": 8 * MiB,
                           "state": "active_allocated", "frames": [TORCH_LINEAR, MODEL]},
                          {"address": 0x300, "size": 2 * MiB, "requested_size": 2 * MiB,
                           "state": "active_allocated", "frames": [OPTIM]},
                          {"address": 0x400, "size": 17 * MiB, "state": "inactive", "frames": []}]}
    return {"segments": [segment], "device_traces": [events]}


def test_memory_from_before_the_ring_makes_the_peak_absolute_and_the_oom_is_reported():
    summary = summarize(_gpu_ring_snapshot())
    # At the end 15 MiB are allocated; the window allocated 10 and freed 10: 15 MiB predate it
    # (the 5 MiB block and the 10 MiB the window frees). Peak: 15 + 8 before that free = 23 MiB.
    assert summary.bytes_before_window == 15 * MiB
    assert (summary.peak_allocated_bytes, summary.peak_entry) == (23 * MiB, 0)
    assert summary.allocated_at_end_bytes == 15 * MiB and summary.reserved_at_end_bytes == 32 * MiB
    at_peak = {s.stack: s.bytes for s in summary.top_at_peak}
    assert at_peak == {"linear.py:134:forward ← model.py:42:forward": 8 * MiB,
                       "(allocated before the recorded window)": 15 * MiB}
    assert summary.ooms == [{"requested_bytes": 64 * MiB, "device_free_bytes": 3 * MiB, "entry": 4}]
    at_end = {s.stack: (s.bytes, s.allocations) for s in summary.top_at_end}
    assert at_end["adamw.py:200:_init_group"] == (7 * MiB, 2)
    text = format_summary(summary)
    assert "OUT OF MEMORY at event 4: asked for 64.00 MiB, the device had 3.00 MiB free" in text


def test_a_stack_is_named_by_its_op_and_the_first_frame_outside_torch():
    assert stack_name([TORCH_LINEAR, _frame("/x/torch/nn/modules/module.py", 1, "_call_impl"), MODEL]) \
        == "linear.py:134:forward ← model.py:42:forward"
    assert stack_name([OPTIM]) == "adamw.py:200:_init_group"  # all framework: the op alone
    assert stack_name([]) == "(no stack recorded)"


def test_load_reads_data_and_refuses_a_pickle_that_would_run_code(tmp_path):
    good = tmp_path / "rank0.pickle"
    good.write_bytes(pickle.dumps(_gpu_ring_snapshot()))
    assert load(good)["device_traces"][0][0]["size"] == 8 * MiB

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": Evil()}))
    with pytest.raises(BadInputError, match="holds only data"):
        load(evil)
    assert not marker.exists()
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(BadInputError, match="not a torch memory snapshot"):
        load(tmp_path / "list.pickle")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "memory-snapshot", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_the_cli_prints_the_summary_and_refuses_bad_input_with_one_line(tmp_path):
    path = tmp_path / "rank0-oom.pickle"
    path.write_bytes(pickle.dumps(_gpu_ring_snapshot()))
    out = _cli(path, "--top", "2")
    assert out.returncode == 0, out.stderr
    assert "peak allocated 23.00 MiB" in out.stdout and "OUT OF MEMORY" in out.stdout
    as_json = json.loads(_cli(path, "--json").stdout)
    assert as_json["peak_allocated_bytes"] == 23 * MiB
    for bad in ([tmp_path / "missing.pickle"], [path, "--top", "0"], [path, "--device", "3"]):
        out = _cli(*bad)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (bad, out.stderr)


def test_a_snapshot_on_the_cpu_is_a_skipped_row_with_the_reason():
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training

    row = run_training(TrainConfig(model="mlp", device="cpu", memory_snapshot=True, steps=2))
    assert row["status"] == "skipped"
    assert "CUDA/ROCm caching allocator" in row["error"] and "'cpu'" in row["error"]
    with pytest.raises(BadInputError, match="memory_snapshot_max_entries"):
        TrainConfig(model="mlp", memory_snapshot=True, memory_snapshot_max_entries=0)


def test_the_h200_snapshot_replays_to_its_row_and_counts_what_was_held_before_the_window():
    # Issue 43: the H200's hf:llama snapshot, read in place. Its window began after the process had
    # put 31 MiB on the device (its earlier work in the same kernel, such as the FLOP-counting step): the
    # summary counts them before the window, so the replayed peak is absolute and equals the row's.
    import pandas as pd

    from conftest import REFERENCE

    folder = REFERENCE / "gpu-h200"
    pickle_path = folder / "memory" / "hf-llama-bf16-b16-rank0.pickle"
    if not pickle_path.exists():
        pytest.skip(f"{pickle_path} is absent (the shared H200 reference data)")
    summary = summarize(load(pickle_path))
    rows = pd.concat([pd.read_parquet(p) for p in (folder / "results").glob("train_step-*.parquet")])
    row = rows[rows["model"] == "hf:llama"].iloc[0]
    assert summary.peak_allocated_bytes == row["memory_snapshot_peak_bytes"]
    assert summary.bytes_before_window == 32_506_624, summary.bytes_before_window  # 31.0 MiB
    assert 0 < summary.bytes_before_window < summary.allocated_at_end_bytes
