"""Collectives: nccl-tests busbw factors and time convention, every op on 2 real gloo ranks with a
correctness check, the check catching a corrupted result, the nccl knob check in its own logged
pass, and a rank dying mid-benchmark through launch()."""

from __future__ import annotations

import json
import os
import statistics
from types import SimpleNamespace

import pandas as pd
import pytest

import perfkit.measuring.collectives.benchmark
from perfkit.measuring.collectives.timing import reduce_times
from perfkit.measuring.collectives.benchmark import CollectivesConfig, reduce_rank_results, run_collectives
from perfkit.core.errors import BadInputError, ExecutionFailed
from perfkit.core.formulas import COLLECTIVES, busbw_factor, message_bytes
from perfkit.run.launch import LaunchResult, launch

# formulas.md, written out per n so a wrong formula cannot agree with itself.
_FACTORS = {
    2: {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5,
        "broadcast": 1.0, "send_recv": 1.0},
    4: {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75,
        "broadcast": 1.0, "send_recv": 1.0},
    8: {"all_reduce": 1.75, "all_gather": 0.875, "reduce_scatter": 0.875, "all_to_all": 0.875,
        "broadcast": 1.0, "send_recv": 1.0},
}

# Tiny sizes: the point is correctness and plumbing, not bandwidth, on 2 shared cores.
_SMALL = dict(min_bytes=64, max_bytes=4096, factor=8, warmup_iters=1, iters=3, timeout_s=120)


@pytest.mark.parametrize("n", sorted(_FACTORS))
@pytest.mark.parametrize("op", COLLECTIVES)
def test_busbw_factor_matches_formulas_table(op, n):
    assert busbw_factor(op, n) == pytest.approx(_FACTORS[n][op])


def test_message_bytes_counts_every_rank_chunk_only_for_per_rank_ops():
    # count 1000 float32 on 4 ranks
    assert message_bytes("all_reduce", 1000, 4, 4) == 4000
    assert message_bytes("broadcast", 1000, 4, 4) == 4000
    assert message_bytes("send_recv", 1000, 4, 4) == 4000
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert message_bytes(op, 1000, 4, 4) == 16000
    with pytest.raises(BadInputError):
        message_bytes("all_reduce_v", 1, 4, 2)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(ops=("gather_v",)), "ops must be"),
    (dict(ops=("all_reduce",), inplace=(False,)), "only the in-place form"),
    (dict(ops=("all_to_all",), inplace=(True,)), "only the out-of-place form"),
    (dict(ops=("send_recv",), world_size=1), "send_recv needs world_size >= 2"),
    (dict(min_bytes=10, max_bytes=5), "min_bytes"),
    (dict(factor=1), "factor"),
    (dict(dtype="floatish"), "dtype"),
    (dict(backend="mpi"), "backend"),
    (dict(ops=("broadcast",), corrupt=("all_reduce",)), "corrupt"),
    (dict(iters=0), "iters"),
    (dict(knob_check_pass="inline"), "knob_check_pass must be one of"),
])
def test_config_rejects_bad_input(kwargs, fragment):
    with pytest.raises(BadInputError, match=fragment):
        CollectivesConfig(**kwargs)


def test_config_sizes_and_round_trip():
    cfg = CollectivesConfig(min_bytes=1000, max_bytes=100_000, factor=10, env={"NCCL_ALGO": "Ring"})
    assert cfg.sizes() == [1000, 10_000, 100_000]
    again = CollectivesConfig(**json.loads(json.dumps(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict()
    assert again.ops == COLLECTIVES and again.inplace == (False, True)


@pytest.fixture(scope="module")
def clean_run() -> pd.DataFrame:
    cfg = CollectivesConfig(**_SMALL, env={"GLOO_SOCKET_IFNAME": "lo", "NCCL_ALGO": "Ring"})
    return run_collectives(cfg)


@pytest.mark.slow
def test_every_collective_runs_on_two_gloo_ranks_with_no_wrong_elements(clean_run):
    df = clean_run
    expected_points = {
        ("all_reduce", True), ("broadcast", True), ("all_to_all", False), ("send_recv", False),
        ("all_gather", False), ("all_gather", True), ("reduce_scatter", False), ("reduce_scatter", True),
    }
    assert set(zip(df["op"], df["inplace"])) == expected_points
    assert len(df) == len(expected_points) * 3  # sizes 64, 512, 4096
    assert (df["wrong_elements"] == 0).all(), df[["op", "inplace", "size_bytes", "wrong_elements"]]
    assert df["rank_wrong_elements"].map(len).eq(2).all()
    assert (df["world_size"] == 2).all() and (df["backend"] == "gloo").all()


@pytest.mark.slow
def test_rows_follow_nccl_tests_sizes_and_bandwidth(clean_run):
    df = clean_run
    # S rounded down to a whole count; count per rank (per chunk) for the per-rank-chunk ops.
    ag = df[(df["op"] == "all_gather") & ~df["inplace"]].sort_values("size_bytes")
    assert ag["size_bytes"].tolist() == [64, 512, 4096]
    assert ag["count"].tolist() == [8, 64, 512]  # float32, 2 ranks: S = count × 4 × 2
    ar = df[df["op"] == "all_reduce"].sort_values("size_bytes")
    assert ar["count"].tolist() == [16, 128, 1024]
    for _, row in df.iterrows():
        # nccl-tests' default: each rank's loop time / iters, averaged over ranks
        assert row["time_s"] == pytest.approx(statistics.fmean(row["rank_time_s"]))
        assert len(row["rank_time_samples_s"]) == 2
        assert all(len(s) == _SMALL["iters"] for s in row["rank_time_samples_s"])
        for loop_s, samples in zip(row["rank_time_s"], row["rank_time_samples_s"]):
            assert loop_s == pytest.approx(sum(samples) / _SMALL["iters"])  # CPU: boundary clock reads
        assert statistics.fmean(row["time_samples_s"]) == pytest.approx(row["time_s"])
        assert row["time_max_over_ranks_s"] == max(row["rank_time_s"])
        assert row["time_median_max_over_ranks_s"] == max(row["rank_median_time_s"])
        assert row["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / row["time_s"])
        assert row["busbw_bytes_per_s"] == pytest.approx(
            row["algbw_bytes_per_s"] * busbw_factor(row["op"], 2))


@pytest.mark.slow
def test_gloo_rows_record_knobs_and_say_check_not_verifiable(clean_run):
    df = clean_run
    assert set(df["knobs"]) == {json.dumps({"GLOO_SOCKET_IFNAME": "lo", "NCCL_ALGO": "Ring"}, sort_keys=True)}
    assert (df["knob_check"] == "not_verifiable").all()
    assert df["algo_observed"].isna().all()
    assert (df["knob_check_pass"] == "separate").all()
    if "NCCL_DEBUG" not in os.environ:
        assert df["timed_nccl_debug"].isna().all()  # what the ranks' timed loop saw


@pytest.mark.slow
def test_check_catches_a_deliberately_corrupted_result():
    # bf16 too: the check's known data must be exact there, or clean elements would count.
    cfg = CollectivesConfig(**{**_SMALL, "max_bytes": 64}, corrupt=COLLECTIVES, dtype="bfloat16")
    df = run_collectives(cfg)
    assert len(df) == 8
    # One element corrupted on the last rank, for every op and form: the check counts exactly it.
    assert (df["wrong_elements"] == 1).all(), df[["op", "inplace", "wrong_elements"]]
    assert all(list(w) == [0, 1] for w in df["rank_wrong_elements"])
    assert (df["dtype"] == "bfloat16").all()
    assert df[df["op"] == "all_reduce"]["count"].tolist() == [32]  # 64 bytes of 2-byte elements


def _rank_result(rank, samples, wrong=0, op="all_reduce", size=4096, loop_s=None, n=2, nccl_debug=None):
    return {"rank": rank, "world_size": n, "backend": "gloo", "device": "cpu", "dtype": "float32",
            "nccl_debug": nccl_debug,
            "entries": [{"op": op, "inplace": True, "count": size // 4, "size_bytes": size,
                         "loop_time_s": sum(samples) if loop_s is None else loop_s,
                         "samples_s": samples, "wrong_elements": wrong}]}


def test_time_is_nccl_tests_default_mean_over_ranks_of_loop_time_per_iteration():
    # nccl-tests src/common.cu BenchTime: deltaSec = loop wall time / iters on each rank, then
    # Allreduce(..., average) with average = 1 (the default of -a): the mean over ranks. The loop
    # time is the host clock over the whole loop, which on GPU exceeds the sum of event samples.
    cfg = CollectivesConfig(world_size=2)
    ranks = [_rank_result(0, [1.0, 2.0, 9.0], loop_s=12.6),
             _rank_result(1, [3.0, 3.0, 4.0], wrong=2, loop_s=10.2)]
    row = reduce_rank_results(ranks, cfg).iloc[0]
    assert row["rank_time_s"] == pytest.approx([4.2, 3.4])
    assert row["time_s"] == pytest.approx(3.8)  # (4.2 + 3.4) / 2
    assert "nccl-tests -a 1" in row["time_convention"]
    # bandwidths from the averaged time (nccl-tests getBw(deltaSec)), not averaged bandwidths
    assert row["algbw_bytes_per_s"] == pytest.approx(4096 / 3.8)
    assert row["algbw_bytes_per_s"] != pytest.approx((4096 / 4.2 + 4096 / 3.4) / 2)
    assert row["busbw_bytes_per_s"] == pytest.approx(4096 / 3.8 * 1.0)  # 2(n-1)/n = 1 at n = 2
    # the other views, kept beside it
    assert row["time_max_over_ranks_s"] == pytest.approx(4.2) and row["slowest_rank"] == 0  # -a 3
    assert row["rank_median_time_s"] == [2.0, 3.0]
    assert row["time_median_max_over_ranks_s"] == 3.0  # perfkit's t before it followed nccl-tests
    assert row["time_samples_s"] == [2.0, 2.5, 6.5]  # per iteration, mean over ranks
    assert row["time_median_s"] == 2.5 and row["noisy"]
    assert row["rank_time_samples_s"] == [[1.0, 2.0, 9.0], [3.0, 3.0, 4.0]]
    assert row["iters"] == 3 and row["wrong_elements"] == 2


def test_time_convention_on_four_ranks_with_a_per_rank_chunk_op():
    cfg = CollectivesConfig(world_size=4, ops=("all_gather",))
    loops = [0.004, 0.005, 0.006, 0.009]  # seconds for 2 iterations
    ranks = [_rank_result(r, [loop / 2] * 2, op="all_gather", size=1 << 20, loop_s=loop, n=4)
             for r, loop in enumerate(loops)]
    row = reduce_rank_results(ranks, cfg).iloc[0]
    t = statistics.fmean(loop / 2 for loop in loops)  # 0.003
    assert row["time_s"] == pytest.approx(t)
    assert row["busbw_bytes_per_s"] == pytest.approx((1 << 20) / t * 3 / 4)  # (n-1)/n
    assert row["time_max_over_ranks_s"] == pytest.approx(0.0045) and row["slowest_rank"] == 3


def test_reduce_times_rejects_ranks_with_different_iterations():
    with pytest.raises(BadInputError, match="different or no iterations"):
        reduce_times([{"loop_time_s": 2.0, "samples_s": [1.0, 1.0]},
                      {"loop_time_s": 1.0, "samples_s": [1.0]}])


def test_reduction_rejects_ranks_that_disagree():
    cfg = CollectivesConfig(world_size=2)
    with pytest.raises(BadInputError, match="disagree"):
        reduce_rank_results([_rank_result(0, [1.0]), _rank_result(1, [1.0], size=8192)], cfg)
    with pytest.raises(BadInputError, match="every rank"):
        reduce_rank_results([_rank_result(0, [1.0]), None], cfg)


_RANK0_LOG = """\
NCCL version 2.27.5+cuda12.9
h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring
h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo {algo} proto SIMPLE channel{{Lo..Hi}}={{0..1}}
h:1:1 [0] NCCL INFO AllReduce: 8 Bytes -> Algo TREE proto LL channel{{Lo..Hi}}={{0..0}}
"""


@pytest.mark.parametrize("algo, verdict", [("RING", "honoured"), ("TREE", "not_honoured")])
def test_nccl_rows_carry_the_knob_check_of_their_own_size(algo, verdict):
    cfg = CollectivesConfig(world_size=2, backend="nccl", env={"NCCL_ALGO": "Ring"})
    ranks = [_rank_result(0, [1e-3]), _rank_result(1, [1e-3])]
    logs = (_RANK0_LOG.format(algo=algo), "h:2:2 [1] NCCL INFO NCCL_ALGO set by environment to Ring\n")
    row = reduce_rank_results(ranks, cfg, logs).iloc[0]
    # the 8-byte TREE line (another call, e.g. torch's barrier) does not count against 4096 bytes
    assert row["knob_check"] == verdict
    assert row["algo_observed"] == algo
    detail = json.loads(row["knob_check_detail"])
    assert detail[0]["knob"] == "NCCL_ALGO" and detail[0]["echoed"] == "Ring"


def test_nccl_p2p_rows_are_unverifiable_for_algo():
    cfg = CollectivesConfig(world_size=2, backend="nccl", env={"NCCL_ALGO": "Ring"})
    ranks = [_rank_result(r, [1e-3], op="send_recv") for r in (0, 1)]
    row = reduce_rank_results(ranks, cfg, (_RANK0_LOG.format(algo="RING"), "")).iloc[0]
    assert row["knob_check"] == "unverifiable"


def _fake_launch(monkeypatch, status="ok"):
    """Replace perfkit.run.launch.launch; return the list of calls it receives. The knob check pass
    gets rank 0's TUNING log; the timed launch gets rank results that report the NCCL_DEBUG their
    environment held."""
    import perfkit.run.launch

    calls = []

    def fake_launch(target, config, **kwargs):
        calls.append({**kwargs, "target": target, "config": config})
        if status != "ok":
            return LaunchResult(status=status, rank_results=(None, None), error="rank 1 killed by signal SIGKILL",
                                failed_rank=1, rank_logs=("", ""), wall_time_s=1.0)
        if target.endswith(":knob_pass_rank"):
            logs = (_RANK0_LOG.format(algo="RING"), "h:2:2 [1] NCCL INFO NCCL_ALGO set by environment to Ring\n")
            return LaunchResult(status="ok", rank_results=({"rank": 0, "points": 1}, {"rank": 1, "points": 1}),
                                error=None, failed_rank=None, rank_logs=logs, wall_time_s=1.0)
        ranks = tuple(_rank_result(r, [1e-3], nccl_debug=kwargs["env"].get("NCCL_DEBUG")) for r in (0, 1))
        return LaunchResult(status="ok", rank_results=ranks, error=None, failed_rank=None,
                            rank_logs=("", ""), wall_time_s=1.0)

    monkeypatch.setattr(perfkit.run.launch, "launch", fake_launch)
    return calls


def test_nccl_knobs_are_checked_in_a_separate_logged_pass_and_timed_without_logging(monkeypatch):
    calls = _fake_launch(monkeypatch)
    clock = iter([1000.0, 1100.0, 1100.0, 1100.0])  # the check pass takes 100 s of the one deadline
    monkeypatch.setattr(perfkit.measuring.collectives.benchmark, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    knobs = {"NCCL_ALGO": "Ring", "NCCL_DEBUG_SUBSYS": "COLL"}
    cfg = CollectivesConfig(backend="nccl", ops=("all_reduce",), env=knobs, timeout_s=300)
    row = run_collectives(cfg).iloc[0]
    check_pass, timed = calls
    assert check_pass["target"] == "perfkit.measuring.collectives.benchmark:knob_pass_rank"
    assert timed["target"] == "perfkit.measuring.collectives.benchmark:collectives_rank"
    # the check pass logs, with the subsystems the check needs and the user's own kept
    assert check_pass["env"]["NCCL_DEBUG"] == "INFO" and check_pass["env"]["NCCL_ALGO"] == "Ring"
    assert check_pass["env"]["NCCL_DEBUG_SUBSYS"].split(",") == ["COLL", "INIT", "ENV", "TUNING"]
    # the timed launch gets the knobs and no NCCL debug variable at all
    assert timed["env"] == {"NCCL_ALGO": "Ring"}
    assert row["timed_nccl_debug"] is None
    assert timed["device"] == "cuda" and timed["backend"] == "nccl"
    assert check_pass["timeout_s"] == 300 and timed["timeout_s"] == pytest.approx(200)  # one deadline
    # the verdict comes from the check pass's logs
    assert row["knob_check"] == "honoured" and row["algo_observed"] == "RING"
    assert row["knob_check_pass"] == "separate"


@pytest.mark.slow
def test_the_knob_check_pass_runs_every_point_once_on_real_ranks():
    # The pass's rank target is backend-agnostic: on gloo it shows every point is reached.
    cfg = CollectivesConfig(**_SMALL, ops=("all_reduce", "all_gather"))
    result = launch("perfkit.measuring.collectives.benchmark:knob_pass_rank", cfg.to_dict(), world_size=2, backend="gloo",
                    timeout_s=cfg.timeout_s)
    assert result.ok, result.error
    assert [r["points"] for r in result.rank_results] == [3 * 3, 3 * 3]  # (1 + 2 forms) × 3 sizes


def test_knob_check_pass_off_runs_one_launch_with_the_knobs_as_given(monkeypatch):
    calls = _fake_launch(monkeypatch)
    cfg = CollectivesConfig(backend="nccl", ops=("all_reduce",), env={"NCCL_PROTO": "Simple"},
                            knob_check_pass="off")
    row = run_collectives(cfg).iloc[0]
    assert [c["target"] for c in calls] == ["perfkit.measuring.collectives.benchmark:collectives_rank"]
    assert calls[0]["env"] == {"NCCL_PROTO": "Simple"}
    assert row["knob_check"] == "not_checked" and row["knob_check_pass"] == "off"


def test_run_collectives_raises_execution_failed_on_a_failed_launch(monkeypatch):
    calls = _fake_launch(monkeypatch, status="killed")
    with pytest.raises(ExecutionFailed) as info:
        run_collectives(CollectivesConfig(backend="nccl", env={"NCCL_PROTO": "Simple"}))
    assert info.value.status == "killed" and "SIGKILL" in info.value.message
    assert info.value.message.startswith("knob check pass, rank 1:")
    assert len(calls) == 1  # nothing is timed after a failed check pass
    calls.clear()
    with pytest.raises(ExecutionFailed) as info:
        run_collectives(CollectivesConfig(backend="gloo"))
    assert info.value.message.startswith("timed launch, rank 1:")
    assert [c["target"] for c in calls] == ["perfkit.measuring.collectives.benchmark:collectives_rank"]  # no pass on gloo
    assert calls[0]["device"] == "cpu"


def _sabotaged(target, timeout_s):
    cfg = CollectivesConfig(**{**_SMALL, "ops": ("all_reduce",), "iters": 50}, world_size=2)
    return launch(f"_collective_targets:{target}", {**cfg.to_dict(), "die_on_call": 4},
                  world_size=2, backend="gloo", timeout_s=timeout_s)


@pytest.mark.slow
def test_a_rank_killed_mid_benchmark_ends_the_launch_as_killed_with_its_error():
    result = _sabotaged("die_mid_benchmark", timeout_s=60)
    assert result.status == "killed", result.error
    assert result.failed_rank == 1
    assert "SIGKILL" in result.error
    assert "killing itself mid-benchmark" in result.rank_logs[1]
    assert result.wall_time_s < 60 + 15  # the deadline plus the launcher's teardown grace


@pytest.mark.slow
def test_a_rank_hung_mid_benchmark_ends_the_launch_as_timeout():
    # The deadline must leave room for two torch start-ups on 2 busy cores before the hang.
    result = _sabotaged("hang_mid_benchmark", timeout_s=20)
    assert result.status == "timeout", result.error
    assert "no result within 20 s" in result.error
    assert "hanging mid-benchmark" in result.rank_logs[1]
    assert result.wall_time_s < 20 + 15


@pytest.mark.slow
def test_a_rank_raising_mid_benchmark_records_its_error():
    result = _sabotaged("raise_mid_benchmark", timeout_s=60)
    assert result.status == "failed"
    assert result.failed_rank == 1
    assert "deliberate failure of rank 1 mid-benchmark" in result.error


@pytest.mark.slow
def test_advise_finds_a_sweep_of_small_messages_latency_bound(tmp_path):
    # Issue 29: 64 B to 4 KiB of all_reduce on gloo never leave the latency regime, so the advice
    # is to send fewer, larger messages, its evidence the fastest samples of the smallest and the
    # largest size. 20 iterations a size: with 3 (clean_run's), the fastest of a size under a
    # loaded suite was 3 ms at 64 B against 1.2 ms at 4 KiB.
    from _advice import advise_json, record_as

    small = dict(_SMALL, ops=("all_reduce",), inplace=(True,), iters=20, warmup_iters=3)
    rows = run_collectives(CollectivesConfig(**small))
    # The notebook records the library's rows with their workload (notebooks/collectives.ipynb).
    folder = record_as(rows.assign(workload="collectives"), tmp_path / "small", notebook="collectives.ipynb",
                       params={k: list(v) if isinstance(v, tuple) else v for k, v in small.items()},
                       config_id="collectives-small")
    findings = advise_json(folder)
    assert {f["rule"] for f in findings} <= {"collectives_latency_bound", "noisy"}, findings
    (f,) = [f for f in findings if f["rule"] == "collectives_latency_bound"]
    assert f["point"] == "collectives (all_reduce, in-place, 2 ranks)" and f["rank"] == 1
    fastest = {s: min(min(x) for x in rows.loc[rows["size_bytes"] == s, "time_samples_s"]) for s in (64, 4096)}
    assert (f["evidence"]["min_size_bytes"], f["evidence"]["max_size_bytes"]) == (64, 4096)
    assert (f["evidence"]["fastest_min_size_time_s"], f["evidence"]["fastest_max_size_time_s"]) == (
        fastest[64], fastest[4096])
    share = 1 - (fastest[4096] - fastest[64]) / fastest[4096] * 4096 / (4096 - 64)
    assert f["cost_share"] == pytest.approx(min(1.0, share)) and f["cost_share"] >= 0.5, f
    assert "larger messages" in f["advice"]
