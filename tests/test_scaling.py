"""Scaling efficiency and step breakdown against hand-computed tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfkit.core.errors import BadInputError
from perfkit.analyse.scaling import scaling_efficiency, step_breakdown


def _points(rows):
    cols = ["parallelism", "world_size", "global_batch_size", "per_device_batch_size", "step_time_s"]
    df = pd.DataFrame([dict(zip(cols, r)) for r in rows])
    df["samples_per_s"] = df["global_batch_size"] / df["step_time_s"]
    return df


# Strong scaling: global batch 64 split over N ranks.
STRONG = _points([
    ("none", 1, 64, 64, 1.00),
    ("ddp", 1, 64, 64, 1.10),  # DDP's own cost on one rank: 10 %
    ("ddp", 2, 64, 32, 0.55),
    ("ddp", 4, 64, 16, 0.32),
])

# Weak scaling: 32 samples per rank, global batch grows with N.
WEAK = _points([
    ("none", 1, 32, 32, 0.50),
    ("ddp", 1, 32, 32, 0.52),
    ("ddp", 2, 64, 32, 0.55),
    ("ddp", 4, 128, 32, 0.625),
])


def _col(df, name):
    return df[name].tolist()


def test_strong_scaling_against_both_baselines():
    out = scaling_efficiency(STRONG)
    assert _col(out, "scaling_mode") == ["baseline", "strong", "strong", "strong"]
    # vs no wrapper, T(1) = 1.00:
    #   ddp N=1: speedup 1/1.1 = 0.90909, efficiency 1/(1·1.1) = 0.90909
    #   ddp N=2: speedup 1/0.55 = 1.81818, efficiency 1/(2·0.55) = 0.90909
    #   ddp N=4: speedup 1/0.32 = 3.125,   efficiency 1/(4·0.32) = 0.78125
    assert _col(out, "speedup_vs_none") == pytest.approx([1.0, 1 / 1.1, 1 / 0.55, 3.125])
    assert _col(out, "efficiency_vs_none") == pytest.approx([1.0, 1 / 1.1, 1 / 1.1, 0.78125])
    # vs DDP on one rank, T(1) = 1.10:
    #   N=2: 1.1/0.55 = 2.0, efficiency 1.1/(2·0.55) = 1.0
    #   N=4: 1.1/0.32 = 3.4375, efficiency 1.1/(4·0.32) = 0.859375
    assert _col(out, "speedup_vs_wrapper")[1:] == pytest.approx([1.0, 2.0, 3.4375])
    assert _col(out, "efficiency_vs_wrapper")[1:] == pytest.approx([1.0, 1.0, 0.859375])
    # X = 64/T, so X(N)/(N·X(1)) reduces to the strong efficiency T(1)/(N·T(N)).
    assert _col(out, "throughput_efficiency_vs_none") == pytest.approx(_col(out, "efficiency_vs_none"))
    assert _col(out, "baseline_none_step_time_s") == [1.0] * 4
    assert _col(out, "baseline_wrapper_step_time_s")[1:] == [1.1] * 3
    assert out["baseline_none_reason"].isna().all()
    # The plain module has no wrapper baseline: NaN with a reason.
    assert math.isnan(out.loc[0, "speedup_vs_wrapper"])
    assert "no wrapper baseline" in out.loc[0, "baseline_wrapper_reason"]
    # Input columns are kept, the input is not modified.
    assert "scaling_mode" not in STRONG.columns
    assert _col(out, "step_time_s") == _col(STRONG, "step_time_s")


def test_weak_scaling_is_inferred_and_uses_no_factor_n():
    out = scaling_efficiency(WEAK)
    assert _col(out, "scaling_mode") == ["baseline", "weak", "weak", "weak"]
    # vs no wrapper, T(1) = 0.50: N=2 0.5/0.55 = 0.90909; N=4 0.5/0.625 = 0.8
    assert _col(out, "efficiency_vs_none") == pytest.approx([1.0, 0.5 / 0.52, 0.5 / 0.55, 0.8])
    # vs DDP on one rank, T(1) = 0.52: N=2 0.52/0.55 = 0.945454; N=4 0.52/0.625 = 0.832
    assert _col(out, "efficiency_vs_wrapper")[1:] == pytest.approx([1.0, 0.52 / 0.55, 0.832])
    # Throughput: N=4 X = 128/0.625 = 204.8, X(1) = 32/0.5 = 64 -> 204.8/(4·64) = 0.8
    assert out.loc[3, "throughput_efficiency_vs_none"] == pytest.approx(0.8)
    # Same data forced to strong: baselines are now matched on the global batch, and there is
    # no one-device point with N=2's global batch of 64 -> NaN + reason, no fallback to 32.
    forced = scaling_efficiency(WEAK, mode="strong")
    assert math.isnan(forced.loc[2, "efficiency_vs_none"])
    assert forced.loc[2, "baseline_none_reason"] == (
        "no baseline row with parallelism='none', world_size=1, global_batch_size=64"
    )


def test_group_by_and_missing_baseline_is_nan_with_reason():
    fp32 = STRONG.assign(precision="fp32")
    bf16 = STRONG[STRONG["parallelism"] == "ddp"].assign(precision="bf16")  # no plain baseline
    bf16 = bf16.assign(step_time_s=bf16["step_time_s"] / 2, samples_per_s=bf16["samples_per_s"] * 2)
    out = scaling_efficiency(pd.concat([fp32, bf16], ignore_index=True), group_by=["precision"])
    got = out[out["precision"] == "bf16"]
    # bf16 never falls back to fp32's plain baseline (1.00 s): NaN, and the reason says why.
    assert got["speedup_vs_none"].isna().all()
    assert got["efficiency_vs_none"].isna().all()
    assert got["baseline_none_step_time_s"].isna().all()
    assert set(got["baseline_none_reason"]) == {
        "no baseline row with parallelism='none', world_size=1, precision='bf16', global_batch_size=64"
    }
    # Its wrapper baseline exists: T(1) = 0.55, N=4 0.16 s -> 0.55/(4·0.16) = 0.859375
    assert got["efficiency_vs_wrapper"].tolist() == pytest.approx([1.0, 1.0, 0.859375])
    assert got["baseline_wrapper_reason"].isna().all()
    # fp32 is unaffected by the bf16 rows.
    fp = out[out["precision"] == "fp32"]
    assert fp["efficiency_vs_none"].tolist() == pytest.approx([1.0, 1 / 1.1, 1 / 1.1, 0.78125])


def test_failed_baseline_is_not_used():
    df = STRONG.assign(status=["oom", "ok", "ok", "ok"])
    df.loc[0, "step_time_s"] = math.nan
    out = scaling_efficiency(df)
    assert out["efficiency_vs_none"].isna().all()
    assert out.loc[2, "baseline_none_reason"].endswith("has status 'oom'")
    assert out.loc[2, "efficiency_vs_wrapper"] == pytest.approx(1.0)


def test_tensor_parallel_same_batch_everywhere_is_strong():
    # Every TP rank sees the whole batch: global = per-device = 8 at every N; fixed work -> strong.
    df = _points([("none", 1, 8, 8, 0.4), ("tp", 2, 8, 8, 0.25)])
    out = scaling_efficiency(df)
    assert out.loc[1, "scaling_mode"] == "strong"
    assert out.loc[1, "efficiency_vs_none"] == pytest.approx(0.4 / (2 * 0.25))  # 0.8
    assert "no baseline row with parallelism='tp'" in out.loc[1, "baseline_wrapper_reason"]


def test_ambiguous_and_bad_inputs_raise():
    # ddp: global 64 then 256, per-device 32 then 64: neither is fixed.
    mixed = _points([("none", 1, 32, 32, 0.5), ("ddp", 2, 64, 32, 0.55), ("ddp", 4, 256, 64, 0.9)])
    with pytest.raises(BadInputError, match="cannot tell strong from weak"):
        scaling_efficiency(mixed)
    with pytest.raises(BadInputError, match="2 rows for one point"):
        scaling_efficiency(pd.concat([STRONG, STRONG.iloc[[0]]], ignore_index=True))
    with pytest.raises(BadInputError, match="only meaningful at world_size 1"):
        scaling_efficiency(_points([("none", 2, 64, 32, 0.5)]))
    with pytest.raises(BadInputError, match="global_batch_size"):
        scaling_efficiency(STRONG.drop(columns="global_batch_size"))
    with pytest.raises(BadInputError, match="mode must be"):
        scaling_efficiency(STRONG, mode="linear")
    with pytest.raises(BadInputError, match="positive"):
        scaling_efficiency(STRONG.assign(step_time_s=0.0))
    with pytest.raises(BadInputError, match="precision"):
        scaling_efficiency(STRONG, group_by=["precision"])


def test_breakdown_with_straggler():
    df = pd.DataFrame({
        "parallelism": ["none", "ddp", "ddp", "ddp"],
        "world_size": [1, 2, 2, 4],
        "step_time_s": [0.25, 0.50, 0.33, 0.45],
        # the compute-only step: per step the slowest rank
        "compute_time_s": [0.25, 0.45, 0.30, 0.40],
        # Synchronous data parallelism: every rank waits in the collective, so per-rank step
        # times are equal whatever the imbalance; they must not decide the straggler time.
        "rank_step_time_s": [None, [0.5, 0.5], [0.33, 0.33], [0.45] * 4],
        # parquet gives numpy arrays back for list columns
        "rank_compute_time_s": [None, np.array([0.25, 0.45]), [0.30, 0.30],
                                [0.30, 0.31, 0.40, 0.32]],
    })
    out = step_breakdown(df)
    # exposed comm = step - compute-only step (both the slowest rank's): 0, 0.05, 0.03, 0.05
    assert out["exposed_comm_time_s"].tolist() == pytest.approx([0.0, 0.05, 0.03, 0.05])
    # N=2, rank 1 computes 0.20 s longer: rank 0 idles 0.45 - 0.25 = 0.20 s at the collective
    # (the median of both ranks, 0.35, would say 0.10).
    assert out.loc[1, "slowest_rank"] == 1
    assert out.loc[1, "median_other_ranks_compute_time_s"] == pytest.approx(0.25)
    assert out.loc[1, "straggler_time_s"] == pytest.approx(0.20)
    assert out.loc[1, "typical_rank_compute_time_s"] == pytest.approx(0.25)
    # N=2 balanced: no straggler.
    assert out.loc[2, "straggler_time_s"] == 0.0
    # N=4: slowest 0.40 (rank 2); the others 0.30 0.31 0.32 -> median 0.31; straggler 0.09.
    assert out.loc[3, "slowest_rank"] == 2
    assert out.loc[3, "slowest_rank_compute_time_s"] == pytest.approx(0.40)
    assert out.loc[3, "median_other_ranks_compute_time_s"] == pytest.approx(0.31)
    assert out.loc[3, "straggler_time_s"] == pytest.approx(0.09)
    assert out.loc[3, "typical_rank_compute_time_s"] == pytest.approx(0.31)
    # The three parts add up to the step.
    parts = out.loc[1:, ["typical_rank_compute_time_s", "straggler_time_s", "exposed_comm_time_s"]]
    assert parts.sum(axis=1).tolist() == pytest.approx(out.loc[1:, "step_time_s"].tolist())
    # No per-rank compute times: NaN, not 0.
    assert math.isnan(out.loc[0, "straggler_time_s"]) and pd.isna(out.loc[0, "slowest_rank"])


def test_breakdown_of_one_rank_has_no_straggler():
    df = pd.DataFrame({"parallelism": ["ddp"], "world_size": [1], "step_time_s": [0.3],
                       "compute_time_s": [0.2], "rank_compute_time_s": [[0.2]]})
    out = step_breakdown(df)
    assert out.loc[0, "straggler_time_s"] == 0.0 and out.loc[0, "slowest_rank"] == 0
    assert out.loc[0, "exposed_comm_time_s"] == pytest.approx(0.1)


def test_breakdown_without_optional_columns_keeps_the_schema():
    out = step_breakdown(STRONG)
    for column in ("compute_time_s", "exposed_comm_time_s", "straggler_time_s", "slowest_rank",
                   "typical_rank_compute_time_s", "median_other_ranks_compute_time_s"):
        assert out[column].isna().all(), column


def test_breakdown_rejects_wrong_rank_count():
    df = pd.DataFrame({"parallelism": ["ddp"], "world_size": [4], "step_time_s": [0.4],
                       "rank_compute_time_s": [[0.4, 0.4]]})
    with pytest.raises(BadInputError, match="one time per rank \\(4\\), got 2"):
        step_breakdown(df)


def test_pipeline_composes():
    out = step_breakdown(scaling_efficiency(STRONG))
    assert {"efficiency_vs_none", "straggler_time_s"} <= set(out.columns)
    assert len(out) == 4
