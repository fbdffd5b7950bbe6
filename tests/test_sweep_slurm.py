"""The Slurm executor (issue 8) against a real one-node Slurm cluster with accounting.

The cluster comes from ``ensure_slurm()`` (tests/slurm_cluster.py): reused when it answers,
started with .ci/slurm/up.sh when root, otherwise every test here skips with the reason (fails
with PERFKIT_SLURM_REQUIRE=1). Every wait is bounded, and pytest-timeout bounds each test, so a
hung driver fails instead of blocking CI. test_time_limit_ends_timeout takes ~2 minutes: Slurm
limits are whole minutes, checked about every 30 s.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import perfkit
from conftest import sigint_default
from perfkit.core.errors import BadInputError
from perfkit.run.sweep import Ledger, SweepPart, SweepSpec, expand, run_sweep
from perfkit.run.sweep.busy import read_summaries
from perfkit.run.sweep.slurm import _expand_ids
from perfkit.run.sweep.slurm_settings import parse_sbatch_options, slurm_parameters

try:
    from slurm_cluster import SlurmCluster, ensure_slurm
except ImportError:  # tests/ imported as a package
    from tests.slurm_cluster import SlurmCluster, ensure_slurm

MODES = Path(__file__).parent / "notebooks" / "modes.ipynb"
TRIVIAL = Path(__file__).parent / "notebooks" / "trivial.ipynb"
NO_RECORD = Path(__file__).parent / "notebooks" / "no_record.ipynb"
# Columns that differ between two runs of the same configuration by design.
_VOLATILE = ("recorded_at", "env_", "measure_window_")  # wall-clock facts of each run


@pytest.fixture(scope="module")
def slurm() -> SlurmCluster:
    pytest.importorskip("submitit", reason="submitit is not installed (pip install 'perfkit[slurm]')")
    return ensure_slurm()


@pytest.fixture
def cluster(slurm, monkeypatch) -> SlurmCluster:
    slurm.apply_env(monkeypatch)  # the driver's sbatch/sacct calls inherit os.environ
    return slurm


def _table(out: Path) -> pd.DataFrame:
    df = perfkit.load(out)
    df = df[[c for c in df.columns if not c.startswith(_VOLATILE)]]
    df = df.astype(object).where(df.notna(), None)
    return df.sort_values(["config_id", "status"]).reset_index(drop=True)[sorted(df.columns)]


def _final(out: Path, config_id: str) -> list[tuple[int, str]]:
    return [(e.attempt, e.status) for e in Ledger(out).events() if e.config_id == config_id]


def _wait_for(what: str, predicate, timeout: float, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not after {timeout} s: {what}")
        time.sleep(poll)


# --- no cluster needed ---------------------------------------------------------------------------

def test_settings_map_to_submitit_parameters():
    configs = expand(SweepSpec(parts=(SweepPart(notebook=MODES, grid={"mode": ["ok"]}, timeout_s=150),)))
    params = slurm_parameters({"partition": "gpu", "cpus_per_task": 4, "gpus_per_task": 1, "array_parallelism": 2,
                               "sbatch_options": {"--account": "p1"}, "setup": ["module load cuda"]}, configs)
    assert params["timeout_min"] == 4  # ceil(150 s / 60) + 1
    assert params["slurm_partition"] == "gpu" and params["cpus_per_task"] == 4 and params["gpus_per_node"] == 1
    assert params["slurm_array_parallelism"] == 2
    assert params["slurm_additional_parameters"] == {"signal": "CONT@30", "account": "p1"}
    assert params["slurm_setup"] == ["module load cuda"]
    no_limit = expand(SweepSpec(parts=(SweepPart(notebook=MODES, grid={"mode": ["ok"]}),)))
    assert slurm_parameters({}, no_limit)["timeout_min"] == 60
    assert slurm_parameters({"time_limit_min": 7}, no_limit)["timeout_min"] == 7
    with pytest.raises(BadInputError, match="unknown slurm setting"):
        slurm_parameters({"partiton": "gpu"}, configs)
    with pytest.raises(BadInputError, match="positive integer"):
        slurm_parameters({"cpus_per_task": 0}, configs)
    assert parse_sbatch_options(["account=p1", "--qos=high", "constraint=a=b"]) == \
        {"account": "p1", "qos": "high", "constraint": "a=b"}
    with pytest.raises(BadInputError, match="KEY=VALUE"):
        parse_sbatch_options(["account"])
    assert _expand_ids("12_[0-2,5%2]") == ["12_0", "12_1", "12_2", "12_5"] and _expand_ids("12_3") == ["12_3"]


def test_slurm_flags_with_the_local_executor_are_refused(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(MODES), "grid": {"mode": ["ok"]}}))
    cp = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "o"),
                         "--partition", "debug"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "--partition only apply with --executor slurm" in cp.stderr


@pytest.mark.parametrize("text", ['{"version": 1, "configs": {"abc": {"job_id": "12_0", "attem',  # torn
                                  '', '{"version": 1, "configs": []}', '{"configs": {"abc": {"job": 1}}}'])
def test_an_unreadable_jobs_file_is_refused_never_reset(tmp_path, text):
    # Resetting it would submit again tasks that may still run: exit 2, one line, file untouched.
    pytest.importorskip("submitit", reason="submitit is not installed (pip install 'perfkit[slurm]')")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(TRIVIAL), "grid": {"x": [1]}}))
    jobs = tmp_path / "out" / "slurm" / "jobs.json"
    jobs.parent.mkdir(parents=True)
    jobs.write_text(text)
    cp = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "out"),
                         "--executor", "slurm", "--partition", "nowhere"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "jobs.json is unreadable" in lines[0] and "squeue" in lines[0], cp.stderr
    assert jobs.read_text() == text
    assert not any((tmp_path / "out" / "ledger").glob("*"))


def test_jobs_file_is_replaced_atomically(tmp_path, monkeypatch):
    from perfkit.run.sweep.slurm import _Jobs

    path = tmp_path / "slurm" / "jobs.json"
    jobs = _Jobs(path)
    jobs.data["a"] = {"job_id": "1_0", "attempt": 1, "submitted_at": 0.0}
    jobs.save()
    before = path.read_text()

    def crash(fd):
        raise OSError("disk full")  # the write dies before the new content is durable

    monkeypatch.setattr("os.fsync", crash)
    jobs.data["b"] = {"job_id": "1_1", "attempt": 1, "submitted_at": 0.0}
    with pytest.raises(OSError):
        jobs.save()
    assert path.read_text() == before  # never a partial or empty jobs.json
    monkeypatch.undo()
    jobs.save()
    assert set(_Jobs(path).data) == {"a", "b"}


# --- the real cluster ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
def test_same_results_as_the_local_executor(cluster, tmp_path):
    """(a) several configurations, (c) a raising one ends failed with its error; re-running submits nothing;
    an ok notebook that records nothing leaves its status row (issue 11)."""
    from perfkit.run.sweep.slurm import run_slurm_sweep

    spec = SweepSpec(parts=(
        SweepPart(notebook=MODES, grid={"mode": ["ok", "raise", "memory_error", "skip", "write_then_raise"]}),
        SweepPart(notebook=TRIVIAL, grid={"x": [1, 2]}),
        SweepPart(notebook=NO_RECORD, grid={"x": [5]}),
    ), slurm={"partition": cluster.partition, "cpus_per_task": 1})
    configs = expand(spec)
    t0 = time.monotonic()
    local = run_sweep(spec, tmp_path / "local", workers=2, progress=False)
    t_local = time.monotonic() - t0
    t0 = time.monotonic()
    remote = run_slurm_sweep(spec, configs, tmp_path / "slurm", progress=False, poll_s=(0.5, 2.0))
    t_slurm = time.monotonic() - t0
    print(f"\nlocal (2 workers) {t_local:.1f} s, slurm (2 CPUs) {t_slurm:.1f} s for {len(configs)} configurations")

    assert remote.total == len(configs) == 8 and remote.already_done == 0
    status = {o.config_id: o.status for o in remote.outcomes}
    assert status == {o.config_id: o.status for o in local.outcomes}
    assert sorted(status.values()) == ["failed", "failed", "ok", "ok", "ok", "ok", "oom", "skipped"]
    assert remote.exit_code == local.exit_code == 1
    pd.testing.assert_frame_equal(_table(tmp_path / "slurm"), _table(tmp_path / "local"))
    silent = next(c for c in configs if c.notebook == NO_RECORD)
    rows = perfkit.load(tmp_path / "slurm")
    assert list(rows[rows["config_id"] == silent.config_id]["status"]) == ["ok"]

    # (c) the raising configuration: its error, cell and traceback, as the local executor has them.
    raised = next(c for c in configs if c.params.get("mode") == "raise")
    outcome = next(o for o in remote.outcomes if o.config_id == raised.config_id)
    assert (outcome.status, outcome.error_name, outcome.message) == ("failed", "ValueError", "boom at batch_size=1")
    assert outcome.cell is not None
    nb = json.loads(outcome.output_notebook.read_text())
    assert any("ValueError" in "".join(o.get("traceback", [])) for c in nb["cells"] for o in c.get("outputs", []))
    rows = perfkit.load(tmp_path / "slurm")
    assert "ValueError: boom at batch_size=1" in rows[rows["config_id"] == raised.config_id]["reason"].iloc[0]

    # Every task ran through the ledger (running, then its ending) on a Slurm slot.
    for c in configs:
        events = [e for e in Ledger(tmp_path / "slurm").events() if e.config_id == c.config_id]
        assert [e.status for e in events][0] == "running" and len(events) == 2
        assert events[0].slot.startswith("slurm:")
    jobs = json.loads((tmp_path / "slurm" / "slurm" / "jobs.json").read_text())["configs"]
    assert len({j["job_id"].split("_")[0] for j in jobs.values()}) == 1  # ONE job array

    # Issue 45: the busy share of the allocations, from sacct, in the result and the ledger.
    busy = remote.busy
    assert busy is not None and busy.executor == "Slurm" and busy.held_from == "sacct"
    assert set(busy.held_s) == {j["job_id"] for j in jobs.values()}
    finals = {e.config_id: e for e in Ledger(tmp_path / "slurm").events() if e.status != "running"}
    for cid, job in jobs.items():
        e = finals[cid]
        assert busy.held_s[job["job_id"]] >= e.end - e.start  # an allocation holds at least its attempt
        if e.window_start is not None:
            assert busy.measured_s[job["job_id"]] == pytest.approx(e.window_end - e.window_start)
    assert 0 < busy.share < 1 and busy.configs == len(busy.measured_s) >= 6
    assert busy.line().startswith(f"device busy {busy.share:.2f} of 8 Slurm allocations'")
    assert read_summaries(tmp_path / "slurm")[-1].held_s == busy.held_s

    again = run_slurm_sweep(spec, configs, tmp_path / "slurm", progress=False)
    assert again.already_done == 8 and again.outcomes == []
    assert json.loads((tmp_path / "slurm" / "slurm" / "jobs.json").read_text())["configs"] == jobs


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_time_limit_ends_timeout(cluster, tmp_path):
    """(b) Slurm, not perfkit, kills it (no timeout_s; 1-minute limit; the notebook sleeps 10)."""
    from perfkit.run.sweep.slurm import run_slurm_sweep

    spec = SweepSpec(parts=(SweepPart(notebook=MODES, parameters={"mode": "sleep", "sleep_s": 600.0}),),
                     slurm={"partition": cluster.partition, "time_limit_min": 1})
    (c,) = expand(spec)
    assert c.timeout_s is None
    t0 = time.monotonic()
    result = run_slurm_sweep(spec, [c], tmp_path, progress=False, poll_s=(1.0, 3.0))
    elapsed = time.monotonic() - t0
    print(f"\ntime limit 1 min: the driver reported timeout after {elapsed:.1f} s")
    (outcome,) = result.outcomes
    assert outcome.status == "timeout" and outcome.error_name == "SlurmTimeout", outcome
    assert 55 < elapsed < 200
    assert _final(tmp_path, c.config_id) == [(1, "running"), (1, "timeout")]
    rows = perfkit.load(tmp_path)
    assert list(rows["status"]) == ["timeout"] and "time limit" in rows["reason"].iloc[0]
    nb = json.loads(outcome.output_notebook.read_text())
    assert "timeout" in "".join(nb["cells"][0]["source"])  # the banner
    assert cluster.sacct_state(Ledger(tmp_path).state()[c.config_id].slot.split(":")[1]) == "TIMEOUT"
    # timeout is not re-run by a plain resume, only with retry_failed.
    assert run_slurm_sweep(spec, [c], tmp_path, progress=False).already_done == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crashing_task_ends_failed_with_its_traceback(cluster, tmp_path):
    """(c) the task itself dies (a broken perfkit on the node): Slurm FAILED → failed + traceback."""
    from perfkit.run.sweep.slurm import run_slurm_sweep

    shadow = tmp_path / "shadow" / "perfkit"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise RuntimeError('broken perfkit install on the node')\n")
    spec = SweepSpec(parts=(SweepPart(notebook=TRIVIAL, grid={"x": [3]}),),
                     slurm={"partition": cluster.partition, "time_limit_min": 2,
                            # not the checkout as working directory: its perfkit/ would come first
                            "sbatch_options": {"chdir": str(tmp_path)},
                            "setup": [f"export PYTHONPATH={shadow.parent}:$PYTHONPATH"]})
    (c,) = expand(spec)
    result = run_slurm_sweep(spec, [c], tmp_path / "out", progress=False, poll_s=(0.5, 2.0))
    (outcome,) = result.outcomes
    assert outcome.status == "failed" and outcome.error_name == "RuntimeError", outcome
    assert "broken perfkit install on the node" in outcome.message and "Traceback" in outcome.message
    rows = perfkit.load(tmp_path / "out")
    assert list(rows["status"]) == ["failed"] and "broken perfkit install" in rows["reason"].iloc[0]
    assert rows["x"].iloc[0] == 3  # the status row carries the configuration's parameters
    assert _final(tmp_path / "out", c.config_id) == [(1, "failed")]
    assert result.exit_code == 1


def _driver(spec: Path, out: Path, cluster: SlurmCluster, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--executor", "slurm",
           "--quiet", "--partition", cluster.partition, "--cpus-per-task", "1", "--time-limit-min", "5",
           "--sbatch-option", "comment=perfkit-test"]
    return subprocess.Popen(cmd, env=cluster.full_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=sigint_default)  # a test sends it Ctrl-C


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_scancel_ends_killed_ctrl_c_leaves_tasks_and_resume_reattaches(cluster, tmp_path):
    """(d) scancel → killed, run again on resume; Ctrl-C leaves the other task running and the
    next driver re-attaches to it instead of resubmitting; (e) every step bounded."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(MODES), "parameters": {"mode": "sleep", "sleep_s": 40.0},
                                    "grid": {"label": ["a", "b"]}}))
    cid = {c.params["label"]: c.config_id for c in expand(perfkit.run.sweep.load_spec(spec))}
    out = tmp_path / "out"
    jobs_file = out / "slurm" / "jobs.json"
    t0 = time.monotonic()
    first = _driver(spec, out, cluster, tmp_path / "driver1.log")
    try:
        _wait_for("both tasks running", lambda: all(_final(out, i) == [(1, "running")] for i in cid.values()),
                  timeout=120)
        jobs = json.loads(jobs_file.read_text())["configs"]
        cluster.run("scancel", jobs[cid["a"]]["job_id"])
        _wait_for("the driver records a's ending", lambda: len(_final(out, cid["a"])) == 2, timeout=60)
        assert _final(out, cid["a"]) == [(1, "running"), (1, "killed")]
        rows = perfkit.load(out)
        assert "CANCELLED" in rows[rows["config_id"] == cid["a"]]["reason"].iloc[0]
        first.send_signal(signal.SIGINT)
        rc = first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    said = (tmp_path / "driver1.log").read_text()
    assert rc == 130, said
    assert "re-attach" in said and f"scancel {jobs[cid['a']]['job_id'].split('_')[0]}" in said
    assert cluster.sacct_state(jobs[cid["b"]]["job_id"]) == "RUNNING"  # Ctrl-C left it running
    t_interrupt = time.monotonic() - t0

    second = _driver(spec, out, cluster, tmp_path / "driver2.log")
    try:
        rc = second.wait(timeout=240)
    finally:
        if second.poll() is None:
            second.kill()
    said = (tmp_path / "driver2.log").read_text()
    assert rc == 0, said
    assert "sweep: 2 run (ok 2), 0 already done" in said
    again = json.loads(jobs_file.read_text())["configs"]
    assert again[cid["b"]] == jobs[cid["b"]]  # re-attached, not resubmitted
    assert again[cid["a"]]["job_id"] != jobs[cid["a"]]["job_id"] and again[cid["a"]]["attempt"] == 2
    assert _final(out, cid["a"]) == [(1, "running"), (1, "killed"), (2, "running"), (2, "ok")]
    assert _final(out, cid["b"]) == [(1, "running"), (1, "ok")]
    rows = perfkit.load(out)
    assert sorted(rows["status"]) == ["ok", "ok"]  # the killed attempt's row is gone
    print(f"\nscancel+Ctrl-C after {t_interrupt:.1f} s; resume done after {time.monotonic() - t0:.1f} s")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_ab_sweep_runs_each_variant_and_round_as_its_own_task(cluster, tmp_path):
    """Issue 14: variants and rounds on Slurm, each (configuration, variant, round) a task of the
    array, its kernel in the variant's environment, its rows tagged."""
    from perfkit.run.sweep.slurm import run_slurm_sweep
    from perfkit.run.sweep.variants import Variant

    probe = Path(__file__).parent / "notebooks" / "ab_probe.ipynb"
    spec = SweepSpec(parts=(SweepPart(notebook=probe, grid={"x": [1]}),), rounds=2,
                     variants=(Variant(name="a", env={"AB_MARK": "side-a"}),
                               Variant(name="b", env={"AB_MARK": "side-b"}, parameters={"label": "from-b"})),
                     slurm={"partition": cluster.partition, "cpus_per_task": 1})
    configs = expand(spec)
    result = run_slurm_sweep(spec, configs, tmp_path / "out", progress=False, poll_s=(0.5, 2.0))
    assert result.exit_code == 0 and sorted(o.status for o in result.outcomes) == ["ok"] * 4
    rows = perfkit.load(tmp_path / "out")
    assert sorted(zip(rows["variant"], rows["round"])) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert (rows["ab_mark"] == "side-" + rows["variant"]).all()
    assert (rows["label_seen"] == rows["variant"].map({"a": "a", "b": "from-b"})).all()
    state = Ledger(tmp_path / "out").state()
    assert {(e.variant, e.round) for e in state.values()} == {("a", 1), ("a", 2), ("b", 1), ("b", 2)}
    assert all(e.slot.startswith("slurm:") for e in state.values())


SLEEP = Path(__file__).parent / "notebooks" / "sleep.ipynb"


@pytest.mark.slow
def test_advise_verify_runs_its_experiment_as_a_slurm_job_array(cluster, tmp_path):
    """Issue 29: ``perfkit advise DIR --verify --executor slurm``: the experiment (a configuration
    as it ran, current against advised) runs as a job array and is judged as a local one is."""
    import argparse

    from perfkit.analyse.advice import Experiment, Finding
    from perfkit.run.sweep.cli import add_executor_arguments, executor_from_args, slurm_options
    from perfkit.view.advise_followup import verify

    folder = tmp_path / "dir"
    local = run_sweep(SweepSpec(parts=(SweepPart(notebook=SLEEP, grid={"delay_s": [0.02]}),)), folder,
                      progress=False)
    (config_id,) = [o.config_id for o in local.outcomes]
    finding = Finding(rule="test", constraint="sleeps too long", point="sleep", config_ids=(config_id,),
                      cost_share=0.5, evidence={}, summary="", advice="sleep less",
                      experiment=Experiment(notebook="sleep.ipynb", parameter="delay_s", current=0.02, proposed=0.005))
    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    # One task at a time, as a timing A/B should run: four tasks on this 2-core node, each importing
    # torch beside another's 5 ms sleeps, made a CI run's speedup interval 0.55-3.93x (inconclusive).
    executor = executor_from_args(parser.parse_args(["--executor", "slurm", "--partition", cluster.partition,
                                                     "--cpus-per-task", "1", "--array-parallelism", "1"]))
    assert executor.kind == "slurm" and executor.options["partition"] == cluster.partition
    (v,) = verify([finding], folder, top=1, rounds=2, executor=executor)
    assert v.verdict == "faster" and v.speedup > 2, v.text  # 20 ms against 5 ms a call
    ran = perfkit.load(v.folder)
    assert sorted(zip(ran["variant"], ran["round"])) == [("advised", 1), ("advised", 2), ("current", 1), ("current", 2)]
    # Every experiment configuration ran as a task of one Slurm array (the driver's record of its jobs).
    jobs = json.loads((v.folder / "slurm" / "jobs.json").read_text())["configs"]
    assert set(jobs) == set(ran["config_id"]) and len({r["job_id"].split("_")[0] for r in jobs.values()}) == 1, jobs
    assert json.loads((v.folder / "verdict.json").read_text())["verdict"] == "faster"
    with pytest.raises(BadInputError, match="only apply with --executor slurm"):
        slurm_options(parser.parse_args(["--partition", "x"]))
