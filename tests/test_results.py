"""The results store: real Parquet files, atomic writes, load() over a directory."""

import json

import pandas as pd
from pathlib import Path

import pytest

import perfkit
from perfkit.core import results
from perfkit.core.errors import BadInputError, ConfigurationSkipped


def test_round_trip_keeps_dtypes_units_and_samples(run_context, tmp_path):
    rows = [
        {"size": 64, "dtype": "fp32", "time_s": 1.5e-5, "flop_per_s": 3.2e10, "peak_mem_bytes": 1 << 20,
         "noisy": False, "time_samples_s": [1.4e-5, 1.5e-5, 1.6e-5]},
        {"size": 128, "dtype": "bf16", "time_s": 2.5e-5, "flop_per_s": 1.6e11, "peak_mem_bytes": 1 << 21,
         "noisy": True, "time_samples_s": [2.0e-5, 2.5e-5]},
    ]
    written = perfkit.record(rows)
    df = perfkit.load(tmp_path)
    assert len(df) == 2
    assert df["size"].dtype == "int64" and df["peak_mem_bytes"].dtype == "int64"
    assert df["time_s"].dtype == "float64" and df["noisy"].dtype == "bool"
    assert pd.api.types.is_string_dtype(df["dtype"])
    assert list(df["time_samples_s"][0]) == [1.4e-5, 1.5e-5, 1.6e-5]
    assert df.attrs["units"]["time_s"] == "s"
    assert df.attrs["units"]["flop_per_s"] == "FLOP/s"
    assert df.attrs["units"]["peak_mem_bytes"] == "bytes"
    assert df.attrs["units"]["time_samples_s"] == "s"
    # Frames derived from it share its units: pandas deep-copied them into every frame an
    # operation made, a third of a report's time (issue 55).
    derived = df[df["time_s"] > 0].sort_values("time_s")[["time_s"]]
    assert derived.attrs["units"] is df.attrs["units"]
    # Every row carries its configuration id, status, parameters and the fingerprint.
    assert set(df["config_id"]) == {"cfg-1"} and set(df["status"]) == {"ok"}
    assert (df["batch_size"] == 8).all() and (df["precision"] == "bf16").all()
    assert json.loads(df["sizes"][0]) == [1, 2]
    assert df["env_torch"][0] == written["env_torch"][0]
    assert json.loads(df["env_json"][0])["torch"] == df["env_torch"][0]


def test_record_appends_and_row_values_win_over_params(run_context, tmp_path):
    perfkit.record({"batch_size": 4, "time_s": 1.0})
    perfkit.record([{"time_s": 2.0}])
    df = perfkit.load(tmp_path).sort_values("time_s")
    assert list(df["time_s"]) == [1.0, 2.0]
    assert list(df["batch_size"]) == [4, 8]  # the row's own value, then the parameter


def test_unit_of():
    assert results.unit_of("busbw_bytes_per_s") == "bytes/s"
    assert results.unit_of("samples_per_s") == "samples/s"
    assert results.unit_of("step_time_s") == "s"
    assert results.unit_of("flop") == "FLOP"
    assert results.unit_of("dtype") is None


def test_interrupted_write_leaves_no_partial_file(run_context, tmp_path, monkeypatch):
    perfkit.record({"time_s": 1.0})
    path = run_context.results_path
    before = path.read_bytes()
    import pyarrow.parquet as pq

    real = pq.write_table

    def crash_midway(table, where, **kw):
        where.write(b"PAR1 partial garbage")  # some bytes reach the temp file, then the crash
        raise KeyboardInterrupt("simulated crash during the write")

    monkeypatch.setattr(pq, "write_table", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        perfkit.record({"time_s": 2.0})
    monkeypatch.setattr(pq, "write_table", real)
    assert path.read_bytes() == before  # the old file, intact
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # temp file removed
    assert list(perfkit.load(tmp_path)["time_s"]) == [1.0]


def test_load_ignores_temp_files_left_by_a_kill(run_context, tmp_path):
    perfkit.record({"time_s": 1.0})
    # What a SIGKILL between write and rename leaves behind:
    (run_context.results_path.parent / "cfg-2.parquet.tmp-deadbeef").write_bytes(b"PAR1 half")
    assert len(perfkit.load(tmp_path)) == 1


def test_skip_records_a_skipped_row_and_raises(run_context, tmp_path):
    with pytest.raises(ConfigurationSkipped, match="tf32"):
        perfkit.skip("tf32 needs an NVIDIA GPU")
    df = perfkit.load(tmp_path)
    assert list(df["status"]) == ["skipped"]
    assert "tf32" in df["reason"][0]


def test_per_row_status_is_kept(run_context, tmp_path):
    perfkit.record([{"dtype": "fp32", "status": "ok"}, {"dtype": "tf32", "status": "skipped", "reason": "no tf32"}])
    df = perfkit.load(tmp_path, statuses=["skipped"])
    assert list(df["dtype"]) == ["tf32"]


def test_load_errors_and_empty(tmp_path):
    with pytest.raises(BadInputError, match="does not exist"):
        perfkit.load(tmp_path / "nope")
    empty = perfkit.load(tmp_path)
    assert empty.empty and "status" in empty
    with pytest.raises(BadInputError, match="unknown status"):
        perfkit.load(tmp_path, statuses=["great"])


def test_interactive_default_location(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(results.CONTEXT_ENV, raising=False)
    monkeypatch.setenv("PERFKIT_OUT", str(tmp_path / "mine"))
    monkeypatch.setattr(results, "_INTERACTIVE", None)
    df = perfkit.record({"time_s": 3.0})
    assert df["config_id"][0].startswith("interactive-")
    files = list((tmp_path / "mine" / "results").glob("*.parquet"))
    assert len(files) == 1
    # the notebook says where its rows went, once per session
    assert str(files[0]) in capsys.readouterr().out
    perfkit.record({"time_s": 4.0})
    assert "interactive session go to" not in capsys.readouterr().out
    assert perfkit.load(tmp_path / "mine")["time_s"].tolist() == [3.0, 4.0]  # one file per session


def test_a_column_two_notebooks_type_differently_does_not_make_the_folder_unreadable(tmp_path):
    """An int64 `count` (collective elements) beside a bool `count` (a flag) has no common Arrow
    type; loading the folder keeps every row with its value as written."""
    results.write_rows(pd.DataFrame({"config_id": ["a"], "status": ["ok"], "count": [1024]}), tmp_path / "a.parquet")
    results.write_rows(pd.DataFrame({"config_id": ["b", "c"], "status": ["ok", "ok"], "count": [True, False]}),
               tmp_path / "b.parquet")
    df = results.load(tmp_path).set_index("config_id")
    assert df.loc["a", "count"] == 1024 and df.loc["b", "count"] is True and df.loc["c", "count"] is False


def test_paths_a_row_stores_are_relative_to_its_folder_and_a_moved_folder_still_finds_them(tmp_path):
    """Issue 55: rows stored absolute paths, so a copied folder lost its traces."""
    import shutil

    import pyarrow.parquet as pq

    from perfkit.core.results import RunContext, load, record

    folder = tmp_path / "run"
    trace = folder / "traces" / "cfg-1" / "run-a" / "rank0.json.gz"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(b"{}")
    ctx = RunContext(results_path=folder / "results" / "cfg-1.parquet", config_id="cfg-1", params={}, param_names=())
    record({"trace_path": str(trace), "rank_trace_paths": [str(trace)], "outside": "/etc/hostname"}, context=ctx)
    stored = pq.read_table(folder / "results" / "cfg-1.parquet").to_pandas()
    assert stored["trace_path"][0] == "traces/cfg-1/run-a/rank0.json.gz"
    assert list(stored["rank_trace_paths"][0]) == ["traces/cfg-1/run-a/rank0.json.gz"]
    moved = tmp_path / "elsewhere"
    shutil.move(folder, moved)
    rows = load(moved)
    assert rows["trace_path"][0] == str(moved / "traces/cfg-1/run-a/rank0.json.gz")
    assert Path(rows["rank_trace_paths"][0][0]).exists()


def test_a_copied_h200_folder_finds_its_trace_and_memory_snapshot(tmp_path):
    """The H200 reference's rows name /tmp/perfkit-gpu/sweep/traces/.../rank0.json.gz, recorded by an
    older perfkit; copied anywhere, they resolve to the files the folder holds."""
    import shutil

    from perfkit.core.results import load

    source = Path(__file__).resolve().parents[2] / "shared" / "reference" / "gpu-h200"
    if not source.is_dir():
        pytest.skip(f"the H200 reference folder is not at {source} (read in place)")
    copy = tmp_path / "h200"
    shutil.copytree(source, copy)
    rows = load(copy)
    traced = rows[rows["trace_path"].notna()].iloc[0]
    assert Path(traced["trace_path"]).exists() and Path(traced["trace_path"]).is_relative_to(copy)
    snapshots = rows["memory_snapshot_path"].dropna()
    assert len(snapshots) and all(Path(p).exists() for p in snapshots)
