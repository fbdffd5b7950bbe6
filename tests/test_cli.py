"""The CLI on real notebooks and real papermill kernels."""

import json
import subprocess
import sys

import pytest

import perfkit
from conftest import NOTEBOOKS


def perfkit_cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def test_env_json_has_the_fingerprint():
    out = perfkit_cli("env", "--json")
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    for key in ("python", "torch", "device_kind", "device_name", "cpu_model", "hostname", "git_sha",
                "git_dirty", "perfkit", "env_vars"):
        assert key in facts
    assert facts["device_kind"] == "cpu"


def test_env_records_perf_env_vars(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("UNRELATED_THING", "x")
    facts = perfkit.fingerprint()
    assert facts["env_vars"]["NCCL_ALGO"] == "Ring" and facts["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert "UNRELATED_THING" not in facts["env_vars"]


def test_unknown_parameter_exits_2_and_runs_nothing(tmp_path):
    out = perfkit_cli("run", NOTEBOOKS / "gemm.ipynb", "--out", tmp_path / "o", "-p", "size", "[64]")
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()
    assert len(line) == 1 and "unknown parameter 'size'" in line[0]
    assert "sizes" in line[0] and "dtypes" in line[0]  # lists the valid names
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,message", [
    (["-p", "sizes", "64"], "expects list"),
    (["-p", "min_run_time_s", "fast"], "expects float"),
])
def test_bad_parameter_value_exits_2(tmp_path, args, message):
    out = perfkit_cli("run", NOTEBOOKS / "gemm.ipynb", "--out", tmp_path / "o", *args)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,message", [
    (["-p", "parallelism", "pp", "-p", "world_size", "2", "-p", "n_microbatches", "0"],
     "n_microbatches must be an integer >= 1"),
    (["-p", "parallelism", "ddp", "-p", "world_size", "2", "-p", "batch_size", "7"],
     "does not split over 2 data-parallel ranks"),
])
def test_a_value_the_notebook_would_refuse_exits_2_before_a_kernel_starts(tmp_path, args, message):
    """train_step.ipynb names its value check in its metadata (perfkit.check): the TrainConfig
    is built from the parameters before anything runs."""
    out = perfkit_cli("run", NOTEBOOKS / "train_step.ipynb", "--out", tmp_path / "o", *args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_sweep_with_one_bad_configuration_exits_2_before_any_runs(tmp_path):
    spec = tmp_path / "s.yaml"
    # world_size 2 alone is no configuration (parallelism 'none' needs 1): fixed parameters are
    # checked with each grid point, not alone; the one bad point (pp, 0 microbatches) fails all.
    spec.write_text(f"notebook: {NOTEBOOKS / 'train_step.ipynb'}\n"
                    "parameters: {world_size: 2, parallelism: pp}\n"
                    "grid: {n_microbatches: [2, 0]}\n")
    out = perfkit_cli("sweep", spec, "--out", tmp_path / "o")
    assert out.returncode == 2 and '"n_microbatches": 0}' in out.stderr, out.stderr
    assert "n_microbatches must be an integer >= 1" in out.stderr
    assert not (tmp_path / "o" / "results").exists()
    spec.write_text(spec.read_text().replace("[2, 0]", "[2, 4]"))
    out = perfkit_cli("sweep", spec, "--out", tmp_path / "o", "--dry-run")
    assert out.returncode == 0 and "2 configurations" in out.stdout, out.stderr


def test_a_notebook_value_check_that_cannot_load_is_bad_input(tmp_path):
    from perfkit.core.errors import BadInputError
    from perfkit.run.notebooks import check_params, read_notebook

    nb = json.loads((NOTEBOOKS / "gemm.ipynb").read_text())
    for target, message in (("no_colon", "must be 'module:function'"),
                            ("perfkit.nope:check", "cannot be loaded")):
        nb["metadata"]["perfkit"] = {"check": target}
        path = tmp_path / "nb.ipynb"
        path.write_text(json.dumps(nb))
        with pytest.raises(BadInputError, match=message):
            check_params(read_notebook(path), {})


def test_missing_notebook_exits_2(tmp_path):
    out = perfkit_cli("run", tmp_path / "nope.ipynb", "--out", tmp_path / "o")
    assert out.returncode == 2 and "not found" in out.stderr


@pytest.mark.slow
def test_run_gemm_end_to_end(tmp_path):
    out = perfkit_cli("run", NOTEBOOKS / "gemm.ipynb", "--out", tmp_path, "-p", "sizes", "[32, 64]",
                      "-p", "dtypes", '["fp32", "tf32"]', "-p", "min_run_time_s", "0.02")
    assert out.returncode == 0, out.stdout + out.stderr
    executed = list((tmp_path / "notebooks").glob("gemm-*.ipynb"))
    assert len(executed) == 1
    nb = json.loads(executed[0].read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in nb["cells"])
    df = perfkit.load(tmp_path)
    ok = df[df["status"] == "ok"]
    assert sorted(ok["size"]) == [32, 64] and set(ok["dtype"]) == {"fp32"}
    assert (ok["flop_per_s"] > 0).all()
    assert (ok["flop"] == 2 * ok["size"] ** 3).all()
    # tf32 cannot be honoured on a CPU: skipped with the reason, not silently run as fp32.
    skipped = df[df["dtype"] == "tf32"]
    assert set(skipped["status"]) == {"skipped"} and skipped["reason"].str.contains("tf32").all()
    # The parameters travel with every row.
    assert set(df["dtypes"]) == {'["fp32", "tf32"]'}
    report = perfkit_cli("report", tmp_path, "-o", tmp_path / "report.html")
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report.html").read_text()
    assert "GEMM throughput" in html and "Bokeh" in html
    assert "cdn.bokeh.org" not in html  # inlined: opens offline


@pytest.mark.slow
def test_peaks_json_lists_measured_and_theoretical_ceilings(tmp_path):
    out = perfkit_cli("peaks", "--json", "--device", "cpu", "--out", tmp_path)
    assert out.returncode == 0, out.stderr
    ceilings = json.loads(out.stdout)
    assert all({"kind", "value", "unit", "source", "origin"} <= set(c) for c in ceilings)
    compute = [c for c in ceilings if c["kind"] == "compute"]
    memory = [c for c in ceilings if c["kind"] == "memory"]
    assert {c["origin"] for c in compute} == {"measured", "theoretical"}  # side by side, never mixed
    assert all(c["dtype"] in {"fp64", "fp32", "bf16"} and c["unit"] == "FLOP/s" and c["value"] > 0 for c in compute)
    assert memory and all(c["level"] in {"L1", "L2", "L3", "DRAM"} and c["unit"] == "bytes/s" for c in memory)
    assert all(c["value"] > 0 for c in memory)
    # the measured compute ceilings say which searched matmul shape reached them
    assert all(c["m"] > 0 and c["n"] > 0 and c["k"] > 0 and "searched shapes" in c["source"]
               for c in compute if c["origin"] == "measured")
    # ...and they were recorded as rows
    rows = perfkit.load(tmp_path)
    assert set(rows["workload"]) == {"ceiling"} and len(rows) == len(ceilings)


@pytest.mark.parametrize("blocked", ["perfkit.run.sweep.engine", "perfkit.run.sweep.cli"])
def test_an_import_error_in_the_sweep_commands_surfaces(blocked):
    # A None entry in sys.modules makes `import NAME` raise ImportError (ModuleNotFoundError), as
    # a broken module or a missing dependency would. The CLI must show it, not quietly lose
    # `sweep` and `new`.
    code = (f"import sys; sys.modules[{blocked!r}] = None; "
            "from perfkit.cli import main; sys.exit(main(['sweep', '--help']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "ModuleNotFoundError" in out.stderr and blocked in out.stderr
    assert "invalid choice" not in out.stderr


def test_the_executor_flags_name_one_executor_with_its_settings():
    # One choice for `perfkit sweep` and `perfkit advise --verify`: the flags of the chosen
    # executor become its settings, another executor's flag is refused.
    import argparse

    from perfkit.core.errors import BadInputError
    from perfkit.run.sweep.cli import add_executor_arguments, executor_from_args
    from perfkit.run.sweep.executors import Executor

    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    assert executor_from_args(parser.parse_args([])) == Executor("local")
    slurm = executor_from_args(parser.parse_args(["--executor", "slurm", "--partition", "gpu", "--cpus-per-task", "4"]))
    assert (slurm.kind, slurm.options["partition"], slurm.options["cpus_per_task"]) == ("slurm", "gpu", 4)
    ray = executor_from_args(parser.parse_args(["--executor", "ray", "--ray-address", "127.0.0.1:6379"]))
    assert (ray.kind, ray.options["address"]) == ("ray", "127.0.0.1:6379")
    with pytest.raises(BadInputError, match="--partition only apply with --executor slurm"):
        executor_from_args(parser.parse_args(["--executor", "ray", "--partition", "gpu"]))
    with pytest.raises(ValueError, match="one of local, slurm, ray"):
        Executor("k8s")
    with pytest.raises(ValueError, match="takes no partition"):
        Executor("local", {"partition": "gpu"})
