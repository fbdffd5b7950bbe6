"""Inference: greedy tokens with and without the KV cache, the metric definitions on synthetic
timestamps, the counted bytes of a decode step against a hand derivation, the row, the plots and,
as a slow test, the acceptance ratios measured on this machine."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import NOTEBOOKS, ceiling_row
from perfkit.analyse.inference import e2e_consistency, itl_samples, latency_metrics, request_metrics
from perfkit.core.errors import BadInputError
from perfkit.measuring.inference import generate as inference
from perfkit.measuring.inference import kv_cache
from perfkit.measuring.ops.counting import count_ops

G = 1e9
# Small enough to count and generate in well under a second, big enough that weights dominate.
SMALL = {"n_layers": 2, "d_model": 128, "n_heads": 2, "vocab_size": 256}


def _generate(cfg: inference.InferenceConfig, *, kv: bool = True, margins: bool = False):
    model, prompt = inference.build_model(cfg, "cpu"), inference.prompt_tokens(cfg, "cpu")
    with torch.no_grad():
        return kv_cache.generate(model, prompt, cfg.new_tokens, kv_cache=kv, margins=margins)


# ---- tokens ----------------------------------------------------------------------------------

def test_cached_greedy_tokens_equal_the_gpt_forward_over_the_whole_sequence():
    """kv_cache=False is GPT.forward itself; the cached decoder must pick the same tokens."""
    cfg = inference.InferenceConfig(batch_size=2, prompt_len=24, new_tokens=12, device="cpu")
    cached, full = _generate(cfg), _generate(cfg, kv=False)
    assert cached.tokens.shape == (2, 12)
    assert torch.equal(cached.tokens, full.tokens)
    assert cached.tokens.unique().numel() > 8  # a real sequence, not one token repeated
    assert len(cached.timestamps_s) == 13 and list(cached.timestamps_s) == sorted(cached.timestamps_s)


def test_tokens_match_across_precisions_where_the_logits_allow():
    """fp64 and fp32 agree everywhere (fp32's rounding, ~1e-6, is far below the smallest top-2
    gap here); bf16 (8 mantissa bits, errors of ~1e-2 in the logits) may first differ only where
    fp32's own top-2 gap is below 0.05, a near tie that bf16 cannot resolve."""
    base = dict(batch_size=4, prompt_len=32, new_tokens=24, device="cpu", model_size=SMALL)
    fp32 = _generate(inference.InferenceConfig(**base, precision="fp32"), margins=True)
    fp64 = _generate(inference.InferenceConfig(**base, precision="fp64"))
    bf16 = _generate(inference.InferenceConfig(**base, precision="bf16"))
    assert torch.equal(fp64.tokens, fp32.tokens)
    for b in range(4):
        differ = (bf16.tokens[b] != fp32.tokens[b]).nonzero()
        if len(differ):
            first = int(differ[0])
            assert fp32.margins[b, first] < 0.05, (b, first, fp32.margins[b])


def test_sdpa_backends_give_the_same_tokens_and_a_cpu_lacks_two():
    cfg = inference.InferenceConfig(batch_size=2, prompt_len=16, new_tokens=8, device="cpu",
                                    model_size=SMALL)
    tokens = {}
    for backend in ("math", "flash"):
        with kv_cache.sdpa_context(backend), torch.no_grad():
            tokens[backend] = _generate(cfg).tokens
    assert torch.equal(tokens["math"], tokens["flash"])
    available = kv_cache.sdpa_backends("cpu")
    assert [k for k, v in available.items() if v is None] == ["math", "flash"]
    row = inference.run_inference(inference.InferenceConfig(sdpa_backend="efficient", device="cpu"))
    assert row["status"] == "skipped" and "no CPU kernel" in row["error"]


# ---- metric definitions ----------------------------------------------------------------------

def test_metrics_follow_vllms_definitions_on_synthetic_timestamps():
    # Two generations of N = 4 tokens: start, then the time each token was available.
    stamps = [[0.0, 1.0, 1.5, 2.5, 3.0],
              [10.0, 11.2, 11.7, 12.2, 12.7]]
    per = request_metrics(stamps)
    np.testing.assert_allclose(per["ttft_s"], [1.0, 1.2])
    np.testing.assert_allclose(per["e2e_latency_s"], [3.0, 2.7])
    np.testing.assert_allclose(per["tpot_s"], [(3.0 - 1.0) / 3, (2.7 - 1.2) / 3])  # (e2e - TTFT)/(N - 1)
    itl = itl_samples(stamps)
    np.testing.assert_allclose(itl, [0.5, 1.0, 0.5, 0.5, 0.5, 0.5])  # no start-to-first gap (vllm#7242)
    row = latency_metrics(stamps, batch_size=2, prompt_len=8, prefill_samples_s=[0.9, 1.1, 1.0])
    assert row["itl_mean_s"] == pytest.approx(row["tpot_mean_s"])  # equal N: mean ITL = mean TPOT (vllm#6531)
    for name, samples in (("ttft", [1.0, 1.2]), ("itl", itl), ("e2e_latency", [3.0, 2.7])):
        for q in (50, 90, 99):
            assert row[f"{name}_p{q}_s"] == pytest.approx(np.percentile(samples, q))
        assert row[f"{name}_s"] == pytest.approx(np.median(samples))
        assert row[f"{name}_samples_s"] == pytest.approx(list(samples))
    assert row["output_tokens_per_s"] == pytest.approx(2 * 4 * 2 / (3.0 + 2.7))  # all tokens / all time
    assert row["prefill_tokens_per_s"] == pytest.approx(2 * 8 / 1.1)  # prompt tokens, not samples
    assert row["prefill_samples_per_s"] == pytest.approx(2 / 1.1)
    assert row["decode_time_s"] == pytest.approx(2.85 - 1.0)  # optimum: generate - prefill
    assert row["decode_tokens_per_s"] == pytest.approx(2 * 3 / 1.85)
    assert row["e2e_consistency"] == pytest.approx((1.1 + 3 * row["tpot_s"]) / 2.85 - 1)
    one = latency_metrics([[0.0, 0.4], [1.0, 1.5]], batch_size=1, prompt_len=4)
    assert math.isnan(one["tpot_s"]) and one["itl_samples_s"] == [] and one["tpot_samples_s"] == []
    assert math.isnan(e2e_consistency(0.4, math.nan, 0.4, 1))
    with pytest.raises(BadInputError, match="non-decreasing"):
        request_metrics([[0.0, 1.0, 0.5]])
    with pytest.raises(BadInputError, match="at least 2 columns"):
        request_metrics([[0.0]])


# ---- counted bytes ---------------------------------------------------------------------------

def test_decode_step_bytes_match_the_hand_derivation():
    """One decode step at batch B reading t cached positions, fp32 (4 bytes), d = d_model,
    L layers, V vocabulary, bias-free (the default):

        weights   = L · (4·d² [q, k, v, out] + 2·4·d² [fc1, fc2] + 2·d [ln1, ln2]) + d [ln_f]
                    + V·d [lm_head] + B·d [B token-embedding rows] + d [one position row]
        KV read   = 2 · L · B · t · d        (keys and values of t positions, the new one included)
        KV write  = 2 · L · B · 1 · d        (the new position, index_copy_ into the cache)
        bytes     = 4 · (weights + KV read + KV write)

    The counter also sees activations (x, q/k/v, the 4d MLP hidden, logits: ~30·B·d per layer),
    which the derivation leaves out; at B = 1 they are ~1 % of the weights, under the 5 %.
    """
    cfg = inference.InferenceConfig(batch_size=1, prompt_len=96, new_tokens=16, device="cpu")
    L, d, V, B = 4, 256, 512, 1
    t = cfg.prompt_len + cfg.new_tokens // 2
    model, prompt = inference.build_model(cfg, "cpu"), inference.prompt_tokens(cfg, "cpu")
    ops = kv_cache.count_steps(model, prompt, cfg.new_tokens)["decode"]
    counted = float((ops["bytes_read"] + ops["bytes_written"]).sum())
    weights = L * (4 * d * d + 2 * 4 * d * d + 2 * d) + d + V * d + B * d + d
    hand = 4 * (weights + 2 * L * B * t * d + 2 * L * B * d)
    assert counted == pytest.approx(hand, rel=0.05)
    assert ops["counted"].all()
    # Attention reads the query and the t cached keys and values: a slice, never the whole cache.
    attention = ops[ops["family"] == "attention"]
    assert len(attention) == L and (attention["bytes_read"] == 4 * (B * d + 2 * B * t * d)).all()
    # Each index_copy_ writes the new position only, never the preallocated cache.
    writes = ops[ops["op"] == "aten.index_copy_.default"]
    assert len(writes) == 2 * L and (writes["bytes_written"] == 4 * B * d).all()
    # FLOP: 2 per weight element per token, plus attention's 2·2·t·d per layer.
    flop = 2 * B * (L * 12 * d * d + V * d) + L * 4 * B * t * d
    assert float(ops["flop"].sum()) == pytest.approx(flop, rel=0.05)


def test_decode_bytes_grow_by_exactly_the_kv_cache_read():
    """Eight more cached positions add 2·L·B·8·d·4 bytes, read by attention (a slice of the cache,
    never its preallocated length) and nothing else."""
    cfg = inference.InferenceConfig(batch_size=2, prompt_len=40, new_tokens=8, device="cpu", model_size=SMALL)
    model = inference.build_model(cfg, "cpu")

    def decode_bytes(prompt_len):
        prompt = inference.prompt_tokens(cfg, "cpu")[:, :prompt_len]
        ops = kv_cache.count_steps(model, prompt, 8)["decode"]
        return float((ops["bytes_read"] + ops["bytes_written"]).sum())

    assert decode_bytes(40) - decode_bytes(32) == 2 * 2 * 2 * 8 * 128 * 4


def test_in_place_index_writes_count_the_written_rows_not_the_tensor():
    cache = torch.zeros(2, 4, 64, 16)
    new = torch.ones(2, 4, 1, 16)
    pos = torch.tensor([5])
    ops = count_ops(lambda: cache.index_copy_(2, pos, new))
    row = ops[ops["op"] == "aten.index_copy_.default"].iloc[0]
    assert row["counted"] and row["bytes_written"] == new.numel() * 4
    assert row["bytes_read"] == new.numel() * 4 + 8  # the values and one int64 index

    def put():
        cache[:, :, pos] = new

    row = count_ops(put).query("op == 'aten.index_put_.default'").iloc[0]
    assert row["bytes_written"] == new.numel() * 4 and row["bytes_read"] == new.numel() * 4 + 8
    flat = torch.zeros(8, 16)
    row = count_ops(lambda: flat.index_put_((torch.tensor([1, 2]),), torch.tensor(1.0))).iloc[-1]
    assert row["bytes_written"] == 2 * 16 * 4  # a broadcast value still writes two whole rows


# ---- the row, the checks, the plots -----------------------------------------------------------

@pytest.fixture(scope="module")
def rows():
    ceilings = pd.DataFrame([ceiling_row("compute", "fp32", None, 50 * G),
                             ceiling_row("memory", None, "DRAM", 5 * G)]).assign(device="cpu")
    base = dict(prompt_len=16, new_tokens=4, device="cpu", model_size=SMALL, threads=1, timed_runs=2)
    out = [inference.run_inference(inference.InferenceConfig(**base, batch_size=b, kv_cache=kv), ceilings)
           for b in (1, 4) for kv in (True, False)]
    return pd.DataFrame(out), ceilings


def test_a_row_holds_the_metrics_samples_and_roofline_points(rows):
    df, _ = rows
    assert (df["status"] == "ok").all(), df["error"].tolist()
    row = df.iloc[0]
    assert row["workload"] == "inference" and bool(row["kv_cache"]) and row["batch_size"] == 1
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        assert {f"{name}_s", f"{name}_p50_s", f"{name}_p90_s", f"{name}_p99_s", f"{name}_samples_s"} <= set(df)
    assert len(row["ttft_samples_s"]) == 2 and len(row["itl_samples_s"]) == 2 * 3
    np.testing.assert_allclose(row["tpot_samples_s"],
                               (np.array(row["e2e_latency_samples_s"]) - row["ttft_samples_s"]) / 3)
    assert row["prefill_tokens_per_s"] == pytest.approx(16 / row["ttft_s"])
    # Each point's time is its phase's: TTFT for the prefill, TPOT for a decode step.
    assert row["prefill_flop_per_s"] == pytest.approx(row["prefill_flop"] / row["ttft_s"])
    assert row["decode_flop_per_s"] == pytest.approx(row["decode_flop"] / row["tpot_s"])
    # Decode reads the weights for one token per sequence: less intense than the prefill, more
    # intense with a bigger batch; both placed under the given roofs.
    cached = df[df["kv_cache"]].set_index("batch_size")
    assert cached.loc[1, "decode_intensity_flop_per_byte"] < cached.loc[4, "decode_intensity_flop_per_byte"]
    assert cached.loc[1, "decode_intensity_flop_per_byte"] < cached.loc[1, "prefill_intensity_flop_per_byte"]
    assert cached.loc[1, "decode_bound"] == "DRAM" and cached["roofline_reason"].isna().all()
    # Same greedy tokens with and without the cache, for each batch.
    assert df.groupby("batch_size")["tokens_digest"].nunique().eq(1).all()
    assert cached.loc[1, "kv_cache_bytes"] == 2 * 2 * 1 * 20 * 128 * 4


def test_bad_parameters_fail_before_anything_runs():
    from perfkit.run.notebooks import check_params, read_notebook

    for bad, text in (({"prompt_len": 0}, "prompt_len"), ({"precision": "fp8"}, "precision"),
                      ({"batch_sizes": []}, "batch_sizes"), ({"nope": 1}, "unknown"),
                      ({"compile_mode": "max-autotune"}, "compile is False"),
                      ({"model_size": {"n_heads": 3}}, "must divide"),
                      ({"sdpa_backend": "fast"}, "sdpa_backend")):
        with pytest.raises(BadInputError, match=text):
            inference.check_params(bad)
    spec = read_notebook(NOTEBOOKS / "inference.ipynb")
    assert spec.check == "perfkit.measuring.inference.generate:check_params"
    with pytest.raises(BadInputError, match="prompt_len"):
        check_params(spec, {"prompt_len": 0})
    assert len(inference.configs_from_params({"batch_sizes": [1, 2, 8]})) == 3
    row = inference.run_inference(inference.InferenceConfig(precision="tf32", device="cpu"))
    assert row["status"] == "skipped" and "tf32" in row["error"]


@pytest.mark.slow  # ~7 s: holoviews and bokeh load, then render every panel
def test_plots_and_the_report_section_build(rows):
    from perfkit.view.plots import hv_bokeh
    from perfkit.view.plots.inference import inference_section, inference_summary, roofline_points

    hv = hv_bokeh()
    df, ceilings = rows
    points = roofline_points(df)
    assert sorted(points["family"].unique()) == ["decode", "prefill"] and len(points) == 2 * len(df)
    assert points["op"].str.contains("no cache").any() and points["op"].str.contains("kv cache").any()
    all_rows = pd.concat([df, ceilings.assign(workload="ceiling", config_id="c")], ignore_index=True)
    df = df.assign(config_id="c")
    section = inference_section(df, all_rows.assign(config_id="c"))
    # TTFT and TPOT vs batch, throughput vs latency, one roofline frame (fp32).
    assert isinstance(section, hv.Layout) and len(section) == 4
    hv.render(section)
    summary = inference_summary(df, ceilings)
    assert isinstance(summary, hv.Layout) and len(summary) == 4


# ---- acceptance (slow) -----------------------------------------------------------------------

@pytest.mark.slow  # > 5 s here: make test runs it, test-fast does not
def test_the_work_behind_the_acceptance_ratios_is_counted_not_timed():
    """The issue's acceptance ratios are timings (TPOT 512/128 <= 1.5, TTFT 512/128 in 2-6, no
    cache / cache >= 4); they are checked by ``benchmarks/inference_latency.py`` on a quiet machine,
    not here: a suite running three workers on two shared cores once read 1.51 for the first. What
    they rest on is counted and deterministic, and is asserted: the bytes a decode step must move
    (weights 13.8 MB + KV cache) grow at most 1.5x from prompt 128 to 512; prefill FLOP grows 2-6x
    for 4x the prompt (linear matmul work plus attention's quadratic term); without the cache a
    decode step recomputes all 512+ positions, >= 4x the FLOP of a cached step; and the greedy
    tokens are the same with and without the cache."""
    base = dict(batch_size=1, new_tokens=16, device="cpu", threads=1, count_ops=True, timed_runs=1)
    rows = {name: inference.run_inference(inference.InferenceConfig(**base, **kw))
            for name, kw in {"cache128": dict(prompt_len=128), "cache512": dict(prompt_len=512),
                             "full512": dict(prompt_len=512, kv_cache=False)}.items()}
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["error"])
    c128, c512, f512 = rows["cache128"], rows["cache512"], rows["full512"]
    assert c512["tokens_digest"] == f512["tokens_digest"]
    # The ids themselves are kept (batch × new_tokens, flattened): perfkit compare's numerics read them.
    assert len(c512["greedy_token_ids"]) == 1 * 16 and c512["greedy_token_ids"] == f512["greedy_token_ids"]
    assert c512["greedy_token_ids"] != c128["greedy_token_ids"]  # another prompt, other tokens
    assert 1.0 < c512["decode_bytes"] / c128["decode_bytes"] <= 1.5
    assert 2 <= c512["prefill_flop"] / c128["prefill_flop"] <= 6
    assert f512["decode_flop"] / c512["decode_flop"] >= 4
    assert c512["weight_bytes"] < c512["decode_bytes"]


def test_latency_axes_are_scaled_to_milli_or_micro_seconds():
    # Seconds under 1 were drawn unscaled: a 50 µs TPOT read "0.000 s" in the hover.
    from perfkit.view.plots._common import display_scale

    assert display_scale([5e-5, 2e-5], below_one=True) == (1e-6, "µ")
    assert display_scale([0.25], below_one=True) == (1e-3, "m")
    assert display_scale([3.0], below_one=True) == (1.0, "")
    assert display_scale([0.25]) == (1.0, "") and display_scale([2e9]) == (1e9, "G")
