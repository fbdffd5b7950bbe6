"""Interleaved A/B sweeps: variants (interpreter, environment, parameters) × rounds, for real.

Real papermill kernels of the A/B probe notebook; a second interpreter is a real venv whose
site-packages point at this one's; bad variants are refused with exit 2 before anything runs.
"""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

import perfkit
from perfkit.core.errors import BadInputError
from perfkit.run.sweep import Ledger, load_spec, run_sweep
from perfkit.run.sweep.spec import expand
from perfkit.run.sweep.variants import Variant, interleaved, kernel_env

PROBE = Path(__file__).parent / "notebooks" / "ab_probe.ipynb"


def sweep_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def write_spec(tmp_path, spec: dict) -> Path:
    path = tmp_path / "ab.yaml"
    path.write_text(yaml.safe_dump({"notebook": str(PROBE), **spec}))
    return path


def venv_python(where: Path, *, with_perfkit: bool) -> Path:
    """A real second interpreter: a venv; with perfkit when its site-packages include ours."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    if with_perfkit:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        # Our site-packages, and the checkout itself: an editable install's own .pth (an import
        # hook) is not run for a directory a .pth adds, so without it perfkit imports only when
        # the current directory happens to be the checkout.
        repo = Path(__file__).resolve().parents[1]
        Path(purelib, "perfkit-test-parent.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{repo}\n")
    return python


def test_interleaving_alternates_the_order_of_the_variants_every_round():
    a, b = Variant(name="a"), Variant(name="b")
    order = [(p, v.name, r) for p, v, r in interleaved(["p1", "p2"], [a, b], 3)]
    assert order == [("p1", "a", 1), ("p1", "b", 1), ("p2", "a", 1), ("p2", "b", 1),
                     ("p1", "b", 2), ("p1", "a", 2), ("p2", "b", 2), ("p2", "a", 2),
                     ("p1", "a", 3), ("p1", "b", 3), ("p2", "a", 3), ("p2", "b", 3)]


def test_a_variants_thread_count_is_the_thread_count_torch_uses():
    slot = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PERFKIT_SLOT": "cpu:0/1x2"}
    env = kernel_env(slot, Variant(name="one", env={"OMP_NUM_THREADS": "1"}))
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"  # MKL_NUM_THREADS would win in torch
    both = kernel_env(slot, Variant(name="both", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}))
    assert (both["OMP_NUM_THREADS"], both["MKL_NUM_THREADS"]) == ("1", "2")
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                          env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1"


@pytest.mark.slow
def test_each_configuration_runs_under_each_variant_and_round_interleaved(tmp_path):
    other = venv_python(tmp_path / "venv-b", with_perfkit=True)
    spec = write_spec(tmp_path, {
        "grid": {"x": [1, 2]},
        "variants": [{"name": "a", "env": {"AB_MARK": "side-a"}},
                     {"name": "b", "env": {"AB_MARK": "side-b", "OMP_NUM_THREADS": 1}, "python": str(other),
                      "parameters": {"label": "from-b"}}],
        "rounds": 2,
    })
    out = tmp_path / "out"
    done = sweep_cli(spec, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    df = perfkit.load(out)
    assert len(df) == 2 * 2 * 2 and set(df["status"]) == {"ok"}
    for row in df.itertuples():
        assert row.ab_mark == f"side-{row.variant}"
        assert row.label_seen == ("from-b" if row.variant == "b" else "a")
        assert (row.python == str(other)) == (row.variant == "b")
        assert json.loads(row.param_names) == (["x", "label"] if row.variant == "b" else ["x"])
        assert json.loads(row.variant_params) == (["label"] if row.variant == "b" else [])
    assert df[df["variant"] == "b"]["omp_threads"].eq("1").all()
    assert df[df["variant"] == "b"]["mkl_threads"].eq("1").all()
    assert sorted(zip(df["x_seen"], df["variant"], df["round"])) == sorted(
        (x, v, r) for x in (1, 2) for v in "ab" for r in (1, 2))
    # Run order (one slot): round 1 a then b, round 2 b then a, for each point.
    started = df.sort_values("started_at_unix")
    assert list(zip(started["x_seen"], started["variant"], started["round"])) == [
        (1, "a", 1), (1, "b", 1), (2, "a", 1), (2, "b", 1), (1, "b", 2), (1, "a", 2), (2, "b", 2), (2, "a", 2)]
    state = Ledger(out).state()
    assert len(state) == 8 and {(e.variant, e.round) for e in state.values()} == {
        (v, r) for v in "ab" for r in (1, 2)}
    # Resume: everything ended ok, nothing runs again.
    again = sweep_cli(spec, "--out", out, "--quiet")
    assert again.returncode == 0 and "0 run" in again.stdout and "8 already done" in again.stdout


@pytest.mark.slow
def test_rounds_without_variants_repeat_each_configuration(tmp_path):
    spec = load_spec(write_spec(tmp_path, {"grid": {"x": [1]}, "rounds": 3}))
    configs = expand(spec)
    assert [c.round for c in configs] == [1, 2, 3] and len({c.config_id for c in configs}) == 3
    result = run_sweep(spec, tmp_path / "out", progress=False)
    assert result.exit_code == 0
    df = perfkit.load(tmp_path / "out")
    assert sorted(df["round"]) == [1, 2, 3] and df["variant"].isna().all()


@pytest.mark.parametrize("variants, rounds, message", [
    ([{"name": "a"}], None, "at least two"),
    ([{"name": "a"}, {"name": "a", "env": {"X": 1}}], None, "unique"),
    ([{"name": "a b"}, {"name": "c"}], None, "variant name"),
    ([{"name": "a", "colour": "red"}, {"name": "b"}], None, "unknown key"),
    ([{"name": "a", "env": {"CUDA_VISIBLE_DEVICES": "1"}}, {"name": "b"}], None, "assigns devices"),
    ([{"name": "a", "env": {"X": "1"}}, {"name": "b", "env": {"X": "1"}}], None, "differ in nothing"),
    ([{"name": "a", "parameters": {"nope": 1}}, {"name": "b"}], None, "nope"),
    ([{"name": "a", "parameters": {"x": "text"}}, {"name": "b"}], None, "x"),
    ([{"name": "a", "python": "/no/such/python"}, {"name": "b"}], None, "does not exist"),
    ([{"name": "a", "env": {"X": "1"}}, {"name": "b"}], 0, "rounds"),
])
def test_bad_variants_exit_2_with_one_line_before_anything_runs(tmp_path, variants, rounds, message):
    spec = {"grid": {"x": [1]}, "variants": variants}
    if rounds is not None:
        spec["rounds"] = rounds
    out = tmp_path / "out"
    done = sweep_cli(write_spec(tmp_path, spec), "--out", out)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (out / "results").exists() and not (out / "ledger").exists()


def test_an_interpreter_without_perfkit_is_refused_before_anything_runs(tmp_path):
    bare = venv_python(tmp_path / "bare", with_perfkit=False)
    spec = write_spec(tmp_path, {"grid": {"x": [1]}, "variants": [{"name": "a"}, {"name": "b", "python": str(bare)}]})
    done = sweep_cli(spec, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert "cannot import perfkit" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "ledger").exists()
    with pytest.raises(BadInputError, match="No module named"):
        expand(load_spec(spec))
