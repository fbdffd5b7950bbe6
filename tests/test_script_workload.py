"""A user's unchanged script as a workload (issue 28, script workloads): tests/_scripts/train_script.py
is a training script written for these tests, with its own flags, loop and output; perfkit builds
its command line, runs it, reads its metrics, classifies its ending and ends every process of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import NOTEBOOKS, REPO
from perfkit.core.errors import BadInputError
from perfkit.measuring.script.command import ScriptConfig, build_argv, config_from_params, run_script

SCRIPT = str(REPO / "tests" / "_scripts" / "train_script.py")
MAPPINGS = {"batch_size": "--batch-size", "precision": {"bf16": "--bf16", "fp32": ""}, "steps": "--steps={value}"}


def _cfg(**kw) -> ScriptConfig:
    values = {"batch_size": 8, "precision": "fp32", "steps": 3, **kw.pop("values", {})}
    return ScriptConfig(command=kw.pop("command", [sys.executable, SCRIPT]), arg_mappings=kw.pop("arg_mappings", MAPPINGS),
                        values=values, **kw)


def test_the_command_line_is_built_from_the_parameters_through_the_mapping():
    cfg = _cfg(values={"precision": "bf16", "layers": [2, 4], "verbose": True, "quiet": False, "tag": None},
               arg_mappings={**MAPPINGS, "layers": "--layers", "verbose": "--verbose", "quiet": "--quiet", "tag": "--tag"})
    assert build_argv(cfg)[2:] == ["--batch-size", "8", "--bf16", "--steps=3", "--layers", "2", "4", "--verbose"]
    fp32 = _cfg(values={"precision": "fp32"})
    assert build_argv(fp32)[2:] == ["--batch-size", "8", "--steps=3"]
    placed = ScriptConfig(command=f"{sys.executable} -m torch.distributed.run --nproc-per-node {{world_size}} {SCRIPT}",
                          values={"world_size": 2})
    assert build_argv(placed)[1:5] == ["-m", "torch.distributed.run", "--nproc-per-node", "2"]


@pytest.mark.parametrize("kw, says", [
    ({"command": "no-such-program --x"}, "command 'no-such-program' is not found or not executable"),
    ({"arg_mappings": {"batch_sise": "--batch-size"}}, "arg_mappings names ['batch_sise'], which are not parameters"),
    ({"sources": ("regex",), "regex": "step ([0-9.]+) ms"}, "has no named group"),
    ({"sources": ("regex",), "regex": "step (?P<t>[0-9.]+ ms"}, "does not compile"),
    ({"sources": ("csv",)}, "source 'csv' needs csv_path"),
    ({"sources": ("stdout",)}, "metric source must be one of"),
    ({"arg_mappings": {"precision": {"bf16": "--bf16"}}}, "maps ['bf16'], not 'fp32'"),
    ({"command": "python3 {nprocs} x.py"}, "command names {nprocs}, which is not a parameter"),
    ({"timeout_s": 0}, "timeout_s must be a number of seconds > 0"),
])
def test_bad_settings_are_refused_with_one_line_before_anything_runs(kw, says):
    with pytest.raises(BadInputError, match=None) as err:
        _cfg(**kw)
    assert says in err.value.reason and "\n" not in err.value.reason


@pytest.mark.slow  # the script trains: it imports torch (seconds)
def test_a_run_reads_its_metrics_in_si_with_their_samples():
    row = run_script(_cfg(values={"batch_size": 16, "steps": 4}), echo=lambda line: None)
    assert row["status"] == "ok" and row["exit_code"] == 0, row["reason"]
    assert row["command"].endswith("--batch-size 16 --steps=4")
    assert len(row["step_time_samples_s"]) == 4 and row["step_time_s"] > 0  # step_time_ms lines, in seconds
    assert row["step_time_s"] == pytest.approx(sorted(row["step_time_samples_s"])[1:3][0] / 2
                                               + sorted(row["step_time_samples_s"])[1:3][1] / 2)
    assert row["performance_samples_per_s"] > 0 and set(row["metrics"]) == {"loss", "performance_samples_per_s",
                                                                           "step_time_s"}


@pytest.mark.parametrize("values, status, says", [
    ({"fail": True}, "failed", "the script exited 3:\nTraceback (most recent call last):\nValueError: the data path"),
    ({"oom": True}, "oom", "DefaultCPUAllocator: can't allocate memory"),
    ({"silent": True}, "failed", "no metric found in the script's output (tried performance, json; json lines start "
                                 "with 'PERFKIT_METRIC')"),
])
def test_how_a_script_ends_decides_its_row(values, status, says):
    mappings = {**MAPPINGS, **{k: f"--{k}" for k in values}}
    row = run_script(_cfg(values=values, arg_mappings=mappings), echo=lambda line: None)
    assert row["status"] == status and says in row["reason"], row["reason"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_script_past_its_deadline_ends_timeout_and_leaves_no_process():
    seen: list[str] = []
    started = time.monotonic()
    row = run_script(_cfg(values={"spawn": True, "sleep": 60.0}, arg_mappings={**MAPPINGS, "spawn": "--spawn",
                                                                             "sleep": "--sleep"}, timeout_s=3.0),
                     echo=seen.append)
    assert row["status"] == "timeout" and "timeout_s = 3 s" in row["reason"]
    assert time.monotonic() - started < 20
    child = int(next(line for line in seen if line.startswith("child pid")).split()[-1])
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), f"the script's child {child} outlived its configuration"


@pytest.mark.slow
def test_a_sweep_of_the_script_over_batch_and_precision_and_two_ranks_resumes(tmp_path):
    import yaml

    import perfkit

    spec = tmp_path / "script.yaml"
    base = {"arg_mappings": MAPPINGS, "steps": 3, "cwd": str(REPO / "tests" / "_scripts"), "timeout_s": 120.0}
    spec.write_text(yaml.safe_dump({
        "name": "script", "parts": [
            {"name": "grid", "notebook": str(NOTEBOOKS / "script.ipynb"),
             "parameters": {**base, "command": f"{sys.executable} train_script.py"},
             "grid": {"batch_size": [8, 32], "precision": ["fp32", "bf16"]}},
            {"name": "ranks", "notebook": str(NOTEBOOKS / "script.ipynb"), "devices_per_config": 2,
             "parameters": {**base, "batch_size": 8, "world_size": 2,
                            # its logs in the test's folder (torchrun's default, a new /tmp/torchelastic_*, stays)
                            "command": f"{sys.executable} -m torch.distributed.run --standalone "
                                       f"--log-dir {tmp_path / 'torchrun-logs'} "
                                       "--nproc-per-node {world_size} train_script.py"}}]}))
    out = tmp_path / "out"
    run = [sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet", "--workers", "2"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = perfkit.load(out)
    assert len(rows) == 5 and set(rows["status"]) == {"ok"}
    assert sorted(zip(rows["batch_size"], rows["precision"].fillna("-"))) == [
        (8, "-"), (8, "bf16"), (8, "fp32"), (32, "bf16"), (32, "fp32")]
    assert (rows["performance_samples_per_s"] > 0).all() and rows["step_time_samples_s"].map(len).eq(3).all()
    assert rows["command"].str.contains("--bf16").sum() == 2
    assert rows.loc[rows["world_size"] == 2, "command"].str.contains("--nproc-per-node 2").all()
    again = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and len(perfkit.load(out)) == 5  # resume: nothing ran again


@pytest.mark.slow
def test_an_ab_of_the_script_over_two_environment_variables_gives_a_compare_verdict(tmp_path):
    # The script reads TRAIN_SCRIPT_STEP_DELAY_S as real scripts read NCCL_* or TORCH_*: the
    # variants set it on the kernel, and the script, the kernel's child, inherits it. A 200 ms
    # delay in a step of a few ms must come out `slower` on the step time (exit 1, the gate's fail).
    import yaml

    spec = tmp_path / "ab.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "script-ab", "notebook": str(NOTEBOOKS / "script.ipynb"), "rounds": 2,
        "parameters": {"command": f"{sys.executable} train_script.py", "cwd": str(REPO / "tests" / "_scripts"),
                       "arg_mappings": MAPPINGS, "steps": 6, "batch_size": 8, "timeout_s": 120.0},
        # One thread each: a 2-thread torch step spinning against the suite's other workers went
        # from 1 ms to tens of ms, and a 30 ms delay read 0.7x ("inconclusive") in a CI run.
        "variants": [{"name": "base", "env": {"TRAIN_SCRIPT_STEP_DELAY_S": "0", "OMP_NUM_THREADS": "1"}},
                     {"name": "delayed", "env": {"TRAIN_SCRIPT_STEP_DELAY_S": "0.2", "OMP_NUM_THREADS": "1"}}]}))
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "perfkit.cli"]
    done = subprocess.run([*cli, "sweep", str(spec), "--out", str(out), "--quiet"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = tmp_path / "verdict.json"
    md = tmp_path / "comment.md"
    compared = subprocess.run([*cli, "compare", str(out), "--by", "variant", "--base", "base", "--json", str(verdict),
                               "--markdown", str(md), "--advice"], capture_output=True, text=True, timeout=120)
    assert compared.returncode == 1, compared.stdout + compared.stderr  # 1: a point is slower
    points = json.loads(verdict.read_text())["points"]
    assert [(p["metric"], p["verdict"]) for p in points] == [("step_time_s", "slower")], points
    assert points[0]["ratio"] > 2  # 200 ms added to a step of a few ms
    # --advice: the comment also says what binds the new side (issue 29); a script's own metrics
    # are not a workload any rule reads, so it says that plainly or flags its noise.
    comment = md.read_text()
    assert "slower" in comment and f"### perfkit advise: `{out} (variant != base)`" in comment


@pytest.mark.slow  # a perfkit process
def test_the_notebook_refuses_a_command_that_does_not_exist_with_exit_2(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(NOTEBOOKS / "script.ipynb"), "--out", str(out),
                           "-p", "command", "no-such-trainer --epochs 1"], capture_output=True, text=True, timeout=120,
                          env={**os.environ})
    assert proc.returncode == 2, proc.stderr
    assert "command 'no-such-trainer' is not found" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert json.loads((NOTEBOOKS / "script.ipynb").read_text())["metadata"]["perfkit"]["check"].endswith(":check_params")
    with pytest.raises(BadInputError, match="unknown parameters"):
        config_from_params(command="x", arg_mappings={}, args={}, env={}, cwd=None, timeout_s=1.0, sources=["json"],
                           json_prefix="P", regex=None, csv_path=None, batch=1)


def test_the_script_template_checks_every_configuration(tmp_path, capsys):
    # templates/script.yaml names tests/_scripts from notebooks/, where kernels run (and the check).
    from perfkit.cli import main

    assert main(["sweep", str(REPO / "templates" / "script.yaml"), "--out", str(tmp_path), "--dry-run"]) == 0
    assert "5 configurations, 5 to run" in capsys.readouterr().out


@pytest.mark.slow  # a sweep: a kernel
def test_a_failed_script_says_why_on_the_sweep_s_console(tmp_path):
    # Issue 47: the summary said only "ExecutionFailed: failed: script failed: (cell 3)"; the row knows.
    import yaml

    spec = tmp_path / "fail.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "script-fails", "notebook": str(NOTEBOOKS / "script.ipynb"),
        "parameters": {"command": f"{sys.executable} -c \"import perfkit_no_such_module\"", "timeout_s": 60.0}}))
    done = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "out"),
                           "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "why: ModuleNotFoundError: No module named 'perfkit_no_such_module'" in done.stdout, done.stdout


ARGV_SCRIPT = REPO / "tests" / "_scripts" / "print_argv.py"


def _argv_seen(cfg) -> list[str]:
    seen: list[str] = []
    row = run_script(cfg, echo=seen.append)
    assert row["status"] == "ok", row["reason"]
    return json.loads(next(line for line in seen if line.startswith("ARGV "))[5:])


@pytest.mark.parametrize("command, mappings, args, want", [
    # A YAML mapping as an args value: JSON, one argument (it went as the Python repr).
    ("{py} {script}", {"opt": "--opt"}, {"opt": {"betas": [0.9, 0.95]}}, ["--opt", '{"betas": [0.9, 0.95]}']),
    # A template: the JSON stays one argument (it was split on its spaces).
    ("{py} {script}", {"opt": "--opt={value}"}, {"opt": {"lr": 0.1, "wd": 0}}, ['--opt={"lr": 0.1, "wd": 0}']),
    # Braces in the command that name no parameter stay as written (they were read as placeholders).
    ("{py} {script} --overrides '{{\"lr\": 0.1}}' model.layers={{4,8}} d={{}}", {}, {},
     ['--overrides', '{"lr": 0.1}', 'model.layers={4,8}', 'd={}']),
    # A parameter in the command, and the escape for a literal {name}.
    ("{py} {script} --depth {{depth}} --literal {{{{depth}}}}", {}, {"depth": 4}, ["--depth", "4", "--literal", "{depth}"]),
], ids=["yaml-mapping", "template-json", "braces-in-command", "named-and-escaped"])
def test_each_form_of_argument_reaches_the_script_intact(command, mappings, args, want):
    cmd = command.format(py=sys.executable, script=ARGV_SCRIPT)
    cfg = config_from_params(command=cmd, arg_mappings=mappings, args=args, env={}, cwd=None, timeout_s=60.0,
                             sources=["performance"], json_prefix="PERFKIT_METRIC", regex=None, csv_path=None)
    assert _argv_seen(cfg) == want


def test_a_misspelt_parameter_in_the_command_is_refused_with_its_escape():
    with pytest.raises(BadInputError, match=r"command names \{dpeth\}.*write \{\{dpeth\}\} for a literal"):
        config_from_params(command=f"{sys.executable} {ARGV_SCRIPT} --depth {{dpeth}}", arg_mappings={},
                           args={"depth": 4}, env={}, cwd=None, timeout_s=60.0, sources=["performance"],
                           json_prefix="PERFKIT_METRIC", regex=None, csv_path=None)
