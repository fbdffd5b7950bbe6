"""Numerics beside speed (issue 58): each compared point says whether the new side computes what
the base did, and the gate fails a point whose numerics differ (exit 4) unless told to accept it.

The rules on known answers first (synthetic rows through real Parquet folders and the CLI), then
real training on 2 gloo ranks: parallel layouts at one global batch come out ``same``, and a
model whose gradient is halved on one rank before DDP's all-reduce comes out ``differs``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from perfkit.analyse.numerics import evidence, judge
from perfkit.cli import main
from perfkit.core.results import RunContext, record
from perfkit.core.tolerances import LOSS_RTOL_PER_STEP, loss_rtol

LOSSES = [4.2133, 4.1048, 3.6136, 3.4645, 3.3520]


def _train_row(losses, *, step_s=0.1, precision="fp32", seed=0, n=8):
    rng = np.random.default_rng(seed)
    samples = step_s * rng.lognormal(0.0, 0.005, n)
    return {"workload": "train_step", "model": "mlp", "batch_size": 32, "precision": precision,
            "parallelism": "ddp", "world_size": 2, "losses": list(losses),
            "step_time_s": float(np.median(samples)), "step_time_samples_s": samples.tolist()}


def _folder(root: Path, rows: dict[str, dict], *, params=("batch_size",)) -> Path:
    """A sweep's results folder: one configuration per row (``cid: row``)."""
    for cid, row in rows.items():
        ctx = RunContext(results_path=root / "results" / f"{cid}.parquet", config_id=cid,
                         params={p: row[p] for p in params}, param_names=tuple(params), notebook="train_step.ipynb")
        record([row], context=ctx)
    return root


def _cli(capsys, *args):
    code = main(["compare", *map(str, args), "--run-to-run", "0.01"])
    return code, capsys.readouterr().out


def test_the_loss_budget_is_torch_testing_s_rtol_per_step_of_the_looser_precision():
    assert loss_rtol("fp32", "fp32") == (1.3e-6, "fp32")
    assert loss_rtol("fp32", "bf16") == (1.6e-2, "bf16 vs fp32")  # the new side first, as a PR reads
    assert loss_rtol("bf16", "fp16")[0] == 1.6e-2 and LOSS_RTOL_PER_STEP["fp8"] == 0.0625
    assert loss_rtol(None, "fp32") == (1.3e-6, "fp32 vs unrecorded (as fp32)")


def test_a_reordered_reduction_is_same_and_a_halved_gradient_differs():
    base = [evidence(_train_row(LOSSES))]
    # pp's fp32 reassociation in the quickstart: 1 ulp-ish (1.3e-7 relative) at steps 3 and 4.
    reordered = [evidence(_train_row([x * (1 + 1.3e-7 * (k > 1)) for k, x in enumerate(LOSSES)]))]
    same = judge(base, reordered)
    assert same.verdict == "same" and same.basis == "fp32, 5 steps"
    assert same.deviation == pytest.approx(1.3e-7, rel=1e-3) and "step 3" in same.why
    # The same first step (same weights), then 0.4 % off at step 2: far outside 2 × 1.3e-6.
    defect = [evidence(_train_row([LOSSES[0], LOSSES[1] * 1.004, *LOSSES[2:]]))]
    differs = judge(base, defect)
    assert differs.verdict == "differs" and differs.deviation == pytest.approx(0.004, rel=1e-6)
    assert "at step 2, the nearest its budget of 2.6e-06" in differs.why
    # bf16 against fp32: the same 0.4 % is within bf16's 2 × 1.6e-2.
    bf16 = [evidence(_train_row([LOSSES[0], LOSSES[1] * 1.004, *LOSSES[2:]], precision="bf16"))]
    assert judge(base, bf16).verdict == "same" and judge(base, bf16).basis == "bf16 vs fp32, 5 steps"


def test_the_budget_grows_with_the_step():
    base = [evidence(_train_row(LOSSES))]
    at = lambda k, rel: [evidence(_train_row([x * (1 + rel * (i == k - 1)) for i, x in enumerate(LOSSES)]))]  # noqa: E731
    assert judge(base, at(5, 4.5 * 1.3e-6)).verdict == "same"  # step 5 allows 5 × 1.3e-6
    assert judge(base, at(1, 1.5 * 1.3e-6)).verdict == "differs"  # step 1 allows 1 ×
    nan = [evidence(_train_row([*LOSSES[:3], math.nan, math.nan]))]
    assert judge(base, nan).verdict == "differs" and "step 4 is nan" in judge(base, nan).why


def test_every_round_is_held_to_every_base_round():
    base = [evidence(_train_row(LOSSES)), evidence(_train_row(LOSSES))]
    one_bad = [evidence(_train_row(LOSSES)), evidence(_train_row([x * 1.01 for x in LOSSES]))]
    assert judge(base, one_bad).verdict == "differs"


def test_greedy_tokens_equal_or_where_they_part():
    row = {"workload": "inference", "precision": "fp32", "greedy_token_ids": [5, 7, 9, 11]}
    base = [evidence(row)]
    assert judge(base, [evidence(dict(row))]).verdict == "same"
    other = judge(base, [evidence({**row, "greedy_token_ids": [5, 7, 3, 2]})])
    assert other.verdict == "differs" and other.deviation == 0.5
    assert "first parts at step 3 (flat index 2)" in other.why
    bf16 = judge(base, [evidence({**row, "precision": "bf16", "greedy_token_ids": [5, 7, 3, 2]})])
    assert "near-tie" in bf16.why and bf16.basis == "4 greedy tokens (bf16 vs fp32)"
    # With the base's margins (top-1 minus top-2 logit per token): two sequences of 2 tokens. bf16
    # parts where fp32's margin is 0.02 at a top logit of 3: within 2 × 1.6e-2 × 3 = 0.096.
    scored = {**row, "batch_size": 2, "greedy_margins": [0.9, 0.02, 0.8, 0.7], "greedy_top_logits": [3.0] * 4}
    tie = judge([evidence(scored)], [evidence({**scored, "precision": "bf16", "greedy_token_ids": [5, 8, 9, 11]})])
    assert tie.verdict == "same" and "part only at near-ties (1 sequence(s))" in tie.why
    # The same parting in fp32 against fp32 is no near-tie (2 × 1.3e-6 × 3): a defect.
    fp32 = judge([evidence(scored)], [evidence({**scored, "greedy_token_ids": [5, 8, 9, 11]})])
    assert fp32.verdict == "differs" and "first parts at step 2" in fp32.why and "margin there is" in fp32.why
    # A parting where the margin was wide (0.8 at the second sequence's first token): differs.
    wide = judge([evidence(scored)], [evidence({**scored, "precision": "bf16", "greedy_token_ids": [5, 7, 4, 11]})])
    assert wide.verdict == "differs" and "first parts at step 1 (flat index 2)" in wide.why
    # Rows recorded before the ids were kept: their digest says equal or not, never where.
    old = {"workload": "inference", "precision": "fp32", "tokens_digest": "ab12"}
    assert judge([evidence(old)], [evidence(dict(old))]).verdict == "same"
    assert judge([evidence(old)], [evidence({**old, "tokens_digest": "ff00"})]).verdict == "differs"


def test_a_kernel_is_judged_by_its_own_check_against_the_reference():
    ok = {"workload": "kernels", "dtype": "bf16", "correct": True, "max_abs_error": 1e-3,
          "max_rel_error": 2e-3, "rtol": 1.6e-2, "atol": 1e-5}
    assert judge([evidence(ok)], [evidence(ok)]).verdict == "same"
    wrong = judge([evidence(ok)], [evidence({**ok, "correct": False, "max_abs_error": 0.3, "max_rel_error": 0.5})])
    assert wrong.verdict == "differs" and wrong.deviation == 0.5 and "rtol 0.016, atol 1e-05" in wrong.why


def test_rows_that_record_no_results_are_n_a_with_why():
    gemm = {"workload": "gemm", "time_s": 1e-3}
    na = judge([evidence(gemm)], [evidence(gemm)])
    assert na.verdict == "n/a" and "gemm rows record no results" in na.why
    mixed = judge([evidence(gemm)], [evidence(_train_row(LOSSES))])
    assert mixed.verdict == "n/a" and "record different things" in mixed.why


def test_a_faster_point_whose_numerics_differ_fails_the_gate_unless_accepted(tmp_path, capsys):
    base = _folder(tmp_path / "base", {"b": _train_row(LOSSES, step_s=0.10, seed=1)})
    fast_wrong = [LOSSES[0], *(x * 1.02 for x in LOSSES[1:])]
    new = _folder(tmp_path / "new", {"n": _train_row(fast_wrong, step_s=0.055, seed=2)})
    md = tmp_path / "c.md"
    code, out = _cli(capsys, base, new, "--markdown", md)
    assert code == 4, out
    assert "1 faster (Holm over 1 points); numerics: 1 differs → exit 4" in out
    assert "numerics (fp32, 5 steps): the loss trajectories part" in out
    text = md.read_text()
    assert "**1.82× faster**" in text and "**numerics differ** (fp32, 5 steps)" in text
    assert "the gate fails (exit 4) whatever the speed" in text and "Measured on:" in text
    code, out = _cli(capsys, base, new, "--accept-numerics", "--json", tmp_path / "c.json")
    assert code == 0 and "numerics: 1 differs (accepted) → exit 0" in out
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["numerics_differ"] == 1 and doc["points"][0]["numerics"] == "differs"


def test_the_pr_comment_says_how_much_faster_and_that_the_numerics_hold(tmp_path, capsys):
    # One sweep over precision, as a PR moving a model to bf16 would run it (compare DIR --by precision).
    bf16 = [x * (1 + 3e-3 * (k > 0)) for k, x in enumerate(LOSSES)]
    sweep = _folder(tmp_path / "sweep", {"fp32": _train_row(LOSSES, step_s=0.10, seed=1),
                                         "bf16": _train_row(bf16, step_s=0.055, seed=2, precision="bf16")},
                    params=("batch_size", "precision"))
    md = tmp_path / "c.md"
    code, out = _cli(capsys, sweep, "--by", "precision", "--base", "fp32", "--markdown", md)
    assert code == 0, out
    text = md.read_text()
    line = next(x for x in text.splitlines() if "× faster" in x)
    assert "**1.82× faster** (95 % CI" in line and "numerics within tolerance (bf16 vs fp32, 5 steps)" in line
    assert "Measured on: device" in text and "torch " in text


# --- Real training on 2 gloo ranks --------------------------------------------------------------

SEQ = {"model": "_user_models:sequential_with_grad_scaled_on_rank_1", "batch_size": 16, "steps": 5,
       "warmup_steps": 1, "world_size": 2}


@pytest.fixture(scope="module")
def layouts():
    """One launch of 2 gloo ranks: the healthy model under ddp, zero2 and zero3, and the defect."""
    from _training_targets import run_training_shared
    from perfkit.measuring.training.config import TrainConfig

    runs = {"ddp": ("ddp", 1.0), "zero2": ("zero2", 1.0), "zero3": ("zero3", 1.0), "defect": ("ddp", 0.5)}
    cfgs = [TrainConfig(**SEQ, parallelism=p, model_size={"grad_scale": s}) for p, s in runs.values()]
    rows = dict(zip(runs, run_training_shared(cfgs, 180.0 * len(cfgs))))
    for name, row in rows.items():
        assert row["status"] == "ok", (name, row["error"])
    return rows


@pytest.mark.slow
def test_parallel_layouts_are_same_and_a_halved_gradient_on_one_rank_differs(layouts, tmp_path, capsys):
    # The layouts as one sweep split by parallelism (perfkit compare DIR --by parallelism).
    sweep = _folder(tmp_path / "layouts", {n: layouts[n] for n in ("ddp", "zero2", "zero3")},
                    params=("batch_size", "parallelism"))
    code, out = _cli(capsys, sweep, "--by", "parallelism", "--base", "ddp")
    assert "numerics: 2 same →" in out and code != 4, out
    # The defect: the same parameters in two sweeps, as a PR that broke the gradient would be.
    base = _folder(tmp_path / "base", {"ddp": layouts["ddp"]}, params=("batch_size",))
    new = _folder(tmp_path / "new", {"defect": layouts["defect"]}, params=("batch_size",))
    code, out = _cli(capsys, base, new)
    assert code == 4 and "numerics: 1 differs → exit 4" in out, out
    # Its first step is the same (same weights, same batch); the second is not.
    assert layouts["defect"]["losses"][0] == pytest.approx(layouts["ddp"]["losses"][0], rel=1e-6)
    assert "the loss trajectories part at step 2 (" in out, out


def test_the_report_and_notebook_table_show_numerics_beside_each_verdict(tmp_path):
    from perfkit.analyse.compare import compare_by
    from perfkit.core.results import load
    from perfkit.view.compare_report import comparison_section
    from perfkit.view.plots.compare import comparison_table

    sweep = _folder(tmp_path / "sweep", {"ddp": _train_row(LOSSES, seed=1),
                                         "zero3": {**_train_row(LOSSES, seed=2), "parallelism": "zero3"},
                                         "bad": {**_train_row([LOSSES[0], *(x * 1.01 for x in LOSSES[1:])], seed=3),
                                                 "parallelism": "bad"}},
                    params=("batch_size", "parallelism"))
    c = compare_by(load(sweep), by="parallelism", base="ddp")
    table = comparison_table(c.points).set_index("point")
    assert list(table.columns[:2]) == ["verdict", "numerics"]
    cells = dict(zip(c.points["new"], table["numerics"]))
    assert cells["zero3"] == "same (fp32, 5 steps)"
    assert cells["bad"].startswith("differs (fp32, 5 steps): the loss trajectories part")
    html = "".join(p for p in comparison_section(c).items if isinstance(p, str))
    assert "same (fp32, 5 steps)" in html and "numerics: 1 same, 1 differs → exit 4" in html


@pytest.mark.slow
def test_real_bf16_inference_parts_from_fp32_only_at_near_ties():
    """perfkit's decoder in fp32 and bf16 on this CPU: where bf16's greedy tokens part from
    fp32's, fp32's own top-2 margin is within bf16's rounding there (the row's greedy_margins,
    from the untimed warm-up): numerics `same`, said so; a second fp32 run is `same` outright."""
    from perfkit.measuring.inference import generate as inference

    base = dict(batch_size=4, prompt_len=32, new_tokens=24, device="cpu", threads=1, timed_runs=1,
                model_size={"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256})
    rows = {p: inference.run_inference(inference.InferenceConfig(**base, precision=p)) for p in ("fp32", "bf16")}
    assert all(r["status"] == "ok" for r in rows.values()), {p: r["error"] for p, r in rows.items()}
    fp32 = rows["fp32"]
    assert len(fp32["greedy_margins"]) == len(fp32["greedy_top_logits"]) == 4 * 24
    assert min(fp32["greedy_margins"]) >= 0
    judged = judge([evidence(fp32)], [evidence(rows["bf16"])])
    assert judged.verdict == "same", judged
    assert judge([evidence(fp32)], [evidence(dict(fp32))]).why == "the 96 greedy token ids are equal"
