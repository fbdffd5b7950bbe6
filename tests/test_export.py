"""`perfkit export`: a real sweep's results into a real MLflow store (local SQLite and a local
`mlflow server`), read back with MLflow's own search; and into TensorBoard event files, read back
with TensorBoard's own event reader and its HParams plugin."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

import perfkit
from perfkit.cli import main
from perfkit.core.results import RunContext, record

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed: pip install 'perfkit[mlflow]'")
pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: pip install 'perfkit[tensorboard]'")

REPO = Path(__file__).resolve().parents[1]
MODES = Path(__file__).parent / "notebooks" / "modes.ipynb"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real sweep: GEMM on the CPU in two configurations (one of two sizes: two rows), and one
    configuration that fails."""
    from perfkit.run.sweep import SweepPart, SweepSpec, run_sweep

    out = tmp_path_factory.mktemp("sweep")
    spec = SweepSpec(parts=(
        SweepPart(notebook=REPO / "notebooks" / "gemm.ipynb", timeout_s=300,
                  parameters={"dtypes": ["fp32"], "device": "cpu", "min_run_time_s": 0.01},
                  grid={"sizes": [[32], [32, 48]]}),
        SweepPart(notebook=MODES, timeout_s=300, grid={"mode": ["raise"]}),
    ))
    result = run_sweep(spec, out, workers=2, progress=False, prestart=False)
    assert sorted(o.status for o in result.outcomes) == ["failed", "ok", "ok"]
    return out


def _expected(rows: pd.DataFrame) -> dict:
    """What a configuration's MLflow run must hold, from its Parquet rows alone."""
    names = json.loads(rows["param_names"].iloc[0])
    statuses = set(rows["status"])
    return {"status": "failed" if "failed" in statuses else "ok",
            "params": {n: str(rows[n].iloc[0]) for n in names},
            "flop_per_s": rows["flop_per_s"].tolist() if rows.get("flop_per_s", pd.Series()).notna().any() else None}


def _check_runs(uri: str, directory: Path, experiment: str) -> pd.DataFrame:
    client = mlflow.MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[experiment])
    children = runs[runs["tags.perfkit.role"] == "configuration"]
    parents = runs[runs["tags.perfkit.role"] == "sweep"]
    assert len(parents) == 1
    rows = perfkit.load(directory)
    assert sorted(children["tags.perfkit.config_id"]) == sorted(rows["config_id"].unique())
    for cid, own in rows.groupby("config_id"):
        run = children[children["tags.perfkit.config_id"] == cid].iloc[0]
        want = _expected(own)
        assert run["tags.perfkit.status"] == want["status"]
        assert run["tags.mlflow.parentRunId"] == parents["run_id"].iloc[0]  # nested under the sweep
        assert {k: run[f"params.{k}"] for k in want["params"]} == want["params"]
        # every env_* column of the fingerprint is a tag
        assert run["tags.env_torch"] == str(own["env_torch"].iloc[0])
        assert run["tags.env_fingerprint_id"] == own["env_fingerprint_id"].iloc[0]
        if want["status"] == "failed":
            assert run["status"] == "FAILED" and "boom at batch_size=1" in run["tags.perfkit.reason"]
        else:
            assert run["status"] == "FINISHED"
            # the unit stays in the name; one step per row, in the rows' order
            history = sorted(client.get_metric_history(run["run_id"], "flop_per_s"), key=lambda m: m.step)
            assert [m.value for m in history] == pytest.approx(want["flop_per_s"], rel=1e-12)
            assert run["metrics.flop_per_s"] == pytest.approx(want["flop_per_s"][-1], rel=1e-12)
        artifacts = {a.path for folder in ("notebook", "results") for a in client.list_artifacts(run["run_id"], folder)}
        assert artifacts == {f"notebook/{cid}.ipynb", f"results/{cid}.parquet"}
    return runs


@pytest.mark.slow
def test_mlflow_local_store_equals_the_parquet_rows_and_exports_once(sweep, capsys):
    before = len(perfkit.load(sweep))
    assert main(["export", str(sweep), "--to", "mlflow"]) == 0
    assert "3 created" in capsys.readouterr().out
    uri = f"sqlite:///{sweep.resolve() / 'mlflow' / 'mlflow.db'}"
    first = _check_runs(uri, sweep, "perfkit")
    # the store under DIR holds copies of the Parquet files: they are not rows of DIR
    assert len(perfkit.load(sweep)) == before
    assert main(["export", str(sweep), "--to", "mlflow"]) == 0  # idempotent
    assert "3 unchanged" in capsys.readouterr().out
    again = _check_runs(uri, sweep, "perfkit")
    assert len(again) == len(first) == 4 and set(again["run_id"]) == set(first["run_id"])
    # a configuration whose rows changed (a retried sweep) gets a fresh run in place of its old one
    gemm = sorted(sweep.glob("results/gemm-*.parquet"))[0]
    ctx = RunContext(results_path=gemm, config_id=gemm.stem, params={}, notebook="gemm.ipynb")
    record({"status": "ok", "flop_per_s": 1.0}, context=ctx)
    assert main(["export", str(sweep), "--to", "mlflow"]) == 0
    assert "1 updated, 2 unchanged" in capsys.readouterr().out
    third = _check_runs(uri, sweep, "perfkit")  # its metric history: the new rows, nothing else
    assert len(third) == 4 and len(set(third["run_id"]) - set(first["run_id"])) == 1


@pytest.mark.slow
def test_mlflow_traces_and_rows_under_another_file_name(sweep, tmp_path):
    # rows that point to profiler traces, and an interactive session's file (its name is not the
    # configuration's id): the traces and the configuration's own rows become artifacts
    trace = tmp_path / "traces" / "train-1" / "run-a" / "rank1.json.gz"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(b"\x1f\x8b fake gzip")
    ctx = RunContext(results_path=tmp_path / "results" / "interactive-x.parquet", config_id="train-1",
                     params={"batch_size": 4}, notebook="train_step.ipynb")
    record({"step_time_s": 0.5, "trace_path": str(trace), "rank_trace_paths": [str(trace)]}, context=ctx)
    uri = f"sqlite:///{sweep.resolve() / 'mlflow' / 'mlflow.db'}"  # a store another test already made
    assert main(["export", str(tmp_path), "--to", "mlflow", "--tracking-uri", uri, "--experiment", "traces"]) == 0
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("traces").experiment_id],
                             filter_string="tags.`perfkit.config_id` = 'train-1'")[0]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "traces/run-a")] == ["traces/run-a/rank1.json.gz"]
    local = Path(client.download_artifacts(run.info.run_id, "results/train-1.parquet", str(tmp_path / "dl")))
    assert pd.read_parquet(local)["step_time_s"].tolist() == [0.5]
    assert run.data.params == {"batch_size": "4"} and run.data.metrics["step_time_s"] == 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_mlflow_tracking_server_on_loopback(sweep, tmp_path, capsys):
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination", str(tmp_path / "art")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # without its job runner (seven huey worker processes on this 2-core machine): tracking only
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "mlflow server did not answer in 90 s"
                time.sleep(0.3)
        uri = f"http://127.0.0.1:{port}"
        for _ in range(2):  # exporting twice adds no run
            assert main(["export", str(sweep), "--to", "mlflow", "--tracking-uri", uri, "--experiment", "nightly"]) == 0
            runs = _check_runs(uri, sweep, "nightly")
            assert len(runs) == 4
        assert "3 unchanged" in capsys.readouterr().out
        assert (tmp_path / "art").is_dir()  # artifacts went through the server
    finally:  # the server and every process it started (uvicorn) are in its session: stop them all
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()
        deadline = time.monotonic() + 10
        while _session_members(server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left := _session_members(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail(f"mlflow server processes outlived SIGTERM: {left}")


def _session_members(sid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # session id; zombies are already gone
            members.append(int(stat.parent.name))
    return members


@pytest.mark.slow
def test_tensorboard_runs_read_back_by_tensorboard(sweep, tmp_path):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.context import RequestContext
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups, metadata

    logdir = tmp_path / "tb"
    for _ in range(2):  # the second export replaces the first's event files
        assert main(["export", str(sweep), "--to", "tensorboard", str(logdir)]) == 0
    rows = perfkit.load(sweep)
    runs = {d.name.rsplit(",", 1)[-1]: d for d in logdir.iterdir()}
    assert sorted(runs) == sorted(rows["config_id"].unique())
    for cid, own in rows.groupby("config_id"):
        run = runs[cid]
        assert len(list(run.glob("events.out.tfevents.*"))) == 1
        want = _expected(own)
        if "sizes" in want["params"]:  # the swept parameter names the run
            assert run.name.startswith("sizes=")
        acc = EventAccumulator(str(run))
        acc.Reload()
        if want["flop_per_s"]:
            assert [(e.step, e.value) for e in acc.Scalars("flop_per_s")] == [
                (i, pytest.approx(v, rel=1e-6)) for i, v in enumerate(want["flop_per_s"])]
        start = metadata.parse_session_start_info_plugin_data(
            acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
        hparams = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
        assert hparams.pop("status") == want["status"]
        assert {k: str(v) for k, v in hparams.items()} == want["params"]
    # TensorBoard's HParams plugin finds one session group per configuration, metrics included
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    context = base_plugin.TBContext(logdir=str(logdir), multiplexer=mux,
                                    data_provider=data_provider.MultiplexerDataProvider(mux, str(logdir)))
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=100, allowed_statuses=[
        api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_RUNNING])
    groups = list_session_groups.Handler(RequestContext(), backend_context.Context(context), "", request).run()
    by_name = {g.name: g for g in groups.session_groups}
    assert sorted(by_name) == sorted(runs)
    for cid, group in by_name.items():
        metrics = {m.name.tag: m.value for m in group.metric_values}
        own = rows[rows["config_id"] == cid]
        if "flop_per_s" in metrics:
            assert metrics["flop_per_s"] == pytest.approx(own["flop_per_s"].iloc[-1], rel=1e-6)
        assert group.sessions[0].status == (api_pb2.STATUS_FAILURE if "failed" in set(own["status"])
                                            else api_pb2.STATUS_SUCCESS)


@pytest.mark.parametrize("args, message", [
    (["export", "{empty}", "--to", "mlflow"], "no results under"),
    (["export", "{missing}", "--to", "tensorboard", "{tmp}/tb"], "is not a results directory"),
    (["export", "{dir}", "--to", "wandb"], "--to 'wandb': export to one of mlflow, tensorboard"),
    (["export", "{dir}", "--to", "tensorboard"], "needs one LOGDIR"),
    (["export", "{dir}", "--to", "mlflow", "{tmp}/x"], "takes no LOGDIR"),
    # nothing listens there: said at once, not after MLflow's minutes of retries
    (["export", "{dir}", "--to", "mlflow", "--tracking-uri", "http://127.0.0.1:{closed}"], "no MLflow tracking server answers"),
    (["export", "{dir}", "--to", "mlflow", "--tracking-uri", "foo://x/y"], "unsupported URI"),  # no store for it
])
def test_export_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    ctx = RunContext(results_path=tmp_path / "dir" / "results" / "c.parquet", config_id="c", params={"a": 1})
    record({"time_s": 1.0}, context=ctx)
    fill = {"empty": tmp_path / "empty", "missing": tmp_path / "missing", "dir": tmp_path / "dir", "tmp": tmp_path,
            "closed": _free_port()}
    assert main([a.format(**fill) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "dir" / "mlflow").exists() and not (tmp_path / "tb").exists()  # nothing written


@pytest.mark.parametrize("target, module, extra", [("mlflow", "mlflow", "mlflow"),
                                                   ("tensorboard", "tensorboard", "tensorboard")])
def test_export_without_the_extra_names_it(tmp_path, monkeypatch, capsys, target, module, extra):
    ctx = RunContext(results_path=tmp_path / "dir" / "results" / "c.parquet", config_id="c", params={"a": 1})
    record({"time_s": 1.0}, context=ctx)
    monkeypatch.setitem(sys.modules, module, None)  # what an environment without the extra looks like
    args = ["export", str(tmp_path / "dir"), "--to", target] + ([str(tmp_path / "tb")] if target == "tensorboard" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"pip install 'perfkit[{extra}]'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "dir" / "mlflow").exists() and not (tmp_path / "tb").exists()


def _one_config(tmp_path) -> Path:
    ctx = RunContext(results_path=tmp_path / "dir" / "results" / "c.parquet", config_id="c", params={"a": 1})
    record({"time_s": 1.0}, context=ctx)
    return tmp_path / "dir"


@pytest.mark.parametrize("uri", ["file://{tmp}/mlruns", "{tmp}/mlruns", "mlruns"])
def test_mlflow_file_store_is_refused_in_one_line_naming_the_ways_out(tmp_path, monkeypatch, capsys, uri):
    # The store most teams' MLflow setups have (./mlruns): MLflow >= 3.7 refuses it unless opted
    # in, and said so in a 36-line traceback with exit 1. One line, exit 2, before anything is written.
    directory = _one_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert main(["export", str(directory), "--to", "mlflow", "--tracking-uri", uri.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for way_out in ("sqlite:///", "http://", "mlflow server", "MLFLOW_ALLOW_FILE_STORE=true", "migrate-filestore"):
        assert way_out in err, (way_out, err)
    assert not (tmp_path / "mlruns").exists() and not (directory / "mlflow").exists()


def test_mlflow_file_store_from_the_command_line_exits_2_without_a_traceback(tmp_path):
    directory = _one_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    done = subprocess.run([sys.executable, "-c", "import sys; from perfkit.cli import main; sys.exit(main())",
                           "export", str(directory), "--to", "mlflow", "--tracking-uri", (tmp_path / "mlruns").as_uri()],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "MLFLOW_ALLOW_FILE_STORE" in done.stderr, done.stderr


def test_mlflow_file_store_with_mlflows_own_opt_in_exports(tmp_path, monkeypatch, capsys):
    directory = _one_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own switch: the user chose the file store
    uri = (tmp_path / "mlruns").as_uri()
    assert main(["export", str(directory), "--to", "mlflow", "--tracking-uri", uri]) == 0
    assert "1 created" in capsys.readouterr().out
    runs = mlflow.MlflowClient(tracking_uri=uri).search_runs(
        [mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name("perfkit").experiment_id])
    assert sorted(r.data.tags.get("perfkit.role") for r in runs) == ["configuration", "sweep"]
    assert [r.data.metrics["time_s"] for r in runs if r.data.tags.get("perfkit.role") == "configuration"] == [1.0]
    assert (tmp_path / "mlruns").is_dir() and not (directory / "mlflow").exists()
