"""The data-loading benchmark with real DataLoader worker processes and real files: input-bound
detection, the worker recommendation, DS-Analyzer's stall split, pinning on CPU, teardown of
workers, bad inputs; the pure analyses on hand-made rows; the plots, notebook and template."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import DROPPING_FILESYSTEMS, NOTEBOOKS, REPO, filesystem_type
from perfkit.analyse import dataloading as analysis
from perfkit.core.errors import BadInputError
from perfkit.measuring.data import loading as dataloading
from perfkit.measuring.data.loading import LoaderConfig, run_loader_benchmark

NOTEBOOK = NOTEBOOKS / "dataloader.ipynb"
SPEC = REPO / "templates" / "dataloader.yaml"


def _children() -> set[int]:
    """Live child processes of this process (from /proc, independent of torch's bookkeeping)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry.name))
    return out


# Loading costs 24 ms per sample of storage latency (a sleep: no CPU), batch 2, a 32 ms step (a
# sleep too): one worker makes a batch in 48 ms, far too slow for the step (67 % of two workers'
# throughput, under the 95 % the recommendation asks); two make one every 24 ms, 25 % headroom.
# Ideal shares: 0.6, 0.33 and 0. Few long sleeps rather than many short ones: on cores shared with
# other jobs each wake-up may start a scheduler slice late, and that lateness, not the sleep, is
# the error. (5 ms x 4 samples for a 16 ms step let two workers wait 28 % of each step in a CI run
# beside the suite's three workers; 2 x 20 ms halves the wake-ups per batch and doubles the slack.
# At 20 ms one worker reached 80 % of two in theory, and once, its run quieter than the two
# workers' run a few seconds later, the 95 % the recommendation asks: 24 ms leaves it 67 %.)
# Two workers still wait a little on a loaded machine, the batch's hand-over needing that worker
# scheduled, so the verdict is taken at a 25 % threshold here; the 5 % default is checked on its
# own below. (The CPU decode of 4 ms at the 2-core edge, where two workers exactly match
# the step, is an acceptance run reported with the machine's load.)
_SWEEP = dict(format="files", n_samples=128, fetch_delay_s=0.024, batch_size=2, step_compute_s=0.032,
              steps=26, warmup_steps=4, loader_batches=8, device="cpu", input_bound_threshold=0.25)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    cache = tmp_path_factory.mktemp("datasets")
    before = _children()
    rows = [run_loader_benchmark(LoaderConfig(**_SWEEP, num_workers=w, cache_dir=str(cache),
                                              persistent_workers=w > 0))
            for w in (0, 1, 2)]
    return pd.DataFrame(rows), before


@pytest.mark.slow
def test_zero_workers_is_input_bound_two_workers_is_not_and_the_recommendation_names_two(sweep):
    df, _ = sweep
    assert (df["status"] == "ok").all(), df["error"].tolist()
    by = df.set_index("num_workers")
    assert by.loc[0, "bound"] == "input-bound" and by.loc[2, "bound"] == "compute-bound", \
        by[["data_wait_share", "bound"]]
    # Ideal 80 ms vs 32 ms per step (2.5x); 1.5x leaves room for a loaded machine.
    assert by.loc[2, "step_samples_per_s"] >= 1.5 * by.loc[0, "step_samples_per_s"]
    rec = analysis.recommend(df)
    assert len(rec) == 1 and rec.loc[0, "recommended_num_workers"] == 2, \
        by[["step_samples_per_s", "data_wait_share", "bound"]]
    # The share is the per-step wait over the per-step wall time, its samples kept.
    for _, row in df.iterrows():
        shares = analysis.wait_shares(row["data_wait_samples_s"], row["step_time_samples_s"])
        assert row["data_wait_share_samples"] == pytest.approx(shares)
        assert len(shares) == _SWEEP["steps"] - _SWEEP["warmup_steps"]
        assert row["samples_per_s"] > 0 and row["bytes_per_s"] == pytest.approx(row["samples_per_s"] * 3072)
        assert 0 < row["time_to_first_batch_s"] < 60
    assert df["dataset_generated"].tolist() == [True, False, False]  # made once, then reused
    import multiprocessing  # the platform default, as the workers really started
    assert df["start_method"].isna()[0]  # no worker process with 0 workers
    assert df["start_method"].tolist()[1:] == [multiprocessing.get_start_method()] * 2


@pytest.mark.slow
def test_every_worker_process_ends_with_its_configuration_even_when_a_step_fails(sweep, monkeypatch, tmp_path):
    df, before = sweep
    assert (df["workers_left_alive"] == 0).all()
    assert _children() <= before  # persistent workers of all three runs: gone
    calls = []

    def failing_step(cfg, device, non_blocking):
        def step(batch):
            calls.append(_children() - before)
            if len(calls) == 3:
                raise RuntimeError("the step failed")
        return step, None

    monkeypatch.setattr(dataloading, "_make_step", failing_step)
    row = run_loader_benchmark(LoaderConfig(**{**_SWEEP, "loader_batches": 0}, num_workers=2,
                                            persistent_workers=True, cache_dir=str(tmp_path)))
    # The failure is the configuration's row (as every ending is), with the step's error.
    assert row["status"] == "failed" and "RuntimeError: the step failed" in row["error"]
    assert len(calls[-1]) == 2  # the two workers were running when the step failed
    assert not (_children() - before)  # yet the persistent workers are gone


@pytest.mark.slow
def test_stall_attribution_puts_a_fetch_delay_and_a_decode_cost_each_in_its_own_bucket(tmp_path):
    # 0 workers: fetch, decode and step run one after another, so each injected cost is all stall.
    # mmap, page cache kept: the real read is microseconds beside 2 x 30 ms injected per batch.
    # Few long costs rather than many short ones: each sleep or spin may end a scheduler slice
    # late on loaded cores, and that lateness, not the cost, is the error (4 x 6 ms read 1.86x
    # the injected cost in a CI run; 2 x 30 ms reads <= 1.22x beside six busy processes).
    base = dict(format="mmap", n_samples=64, batch_size=2, step_compute_s=0.004, steps=12, warmup_steps=2,
                loader_batches=0, stall_attribution=True, decode_clock="wall", device="cpu",
                cache_dir=str(tmp_path))
    injected = 2 * 0.03
    fetch = run_loader_benchmark(LoaderConfig(**base, fetch_delay_s=0.03))
    prep = run_loader_benchmark(LoaderConfig(**base, decode_cost_s=0.03))
    for row, own, other in ((fetch, "fetch_stall_s", "prep_stall_s"), (prep, "prep_stall_s", "fetch_stall_s")):
        # Neither a sleep nor the wall-clock decode ends early; late, each of the two per batch
        # may be on loaded cores (a woken process waits for one), and the three phases run one
        # after another while neighbours come and go (at load 5.5 the other bucket read -30 %):
        # loose bounds, and each cost clearly in its own bucket rather than the other.
        assert 0.75 * injected <= row[own] <= 1.6 * injected, row
        assert abs(row[other]) < 0.4 * injected and row[own] > 2 * abs(row[other]), row
        assert len(row["cached_step_time_samples_s"]) == len(row["ceiling_step_time_samples_s"]) == 10


@pytest.mark.parametrize("fmt", ["parquet", "lmdb", "files", "mmap", "tfrecord"])
def test_every_format_loads_in_the_main_process_then_in_forked_workers(tmp_path, fmt):
    # The main process reads first (0 workers), then forks workers: an LMDB environment or a
    # mapping left open across the fork must not break them.
    cfg = dict(format=fmt, n_samples=24, rows_per_group=5, steps=3, warmup_steps=1, loader_batches=2,
               device="cpu", cache_dir=str(tmp_path))
    for workers in (0, 2):
        row = run_loader_benchmark(LoaderConfig(**cfg, num_workers=workers))
        assert row["status"] == "ok" and row["workers_left_alive"] == 0 and row["bytes_per_s"] > 0


@pytest.mark.parametrize("cache_on", ["disk", "tmpfs"], indirect=True)
def test_page_cache_evicted_is_what_the_kernel_did_not_what_was_asked(cache_on):
    fs = filesystem_type(cache_on)
    if fs != "tmpfs" and fs not in DROPPING_FILESYSTEMS:
        pytest.skip(f"dataset cache on {fs}: whether it drops clean pages on request is not known here")
    cfg = dict(format="mmap", n_samples=64, sample_bytes=4096, steps=3, warmup_steps=1, loader_batches=2,
               device="cpu", cache_dir=str(cache_on))
    # Not asked first, on the dataset just written and fsynced (all of it in the page cache).
    warm = run_loader_benchmark(LoaderConfig(**cfg))
    row = run_loader_benchmark(LoaderConfig(**cfg, evict_page_cache=True))
    assert warm["status"] == row["status"] == "ok", (warm["error"], row["error"])
    assert warm["page_cache_evicted"] is None
    # Asked on tmpfs, nothing could be dropped (no backing store): the row says so.
    assert row["page_cache_evicted"] is (fs != "tmpfs")
    assert warm["page_cache_resident_fraction"] == 1.0
    assert math.isnan(warm["page_cache_resident_fraction_before_eviction"])
    assert row["page_cache_resident_fraction_before_eviction"] == 1.0
    if fs == "tmpfs":
        assert row["page_cache_resident_fraction"] == 1.0
    else:
        assert row["page_cache_resident_fraction"] <= 0.01
    assert row["page_cache_residency_note"] is None
    # coreutils names ext2, ext3 and ext4 alike
    assert row["dataset_filesystem"] in (("ext2", "ext3", "ext4") if fs == "ext2/ext3" else (fs,))


def test_pinning_on_cpu_is_reported_not_applicable_and_a_missing_gpu_skips(tmp_path):
    cfg = dict(n_samples=16, steps=3, warmup_steps=1, loader_batches=2, cache_dir=str(tmp_path))
    row = run_loader_benchmark(LoaderConfig(**cfg, device="cpu", pin_memory=True))
    assert row["status"] == "ok" and row["pin_memory"] is True
    assert row["pin_memory_applied"] is False and row["non_blocking"] is False
    assert "not applicable on cpu" in row["pin_memory_note"]
    assert run_loader_benchmark(LoaderConfig(**cfg, device="cpu"))["pin_memory_note"] is None
    if not torch.cuda.is_available():
        skipped = run_loader_benchmark(LoaderConfig(**cfg, device="cuda"))
        assert skipped["status"] == "skipped" and "no CUDA/ROCm device" in skipped["error"]


@pytest.mark.slow
def test_spawned_workers_read_lmdb_and_train_a_workload(tmp_path):
    # One phase (loader_batches=0): each spawned worker imports torch afresh, seconds on 2 cores.
    row = run_loader_benchmark(LoaderConfig(format="lmdb", n_samples=32, num_workers=1, multiprocessing_context="spawn",
                                            model="mlp", steps=4, warmup_steps=1, loader_batches=0,
                                            device="cpu", cache_dir=str(tmp_path)))
    assert row["status"] == "ok" and row["start_method"] == "spawn" and row["workers_left_alive"] == 0
    assert math.isfinite(row["step_time_s"]) and row["bound"] in ("input-bound", "compute-bound")


@pytest.mark.parametrize("params,message", [
    ({"num_workers": [-1]}, "num_workers must be an integer >= 0"),
    ({"num_workers": [0, 2], "prefetch_factor": 4}, "prefetch_factor needs num_workers > 0"),
    ({"persistent_workers": True, "num_workers": 0}, "persistent_workers needs num_workers > 0"),
    ({"format": "recordio"}, "unknown format 'recordio'; use one of parquet, lmdb, files, mmap, tfrecord, webdataset"),
    ({"model": "transformer"}, "model must be one of 'mlp', 'convnet'"),
    ({"warmup_steps": 12, "steps": 12}, "warmup_steps"),
    ({"nonsense": 1}, "unknown data-loading parameters"),
])
def test_bad_inputs_are_refused_before_any_data_is_generated(tmp_path, params, message):
    from perfkit.run.notebooks import read_notebook

    defaults = {name: p.default for name, p in read_notebook(NOTEBOOK).parameters.items()}
    cache = tmp_path / "cache"
    with pytest.raises(BadInputError, match=message):
        dataloading.check_params({**defaults, "cache_dir": str(cache), **params})
    if "nonsense" not in params:
        with pytest.raises(BadInputError, match=message):
            for cfg in dataloading.configs_from_params({**defaults, "cache_dir": str(cache), **params}):
                run_loader_benchmark(cfg)
    assert not cache.exists()


def test_the_notebook_names_its_check_and_its_defaults_pass_it():
    nb = json.loads(NOTEBOOK.read_text())
    module, _, name = nb["metadata"]["perfkit"]["check"].partition(":")
    assert (module, name) == ("perfkit.measuring.data.loading", "check_params")
    from perfkit.run.notebooks import read_notebook

    defaults = {n: p.default for n, p in read_notebook(NOTEBOOK).parameters.items()}
    dataloading.check_params(defaults)
    assert [(c.num_workers, c.pin_memory) for c in dataloading.configs_from_params(defaults)] == \
        [(w, p) for w in defaults["num_workers"] for p in defaults["pin_memory"]]


def test_the_template_expands_against_the_notebook():
    from perfkit.run.sweep import expand, load_spec

    configs = expand(load_spec(SPEC))
    assert len(configs) == len({c.config_id for c in configs}) >= 8
    for c in configs:
        dataloading.check_params(c.params)


# ---- the pure analyses, on hand-made rows --------------------------------------------------------


def _row(workers, pin, rate, **extra):
    return {"status": "ok", "format": "files", "num_workers": workers, "pin_memory": pin,
            "step_samples_per_s": rate, **extra}


def test_recommend_takes_the_fewest_workers_within_95_percent_then_no_pinning():
    rows = pd.DataFrame([_row(0, False, 100.0), _row(2, True, 196.0), _row(2, False, 191.0),
                         _row(4, False, 200.0), _row(1, False, 150.0),
                         _row(8, False, 400.0, status="failed"),  # not ok: not compared
                         _row(0, False, 50.0, format="lmdb"), _row(1, False, 60.0, format="lmdb")])
    rec = analysis.recommend(rows).set_index("format")
    # files: best 200; 191 and 196 reach 190; two workers unpinned is the cheapest of those.
    assert rec.loc["files", "recommended_num_workers"] == 2
    assert not rec.loc["files", "recommended_pin_memory"]
    assert rec.loc["files", "fraction_of_best"] == pytest.approx(191 / 200)
    assert rec.loc["files", "rows_compared"] == 5
    assert rec.loc["lmdb", "recommended_num_workers"] == 1  # 50 < 0.95 x 60
    # 0.7 x 200 = 140: one worker (150) is enough; 0.5: none (100).
    assert analysis.recommend(rows, fraction=0.5).set_index("format").loc["files", "recommended_num_workers"] == 0
    assert analysis.recommend(rows, fraction=0.9).set_index("format").loc["files", "recommended_num_workers"] == 2
    assert analysis.recommend(rows, fraction=0.7).set_index("format").loc["files", "recommended_num_workers"] == 1


def test_recommend_prefers_a_setting_whose_step_does_not_wait():
    # One worker reaches 97 % of two workers' throughput but leaves the step waiting (no slack):
    # two, which do not, are recommended; with no compute-bound row, the cheapest within 95 %.
    rows = pd.DataFrame([_row(0, False, 230.0, bound="input-bound"), _row(1, False, 439.0, bound="input-bound"),
                         _row(2, False, 450.0, bound="compute-bound")])
    rec = analysis.recommend(rows).iloc[0]
    assert (rec["recommended_num_workers"], rec["recommended_bound"]) == (2, "compute-bound")
    waiting = rows.assign(bound="input-bound")
    assert analysis.recommend(waiting).iloc[0]["recommended_num_workers"] == 1


def test_recommend_never_compares_rows_of_two_storage_conditions():
    # A warm page cache needs no workers; the same dataset evicted first (cold) needs two; on a
    # slow network mount, four. Mixed into one group, the best (101) makes 0 workers "enough"
    # for all three, since the warm rows' 100 reaches 95 % of it.
    warm = dict(evict_page_cache=False, page_cache_evicted=None, cache_dir="/local")
    cold = dict(evict_page_cache=True, page_cache_evicted=True, cache_dir="/local")
    remote = dict(evict_page_cache=False, page_cache_evicted=None, cache_dir="/mnt/nfs")
    rows = pd.DataFrame([_row(0, False, 100.0, **warm), _row(1, False, 101.0, **warm),
                         _row(0, False, 40.0, **cold), _row(1, False, 70.0, **cold),
                         _row(2, False, 98.0, **cold),
                         _row(0, False, 20.0, **remote), _row(2, False, 50.0, **remote),
                         _row(4, False, 97.0, **remote)])
    rec = analysis.recommend(rows)
    assert sorted(rec["recommended_num_workers"]) == [0, 2, 4]
    chosen = {(r.cache_dir, r.evict_page_cache): r.recommended_num_workers for r in rec.itertuples()}
    assert chosen == {("/local", False): 0, ("/local", True): 2, ("/mnt/nfs", False): 4}
    assert sorted(rec["rows_compared"]) == [2, 3, 3]
    # Asked to evict on both, dropped on one only (a tmpfs keeps its pages): still two conditions.
    kept = dict(cold, page_cache_evicted=False)
    asked = pd.DataFrame([_row(0, False, 100.0, **kept), _row(0, False, 40.0, **cold),
                          _row(2, False, 98.0, **cold)])
    assert sorted(analysis.recommend(asked)["recommended_num_workers"]) == [0, 2]


def test_bound_is_input_bound_strictly_above_the_threshold():
    assert analysis.INPUT_BOUND_SHARE == 0.05
    assert analysis.bound(0.051) == "input-bound" and analysis.bound(0.05) == "compute-bound"
    assert analysis.bound(float("nan")) is None
    df = pd.DataFrame({"data_wait_share": [0.2, 0.02], "input_bound_threshold": [0.3, 0.01]})
    assert analysis.classify(df).tolist() == ["compute-bound", "input-bound"]
    assert analysis.classify(df, threshold=0.05).tolist() == ["input-bound", "compute-bound"]


def test_stall_arithmetic_is_ds_analyzer_differences():
    split = analysis.stall_attribution(ceiling_s=0.010, cached_s=0.025, cold_s=0.040)
    assert split["prep_stall_s"] == pytest.approx(0.015) and split["fetch_stall_s"] == pytest.approx(0.015)
    assert split["fetch_stall_share"] == pytest.approx(0.015 / 0.040)
    parts = analysis.breakdown(pd.DataFrame({"data_wait_samples_s": [[0.01, 0.03]],
                                             "step_time_samples_s": [[0.02, 0.06]]}))
    assert parts.iloc[0].to_dict() == pytest.approx({"mean_data_wait_s": 0.02, "mean_compute_s": 0.02,
                                                     "mean_step_time_s": 0.04})


@pytest.mark.slow
def test_the_plots_and_the_report_section_render_from_measured_rows(sweep):
    from perfkit.view.plots import hv_bokeh
    from perfkit.view.plots.dataloading import dataloading_section, stall_bars, throughput_vs_workers

    df, _ = sweep
    hv = hv_bokeh()
    layout = dataloading_section(df, df)
    assert isinstance(layout, hv.Layout) and len(layout) == 3  # table, throughput, breakdown (no stall)
    hv.render(layout, backend="bokeh")
    assert isinstance(throughput_vs_workers(df, "samples_per_s"), hv.Overlay)
    assert isinstance(stall_bars(df), hv.Div)  # no stall attribution measured: says so


def test_every_ending_is_a_row_and_stops_the_notebook_the_way_it_ended(monkeypatch, tmp_path):
    from perfkit.core.errors import ConfigurationSkipped, ExecutionFailed
    from perfkit.core.status import OutOfMemoryError

    def out_of_memory(cfg, device):
        raise MemoryError("cannot allocate the prefetch buffers")

    monkeypatch.setattr(dataloading, "_benchmark", out_of_memory)
    row = run_loader_benchmark(LoaderConfig(format="mmap", n_samples=16, cache_dir=str(tmp_path)))
    assert row["status"] == "oom" and "MemoryError" in row["error"] and row["workload"] == "dataloader"
    skipped = {"status": "skipped", "error": "no GPU", "workload": "dataloader"}
    with pytest.raises(OutOfMemoryError):  # the runner classifies the configuration oom
        dataloading.raise_for_status([skipped, row])
    with pytest.raises(ConfigurationSkipped, match="no GPU"):
        dataloading.raise_for_status([skipped, skipped])
    with pytest.raises(ExecutionFailed) as failed:
        dataloading.raise_for_status([{"status": "failed", "error": "boom", "workload": "dataloader"}])
    assert failed.value.status == "failed"
    dataloading.raise_for_status([skipped, {"status": "ok"}])  # one ok row: the notebook goes on


def test_a_pinned_configuration_is_labelled_pinned_once():
    from perfkit.view.plots.dataloading import _label, _series

    rows = pd.DataFrame({"format": ["files", "files"], "pin_memory_applied": [True, False],
                         "num_workers": [2, 2]})
    rows["series"] = _series(rows)
    assert [_label(r) for _, r in rows.iterrows()] == ["files pinned w2", "files w2"]


@pytest.mark.slow
def test_advise_finds_zero_workers_input_bound_and_names_the_measured_worker_count(sweep, tmp_path):
    # Issue 29: each worker count as its own configuration of one folder, as a sweep records them.
    from _advice import advise_json, evidence_is_in_rows, record_as

    df, _ = sweep
    folder = tmp_path / "loader"
    for _, row in df.iterrows():
        record_as([row.to_dict()], folder, notebook="dataloader.ipynb", config_id=f"dataloader-w{row['num_workers']}",
                  params={"num_workers": int(row["num_workers"]), **{k: v for k, v in _SWEEP.items() if k != "device"}})
    findings = advise_json(folder)
    f = next(x for x in findings if x["config_ids"] == ["dataloader-w0"] and x["rank"] == 1)
    assert f["rule"] == "input_bound" and f["evidence"]["num_workers"] == 0, f
    cores = f["evidence"].get("cpu_cores", 2)
    assert f["experiment"]["parameter"] == "num_workers" and f["experiment"]["proposed"] == min(2, cores)
    assert "measured num_workers=2 as the cheapest" in f["advice"]
    evidence_is_in_rows(f, folder)
    w2 = [x for x in findings if x["config_ids"] == ["dataloader-w2"] and x["rule"] == "input_bound"]
    assert not w2 or w2[0]["cost_share"] < f["cost_share"] / 2


def test_the_sharing_strategy_is_set_in_the_workers_that_hand_batches_over(tmp_path, monkeypatch):
    from perfkit.measuring.data import datasets as ds

    seen = tmp_path / "seen"
    seen.mkdir()
    decode = ds.decode

    def noting_decode(*args, **kwargs):  # runs in the (forked) workers
        import torch.multiprocessing as mp

        (seen / f"{os.getpid()}-{mp.get_sharing_strategy()}").touch()
        return decode(*args, **kwargs)

    monkeypatch.setattr(ds, "decode", noting_decode)
    cfg = dict(format="mmap", n_samples=32, batch_size=4, steps=4, warmup_steps=1, loader_batches=0,
               step_compute_s=0.001, device="cpu", cache_dir=str(tmp_path / "cache"), num_workers=2)
    row = run_loader_benchmark(LoaderConfig(**cfg, sharing_strategy="file_system"))
    assert row["status"] == "ok" and row["sharing_strategy_effective"] == "file_system", row["error"]
    strategies = {p.name.split("-", 1)[1] for p in seen.iterdir() if int(p.name.split("-")[0]) != os.getpid()}
    assert strategies == {"file_system"}
    import torch.multiprocessing as mp
    assert mp.get_sharing_strategy() == "file_descriptor"  # this process's own setting is left alone
    with pytest.raises(BadInputError, match="sharing_strategy needs num_workers > 0"):
        LoaderConfig(sharing_strategy="file_system")
    with pytest.raises(BadInputError, match="sharing_strategy must be one of"):
        LoaderConfig(sharing_strategy="carrier_pigeon", num_workers=2)


def test_workers_0_and_2_draw_one_line_whatever_torch_sets_for_worker_only_settings():
    """Issue 55: 0 and 2 workers landed in two series (prefetch_factor_effective is None without
    workers, 2 with them), so the chart drew no line; the workers axis is ticked at whole workers."""
    import pandas as pd
    from bokeh.models import FixedTicker

    from perfkit.view.plots._common import hv_bokeh
    from perfkit.view.plots.dataloading import _series, throughput_vs_workers

    rows = pd.DataFrame({"workload": "dataloader", "status": "ok", "format": "npy", "num_workers": [0, 2, 4],
                         "prefetch_factor_effective": [None, 2, 2], "batch_size": [32.0, 32.0, 32.0],
                         "step_time_s": [0.1, 0.05, 0.04], "step_samples_per_s": [320.0, 640.0, 800.0],
                         "data_wait_share": [0.5, 0.1, 0.0], "bound": "input"})
    assert _series(rows).nunique() == 1
    fig = hv_bokeh().render(throughput_vs_workers(rows, rec=rows.iloc[0:0]), backend="bokeh")
    assert list(fig.xaxis[0].ticker.ticks) == [0, 2, 4] and isinstance(fig.xaxis[0].ticker, FixedTicker)
    assert fig.x_range.start < 0 and fig.x_range.end > 4
    other = rows.assign(prefetch_factor_effective=[None, 2, 4])  # a real difference where workers ran
    assert {"npy prefetch_factor_effective=2", "npy prefetch_factor_effective=4"} < set(_series(other))
