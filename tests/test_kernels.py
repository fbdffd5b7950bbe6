"""A user's kernels against the reference (issue 58): real torch ops, the worked example in
templates/my_kernels.py (RMSNorm in torch ops, and a deliberately wrong variant), torch.compile."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfkit.analyse import kernels
from perfkit.core.errors import BadInputError
from perfkit.measuring.ops.user_kernels import measure_kernels

TEMPLATES = str(Path(__file__).resolve().parents[1] / "templates")
IMPLS = {"eager": "torch.nn.functional:rms_norm", "mine": "my_kernels:rms_norm", "wrong": "my_kernels:rms_norm_wrong"}
COMMON = dict(reference="eager", make_inputs="my_kernels:rms_norm_inputs", model_path=TEMPLATES, min_run_time_s=0.02)


def _frame(rows):
    return pd.DataFrame(rows)


def test_the_wrong_variant_is_incorrect_in_every_dtype_and_never_in_fast_p():
    rows = _frame(measure_kernels(IMPLS, shapes=[{"rows": 64, "hidden": 256}, {"rows": 32, "hidden": 512}],
                                  dtypes=["fp32", "bf16"], **COMMON))
    assert (rows["status"] == "ok").all() and len(rows) == 12
    assert rows["time_samples_s"].map(len).min() >= 10  # enough for a CI, and for perfkit compare's 5 a side
    by = {(r.impl, r.dtype, r.dim_hidden): r for r in rows.itertuples()}
    for dtype in ("fp32", "bf16"):
        for hidden in (256, 512):
            assert by[("mine", dtype, hidden)].correct and by[("eager", dtype, hidden)].max_abs_error == 0
            wrong = by[("wrong", dtype, hidden)]
            assert not wrong.correct and wrong.max_abs_error > 0.5 and wrong.worst_index.startswith("(")
            assert (wrong.rtol, wrong.atol) == {"fp32": (1.3e-6, 1e-5), "bf16": (1.6e-2, 1e-5)}[dtype]
    table = kernels.speedups(rows)
    assert set(table[table["impl"] == "wrong"]["verdict"]) == {"incorrect"}
    fast = kernels.fast_p(table).set_index("impl")
    assert fast.loc["wrong", ["fast_0", "fast_1", "fast_1.5", "fast_2"]].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert fast.loc["mine", "fast_0"] == 1.0 and fast.loc["mine", "points"] == 4
    # the work: counted from the reference at dispatch where the user gives none
    assert (rows["flop"] > 0).all() and (rows["bytes"] > 0).all() and rows["flop_per_s"].notna().all()
    assert set(rows["work_source"]) == {"the reference's, counted at dispatch (forward)"}


def test_an_impl_that_raises_or_returns_the_wrong_shape_fails_its_points_and_the_rest_go_on(tmp_path, monkeypatch):
    (tmp_path / "broken_kernels.py").write_text(
        "import torch\n"
        "def raises(x, shape, weight=None, eps=1e-6):\n    raise RuntimeError('CUDA error: an illegal memory access')\n"
        "def transposed(x, shape, weight=None, eps=1e-6):\n    return torch.nn.functional.rms_norm(x, shape, weight, eps).t()\n"
        "def flops(shape, dtype):\n    return 7\n"
        "def nbytes(shape, dtype):\n    return 11\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    impls = {**IMPLS, "raises": "broken_kernels:raises", "transposed": "broken_kernels:transposed"}
    rows = _frame(measure_kernels(impls, shapes=[{"rows": 8, "hidden": 16}], dtypes=["fp32"], flops="broken_kernels:flops",
                                  bytes_fn="broken_kernels:nbytes", **COMMON))
    status = dict(zip(rows["impl"], rows["status"]))
    assert status == {"eager": "ok", "mine": "ok", "wrong": "ok", "raises": "failed", "transposed": "failed"}
    reasons = dict(zip(rows["impl"], rows["reason"]))
    assert "illegal memory access" in reasons["raises"] and "shape (16, 8)" in reasons["transposed"]
    ok = rows[rows["status"] == "ok"]
    assert (ok["flop"] == 7).all() and (ok["bytes"] == 11).all() and set(ok["work_source"]) == {"the user's flops/bytes"}
    assert kernels.fast_p(kernels.speedups(rows)).set_index("impl").loc["raises", "failed"] == 1


@pytest.mark.parametrize("impls, reference, message", [
    ({"eager": "torch.nn.functional:rms_norm", "x": "no_such_module:f"}, "eager", "module 'no_such_module' does not import"),
    ({"eager": "torch.nn.functional:no_such_fn"}, "eager", "has no function 'no_such_fn'"),
    ({"eager": "torch.nn.functional:rms_norm", "c": "compile:nothing"}, "eager", "'nothing' is not an impl to compile"),
    ({"eager": "torch.nn.functional:rms_norm"}, "truth", "reference 'truth' is not one of impls"),
    ({"eager": "torch.nn.functional"}, "eager", "write it as 'package.module:function'"),
])
def test_bad_entry_points_are_one_line_before_any_work(impls, reference, message):
    with pytest.raises(BadInputError, match=message):
        measure_kernels(impls, reference=reference, make_inputs="my_kernels:rms_norm_inputs", shapes=[{"rows": 4, "hidden": 4}],
                        dtypes=["fp32"], model_path=TEMPLATES)


def test_backward_checks_the_input_gradients_too():
    rows = _frame(measure_kernels(IMPLS, shapes=[{"rows": 16, "hidden": 64}], dtypes=["fp32"], backward=True, **COMMON))
    by = dict(zip(rows["impl"], rows["correct"]))
    assert rows["backward"].all() and by == {"eager": True, "mine": True, "wrong": False}
    # the worst element names which tensor first: 0 the output, 1 x's gradient, 2 the weight's
    import ast

    where = ast.literal_eval(rows.set_index("impl").loc["wrong", "worst_index"])
    assert where[0] in (0, 1, 2) and len(where) == (3 if where[0] < 2 else 2)


@pytest.mark.slow
def test_a_compiled_impl_is_checked_and_timed_like_the_others():
    rows = _frame(measure_kernels({"eager": "torch.nn.functional:rms_norm", "mine": "my_kernels:rms_norm",
                                   "compiled": "compile:mine"}, shapes=[{"rows": 32, "hidden": 128}], dtypes=["fp32"], **COMMON))
    assert (rows["status"] == "ok").all() and rows["correct"].all()


def _row(impl, samples, correct=True, reference="ref"):
    samples = np.asarray(samples, dtype=float)
    return {"impl": impl, "dtype": "fp32", "shape": {"n": 1}, "reference": reference, "status": "ok", "correct": correct,
            "time_s": float(np.median(samples)), "time_samples_s": list(samples), "flop_per_s": math.nan,
            "bytes_per_s": math.nan}


def test_a_faster_impl_needs_its_whole_interval_past_one_and_an_incorrect_one_is_never_faster():
    rng = np.random.default_rng(0)
    ref = rng.normal(1.0, 0.01, 40)
    rows = pd.DataFrame([_row("ref", ref), _row("fast", ref / 2), _row("same", rng.normal(1.0, 0.01, 40)),
                         _row("slow", ref * 3), _row("cheat", ref / 10, correct=False)])
    table = kernels.speedups(rows).set_index("impl")
    assert table.loc["fast", "verdict"] == "faster" and table.loc["fast", "speedup"] == pytest.approx(2.0, rel=0.01)
    assert table.loc["fast", "speedup_ci_low"] > 1 and table.loc["slow", "verdict"] == "slower"
    assert table.loc["same", "verdict"] == "same" and table.loc["cheat", "verdict"] == "incorrect"
    fast = kernels.fast_p(table.reset_index()).set_index("impl")
    assert fast.loc["fast", "fast_1.5"] == 1.0 and fast.loc["fast", "fast_2"] == 0.0  # 2.0 is not > 2
    assert fast.loc["cheat", "fast_1"] == 0.0


@pytest.mark.slow
def test_the_report_has_a_kernels_section_with_the_notebook_s_views_and_renders(tmp_path):
    """The report's Kernels section (issue 58): what ran, fast_p, the speedup table, perf_report and
    the roofline under the roofs recorded beside the rows; a failed point listed with its reason;
    no browser error."""
    from jupyterlab_driver import report_page

    from perfkit.core.results import RunContext, record
    from perfkit.view.report_page import write_report

    impls = {**IMPLS, "raises": "torch.nn.functional:softmax"}  # softmax(x, shape, ...) raises: a failed point
    rows = measure_kernels(impls, shapes=[{"rows": 64, "hidden": 256}, {"rows": 64, "hidden": 1024}],
                           dtypes=["fp32"], flops="my_kernels:rms_norm_flops", bytes_fn="my_kernels:rms_norm_bytes",
                           **COMMON)
    ctx = RunContext(results_path=tmp_path / "k" / "results" / "k.parquet", config_id="k", params={},
                     param_names=(), notebook="kernels.ipynb")
    record(rows, context=ctx)
    roofs = [{"workload": "ceiling", "kind": "compute", "dtype": "fp32", "level": None, "value": 3e11,
              "unit": "FLOP/s", "origin": "theoretical", "source": "test"},
             {"workload": "ceiling", "kind": "memory", "dtype": None, "level": "DRAM", "value": 2e10,
              "unit": "bytes/s", "origin": "measured", "source": "test"}]
    record(roofs, context=ctx)
    report = tmp_path / "report.html"
    write_report(tmp_path / "k", report)
    text = html.unescape(report.read_text()).replace('\\"', '"')
    assert "Kernels: yours against the reference, correct first" in text
    assert "Incorrect: 2 point(s) outside tolerance" in text  # the wrong variant at both shapes
    assert "<h3>fast_p</h3>" in text and "rows=64, hidden=1024" in text
    assert "<h3>Failed points</h3>" in text and "raises" in text
    assert "Kernels on the roofline" in text and "Achieved GB/s against hidden" in text
    with report_page(report) as opened:
        opened.page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    assert not opened.errors, opened.errors
