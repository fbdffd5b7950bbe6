"""MLPerf Training result logs and ROCm/MAD perf CSVs as perfkit rows (issue 28, readers of native
outputs), on the real fixtures of ../shared/reference/native; the unit table they share."""

from __future__ import annotations

import csv
import json
import math

import pytest

from perfkit.core.errors import BadInputError
from perfkit.ingest import mad, mlperf
from perfkit.core.units import si_column

MLPERF = "mlperf-training-v5.1-amd-mi300x-llama2_70b_lora-result_0.txt"
MAD = "mad-perf_Kimi-K3-multiple-results.csv"


def test_an_mlperf_log_is_one_time_to_train_row_on_mlperfs_own_clock(reference_dir):
    text = (reference_dir / "native" / MLPERF).read_text()
    events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in text.splitlines()]
    (row,) = mlperf.parse(text, source=MLPERF).rows
    at = {e["key"]: e["time_ms"] for e in reversed(events)}  # first occurrence wins
    assert row["time_to_train_s"] == pytest.approx((at["run_stop"] - at["run_start"]) / 1e3)
    assert row["time_to_train_s"] == pytest.approx(2035.848, abs=5e-4)  # the log's own "duration"
    assert row["status"] == "ok" and row["run_stop_status"] == "success"
    assert row["benchmark"] == "llama2_70b_lora" and row["submission_platform"] == "1xMI300X"
    assert row["mlperf_global_batch_size"] == 8 and row["mlperf_lora_rank"] == 16
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    assert row["eval_accuracy_samples"] == [e["value"] for e in evals] and len(evals) == 7
    assert row["eval_samples_count"][-1] == 3840 and row["eval_accuracy"] == evals[-1]["value"]
    assert len(row["throughput_samples"]) == 7 and 2.11 < row["throughput"] < 2.12


def test_an_mlperf_log_that_did_not_finish_or_did_not_succeed_says_so(reference_dir):
    lines = (reference_dir / "native" / MLPERF).read_text().splitlines()
    with pytest.raises(BadInputError, match="no run_stop event: the run did not finish"):
        mlperf.parse("\n".join(lines[:-1]), source=MLPERF)
    aborted = "\n".join(lines[:-1] + [lines[-1].replace('"status": "success"', '"status": "aborted"')])
    (row,) = mlperf.parse(aborted, source=MLPERF).rows
    assert row["status"] == "failed" and "'aborted'" in row["reason"]
    with pytest.raises(BadInputError, match="line 3: a :::MLLOG line whose JSON does not parse"):
        mlperf.parse("\n".join(lines[:2] + [lines[2][:60]] + lines[3:]), source=MLPERF)
    with pytest.raises(BadInputError, match="not an MLPerf result log"):
        mlperf.parse("hello\n", source="x.txt")


def test_a_mad_csv_is_one_row_per_run_with_a_column_per_metric_in_si(reference_dir):
    text = (reference_dir / "native" / MAD).read_text()
    lines = list(csv.DictReader(text.splitlines()))
    (row,) = mad.parse(text, source=MAD).rows  # six metrics of one run
    assert row["model"] == "Kimi-K3" and row["status"] == "ok" and row["mad_tp"] == "8"
    for line in lines:
        column, factor = si_column(line["metric"], line["unit"])
        assert row[column] == pytest.approx(float(line["performance"]) * factor)
    assert row["median_ttft_s"] == pytest.approx(0.5289972266182303)
    assert row["throughput_tot_tokens_per_s"] == pytest.approx(68.20421075018477)
    assert row["mad_cmd"].count(",") > 0  # the quoted command with its commas, one field
    failed = text.replace("68.20421075018477", "FAILED", 1)
    (row,) = mad.parse(failed, source=MAD).rows
    assert row["status"] == "failed" and "'FAILED' is not a number" in row["reason"]
    assert math.isnan(row["throughput_tot_tokens_per_s"])
    with pytest.raises(BadInputError, match="not a MAD perf CSV: its header has no performance, metric"):
        mad.parse("model,score\nx,1\n", source="x.csv")


@pytest.mark.parametrize("metric, unit, column, factor", [
    ("median_ttft", "ms", "median_ttft_s", 1e-3), ("throughput", "tok/sec", "throughput_tokens_per_s", 1.0),
    ("perf", "samples_per_second", "perf_samples_per_s", 1.0), ("bw", "GB/s", "bw_bytes_per_s", 1e9),
    ("latency", "us", "latency_s", 1e-6), ("mfu", "%", "mfu_percent", 1.0),
    ("time_to_train", "min", "time_to_train_s", 60.0), ("x", "widgets", "x_widgets", 1.0),
])
def test_units_become_perfkit_suffixes_and_si_factors(metric, unit, column, factor):
    assert si_column(metric, unit) == (column, factor)


def _as_stable_diffusion(lines: list[str]) -> str:
    """The MLPerf fixture's log as Stable Diffusion logs its evaluations: FID and CLIP at each one,
    told apart by metadata.metric (mlperf-logging's stable_diffusion rules), the last FID null."""
    out, evals = [], 0
    for line in lines:
        at = line.find(":::MLLOG")
        event = json.loads(line[at + len(":::MLLOG"):]) if at >= 0 else None
        if event is None or event["key"] != "eval_accuracy":
            out.append(line)
            continue
        evals += 1
        for metric, value in (("FID", 90.0 - 10 * evals), ("CLIP", 0.10 + 0.01 * evals)):
            event = {**event, "value": value, "metadata": {**event["metadata"], "metric": metric}}
            out.append(":::MLLOG " + json.dumps(event))
    last_fid = max(i for i, line in enumerate(out) if '"metric": "FID"' in line)
    event = json.loads(out[last_fid][len(":::MLLOG "):])
    out[last_fid] = ":::MLLOG " + json.dumps({**event, "value": None})
    return "\n".join(out), evals


def test_stable_diffusion_s_two_evaluation_metrics_are_two_series_and_a_null_is_nan(reference_dir):
    # Issue 47: FID and CLIP were interleaved into one eval_accuracy series; a null value crashed
    # `perfkit import` with a traceback.
    text, evals = _as_stable_diffusion((reference_dir / "native" / MLPERF).read_text().splitlines())
    (row,) = mlperf.parse(text, source="sd.txt").rows
    assert row["eval_metrics"] == ["FID", "CLIP"] and row["eval_accuracy"] is None
    assert row["eval_clip_samples"] == pytest.approx([0.10 + 0.01 * i for i in range(1, evals + 1)])
    assert row["eval_fid_samples"][:-1] == [90.0 - 10 * i for i in range(1, evals)]
    assert math.isnan(row["eval_fid_samples"][-1]) and math.isnan(row["eval_fid"])
    assert len(row["eval_fid_samples_count"]) == evals and row["status"] == "ok"


def test_every_reader_refuses_truncated_empty_binary_and_wrong_tool_files_with_one_line(reference_dir, tmp_path,
                                                                                        capsys):
    # Issue 47 item 6: any reader, any malformed input: one line on stderr, exit 2, nothing written.
    from perfkit.cli import main

    native = reference_dir / "native"
    good = {"nccl-tests": native / "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt",
            "vllm-bench": native / "vllm-0.25.1-bench-serve-opt125m-cpu.json",
            "mlperf": native / MLPERF, "mad": native / "mad-perf_Kimi-K3-multiple-results.csv"}
    broken = {"empty": b"", "binary": bytes(range(256)) * 4, "whitespace": b"\n \n"}
    for kind, path in good.items():
        cases = {**broken, "truncated": path.read_bytes()[: len(path.read_bytes()) // 3],
                 **{f"{other}'s output": p.read_bytes() for other, p in good.items() if other != kind}}
        if kind == "mlperf":  # a value no reader foresaw (a reader's own exception, not perfkit's error)
            cases["a word for a number"] = path.read_bytes().replace(b'"value": 0.9382773041725159',
                                                                     b'"value": "n/a"', 1)
        for case, payload in cases.items():
            bad = tmp_path / "input.txt"
            bad.write_bytes(payload)
            code = main(["import", kind, str(bad), "--out", str(tmp_path / "out")])
            err = capsys.readouterr().err
            if kind == "mad" and case == "truncated" and code == 0:
                continue  # a CSV cut between rows is a shorter CSV: its whole rows are real
            assert code == 2, (kind, case, code, err[-400:])
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (kind, case, err)
            assert not (tmp_path / "out").exists(), (kind, case)


# madengine's classic perf.csv header (ROCm/MAD, madengine's ensure_perf_csv_exists): no unit column,
# the unit in `metric`, MAD's own verdict in `status`.
CLASSIC_HEADER = ("model,n_gpus,training_precision,pipeline,args,tags,docker_file,base_docker,docker_sha,docker_image,"
                  "git_commit,machine_name,gpu_architecture,performance,metric,relative_change,status,build_duration,"
                  "test_duration,dataname,data_provider_type,data_size,data_download_duration,build_number,"
                  "additional_docker_run_options")


def test_a_classic_mad_perf_csv_is_a_judged_rate_and_its_failure_is_failed():
    def line(model, performance, metric, status):
        return (f"{model},8,fp16,ci,--batch-size 32,\"pyt,train\",docker/pyt.Dockerfile,rocm/pytorch:latest,sha256:0,"
                f"ci-{model},abcd1234,node-1,gfx942,{performance},{metric},0.0,{status},120.5,45.2,,,,,1,")
    text = "\n".join([CLASSIC_HEADER, line("pyt_bert", "245.67", "samples_per_second", "SUCCESS"),
                      line("pyt_llama", "1234.5", "tokens/sec", "SUCCESS"),
                      line("pyt_gpt2", "0", "samples_per_second", "FAILURE")]) + "\n"
    rows = {r["model"]: r for r in mad.parse(text, source="perf.csv").rows}
    assert rows["pyt_bert"]["performance_samples_per_s"] == 245.67 and rows["pyt_bert"]["status"] == "ok"
    assert rows["pyt_llama"]["performance_tokens_per_s"] == 1234.5
    assert rows["pyt_gpt2"]["status"] == "failed" and "FAILURE" in rows["pyt_gpt2"]["reason"]
    # compare judges the column: a rate, higher is better (a name it reads as a unit it knows).
    from perfkit.analyse.compare_match import lower_is_better

    assert lower_is_better("performance_samples_per_s") is False
