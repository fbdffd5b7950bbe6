"""The report's parallelism section: model state per rank per parallelism, measured beside the
memory model, throughput and memory against the batch, and the pipeline bubble when pp rows exist.
Rows are written as real Parquet files; tests/test_report.py opens these rows' report in a real
headless Chromium (its browser test adds :func:`parallel_train_rows`)."""

import pandas as pd
import pytest

from perfkit.analyse import pipeline_bubble as pb
from perfkit.core.env import fingerprint, flat_columns
from perfkit.core.results import write_rows
from perfkit.view.report_page import write_report
from perfkit.view.plots._common import Legend

MIB = 10**6  # display_scale is SI: the plot shows MB


def _row(parallelism, batch, *, param, grad, optim, predicted, **extra):
    return {"workload": "train_step", "status": "ok", "error": None, "model": "transformer",
            "precision": "fp32", "world_size": 2, "parallelism": parallelism, "batch_size": batch,
            "step_time_s": 0.01 * batch, "step_time_iqr_s": 0.0001, "samples_per_s": 100.0, "tokens_per_s": 1600.0, "noisy": False,
            "peak_mem_bytes": 400 * MIB, "peak_mem_kind": "cpu_max_rss", "param_bytes": param,
            "grad_bytes": grad, "optim_state_bytes": optim, "model_state_bytes_predicted": predicted,
            "mfu": 0.01, "mfu_convention": "6N", "config_id": f"{parallelism}-{batch}", **extra}


def parallel_train_rows(with_pp: bool) -> pd.DataFrame:
    rows = [_row(p, b, param=4 * MIB, grad=g * MIB, optim=o * MIB, predicted=(4 + g + o) * MIB)
            for p, g, o in (("ddp", 4, 8), ("zero1", 4, 4)) for b in (8, 32)]
    if with_pp:
        rows += [_row("pp", 16, param=2 * MIB, grad=2 * MIB, optim=4 * MIB, predicted=8 * MIB,
                      pp_schedule="1F1B", n_microbatches=m, stages_per_rank=1, bubble_fraction=b,
                      bubble_fraction_predicted=pb.predicted_bubble_fraction("1F1B", 2, m))
                 for m, b in ((2, 0.4), (8, 0.15))]
    rows.append({**_row("none", 8, param=4 * MIB, grad=4 * MIB, optim=8 * MIB, predicted=16 * MIB),
                 "world_size": 1})
    return pd.DataFrame(rows)


def test_model_state_bars_stack_what_each_rank_holds_beside_the_prediction():
    hv = pytest.importorskip("holoviews")
    from perfkit.view.plots.parallelism import model_state_per_rank, parallel_rows

    rows = parallel_train_rows(with_pp=True)
    assert set(parallel_rows(rows)["parallelism"]) == {"ddp", "zero1", "pp"}  # not 'none'
    overlay = model_state_per_rank(rows)
    bars = next(e for e in overlay if isinstance(e, hv.Bars))
    held = bars.data.pivot_table(index="series", columns="part", values="size")
    # One bar per parallelism (batch sizes collapse: model state does not depend on them), in MB.
    assert held.loc["zero1×2"].to_dict() == {"gradients": 4, "optimizer state": 4, "parameters": 4}
    assert held.loc["ddp×2", "optimizer state"] == 8 and held.loc["pp×2", "parameters"] == 2
    predicted = next(e for e in overlay if isinstance(e, hv.Scatter)).data.set_index("series")["predicted"]
    assert predicted.to_dict() == {"ddp×2": 16, "pp×2": 8, "zero1×2": 12}


def test_pipeline_rows_are_a_line_per_schedule_and_microbatch_count():
    hv = pytest.importorskip("holoviews")
    from perfkit.view.plots.parallelism import parallelism_section

    layout = parallelism_section(None, parallel_train_rows(with_pp=True))
    throughput = next(p for p in layout if "throughput" in p.opts.get().kwargs.get("title", "").lower())
    labels = sorted({Legend.shown(throughput, c) for c in throughput if isinstance(c, hv.Curve)})
    assert labels == ["fp32 ddp×2", "fp32 pp 1F1B m=2×2", "fp32 pp 1F1B m=8×2", "fp32 zero1×2"]


@pytest.mark.slow  # > 10 s here: make test runs it, test-fast does not
def test_the_report_has_the_parallelism_section_and_the_bubble_only_with_pipeline_rows(tmp_path):
    env = flat_columns(fingerprint("cpu"))
    for with_pp in (False, True):
        out = tmp_path / str(with_pp)
        write_rows(parallel_train_rows(with_pp).assign(**env), out / "results" / "rows.parquet")
        html = write_report(out, out / "report.html").read_text()
        assert "Parallelism: memory per rank, throughput, pipeline bubble" in html
        assert "Model state per rank" in html
        assert ("Pipeline bubble" in html) is with_pp


def test_every_legend_of_the_section_hides_its_series_on_click_so_the_layout_syncs_them():
    # The model-state bars kept bokeh's default 'mute' beside the others' 'hide': holoviews then
    # warned "Click policy of legends are not the same" in every `make demo` and synced none.
    import warnings

    hv = pytest.importorskip("holoviews")
    from perfkit.view.plots.parallelism import parallelism_section

    hv.extension("bokeh")
    layout = parallelism_section(None, parallel_train_rows(with_pp=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure = hv.render(layout, backend="bokeh")
    assert not [w for w in caught if "Click policy" in str(w.message)]
    figures = [k[0] if isinstance(k, tuple) else k for k in figure.children]
    assert {leg.click_policy for f in figures for leg in getattr(f, "legend", [])} == {"hide"}
