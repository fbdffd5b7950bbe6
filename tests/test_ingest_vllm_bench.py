"""vLLM serving benchmark results as perfkit's inference rows (issue 28, readers of native
outputs): every real vLLM fixture in ../shared/reference/native (0.6, 0.9 appended runs, 0.25,
an all-failed run, a `bench sweep` folder), compared key by key with the files themselves."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from perfkit.core.errors import BadInputError
from perfkit.ingest import vllm_bench
from perfkit.ingest.store import import_files

FILES = {"vllm-0.6-benchmark_serving-lambda-h100-llama3.1-8b-fp8-detailed.json": 1,
         "vllm-0.9-benchmark_serving-llmd-l40s-9runs-appended.jsonl": 9,
         "vllm-0.25.1-bench-serve-opt125m-cpu.json": 1,
         "vllm-0.25.1-bench-serve-all-requests-failed.json": 1}


def _objects(path) -> list[dict]:
    text = path.read_text()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_run_reads_with_vllms_own_numbers_in_seconds(reference_dir, name):
    path = reference_dir / "native" / name
    run = vllm_bench.parse(path.read_text(), source=name)
    assert len(run.rows) == FILES[name]
    for row, obj in zip(run.rows, _objects(path)):
        assert row["workload"] == "inference" and row["model"] == obj["model_id"]
        failed = obj["completed"] == 0
        assert row["status"] == ("failed" if failed else "ok")
        for metric, mine in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e_latency"),
                             ("latency", "e2e_latency")):
            for stat, column in (("median", f"{mine}_s"), ("mean", f"{mine}_mean_s"), ("p99", f"{mine}_p99_s")):
                key = f"{stat}_{metric}_ms"
                if key in obj:
                    expected = math.nan if failed else obj[key] / 1e3
                    assert row[column] == pytest.approx(expected, nan_ok=True), (key, column)
        assert row["request_rate_per_s"] == (math.inf if obj["request_rate"] == "inf" else obj["request_rate"])
        assert row["completed"] == obj["completed"] and row["batch_size"] == obj.get("max_concurrency")
        if not failed:
            assert row["output_tokens_per_s"] == obj["output_throughput"]
            assert row["prompt_len"] == round(obj["total_input_tokens"] / obj["completed"])
        if "request_goodput" in obj or "request_goodput:" in obj:  # vLLM ≈0.9 wrote the key with a colon
            assert row["goodput_requests_per_s"] == obj.get("request_goodput", obj.get("request_goodput:"))
            assert not any(k.startswith("vllm_request_goodput") for k in row)


def test_the_per_request_arrays_are_kept_as_raw_samples(reference_dir):
    name = "vllm-0.6-benchmark_serving-lambda-h100-llama3.1-8b-fp8-detailed.json"
    obj = json.loads((reference_dir / "native" / name).read_text())
    (row,) = vllm_bench.parse(json.dumps(obj), source=name).rows
    assert row["ttft_samples_s"] == obj["ttfts"] and statistics.median(row["ttft_samples_s"]) == row["ttft_s"]
    assert len(row["itl_samples_s"]) == sum(map(len, obj["itls"]))
    assert statistics.median(row["itl_samples_s"]) == pytest.approx(row["itl_s"])
    # A file whose arrays disagree with its own median is corrupt or mixed: refused.
    obj["ttfts"][4] = obj["ttfts"][6] = 9.0  # two of its 0.0 (requests without output) moved past the middle
    with pytest.raises(BadInputError, match="median of its ttfts .* is not its median_ttft_ms"):
        vllm_bench.parse(json.dumps(obj), source=name)


def test_an_all_failed_run_is_failed_and_its_zeros_are_not_latencies(reference_dir):
    name = "vllm-0.25.1-bench-serve-all-requests-failed.json"
    (row,) = vllm_bench.parse((reference_dir / "native" / name).read_text(), source=name).rows
    assert row["status"] == "failed" and "every request failed (completed 0, failed 8)" in row["reason"]
    assert all(math.isnan(row[c]) for c in ("ttft_s", "tpot_s", "itl_p99_s", "output_tokens_per_s"))
    assert row["request_rate_per_s"] == math.inf  # the load it was asked for is not a measurement


def test_a_bench_sweep_folder_imports_each_run_once_and_not_its_summary(reference_dir, tmp_path):
    import perfkit

    folder = reference_dir / "native" / "vllm-0.25.1-bench-sweep"
    done = import_files("vllm-bench", [folder], tmp_path)
    assert [p.rsplit("/", 1)[-1] for p, _ in done.added] == ["run=0.json", "run=1.json"]
    rows = perfkit.load(tmp_path)
    assert sorted(rows["run_number"]) == [0, 1] and set(rows["vllm_max_num_seqs"]) == {4}
    assert set(rows["batch_size"]) == {2} and set(rows["source"]) == {"vllm-bench"}
    again = import_files("vllm-bench", [folder], tmp_path)
    assert not again.added and len(again.unchanged) == 2


@pytest.mark.parametrize("text, says", [("", "is empty"), ('{"a": 1}', "is not a vLLM benchmark result"),
                                        ('{"median_ttft_ms": 1.0}\n{"median_ttft', "line 2: not JSON")])
def test_what_is_not_a_vllm_result_is_refused_with_one_line(text, says):
    with pytest.raises(BadInputError, match=says) as err:
        vllm_bench.parse(text, source="x.json")
    assert "\n" not in err.value.reason


def test_the_report_draws_imported_serving_runs_by_model_and_load(reference_dir, tmp_path):
    import perfkit
    from perfkit.view.plots.inference import ttft_vs_prompt

    native = reference_dir / "native"
    import_files("vllm-bench", [native / "vllm-0.6-benchmark_serving-lambda-h100-llama3.1-8b-fp8-detailed.json",
                                native / "vllm-0.25.1-bench-serve-opt125m-cpu.json",
                                native / "vllm-0.25.1-bench-serve-all-requests-failed.json"], tmp_path)
    plot = ttft_vs_prompt(perfkit.load(tmp_path))
    import pandas as pd

    data = pd.concat([el.dframe() for el in plot.traverse(lambda el: el) if type(el).__name__ == "Scatter"])
    # Two ok runs of two models are two series, each at its mean prompt length; the failed run is not drawn.
    assert sorted(data["prompt_len"].unique()) == [32, 137]
    assert data["series"].nunique() == 2 and data["series"].str.contains("meta-llama|neuralmagic").any()


def test_a_run_with_failed_requests_keeps_the_successful_ones_samples_and_counts_the_failed(reference_dir):
    # Issue 47: vLLM saves a ttfts entry for every request, a failed one as 0.0 beside its error text,
    # and its median_ttft_ms is over the successful requests only (calculate_metrics, outputs[i].success).
    # Such a file was refused as "corrupt or mixed". Made from the 0.6 fixture: three requests failed.
    name = "vllm-0.6-benchmark_serving-lambda-h100-llama3.1-8b-fp8-detailed.json"
    obj = json.loads((reference_dir / "native" / name).read_text())
    failed = [1, 4, 7]
    for i in failed:
        obj["ttfts"][i], obj["itls"][i], obj["output_lens"][i] = 0.0, [], 0
        obj["errors"][i] = "Traceback (most recent call last): ... aiohttp.ClientPayloadError"
    good = [t for i, t in enumerate(obj["ttfts"]) if i not in failed]
    obj["median_ttft_ms"], obj["mean_ttft_ms"] = statistics.median(good) * 1e3, statistics.mean(good) * 1e3
    obj["completed"], obj["failed"] = len(good), len(failed)
    (row,) = vllm_bench.parse(json.dumps(obj), source=name).rows
    assert row["status"] == "ok" and row["failed_requests"] == 3
    assert row["ttft_samples_s"] == good and statistics.median(row["ttft_samples_s"]) == pytest.approx(row["ttft_s"])
    assert len(row["itl_samples_s"]) == sum(len(x) for i, x in enumerate(obj["itls"]) if i not in failed)
    assert row["output_len_samples"] == [n for i, n in enumerate(obj["output_lens"]) if i not in failed]
    # Without a "failed" count (vLLM 0.6 kept none), the errors say how many.
    del obj["failed"]
    assert vllm_bench.parse(json.dumps(obj), source=name).rows[0]["failed_requests"] == 3


def test_an_imported_run_is_named_by_its_model_in_the_plots(reference_dir, tmp_path):
    """Issue 55: an imported vLLM run's legend said "all"."""
    from perfkit.core.results import load
    from perfkit.view.plots.inference import _labels, _rows

    name = "vllm-0.25.1-bench-serve-opt125m-cpu.json"
    import_files("vllm-bench", [reference_dir / "native" / name], tmp_path / "runs")
    assert _labels(_rows(load(tmp_path / "runs")), ()).tolist() == ["facebook/opt-125m"]
