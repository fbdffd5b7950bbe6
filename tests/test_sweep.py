"""The sweep engine with real papermill kernels: failure classes, resume, locking, bad input."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import perfkit
import perfkit.run.sweep
from perfkit.run.sweep import Ledger, SweepPart, SweepSpec, expand, run_sweep
from perfkit.run.sweep.engine import device_slots
from perfkit.run.sweep import slots
from perfkit.run import _teardown

MODES = Path(__file__).parent / "notebooks" / "modes.ipynb"
TRIVIAL = Path(__file__).parent / "notebooks" / "trivial.ipynb"


def sweep_cli(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, **kw)


def write_spec(tmp_path, spec: dict, name="spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def final_events(out):
    return [e for e in Ledger(out).events() if e.status != "running"]


@pytest.mark.slow
def test_failure_classes_each_for_real(tmp_path):
    spec = SweepSpec(parts=(
        SweepPart(notebook=MODES, timeout_s=300,
                  grid={"mode": ["ok", "raise", "memory_error", "cpu_oom", "die", "skip", "write_then_raise"]}),
        SweepPart(notebook=MODES, parameters={"sleep_s": 120.0}, timeout_s=8, grid={"mode": ["sleep"]}),
    ))
    t0 = time.monotonic()
    result = run_sweep(spec, tmp_path, workers=2, progress=False)
    elapsed = time.monotonic() - t0
    by_mode = {o.config_id: o for o in result.outcomes}
    cfgs = {c.params["mode"]: c.config_id for c in expand(spec)}
    status = {mode: by_mode[cid].status for mode, cid in cfgs.items()}
    assert status == {"ok": "ok", "raise": "failed", "memory_error": "oom", "cpu_oom": "oom", "sleep": "timeout",
                      "die": "killed", "skip": "skipped", "write_then_raise": "failed"}
    raised = by_mode[cfgs["raise"]]
    assert raised.error_name == "ValueError" and "boom at batch_size=1" in raised.message
    assert raised.cell is not None
    # The kernel of the sleeping configuration was killed within its limit + 10 s.
    assert by_mode[cfgs["sleep"]].duration_s < 8 + 10
    assert elapsed < 120  # nothing waited for the 120 s sleep
    # The executed notebook of a failed configuration is kept, with papermill's error banner.
    nb = json.loads(raised.output_notebook.read_text())
    assert any("An Exception was encountered" in "".join(c["source"]) for c in nb["cells"])
    killed_nb = json.loads(by_mode[cfgs["die"]].output_notebook.read_text())
    assert "killed" in "".join(killed_nb["cells"][0]["source"])
    # Every configuration leaves at least one row carrying its status.
    df = perfkit.load(tmp_path)
    for mode, cid in cfgs.items():
        rows = df[df["config_id"] == cid]
        assert status[mode] in set(rows["status"]), mode
        assert (rows["mode"] == mode).all()
    partial = df[df["config_id"] == cfgs["write_then_raise"]]
    assert sorted(partial["status"]) == ["failed", "ok"]  # its row, then the failure row
    assert "KeyError" in partial[partial["status"] == "failed"]["reason"].iloc[0]
    assert result.exit_code == 1


@pytest.mark.slow
def test_oom_ends_the_batch_size_axis(tmp_path):
    spec = SweepSpec(parts=(SweepPart(notebook=MODES, parameters={"mode": "oom_if_big"},
                                      grid={"batch_size": [1, 2, 4, 8, 16]}),))
    result = run_sweep(spec, tmp_path, workers=1, progress=False)
    statuses = {o.config_id: o.status for o in result.outcomes}
    by_bs = {c.params["batch_size"]: statuses[c.config_id] for c in expand(spec)}
    assert by_bs == {1: "ok", 2: "ok", 4: "oom", 8: "skipped", 16: "skipped"}
    df = perfkit.load(tmp_path)
    assert df[df["batch_size"] == 8]["reason"].iloc[0] == "batch_size=8 is past the OOM edge at 4"


@pytest.mark.slow
def test_resume_and_retry_failed(tmp_path):
    spec = write_spec(tmp_path, {"notebook": str(MODES), "grid": {"mode": ["ok", "raise"]}})
    out = tmp_path / "out"
    first = sweep_cli(spec, "--out", out, "--quiet")
    assert first.returncode == 1, first.stderr
    assert "failed" in first.stdout and "ValueError" in first.stdout
    again = sweep_cli(spec, "--out", out, "--quiet")
    assert again.returncode == 0 and "0 run" in again.stdout and "2 already done" in again.stdout
    retry = sweep_cli(spec, "--out", out, "--quiet", "--retry-failed")
    assert retry.returncode == 1 and "1 run" in retry.stdout
    attempts = [e.attempt for e in final_events(out) if e.params["mode"] == "raise"]
    assert attempts == [1, 2]
    # Rows hold the latest attempt only: one failure row, not two.
    df = perfkit.load(out)
    assert len(df[df["mode"] == "raise"]) == 1


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path):
    spec = write_spec(tmp_path, {"notebook": str(MODES), "parameters": {"mode": "sleep", "sleep_s": 1.5},
                                 "grid": {"batch_size": list(range(1, 9))}})
    out = tmp_path / "out"
    marker = f"PERFKIT_TEST_MARK_{uuid.uuid4().hex}"  # every process of the killed sweep inherits it
    proc = subprocess.Popen([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out),
                             "--workers", "2", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, marker: "1"})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if sum(e.status == "ok" for e in final_events(out)) >= 2:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the sweep made no progress")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # Its kernels, the running ones and those started ahead, end by themselves (their parent watch).
    deadline = time.monotonic() + 10
    while (left := _teardown.holders(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _teardown.reap(marker)
    assert not left, f"processes {left} of the killed sweep outlived it by 10 s"
    done_before = {e.config_id for e in final_events(out) if e.status == "ok"}
    assert 2 <= len(done_before) < 8
    resumed = sweep_cli(spec, "--out", out, "--workers", "2", "--quiet")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    oks = [e.config_id for e in final_events(out) if e.status == "ok"]
    assert len(oks) == 8 and len(set(oks)) == 8  # every configuration ended ok exactly once
    assert done_before.isdisjoint({e.config_id for e in final_events(out)
                                   if e.status == "ok" and e.attempt > 1 and e.config_id in done_before})
    df = perfkit.load(out)  # every results file loads
    assert sorted(df["batch_size"]) == list(range(1, 9))  # one row per configuration: none lost, none twice
    assert set(df["status"]) == {"ok"}


@pytest.mark.slow
def test_second_sweep_on_the_same_dir_is_refused(tmp_path):
    spec = write_spec(tmp_path, {"notebook": str(MODES), "parameters": {"mode": "sleep", "sleep_s": 20.0},
                                 "grid": {"batch_size": [1]}})
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any(e.status == "running" for e in Ledger(out).events()) and time.monotonic() < deadline:
            time.sleep(0.1)
        second = sweep_cli(spec, "--out", out, "--quiet", timeout=60)
        assert second.returncode == 2
        assert "another sweep is running" in second.stderr and f"pid {first.pid}" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)  # ends like Ctrl-C: kernel killed, ledger kept
        first.wait(timeout=60)
    events = list(Ledger(out).events())
    assert events[-1].status == "killed" and "interrupted" in events[-1].message


@pytest.mark.slow
def test_string_parameter_is_injected_as_a_literal(tmp_path):
    nasty = 'a"b\'c\nimport os; os._exit(3)\n"""\n\'\'\'\n{x}\\n'
    spec = SweepSpec(parts=(SweepPart(notebook=TRIVIAL, grid={"label": [nasty, "plain"]}),))
    result = run_sweep(spec, tmp_path, progress=False)
    assert {o.status for o in result.outcomes} == {"ok"}
    df = perfkit.load(tmp_path)
    assert set(df["label_seen"]) == {nasty, "plain"}


BAD_SPECS = {
    "unknown name": ({"notebook": str(MODES), "grid": {"modee": ["ok"]}}, "unknown parameter 'modee'"),
    "wrong type": ({"notebook": str(MODES), "grid": {"batch_size": ["big"]}}, "expects int"),
    "empty grid": ({"notebook": str(MODES), "grid": {"mode": []}}, "is empty"),
    "duplicate": ({"notebook": str(MODES), "grid": {"mode": ["ok", "ok"]}}, "duplicate configuration"),
    "missing notebook": ({"notebook": "nope.ipynb", "grid": {"mode": ["ok"]}}, "not found"),
    "no parameters cell": ({"notebook": "noparams.ipynb", "grid": {"x": [1]}}, "no cell tagged 'parameters'"),
    "unknown key": ({"notebook": str(MODES), "grids": {"mode": ["ok"]}}, "unknown key"),
    "bad timeout": ({"notebook": str(MODES), "grid": {"mode": ["ok"]}, "timeout_s": -1}, "timeout_s"),
    "all excluded": ({"notebook": str(MODES), "grid": {"mode": ["ok"]}, "exclude": [{"mode": "ok"}]}, "excluded"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_input_exits_2_before_anything_runs(tmp_path, case):
    spec, message = BAD_SPECS[case]
    nb = json.loads(TRIVIAL.read_text())
    for cell in nb["cells"]:
        cell["metadata"]["tags"] = []
    (tmp_path / "noparams.ipynb").write_text(json.dumps(nb))
    path = write_spec(tmp_path, spec)
    out = sweep_cli(path, "--out", tmp_path / "out", timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,message", [("notebook: [unclosed", "malformed YAML"),
                                          ("- just\n- a list", "YAML mapping"),
                                          ("!!python/object/apply:os.system ['echo pwned']", "malformed YAML")])
def test_malformed_yaml_exits_2(tmp_path, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    out = sweep_cli(path, "--out", tmp_path / "out", timeout=60)
    assert out.returncode == 2 and message in out.stderr and "pwned" not in out.stdout


def test_dry_run_prints_the_table_and_runs_nothing(tmp_path):
    spec = write_spec(tmp_path, {"notebook": str(MODES), "grid": {"mode": ["ok", "raise"], "batch_size": [1, 2]},
                                 "exclude": [{"mode": "raise", "batch_size": 2}]})
    out = sweep_cli(spec, "--out", tmp_path / "out", "--dry-run", timeout=60)
    assert out.returncode == 0
    assert out.stdout.count("modes-") == 3 and "3 to run" in out.stdout
    assert not (tmp_path / "out").exists()


def test_list_parameters_in_a_grid_need_lists(tmp_path):
    gemm = Path(__file__).parents[1] / "notebooks" / "gemm.ipynb"
    spec = write_spec(tmp_path, {"notebook": str(gemm), "grid": {"sizes": [64, 128]}})
    out = sweep_cli(spec, "--out", tmp_path / "out", timeout=60)
    assert out.returncode == 2 and "each value must itself be a list" in out.stderr


def test_device_slots_are_disjoint():
    gpus = device_slots(4, 2, gpu_ids=["0", "1", "2", "3", "4", "5", "6", "7"])
    assert [s["CUDA_VISIBLE_DEVICES"] for s in gpus] == ["0,1", "2,3", "4,5", "6,7"]
    assert all(s["HIP_VISIBLE_DEVICES"] == s["CUDA_VISIBLE_DEVICES"] for s in gpus)
    assert len(device_slots(8, 4, gpu_ids=[str(i) for i in range(8)])) == 2  # capped by the GPUs
    one_gpu = device_slots(2, 2, gpu_ids=["0"])  # wants 2, node has 1: one slot with the GPU it has
    assert [s["CUDA_VISIBLE_DEVICES"] for s in one_gpu] == ["0"]
    cpus = device_slots(2, 1, gpu_ids=[], cores=16)
    assert [s["OMP_NUM_THREADS"] for s in cpus] == ["8", "8"]


def test_perfkit_new_scaffolds_a_runnable_pair(tmp_path):
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "new", "mybench", "--dir", tmp_path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spec = yaml.safe_load((tmp_path / "mybench.yaml").read_text())
    assert spec["notebook"] == "mybench.ipynb"
    configs = expand(perfkit.run.sweep.load_spec(tmp_path / "mybench.yaml"))
    assert len(configs) == 6
    again = subprocess.run([sys.executable, "-m", "perfkit.cli", "new", "mybench", "--dir", tmp_path],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr


def test_status_for_error_maps_execution_failures():
    from perfkit.core.status import status_for_error

    assert status_for_error("ExecutionFailed", "timeout: Timeout: no result within 0.5 s") == "timeout"
    assert status_for_error("perfkit.core.errors.ExecutionFailed", "oom: OutOfMemoryError in cell 3: x") == "oom"
    assert status_for_error("ExecutionFailed", "weird text") == "failed"
    assert status_for_error("RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried") == "oom"
    assert status_for_error("OutOfMemoryError", "CUDA out of memory") == "oom"
    assert status_for_error("ValueError", "out of memory") == "failed"


def test_error_row_is_the_base_row_with_the_ending_status_and_error():
    from perfkit.core.errors import ConfigurationSkipped
    from perfkit.core.status import error_row

    base = {"config_id": "c", "error": None}
    assert error_row(base, ConfigurationSkipped("tf32 needs a GPU")) == \
        {"config_id": "c", "status": "skipped", "error": "tf32 needs a GPU"}
    oom = error_row(base, RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert oom["status"] == "oom" and oom["error"].startswith("builtins.RuntimeError: DefaultCPUAllocator")
    assert error_row(base, ValueError("x"))["status"] == "failed" and base["error"] is None


@pytest.mark.slow
def test_a_warming_kernel_runs_at_idle_priority_until_handed_a_configuration():
    # A slot's next kernel starts while the current configuration is measured on the same cores;
    # it must not perturb that measurement, then must measure at normal priority itself.
    from perfkit.run.execute import WarmKernel

    kernel = WarmKernel(preload=("import json",), background=True)
    try:
        pid = kernel.km.provisioner.pid
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        if not kernel.background:
            pytest.skip("this system does not allow SCHED_IDLE for child processes")
        assert all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in tids)
        assert kernel.foreground()
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        assert all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in tids)
    finally:
        kernel.shutdown()


@pytest.mark.slow
def test_no_prestart_runs_each_kernel_on_demand(tmp_path):
    spec = write_spec(tmp_path, {"notebook": str(TRIVIAL), "grid": {"x": [1, 2, 3]}})
    out = sweep_cli(spec, "--out", tmp_path / "out", "--prestart", "off", "--quiet")
    assert out.returncode == 0, out.stderr
    assert sorted(perfkit.load(tmp_path / "out")["x_seen"]) == [1, 2, 3]


def test_a_slot_warms_a_kernel_only_for_a_configuration_no_other_slot_warmed_for():
    # Two slots peeking at the same last configuration each warmed a kernel for it: one started,
    # imported and was killed for nothing (0.4 s of CPU at the end of every sweep, here).
    import queue

    from perfkit.run.sweep import engine

    class FakeSlot:
        def __init__(self, warmed=False):
            self.warmed, self.warmed_for = warmed, []

        def warm(self, variant, statement=None):
            self.warmed_for.append(variant)

    def waiting(*variants):
        q = queue.Queue()
        for v in variants:
            q.put(SimpleNamespace(variant=v))
        return q

    me, other = FakeSlot(), FakeSlot(warmed=True)
    slots.warm_next(me, [me, other], waiting("last"))  # the other slot's kernel is for it
    assert me.warmed_for == []
    slots.warm_next(me, [me, other], waiting("second-last", "last"))
    assert me.warmed_for == ["last"]
    alone = FakeSlot()
    slots.warm_next(alone, [alone, FakeSlot()], waiting("last"))
    assert alone.warmed_for == ["last"]
    slots.warm_next(alone, [alone], waiting())
    assert alone.warmed_for == ["last"]


@pytest.mark.slow
def test_every_kernel_of_a_prestarted_sweep_ends_with_it(tmp_path, monkeypatch):
    import perfkit.run.sweep.engine as engine

    started = []

    class Counted(slots.WarmKernel):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            started.append(self)

    monkeypatch.setattr(slots, "WarmKernel", Counted)
    spec = SweepSpec(parts=(SweepPart(notebook=TRIVIAL, grid={"x": [1, 2, 3, 4, 5]}),))
    result = run_sweep(spec, tmp_path, workers=2, progress=False, prestart=True)
    assert [o.status for o in result.outcomes] == ["ok"] * 5
    assert sorted(perfkit.load(tmp_path)["x_seen"]) == [1, 2, 3, 4, 5]
    assert 5 <= len(started) and all(not _teardown.holders(k.token) for k in started)


NO_RECORD = Path(__file__).parent / "notebooks" / "no_record.ipynb"


def test_a_kernel_that_fails_to_start_fails_its_configuration_not_the_sweep(tmp_path, monkeypatch):
    # Every configuration still ends with a ledger entry and a row, the slot goes on, exit code 1.
    import perfkit.run.sweep.engine as engine

    class NoKernel:
        def __init__(self, **kwargs):
            raise RuntimeError("kernel refused to start")

    monkeypatch.setattr(slots, "WarmKernel", NoKernel)
    spec = SweepSpec(parts=(SweepPart(notebook=TRIVIAL, grid={"x": [1, 2, 3]}),))
    for prestart in (False, True):
        out = tmp_path / f"prestart-{prestart}"
        result = run_sweep(spec, out, workers=1, progress=False, prestart=prestart)
        assert result.to_run == 3 and len(result.outcomes) == 3
        assert {o.status for o in result.outcomes} == {"failed"} and result.exit_code == 1
        state = Ledger(out).state()
        assert len(state) == 3 and {e.status for e in state.values()} == {"failed"}
        assert all("kernel refused to start" in e.message for e in state.values())
        df = perfkit.load(out)
        assert sorted(df["x"]) == [1, 2, 3] and set(df["status"]) == {"failed"}
        assert df["reason"].str.contains("kernel refused to start").all()


def test_an_engine_error_around_a_configuration_is_recorded(tmp_path, monkeypatch):
    import perfkit.run.sweep.engine as engine

    def broken_run_one(c, *args, **kwargs):
        raise OSError("the engine tripped")

    monkeypatch.setattr(engine, "run_one", broken_run_one)
    spec = SweepSpec(parts=(SweepPart(notebook=TRIVIAL, grid={"x": [1, 2]}),))
    result = run_sweep(spec, tmp_path, workers=1, progress=False)
    assert [o.status for o in result.outcomes] == ["failed", "failed"] and result.exit_code == 1
    assert {e.status for e in Ledger(tmp_path).state().values()} == {"failed"}
    assert sorted(perfkit.load(tmp_path)["x"]) == [1, 2]


def test_exit_code_counts_configurations_without_an_ending(tmp_path):
    from perfkit.run.execute import Outcome
    from perfkit.run.sweep import SweepResult

    ok = Outcome(config_id="a", status="ok", error_name=None, message=None, cell=None,
                 output_notebook=tmp_path / "a.ipynb", results_path=tmp_path / "a.parquet",
                 started_at=0.0, duration_s=0.0)
    assert SweepResult(out_dir=tmp_path, total=2, already_done=0, to_run=1, outcomes=[ok]).exit_code == 0
    assert SweepResult(out_dir=tmp_path, total=2, already_done=0, to_run=2, outcomes=[ok]).exit_code == 1


@pytest.mark.slow
def test_an_ok_notebook_that_records_nothing_leaves_a_row(tmp_path):
    spec = SweepSpec(parts=(SweepPart(notebook=NO_RECORD, grid={"x": [4]}),))
    result = run_sweep(spec, tmp_path, progress=False)
    assert [o.status for o in result.outcomes] == ["ok"] and result.exit_code == 0
    df = perfkit.load(tmp_path)
    assert len(df) == 1 and df["status"].iloc[0] == "ok" and df["x"].iloc[0] == 4
    assert df["config_id"].iloc[0] == result.outcomes[0].config_id


@pytest.mark.slow
def test_the_row_the_engine_writes_is_fingerprinted_as_its_kernel_ran_and_the_engine_never_imports_torch(tmp_path):
    """One configuration records its own row (its kernel's fingerprint), one records nothing (the
    engine writes its row): both rows describe the same environment — the slot's thread share,
    the notebook's git checkout — though the engine runs elsewhere (cwd outside any repository, no
    thread variable), and the engine describes it without the 1.5 s of importing torch."""
    spec = write_spec(tmp_path, {"parts": [{"notebook": str(TRIVIAL), "grid": {"x": [1]}},
                                           {"notebook": str(NO_RECORD), "grid": {"x": [2]}}]})
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    engine = ("import sys; from perfkit.cli import main; code = main(sys.argv[1:]);"
              "print('engine imported torch:', 'torch' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", engine, "sweep", str(spec), "--out", str(tmp_path / "out"),
                           "--workers", "2", "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "engine imported torch: False" in done.stdout
    rows = perfkit.load(tmp_path / "out").set_index("x")
    own, engines = rows.loc[1], rows.loc[2]
    assert "x_seen" in rows and own["x_seen"] == 1 and rows["x_seen"].isna()[2]  # who wrote which
    slot_threads = int(device_slots(2, 1, gpu_ids=[])[0]["OMP_NUM_THREADS"])
    assert engines["env_cpu_threads"] == own["env_cpu_threads"] == slot_threads
    assert engines["env_git_sha"] == own["env_git_sha"] is not None
    assert engines["env_fingerprint_id"] == own["env_fingerprint_id"]


def _entry(cid, status, attempt=1, **kw):
    from perfkit.run.sweep.ledger import LedgerEntry

    return LedgerEntry(config_id=cid, status=status, attempt=attempt, notebook="nb.ipynb", params={"x": 1}, **kw)


def test_ledger_one_file_per_writer_merged_on_read(tmp_path):
    # Two writers (two Slurm tasks on two nodes, the driver) never append to the same file.
    a, b = Ledger(tmp_path), Ledger(tmp_path)
    a.append(_entry("c1", "running"))
    b.append(_entry("c2", "running"))
    b.append(_entry("c2", "ok"))
    a.append(_entry("c1", "failed"))
    files = sorted((tmp_path / "ledger").iterdir())
    assert len(files) == 2 and not (tmp_path / "ledger.jsonl").exists()
    assert all(len(f.read_text().splitlines()) == 2 for f in files)
    reader = Ledger(tmp_path)
    assert [(e.config_id, e.status) for e in reader.events()] == [
        ("c1", "running"), ("c2", "running"), ("c2", "ok"), ("c1", "failed")]
    assert {cid: e.status for cid, e in reader.state().items()} == {"c1": "failed", "c2": "ok"}
    assert sorted((tmp_path / "ledger").iterdir()) == files  # a reader creates no file


def test_ledger_torn_last_line_is_skipped_and_attempts_beat_clocks(tmp_path):
    a = Ledger(tmp_path)
    a.append(_entry("c1", "running"))
    a.append(_entry("c1", "ok"))
    with open(a.path, "a") as fh:  # a SIGKILL in the middle of the next write
        fh.write('{"config_id": "c1", "status": "fail')
    assert Ledger(tmp_path).state()["c1"].status == "ok"
    a.append(_entry("c1", "running", attempt=2))  # the same writer goes on, on a fresh line
    assert Ledger(tmp_path).state()["c1"].status == "running"
    # A node whose clock is behind writes attempt 2's ending: the attempt, not the clock, decides.
    skewed = Ledger(tmp_path)
    skewed.append(_entry("c1", "ok", attempt=2))
    line = json.loads(skewed.path.read_text())
    line["written_at"] -= 3600
    skewed.path.write_text(json.dumps(line) + "\n")
    a.append(_entry("c1", "failed", attempt=1))  # a late settle of the old attempt
    assert Ledger(tmp_path).state()["c1"].status == "ok"


def test_ledger_reads_a_folders_older_single_file(tmp_path):
    old = [{"config_id": "c1", "status": "running", "attempt": 1, "notebook": "nb.ipynb", "params": {}},
           {"config_id": "c2", "status": "ok", "attempt": 1, "notebook": "nb.ipynb", "params": {}}]
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    assert {cid: e.status for cid, e in Ledger(tmp_path).state().items()} == {"c1": "running", "c2": "ok"}
    Ledger(tmp_path).append(_entry("c1", "killed"))  # resumed in the new layout
    ledger = Ledger(tmp_path)
    assert [e.status for e in ledger.events()] == ["running", "ok", "killed"]
    assert {cid: e.status for cid, e in ledger.state().items()} == {"c1": "killed", "c2": "ok"}
    assert (tmp_path / "ledger.jsonl").read_text().count("\n") == 2  # never written again


def test_an_ending_banner_survives_a_notebook_cut_off_mid_write(tmp_path):
    # papermill rewrites the executed notebook in place after each cell; a configuration's kill can
    # land in that write. Recording its ending (the banner) must neither fail on the torn file nor
    # lose what was written.
    import nbformat

    from perfkit.run.execute import banner

    whole = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    intact, torn = tmp_path / "intact.ipynb", tmp_path / "torn.ipynb"
    nbformat.write(whole, intact)
    text = nbformat.writes(whole)
    torn.write_text(text[: len(text) // 2])
    banner(intact, "ended killed")
    banner(torn, "ended killed")
    kept = nbformat.read(intact, as_version=4)
    assert [c.cell_type for c in kept.cells] == ["markdown", "code"] and "ended killed" in kept.cells[0].source
    redone = nbformat.read(torn, as_version=4)
    assert "ended killed" in redone.cells[0].source and "torn.ipynb.partial" in redone.cells[0].source
    assert (tmp_path / "torn.ipynb.partial").read_text() == text[: len(text) // 2]
