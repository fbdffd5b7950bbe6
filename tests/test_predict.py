"""``perfkit predict``: a traced step's execution graph replayed, and re-costed for DDP and ZeRO-3
at other world sizes (issue 48). Real Kineto traces: made here by torch.profiler on CPU, the
H200 ``hf:llama`` step in ``shared/reference/gpu-h200/``, an nccl-tests table of a 16-rank H100
cluster from ``shared/reference/native/``."""

from __future__ import annotations

import copy
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from perfkit.analyse.network_model import ring_hops
from perfkit.ingest.network import read_network
from perfkit.analyse.predict import ModelFacts, what_if
from perfkit.analyse.step_graph import COMM, DEVICE, HOST, replay, replay_error
from perfkit.analyse.trace.graph import step_graphs
from perfkit.core.errors import BadInputError

REF = Path(__file__).resolve().parents[2] / "shared" / "reference"
H200 = REF / "gpu-h200"
H200_TRACE = H200 / "trace" / "hf-llama-bf16-b16-rank0.json.gz"
H200_CONFIG = "train_step-7a362e396d16"
H100_TABLE = REF / "native" / "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt"


def _need(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is absent (shared/reference/ sits beside the repository)")


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    """Four profiled steps of a small transformer-like model training on this CPU."""
    out = tmp_path_factory.mktemp("trace")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 64), torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True),
                                torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), torch.nn.Linear(64, 64))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 64, (4, 32))
    sched = torch.profiler.schedule(wait=1, warmup=1, active=4, repeat=1)
    path = out / "rank0.json.gz"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(6):
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()
            prof.step()
    return path


CPU_FACTS = dict(n_params=40000, n_params_non_embedding=36000, n_blocks=2, tokens_per_rank=128)


def test_a_cpu_step_replays_to_its_measured_time_and_its_phases_are_found(cpu_trace):
    graphs = step_graphs(cpu_trace)
    assert len(graphs) == 4
    for g in graphs:
        assert abs(replay_error(g)) < 1e-6, (g.step, replay_error(g))
        assert {"backward", "optimizer", "zero_grad"} <= set(g.phases)
        b0, b1 = g.phases["backward"]
        assert g.start_us < b0 < b1 <= g.start_us + g.measured_us
        assert set(g.kind) == {HOST}  # no device, no collective
    # The replay is a model, not a copy: every host leaf twice as long makes the step longer by
    # their total time (the gaps between them stay as measured).
    g = copy.deepcopy(graphs[0])
    work = sum(g.dur_us)
    g.dur_us = [2 * d for d in g.dur_us]
    assert replay(g)[0] == pytest.approx(graphs[0].measured_us + work, rel=1e-9)


def test_an_op_whose_children_are_a_sliver_of_it_is_one_task_with_its_own_time(cpu_trace):
    """aten::mm calls aten::resolve_conj (µs): the matmul's time is the mm's own, so it lies inside a
    task a what-if re-costs (the mm, or an op around it whose own time dominates), never in a gap
    between two resolve_conj leaves."""
    import gzip

    g = step_graphs(cpu_trace)[0]
    events = [e for e in json.loads(gzip.open(cpu_trace).read())["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in events if e["name"] == f"ProfilerStep#{g.step}")
    matmuls = [e for e in events if e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")
               and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
    tasks = [(g.start_measured_us[i], g.start_measured_us[i] + g.dur_us[i]) for i in range(len(g)) if g.kind[i] == HOST]
    t0 = g.start_us - step["ts"]  # the graph's clock against the file's

    def inside(e) -> bool:
        return any(a - 0.01 <= e["ts"] + t0 and e["ts"] + e["dur"] + t0 <= b + 0.01 for a, b in tasks)

    assert len(matmuls) > 10 and all(inside(e) for e in matmuls), [e["name"] for e in matmuls if not inside(e)]
    assert sum(g.names[i] in ("aten::mm", "aten::addmm", "aten::bmm") for i in range(len(g))) >= len(matmuls) // 2
    assert not any(g.names[i] == "aten::resolve_conj" for i in range(len(g)))
    assert abs(replay_error(g)) < 1e-9


def test_a_launch_or_a_gloo_call_inside_an_op_stays_a_task_of_its_own():
    """The rule above never swallows what must keep its own edge: an op 0–10 µs whose only child
    1–2 µs is a cudaLaunchKernel or a gloo:send (marked keep) is not one task, the child is; the next
    op 12–18 µs with a sliver of a child 13–13.5 µs is one task either way."""
    import numpy as np

    from perfkit.analyse.trace.windows import leaves as _leaves

    ts, end = np.array([0.0, 1.0, 12.0, 13.0]), np.array([10.0, 2.0, 18.0, 13.5])
    assert list(_leaves(ts, end)) == [0, 2]
    assert list(_leaves(ts, end, np.array([False, True, False, False]))) == [1, 2]


def test_the_h200_step_replays_and_is_bound_by_its_host():
    _need(H200_TRACE)
    graphs = step_graphs(H200_TRACE)
    assert [g.step for g in graphs] == [4, 5]
    for g in graphs:
        assert abs(replay_error(g)) < 0.05
        lanes = set(g.lane)
        assert "host" in lanes and any(lane.startswith("host thread") for lane in lanes)  # the autograd thread
        assert any(lane.startswith("stream") for lane in lanes)
        # The GPU mostly waited for its launches (27 ms of device tasks in 52-59 ms): with every
        # kernel free the step keeps most of its time (the host's), and kernels twice as long delay
        # it by less than the device time they add (one stream: it cannot fall further behind).
        free_gpu = copy.deepcopy(g)
        free_gpu.dur_us = [0.0 if k == DEVICE else d for d, k in zip(g.dur_us, g.kind)]
        assert replay(free_gpu)[0] > 0.85 * g.measured_us
        slow_gpu = copy.deepcopy(g)
        slow_gpu.dur_us = [2 * d if k == DEVICE else d for d, k in zip(g.dur_us, g.kind)]
        added = sum(d for d, k in zip(g.dur_us, g.kind) if k == DEVICE)
        assert 15e3 < added < 30e3  # kernels, copies and sets of the step
        assert 0 <= replay(slow_gpu)[0] - g.measured_us < added
        # The step's thread waits for the backward on the autograd thread: that thread's work twice
        # as long delays the step by most of what it adds (a wait edge, not a measured gap).
        slow_bwd = copy.deepcopy(g)
        side = [i for i in range(len(g)) if g.lane[i].startswith("host thread")]
        for i in side:
            slow_bwd.dur_us[i] *= 2
        assert replay(slow_bwd)[0] - g.measured_us > 0.5 * sum(g.dur_us[i] for i in side)
        # host work twice as long moves it by most of the host time added
        slow_host = copy.deepcopy(g)
        slow_host.dur_us = [2 * d if k == HOST else d for d, k in zip(g.dur_us, g.kind)]
        main = sum(d for d, lane in zip(g.dur_us, g.lane) if lane == "host")  # the step's own thread
        assert replay(slow_host)[0] - g.measured_us > 0.5 * main


def test_a_trace_without_steps_is_one_window_and_one_without_host_events_is_one_line(tmp_path):
    one = tmp_path / "t.json"
    one.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": n, "cat": "cpu_op", "ts": ts, "dur": 2, "pid": 1, "tid": 1}
                                               for n, ts in (("aten::mm", 1), ("aten::add", 5))]}))
    (g,) = step_graphs(one)
    assert g.step == -1 and g.window == "whole trace" and g.measured_us == 6 and replay_error(g) == 0
    bad = tmp_path / "gpu_only.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "k", "cat": "kernel", "ts": 1, "dur": 2,
                                                "pid": 0, "tid": 7, "args": {"stream": 7}}]}))
    with pytest.raises(BadInputError, match="no host events"):
        step_graphs(bad)


def test_the_ring_model_scales_its_latency_terms_with_the_ranks():
    """Against the measured table's own times: tests/test_network_model.py."""
    _need(H100_TABLE)
    net = read_network(H100_TABLE)
    link = net.links["all_reduce"]
    assert link.world_size == 16
    # 2(p-1) latency hops and 2(p-1)/p of the bytes per rank (Thakur et al. 2005).
    assert ring_hops("all_reduce", 64) == 126 and ring_hops("all_gather", 64) == 63
    tiny = net.time_s("all_reduce", 1.0, 64) - net.time_s("all_reduce", 1.0, 16)
    assert tiny == pytest.approx(link.alpha_hop_s * (126 - 30), rel=1e-6)
    assert net.time_s("all_gather", 2**30, 8) < net.time_s("all_reduce", 2**30, 8)
    assert net.time_s("all_reduce", 2**30, 1) == 0.0
    assert net.extrapolation(16) is None and "4x beyond the 16 ranks" in net.extrapolation(64)


def _net_from(alpha_s: float, bus_bytes_per_s: float):
    """A network of known per-hop latency and bus bandwidth, every op on the same links."""
    from perfkit.analyse.network_model import Link, NetworkModel

    links = {op: Link(op=op, alpha_hop_s=alpha_s, bus_bytes_per_s=bus_bytes_per_s, world_size=2,
                      note="test") for op in ("all_reduce", "all_gather", "reduce_scatter")}
    return NetworkModel(links=links, source="test")


def test_ddp_on_a_cpu_step_exposes_its_last_bucket_and_a_faster_network_hides_it(cpu_trace):
    g = step_graphs(cpu_trace)[0]
    base = replay(g)[0] / 1e6
    slow = _net_from(1e-3, 1e8)
    facts = ModelFacts(**CPU_FACTS)
    p = what_if(g, layout="ddp", world_size=4, network=slow, facts=facts)
    # One bucket (160 kB < 1 MiB), ready when backward ends; on a CPU the host waits for it.
    t_ar = slow.time_s("all_reduce", 40000 * 4, 4)
    assert p.collectives == 1 and p.comm_s == pytest.approx(t_ar)
    # Exposed but for the host work from backward's last op to the optimizer's first, which it
    # overlaps (some hundred µs on this step, against 8.4 ms of all-reduce).
    host = g.host_nodes()
    last_bwd = [i for i in host if g.start_measured_us[i] <= g.phases["backward"][1]][-1]
    first_opt = [i for i in host if g.start_measured_us[i] >= g.phases["optimizer"][0]][0]
    overlap_s = (g.start_measured_us[first_opt] - g.start_measured_us[last_bwd] - g.dur_us[last_bwd]) / 1e6
    assert 0 <= overlap_s < t_ar / 2
    assert p.exposed_comm_s == pytest.approx(t_ar - overlap_s, abs=1e-6)
    assert p.step_s == pytest.approx(base + p.exposed_comm_s, rel=1e-6)
    assert p.weak_scaling_efficiency == pytest.approx(base / p.step_s) and math.isnan(p.strong_scaling_efficiency)
    fast = what_if(g, layout="ddp", world_size=4, network=_net_from(1e-9, 1e15), facts=facts)
    assert fast.step_s == pytest.approx(base, rel=1e-3)
    # More ranks, more hops: never faster.
    steps = [what_if(g, layout="ddp", world_size=n, network=slow, facts=facts).step_s for n in (2, 8, 64)]
    assert steps == sorted(steps)


def test_zero3_gathers_each_unit_before_its_compute_and_shards_the_optimizer(cpu_trace):
    g = step_graphs(cpu_trace)[0]
    facts = ModelFacts(**CPU_FACTS)
    p = what_if(g, layout="zero3", world_size=2, network=_net_from(1e-9, 1e15), facts=facts)
    # 3 units (root + 2 blocks): 3 forward gathers, 2 backward (the root stays gathered), 3 reduce-scatters.
    assert p.collectives == 8
    opt = g.phases["optimizer"]
    optimizer_us = sum(d for i, d in enumerate(g.dur_us) if opt[0] <= g.start_measured_us[i] <= opt[1])
    assert p.step_s == pytest.approx((g.measured_us - optimizer_us / 2) / 1e6, rel=0.01)
    slow = what_if(g, layout="zero3", world_size=2, network=_net_from(2e-3, 1e9), facts=facts)
    # Before the first block can run, the root's and the first block's gathers must have landed.
    assert slow.exposed_comm_s > 2 * 2e-3 and slow.step_s > p.step_s


def test_zero3_on_a_cpu_step_waits_for_every_collective_and_on_a_device_overlaps_its_gathers(cpu_trace):
    """FSDP2 unshards and reduce-scatters with ``async_op=False``: on a CPU step ``work.wait()``
    blocks the thread that issued it, so every collective is exposed (the prefetch overlapped them
    with compute, under-predicting a gloo step); on a GPU it only orders streams, and the
    prefetched gathers hide behind the device's compute."""
    g = step_graphs(cpu_trace)[0]
    facts = ModelFacts(**CPU_FACTS)
    p = what_if(g, layout="zero3", world_size=2, network=_net_from(5e-3, 1e8), facts=facts)
    assert p.collectives == 8 and p.comm_s > 0.04
    # All but the host's Python time between two ops, where the hook that issues each one runs
    # (about a millisecond in all, more under load; the prefetch overlapped a unit's compute with
    # each gather: 12 of 42 ms hidden).
    between_ops_s = sum(g.idle_us.values()) / 1e6
    assert between_ops_s < 0.2 * p.comm_s and p.exposed_comm_s >= p.comm_s - between_ops_s
    assert any("blocks the thread that issued it" in a for a in p.assumptions)
    _need(H200_TRACE)
    d = what_if(step_graphs(H200_TRACE)[0], layout="zero3", world_size=8, network=_net_from(5e-6, 1e11),
                facts=ModelFacts(n_params=int(400e6), n_params_non_embedding=int(300e6), n_blocks=4, grad_bytes=2))
    assert d.exposed_comm_s < 0.8 * d.comm_s
    assert not any("blocks the thread" in a for a in d.assumptions)


def test_tp_divides_the_sharded_compute_and_waits_for_four_activation_all_reduces_a_block(cpu_trace):
    from perfkit.analyse.predict import _REPLICATED, _compute_nodes, _time_key

    g = step_graphs(cpu_trace)[0]
    base = replay(g)[0] / 1e6
    facts = ModelFacts(**CPU_FACTS, hidden_size=64, act_bytes=4)
    fast = what_if(g, layout="tp", world_size=4, network=_net_from(1e-9, 1e15), facts=facts)
    # Free collectives: the step loses 3/4 of the sharded forward, backward and optimizer compute (an
    # added collective starts when its issuer ends in the re-costed replay, not at its measured time).
    f0, b1 = g.phases["zero_grad"][1], g.phases["backward"][1]
    opt = g.phases["optimizer"]
    nodes = _compute_nodes(g)
    sharded = sum(g.dur_us[i] for i in nodes if f0 <= _time_key(g, i) <= b1 and not _REPLICATED.search(g.names[i]))
    optimizer = sum(g.dur_us[i] for i in nodes if opt[0] <= _time_key(g, i) <= opt[1])
    assert 0 < sharded and fast.collectives == 4 * CPU_FACTS["n_blocks"]
    assert fast.step_s == pytest.approx(base - 0.75 * (sharded + optimizer) / 1e6, rel=0.01)
    assert fast.tokens_per_s == pytest.approx(CPU_FACTS["tokens_per_rank"] / fast.step_s)  # one replica
    assert fast.strong_scaling_efficiency == pytest.approx(base / (4 * fast.step_s)) and math.isnan(fast.weak_scaling_efficiency)
    # A slow network: every all-reduce (128 tokens x 64 x 4 B) is on the critical path.
    slow_net = _net_from(1e-3, 1e9)
    slow = what_if(g, layout="tp", world_size=4, network=slow_net, facts=facts)
    t_ar = slow_net.time_s("all_reduce", 128 * 64 * 4, 4)
    assert slow.comm_s == pytest.approx(8 * t_ar) and slow.exposed_comm_s >= 0.9 * 8 * t_ar
    with pytest.raises(BadInputError, match="activations' width"):
        what_if(g, layout="tp", world_size=2, network=slow_net, facts=ModelFacts(**CPU_FACTS))


def test_a_base_that_already_communicates_is_refused_for_zero3(cpu_trace):
    g = copy.deepcopy(step_graphs(cpu_trace)[0])
    g.add(name="gloo:all_gather", kind=COMM, lane="thread 9", start_us=g.start_us + 10, dur_us=5, op="all_gather")
    with pytest.raises(BadInputError, match="already runs all_gather"):
        what_if(g, layout="zero3", world_size=2, network=_net_from(1e-6, 1e9), facts=ModelFacts(**CPU_FACTS))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "predict", *map(str, args)], capture_output=True, text=True)


@pytest.mark.slow  # `perfkit predict` in a process of its own over the H200 trace: 3 s
def test_the_h200_llama_step_predicted_at_8_16_64_ranks_on_an_h100_cluster():
    _need(H200_TRACE)
    _need(H100_TABLE)
    run = _cli(H200, "--trace", H200_TRACE, "--config", H200_CONFIG, "--world-sizes", "8,16,64",
               "--network", H100_TABLE, "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert abs(out["replay"][0]["replay_error"]) < 0.05
    got = {(p["layout"], p["world_size"]): p for p in out["predictions"]}
    assert set(got) == {(layout, n) for layout in ("ddp", "zero3") for n in (8, 16, 64)}
    for p in got.values():
        assert p["step_ms"] >= p["compute_ms"] > 0 and p["comm_ms"] > 0
        assert p["step_ms"] == pytest.approx(p["compute_ms"] + p["exposed_comm_ms"])
        assert p["measured_ms"] is None and "no measured" in p["extrapolation"]
    assert "4x beyond the 16 ranks" in got[("ddp", 64)]["extrapolation"]
    assert "beyond" not in got[("ddp", 16)]["extrapolation"]
    assert got[("ddp", 64)]["comm_ms"] > got[("ddp", 8)]["comm_ms"]
    text = _cli(H200, "--trace", H200_TRACE, "--config", H200_CONFIG, "--world-sizes", "64", "--network", H100_TABLE)
    assert text.returncode == 0 and "Thakur" in text.stdout and "! no measured ddp point at 64 ranks" in text.stdout


@pytest.mark.slow  # > 10 s here: make test runs it, test-fast does not
def test_bad_inputs_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    junk = tmp_path / "junk.txt"
    junk.write_text("not a table\n")
    _need(H100_TABLE)
    cases = [
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--network", H100_TABLE), "no traced configurations"),
        (_cli(tmp_path / "nowhere", "--world-sizes", "8", "--network", H100_TABLE), "no such results directory"),
        (_cli(tmp_path / "empty", "--world-sizes", "0,x", "--network", H100_TABLE), "--world-sizes"),
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--network", H100_TABLE, "--layout", "sp"), "--layout"),
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--network", junk), "not an nccl-tests"),
        (_cli(tmp_path / "empty", "--world-sizes", "8"), "needs --network"),
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--layout", "pp"), "no ok pipeline configuration"),
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--network", H100_TABLE, "--microbatches", "8"),
         "are for --layout pp"),
        (_cli(tmp_path / "empty", "--world-sizes", "8", "--layout", "pp", "--microbatches", "0"), "--microbatches"),
    ]
    if H200_TRACE.exists():
        cases.append((_cli(H200, "--trace", H200_TRACE, "--config", H200_CONFIG, "--world-sizes", "8",
                           "--network", junk), "not an nccl-tests"))
        cases.append((_cli(H200, "--trace", H200_TRACE, "--config", H200_CONFIG, "--world-sizes", "8",
                           "--network", tmp_path / "empty"), "no measured collectives"))
    for run, words in cases:
        assert run.returncode == 2, (words, run.stdout, run.stderr)
        assert words in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def _folders(tmp_path: Path, trace: Path, alpha_s: float = 2e-4, bus: float = 1e9) -> tuple[Path, Path]:
    """A results folder whose one-rank row points at a real trace, with a measured DDP point at 2
    ranks; and a network folder of gloo-like collectives of known alpha and bus bandwidth."""
    import pandas as pd

    from perfkit.core.formulas import busbw_factor
    from perfkit.core.results import write_rows

    runs = tmp_path / "runs"
    common = {"workload": "train_step", "status": "ok", "model": "transformer", "seq_len": 32, "precision": "fp32",
              "n_params": CPU_FACTS["n_params"], "n_params_non_embedding": CPU_FACTS["n_params_non_embedding"],
              "model_n_layers": 2, "model_d_model": 64}
    write_rows(pd.DataFrame([
        {**common, "config_id": "one", "parallelism": "none", "world_size": 1, "batch_size": 4, "step_time_s": 0.02,
         "trace_path": str(trace)},
        {**common, "config_id": "two", "parallelism": "ddp", "world_size": 2, "batch_size": 8, "step_time_s": 0.05},
    ]), runs / "results" / "train.parquet")
    net = pd.DataFrame([{"workload": "collectives", "status": "ok", "op": op, "inplace": False, "world_size": 2,
                         "size_bytes": size, "time_s": ring_hops(op, 2) * alpha_s + busbw_factor(op, 2) * size / bus}
                        for op in ("all_reduce", "all_gather", "reduce_scatter") for size in [2**k for k in range(10, 25, 2)]])
    write_rows(net, tmp_path / "net" / "results" / "collectives.parquet")
    return runs, tmp_path / "net"


def test_predict_records_its_points_and_the_report_draws_them_beside_the_measured_one(cpu_trace, tmp_path):
    from perfkit.core.results import load

    alpha_s, bus = 2e-4, 1e9
    runs, _ = _folders(tmp_path, cpu_trace, alpha_s, bus)
    run = _cli(runs, "--world-sizes", "2,16", "--network", tmp_path / "net", "--record", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    got = {(p["layout"], p["world_size"]): p for p in out["predictions"]}
    ddp2 = got[("ddp", 2)]
    assert ddp2["measured_ms"] == pytest.approx(50.0) and ddp2["error"] == pytest.approx(ddp2["step_ms"] / 50.0 - 1)
    assert ddp2["comm_ms"] == pytest.approx((2 * alpha_s + CPU_FACTS["n_params"] * 4 / bus) * 1e3, rel=1e-3)
    assert got[("zero3", 2)]["measured_ms"] is None  # only DDP was measured at 2 ranks
    assert "8x beyond the 2 ranks" in got[("ddp", 16)]["extrapolation"]
    rows = load(runs)
    predicted = rows[rows["workload"] == "prediction"]
    assert len(predicted) == 4 and set(predicted["layout"]) == {"ddp", "zero3"}
    assert predicted.loc[predicted["world_size"] == 2, "measured_step_time_s"].notna().sum() == 1
    # A rerun appends (nothing recorded is replaced); the report keeps the latest of each point.
    assert _cli(runs, "--world-sizes", "2,16", "--network", tmp_path / "net", "--record").returncode == 0
    rows = load(runs)
    assert (rows["workload"] == "prediction").sum() == 8
    from perfkit.view.plots.scaling import prediction_section

    plot = prediction_section(rows[rows["workload"] == "prediction"])
    labels = sorted({el.label for el in plot})
    assert "measured ddp from one" in labels and "predicted zero3 from one" in labels
    measured = [el for el in plot if el.label == "measured ddp from one"][0]
    assert list(measured.data["world_size"]) == [2] and measured.data["step_ms"].iloc[0] == pytest.approx(50.0)
    from perfkit.view.report_page import write_report

    html = write_report(runs, tmp_path / "report.html").read_text()
    assert "Predicted scaling (perfkit predict)" in html and "predicted ddp from one" in html


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    {"parallelism": "ddp"}, {"parallelism": "zero3"},
    {"parallelism": "pp", "pp_schedule": "GPipe", "n_microbatches": 4},
    {"parallelism": "pp", "pp_schedule": "1F1B", "n_microbatches": 4},
], ids=["ddp", "zero3", "gpipe", "1f1b"])
def test_every_rank_of_a_two_rank_gloo_step_replays_within_5_percent(tmp_path, monkeypatch, settings):
    from perfkit.core.results import CONTEXT_ENV, RunContext
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training

    ctx = RunContext(results_path=tmp_path / "results" / "cfg.parquet", config_id="cfg")
    monkeypatch.setenv(CONTEXT_ENV, ctx.to_env())
    row = run_training(TrainConfig(model="transformer", batch_size=8, seq_len=32, steps=5, warmup_steps=1, profile=True,
                                   profile_active_steps=2, world_size=2, device="cpu", **settings))
    assert row["status"] == "ok", row.get("error")
    for path in row["rank_trace_paths"]:
        graphs = step_graphs(path)
        assert len(graphs) == 2
        for g in graphs:
            assert abs(replay_error(g)) < 0.05, (path, g.step, replay_error(g))
        expected = {"ddp": {"all_reduce"}, "zero3": {"all_gather"}, "pp": {"send", "recv"}}[settings["parallelism"]]
        for g in graphs:  # every step's collectives (or a pipeline's transfers, isend spans that outlive their call)
            ops = {g.op[i] for i in range(len(g)) if g.op[i]}
            assert ops >= expected if settings["parallelism"] == "pp" else ops & expected, (g.step, ops)


@pytest.mark.slow  # > 10 s here: make test runs it, test-fast does not
def test_memory_per_rank_beside_each_prediction_says_when_it_does_not_fit(cpu_trace, tmp_path):
    runs, net = _folders(tmp_path, cpu_trace)
    run = _cli(runs, "--world-sizes", "2,8", "--network", net, "--layout", "zero3", "--device", "h100", "--json")
    assert run.returncode == 0, run.stderr
    got = {p["world_size"]: p for p in json.loads(run.stdout)["predictions"]}
    # perfkit fit's fake-tensor step of the row's model at each layout: ZeRO-3 shards the state.
    assert all(p["fits"] is True and p["memory_peak_bytes_per_rank"] > 0 for p in got.values())
    assert got[8]["memory_peak_bytes_per_rank"] < got[2]["memory_peak_bytes_per_rank"]
    assert "H100" in got[2]["memory_budget_source"] and "10% headroom" in got[2]["memory_budget_source"]
    small = _cli(runs, "--world-sizes", "2", "--network", net, "--layout", "zero3", "--memory-bytes", "64KB")
    assert small.returncode == 0 and "DOES NOT FIT" in small.stdout, small.stdout
    # TP: not on fake tensors; the analytic model shards the plan's projections (the built-in
    # transformer has one), and says so.
    tp = _cli(runs, "--world-sizes", "1,2", "--network", net, "--layout", "tp", "--device", "h100", "--json")
    assert tp.returncode == 0, tp.stderr
    by = {p["world_size"]: p for p in json.loads(tp.stdout)["predictions"]}
    assert by[2]["memory_method"].startswith("analytic") and by[2]["fits"] is True
    assert 0 < by[2]["memory_peak_bytes_per_rank"] < by[1]["memory_peak_bytes_per_rank"]
    bad = _cli(runs, "--world-sizes", "2", "--network", net, "--device", "nonesuch")
    assert bad.returncode == 2 and "unknown device" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# --- pipelines (perfkit.analyse.predict_pipeline) -------------------------------------------------

def _pp_row(**over):
    # 2 ranks, 1F1B, m = 4: t = 30 ms, o = 2 ms a slot, so the window is (4 + 1)·32 = 160 ms; 10 ms of
    # barrier and optimizer outside it; 8 samples of 64 tokens (2 a microbatch).
    return {"config_id": "pp-base", "parallelism": "pp", "pp_schedule": "1F1B", "world_size": 2,
            "stages_per_rank": 1, "n_microbatches": 4, "batch_size": 8, "seq_len": 64,
            "microbatch_compute_s": 0.030, "microbatch_overhead_s": 0.002, "pipeline_time_s": 0.160,
            "step_time_s": 0.170, **over}


def test_a_pipeline_prediction_reproduces_its_base_and_scales_by_narayanans_slots():
    from perfkit.analyse.predict_pipeline import pipeline_base, predict_pipeline

    base = pipeline_base(_pp_row())
    same = predict_pipeline(base, ranks=2)
    assert same.step_s == pytest.approx(0.170) and same.bubble_s == pytest.approx(0.030)
    assert same.compute_s + same.bubble_s + same.exposed_comm_s == pytest.approx(same.step_s)
    # 8 ranks, 16 microbatches: a stage holds a quarter of the blocks (t = 7.5 ms), 23 slots of
    # t + o, the optimizer's share a quarter (2.5 ms).
    deep = predict_pipeline(base, ranks=8, microbatches=16)
    assert deep.step_s == pytest.approx(23 * (0.0075 + 0.002) + 0.0025)
    assert deep.bubble_s == pytest.approx(7 * 0.0075) and deep.exposed_comm_s == pytest.approx(23 * 0.002)
    assert deep.tokens_per_s == pytest.approx(16 * 2 * 64 / deep.step_s)
    assert deep.busy_share == pytest.approx((16 * 0.0075 + 0.0025) / deep.step_s)
    # Interleaving two stages per rank halves a slot's compute and doubles the slots that do work.
    inter = predict_pipeline(base, ranks=8, microbatches=16, schedule="Interleaved1F1B", stages_per_rank=2)
    assert inter.bubble_s == pytest.approx(deep.bubble_s / 2)
    assert inter.step_s == pytest.approx(39 * (0.00375 + 0.002) + 0.0025)
    assert any("Interleaved1F1B predicted from a 1F1B run" in a for a in inter.assumptions)


@pytest.mark.parametrize("row, call, message", [
    (_pp_row(parallelism="ddp"), {}, "not a pipeline configuration"),
    (_pp_row(pp_schedule="ZBVZeroBubble"), {}, "weight-gradient"),
    (_pp_row(microbatch_overhead_s=None), {}, "no microbatch_overhead_s"),
    (_pp_row(), {"ranks": 8, "microbatches": 4}, "1F1B needs n_microbatches >= stages (8)"),
    (_pp_row(), {"ranks": 2, "schedule": "InterleavedZeroBubble", "stages_per_rank": 2}, "no closed form"),
    (_pp_row(), {"ranks": 2, "schedule": "GPipe", "stages_per_rank": 2}, "GPipe runs one stage per rank"),
])
def test_a_pipeline_it_cannot_recost_is_bad_input(row, call, message):
    from perfkit.analyse.predict_pipeline import pipeline_base, predict_pipeline

    with pytest.raises(BadInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        predict_pipeline(pipeline_base(row), **({"ranks": 2} | call))


def test_a_traced_target_is_the_check_like_with_like(cpu_trace, tmp_path):
    """The base's graph ran under the profiler, so a measured point that was traced too is compared
    by its traced steps (per step the slowest rank, the median step), its unprofiled step beside it."""
    import pandas as pd

    from perfkit.core.results import write_rows

    runs, net = _folders(tmp_path, cpu_trace)
    # The 2-rank DDP point, traced too (its one rank file: a copy of this trace).
    copied = tmp_path / "two" / "rank0.json.gz"
    copied.parent.mkdir()
    shutil.copy(cpu_trace, copied)
    two = pd.read_parquet(runs / "results" / "train.parquet").query("config_id == 'two'").assign(
        trace_path=str(copied), config_id="two-traced")
    write_rows(two, runs / "results" / "traced.parquet")
    run = _cli(runs, "--world-sizes", "2", "--network", net, "--layout", "ddp", "--json")
    assert run.returncode == 0, run.stderr
    (ddp2,) = json.loads(run.stdout)["predictions"]
    traced_ms = statistics.median(g.measured_us for g in step_graphs(cpu_trace)) / 1e3
    assert ddp2["measured_under_profiler"] is True and ddp2["measured_ms"] == pytest.approx(traced_ms)
    assert ddp2["measured_unprofiled_ms"] == pytest.approx(50.0)
    assert ddp2["error"] == pytest.approx(ddp2["step_ms"] / traced_ms - 1)


def test_a_base_that_does_not_replay_is_refused_and_forced_predictions_are_marked(cpu_trace, tmp_path, monkeypatch, capsys):
    """A traced step 25 % longer than its graph explains (a dependency the graph misses): predictions
    from it are refused with that figure (exit 2); --force shows them, each marked."""
    import perfkit.analyse.trace.graph as sg
    from perfkit.cli import main

    runs, net = _folders(tmp_path, cpu_trace)
    real = sg.step_graphs

    def unexplained(path, *a, **kw):
        graphs = real(path, *a, **kw)
        for g in graphs:
            g.measured_us *= 1.25
        return graphs
    monkeypatch.setattr(sg, "step_graphs", unexplained)
    assert main(["predict", str(runs), "--world-sizes", "2", "--network", str(net)]) == 2
    err = capsys.readouterr().err
    assert "replays -20.0 % off its measured step" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert main(["predict", str(runs), "--world-sizes", "2", "--network", str(net), "--force"]) == 0
    out = capsys.readouterr().out
    assert out.count("FORCED: the base replays -20.0 % off its step") == 2  # ddp and zero3
    monkeypatch.setattr(sg, "step_graphs", real)
    assert main(["predict", str(runs), "--world-sizes", "2", "--network", str(net)]) == 0
    assert "FORCED" not in capsys.readouterr().out


def _gpu_bound(g, factor=20.0):
    """The H200 step with every GPU task ``factor`` times as long: the device far behind the host."""
    slow = copy.deepcopy(g)
    slow.dur_us = [d * factor if k == DEVICE else d for d, k in zip(g.dur_us, g.kind)]
    return slow


def test_an_added_collective_starts_after_the_device_task_that_produced_its_gradients():
    """On a step whose GPU runs far behind its host, an all-reduce is ready when its producer's
    kernel has ended on the device, not when the host launched it (the replay's topological order;
    a replay in measured start order started it 12 ms early)."""
    from perfkit.analyse.predict import _ddp, _Editor
    from perfkit.analyse.step_graph import ISSUE

    _need(H200_TRACE)
    g = _gpu_bound(step_graphs(H200_TRACE)[0])
    e = _Editor(g)
    _ddp(e, ModelFacts(n_params=int(400e6), grad_bytes=2), 8, _net_from(5e-6, 1e11))
    _, start, end = replay(e.g)
    producers = [(n, e.g.src[k]) for n in e.added for k in e.g.edges_into(n, ISSUE)]
    assert len(producers) == len(e.added) > 10
    for n, producer in producers:
        assert e.g.kind[producer] == DEVICE
        assert start[n] >= end[producer] - 1e-6
    lag_ms = max(end[p] - e.g.start_measured_us[p] for _, p in producers) / 1e3
    assert lag_ms > 10  # the device ran behind: host-side ready times would have been early


def test_ddp_waits_where_finalize_backward_does_and_anchors_hold_across_streams(tmp_path):
    """clip_grad_norm_ between backward and the optimizer waits for the last bucket, as
    Reducer::finalize_backward makes it: the wait is on its first op, not the optimizer's."""
    from perfkit.analyse.predict import _ddp, _Editor, _time_key
    from perfkit.analyse.step_graph import WAIT

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    path = tmp_path / "clip.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            prof.step()
    (g,) = step_graphs(path)
    e = _Editor(g)
    _ddp(e, ModelFacts(n_params=sum(p.numel() for p in model.parameters())), 4, _net_from(1e-4, 1e9))
    (w,) = [k for k in range(len(e.g.src)) if e.g.edge_kind[k] == WAIT]
    b1, (o0, _) = g.phases["backward"][1], g.phases["optimizer"]
    waiter = e.g.dst[w]
    assert b1 <= _time_key(e.g, waiter) < o0  # clip_grad_norm_'s first op, before the optimizer
    assert not [i for i in e.nodes if b1 <= _time_key(e.g, i) < _time_key(e.g, waiter)]
    # Four streams (the 2-rank NCCL trace): the anchors are in issue order, whatever stream runs them.
    path = REF / "traces" / "trace_diff" / "test.json.gz"
    _need(path)
    m = _Editor(step_graphs(path)[0])
    assert len({m.g.lane[i] for i in m.nodes}) >= 3
    assert (np.diff(m.keys) >= 0).all()
    t = float(np.median(m.keys))
    assert _time_key(m.g, m.before(t)) <= t <= _time_key(m.g, m.after(t))


def test_tp_keeps_the_ops_a_megatron_plan_replicates_by_their_aten_op():
    """On the H200 step the loss's kernels (log_softmax and its backward, cross_entropy, nll_loss)
    and the embedding's backward are kept whole; by kernel name only some of them were."""
    from perfkit.analyse.predict import _REPLICATED

    _need(H200_TRACE)
    g = step_graphs(H200_TRACE)[0]
    kept = {g.aten[i] for i in range(len(g)) if g.kind[i] == DEVICE and _REPLICATED.search(g.aten[i])}
    assert {"autograd::engine::evaluate_function: LogSoftmaxBackward0", "aten::cross_entropy_loss",
            "autograd::engine::evaluate_function: EmbeddingBackward0"} <= kept
    kept_us = sum(g.dur_us[i] for i in range(len(g)) if g.kind[i] == DEVICE and _REPLICATED.search(g.aten[i]))
    by_name_us = sum(g.dur_us[i] for i in range(len(g)) if g.kind[i] == DEVICE and _REPLICATED.search(g.names[i]))
    assert kept_us > by_name_us + 300  # the softmax kernels (cunn_SoftMax*) were divided by name


def test_rccl_kernels_of_a_ddp_base_are_communication_and_re_costed():
    """ResNet on an MI300X, rank 0 of 8 with RCCL: its ncclDevKernel_Generic kernels are the
    collectives their nccl:* annotations name, and DDP re-costs them."""
    path = REF / "field-traces" / "tracelens" / "mi300" / "resnet_act_checkpoint.json.gz"
    _need(path)
    g = step_graphs(path)[0]
    comm = [i for i in range(len(g)) if g.is_comm(i)]
    assert {g.op[i] for i in comm} == {"all_reduce", "broadcast"} and all(g.kind[i] == DEVICE for i in comm)
    facts = ModelFacts(n_params=int(25.6e6), n_blocks=16, tokens_per_rank=64)
    fast = what_if(g, layout="ddp", world_size=8, network=_net_from(1e-9, 1e15), facts=facts)
    slow = what_if(g, layout="ddp", world_size=8, network=_net_from(1e-3, 1e9), facts=facts)
    assert fast.collectives == slow.collectives == 2  # its own all-reduces, re-costed
    assert slow.comm_s > 100 * fast.comm_s and slow.step_s > fast.step_s


def test_a_cpu_base_with_another_share_of_the_cores_than_a_rank_is_said(cpu_trace, tmp_path):
    """Weak scaling keeps a rank's compute as the base's: a one-rank CPU base that computed with 2
    threads, checked against ranks of 1 thread each (``cpu_threads`` sums a run's ranks), is not
    like with like, and the prediction says so and how to run the base; equal shares say nothing."""
    import pandas as pd

    from perfkit.core.results import write_rows

    runs, net = _folders(tmp_path, cpu_trace)
    table = runs / "results" / "train.parquet"
    rows = pd.read_parquet(table).assign(device="cpu", cpu_threads=[2, 2])
    table.unlink()
    write_rows(rows, table)
    said = _cli(runs, "--world-sizes", "2", "--network", net, "--layout", "ddp")
    assert said.returncode == 0, said.stderr
    assert "the base computed with 2 CPU threads, each measured rank with 1" in said.stdout
    assert "taskset" in said.stdout
    table.unlink()
    write_rows(rows.assign(cpu_threads=[1, 2]), table)
    quiet = _cli(runs, "--world-sizes", "2", "--network", net, "--layout", "ddp")
    assert quiet.returncode == 0 and "CPU threads" not in quiet.stdout
