"""nccl-tests/rccl-tests outputs as perfkit rows (issue 28, readers of native outputs): every
real fixture of its kind in ../shared/reference/native (its README says where each came from and
what is unusual), never made-up text; `perfkit import` into a results directory, and the report
drawing the imported rows in its collectives section."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from perfkit.core.errors import BadInputError
from perfkit.ingest import nccl_tests

# file -> (collective, ranks, device, NCCL/RCCL library version, tool version), for clean runs.
CLEAN = {
    "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt": ("all_reduce", 16, "NVIDIA H100 80GB HBM3", None, None),
    "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt": ("all_gather", 2, "NVIDIA GB10", "2.28.9", "2.18.5"),
    "nccl-tests-2.17.8-gh200-2node-allreduce-wrong-nonzero.txt": ("all_reduce", 2, "NVIDIA GH200 120GB", "2.29.2", "2.17.8"),
    "rccl-tests-3f7f785-mi100-2gpu-allreduce.txt": ("all_reduce", 2, "AMD Instinct MI100", None, "develop:3f7f785"),
    "rccl-tests-33cc4df-r9700-2node-allreduce.txt": ("all_reduce", 2, "AMD Radeon AI PRO R9700", None, "develop:33cc4df"),
    "rccl-tests-mi300x-vf-8gpu-allreduce.txt": ("all_reduce", 8, "AMD Instinct MI300X VF", None, None),
    "nccl-tests-legacy-a100-8gpu-broadcast-superbench.log": ("broadcast", 8, "A100-SXM4-40GB", None, None),
    "nccl-tests-legacy-a100-8gpu-reducescatter-superbench.log": ("reduce_scatter", 8, "A100-SXM4-40GB", None, None),
}
# Files older than v2.16.7 whose columns and busbw/algbw fit more than one collective: --op.
NEEDS_OP = {"nccl-tests-legacy-a100-8gpu-allgather-superbench.log": "all_gather",
            "nccl-tests-legacy-a100-8gpu-alltoall-superbench.log": "all_to_all"}
MLPERF_LOG = "mlperf-training-v5.1-amd-mi300x-llama2_70b_lora-result_0.txt"
ROW = re.compile(r"^\s*\d+\s+\d+\s+\w+\s")


def _text(reference_dir, name: str) -> str:
    return (reference_dir / "native" / name).read_text()


def _table_lines(text: str) -> list[list[str]]:
    """The file's result lines, split: what the test checks the rows against, read apart from
    the reader (only complete lines: 8 numeric-or-N/A cells at the end)."""
    return [line.split() for line in text.splitlines() if ROW.match(line) and len(line.split()) >= 11]


@pytest.mark.parametrize("name", sorted(CLEAN) + sorted(NEEDS_OP))
def test_every_clean_run_reads_row_for_row_with_perfkits_busbw_equal_to_the_printed_one(reference_dir, name):
    text = _text(reference_dir, name)
    run = nccl_tests.parse(text, source=name, op=NEEDS_OP.get(name))
    op, ranks, device, library, tool = CLEAN.get(name) or (NEEDS_OP[name], 8, "A100-SXM4-40GB", None, None)
    lines = _table_lines(text)
    assert len(run.rows) == 2 * len(lines) and run.finished
    assert {r["op"] for r in run.rows} == {op} and {r["world_size"] for r in run.rows} == {ranks}
    assert run.facts["device_name"] == device and run.facts.get("nccl") == library
    assert run.facts.get("tool_version") == tool
    assert run.facts["backend"] == ("rccl" if name.startswith("rccl") else "nccl")
    for row, cells in zip(run.rows[::2] + run.rows[1::2], lines + lines):
        form = cells[-4:] if row["inplace"] else cells[-8:-4]
        time_us, algbw, busbw = float(form[0]), float(form[1]), float(form[2])
        assert row["size_bytes"] == int(cells[0]) and row["time_s"] == pytest.approx(time_us * 1e-6)
        assert row["busbw_reported_bytes_per_s"] == pytest.approx(busbw * 1e9)
        # perfkit's recomputation from size, time and the factor: equal within the printed digits.
        digits = 10.0 ** -len(form[2].partition(".")[2])
        rounding = row["busbw_bytes_per_s"] * 0.5 * 10.0 ** -len(form[0].partition(".")[2]) / time_us
        assert abs(row["busbw_bytes_per_s"] / 1e9 - busbw) <= 0.5 * digits + rounding + 1e-9, (row, form)
        assert abs(row["algbw_bytes_per_s"] / 1e9 - algbw) <= 0.5 * digits + rounding / 2 + 1e-9
        assert row["wrong_elements"] == (None if form[3] == "N/A" else int(form[3]))


def test_wrong_elements_fail_their_rows_only(reference_dir):
    name = "nccl-tests-2.17.8-gh200-2node-allreduce-wrong-nonzero.txt"
    run = nccl_tests.parse(_text(reference_dir, name), source=name)
    failed = {(r["size_bytes"], r["inplace"]): r for r in run.rows if r["status"] == "failed"}
    assert sorted(failed) == [(1048576, False), (1048576, True)]
    assert failed[1048576, False]["wrong_elements"] == 96 and failed[1048576, True]["wrong_elements"] == 32
    assert "96 wrong elements" in failed[1048576, False]["reason"]
    assert sum(r["status"] == "ok" for r in run.rows) == len(run.rows) - 2


@pytest.mark.parametrize("name, says", [
    ("rccl-tests-3f7f785-mi100-2gpu-allreduce-hang.txt", "no result rows: the run did not finish (the output stops "
                                                         "after the table header"),
    ("nccl-tests-2.17.8-gh200-8rank-cuda-busy-failure.txt", "the run failed before its table: gpu-1-1: Test CUDA "
                                                            "failure common.cu:1304 'CUDA-capable device(s) is/are busy"),
    ("nccl-tests-2.17.6-h800-2node-16rank-alltoall-illegal-memory-access.txt",
     "no result rows: the run did not finish (node0: Test CUDA failure common.cu:389 'an illegal memory access"),
    ("nccl-tests-h100-1024rank-allreduce-nccl-failure-excerpt.txt", "5 rows before it; its rows are not a complete "
                                                                    "run (--partial imports them marked failed)"),
])
def test_a_run_that_did_not_finish_is_refused_never_read_as_a_shorter_clean_run(reference_dir, name, says):
    with pytest.raises(BadInputError) as err:
        nccl_tests.parse(_text(reference_dir, name), source=name)
    assert says in err.value.reason and "\n" not in err.value.reason


def test_partial_keeps_an_unfinished_runs_rows_marked_failed_at_the_runs_world_size(reference_dir):
    # The poster cut the rank list at rank 99 of 1024: at 100 ranks no collective's busbw fits.
    name = "nccl-tests-h100-1024rank-allreduce-nccl-failure-excerpt.txt"
    with pytest.raises(BadInputError, match="at the 100 ranks it lists no collective's busbw/algbw fits"):
        nccl_tests.parse(_text(reference_dir, name), source=name, partial=True)
    run = nccl_tests.parse(_text(reference_dir, name), source=name, partial=True, world_size=1024, op="all_reduce")
    assert len(run.rows) == 10 and not run.finished
    assert {r["status"] for r in run.rows} == {"failed"}
    assert "Test NCCL failure common.cu:1204 'unhandled cuda error" in run.rows[0]["reason"]
    assert run.rows[0]["size_bytes"] == 2**30 and math.isclose(run.rows[0]["busbw_bytes_per_s"] / 1e9, 2 * 1023 / 1024 *
                                                                run.rows[0]["algbw_bytes_per_s"] / 1e9, rel_tol=1e-9)


def test_a_collective_the_file_does_not_name_is_inferred_or_asked_for(reference_dir):
    # Before 2.16.7 no line names the binary: all_reduce's 2(n-1)/n fits one collective alone.
    name = "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt"
    assert nccl_tests.parse(_text(reference_dir, name), source=name).rows[0]["op"] == "all_reduce"
    name = "nccl-tests-legacy-a100-8gpu-alltoall-superbench.log"
    with pytest.raises(BadInputError, match="fit all_gather, all_to_all: pass --op"):
        nccl_tests.parse(_text(reference_dir, name), source=name)
    # A wrong collective does not read: its message size (or its busbw) is not the row's.
    with pytest.raises(BadInputError, match=r"line 21: 1 float elements of all_reduce on 8 ranks are 4 B, "
                                            r"the row says 32 B"):
        nccl_tests.parse(_text(reference_dir, name), source=name, op="all_reduce")
    name = "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt"
    with pytest.raises(BadInputError, match="is all_gather's output .* not broadcast's"):
        nccl_tests.parse(_text(reference_dir, name), source=name, op="broadcast")


def _perfkit(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "perfkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_perfkit_import_adds_each_file_once_and_refuses_bad_files_with_one_line(reference_dir, tmp_path, capsys):
    import perfkit
    from perfkit.cli import main

    native = reference_dir / "native"
    out = tmp_path / "runs"
    files = [native / n for n in ("nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt",
                                  "rccl-tests-3f7f785-mi100-2gpu-allreduce.txt")]
    done = _perfkit("import", "nccl-tests", *map(str, files), "--out", str(out))  # the real command, once
    assert done.returncode == 0, done.stderr
    assert "2 files imported, 0 unchanged" in done.stdout
    rows = perfkit.load(out)
    assert len(rows) == 10 + 50 and set(rows["source"]) == {"nccl-tests"}
    by_device = rows.groupby("env_device_name")["env_fingerprint_id"].nunique()
    assert dict(by_device) == {"NVIDIA H100 80GB HBM3": 1, "AMD Instinct MI100": 1}  # the run's, not this machine's
    assert set(rows["source_sha256"].str.len()) == {64} and rows["source_path"].str.endswith((".txt",)).all()
    assert main(["import", "nccl-tests", str(files[0]), "--out", str(out)]) == 0
    assert "already imported, nothing added" in capsys.readouterr().out
    assert len(perfkit.load(out)) == 60
    # Bad input: exit 2, one line, nothing written (a good file named with a bad one included).
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for bad, says in [(native / "rccl-tests-3f7f785-mi100-2gpu-allreduce-hang.txt", "no result rows"),
                      (native / "vllm-0.25.1-bench-serve-opt125m-cpu.json", "is not nccl-tests output"),
                      (native / MLPERF_LOG, "is not nccl-tests output: no table header"),
                      (empty, "is empty"), (tmp_path / "missing.txt", "no such file")]:
        fresh = tmp_path / "fresh"
        assert main(["import", "nccl-tests", str(files[0]), str(bad), "--out", str(fresh)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
        assert not fresh.exists()
    assert main(["import", "vllm", str(files[0]), "--out", str(out)]) == 2
    assert "unknown kind 'vllm'" in capsys.readouterr().err


def test_the_report_draws_imported_runs_one_line_per_file_and_device(reference_dir, tmp_path):
    from perfkit.ingest.store import import_files
    from perfkit.view.plots.collectives import busbw_vs_size

    import perfkit

    native = reference_dir / "native"
    import_files("nccl-tests", [native / "rccl-tests-3f7f785-mi100-2gpu-allreduce.txt",
                                native / "nccl-tests-2.17.8-gh200-2node-allreduce-wrong-nonzero.txt"], tmp_path)
    rows = perfkit.load(tmp_path)
    plot = busbw_vs_size(rows)
    labels = {str(el.label) for el in plot.traverse() if getattr(el, "label", "")}
    # Two runs of all_reduce on 2 ranks, told apart by device and backend; the failed rows (#wrong
    # > 0) are not drawn as measurements.
    assert any("NVIDIA GH200 120GB" in label or "nccl×2" in label for label in labels), labels
    assert any("AMD Instinct MI100" in label or "rccl×2" in label for label in labels), labels
    from perfkit.view.report_page import write_report

    html = write_report(tmp_path, tmp_path / "r.html").read_text()
    assert "Collective bus bandwidth" in html and "AMD Instinct MI100" in html


def test_rccl_tests_json_lines_read_with_perfkits_busbw_equal_to_the_records(reference_dir):
    import json

    name = "rccl-tests-pr93-output_file-json-lines-excerpt.jsonl"
    text = _text(reference_dir, name)
    records = [json.loads(line) for line in text.splitlines()]
    run = nccl_tests.parse(text, source=name)
    assert len(run.rows) == len(records) == 5 and run.facts["backend"] == "rccl"
    for row, rec in zip(run.rows, records):
        assert (row["op"], row["world_size"], row["inplace"], row["size_bytes"]) == ("all_reduce", 4, bool(rec["inPlace"]),
                                                                                     rec["size"])
        assert row["busbw_bytes_per_s"] == pytest.approx(rec["busBw"] * 1e9, rel=1e-9)
        assert row["time_s"] == pytest.approx(rec["time"] * 1e-6) and row["wrong_elements"] == 0
    # A record whose busBw is not its collective's at its rank count is refused, naming it.
    with pytest.raises(BadInputError, match="record 1: busBw .* is not all_reduce of 1024 B .* on 8 ranks"):
        nccl_tests.parse(text, source=name, world_size=8)


# ------------------------------------------------------------------ files as users have them (issue 47)


def test_a_log_of_several_runs_is_split_each_with_its_own_collective_world_size_and_version(reference_dir):
    # What a loop over the binaries writes. A file of v2.16.7+ names each run's collective; today's
    # reader kept the last one for every row (the 16-rank all_reduce run read as all_gather: refused).
    first, second = "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt", "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt"
    text = _text(reference_dir, first) + _text(reference_dir, second)
    run = nccl_tests.parse(text, source="loop.log")
    assert [(p.rows[0]["op"], p.rows[0]["world_size"], p.facts.get("tool_version")) for p in run.parts] == \
        [("all_reduce", 16, None), ("all_gather", 2, "2.18.5")]
    alone = [nccl_tests.parse(_text(reference_dir, name)).rows for name in (first, second)]
    assert [r["busbw_bytes_per_s"] for r in run.rows] == [r["busbw_bytes_per_s"] for rows in alone for r in rows]
    assert {r["run_index"] for r in run.rows} == {1, 2} and len(run.rows) == sum(map(len, alone))


def test_legacy_logs_of_two_collectives_are_not_labelled_with_one_of_them(reference_dir):
    # The legacy all_gather log followed by the reduce_scatter one: neither names its collective; the
    # reader gave all 136 rows the op (--op all_gather labelled the reduce_scatter run all_gather too:
    # the same busbw factor and message size, so nothing caught it). --op now settles only a run that
    # more than one collective fits; the reduce_scatter run's redop column says what it is.
    text = (_text(reference_dir, "nccl-tests-legacy-a100-8gpu-allgather-superbench.log")
            + _text(reference_dir, "nccl-tests-legacy-a100-8gpu-reducescatter-superbench.log"))
    run = nccl_tests.parse(text, op="all_gather", source="c.log")
    ops = {}
    for r in run.rows:
        ops.setdefault(r["run_index"], set()).add(r["op"])
    assert ops == {1: {"all_gather"}, 2: {"reduce_scatter"}} and len(run.rows) == 136
    with pytest.raises(BadInputError, match=r"run 1 of 2, from line 1\).*fit all_gather, all_to_all: pass --op"):
        nccl_tests.parse(text, source="c.log")


@pytest.mark.parametrize("prefix", ["0: ", "[1,0]<stdout>:"], ids=["srun-l", "mpirun-tag-output"])
def test_a_launcher_s_line_prefixes_are_read_through(reference_dir, prefix):
    name = "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt"
    plain = nccl_tests.parse(_text(reference_dir, name))
    tagged = "".join(prefix + line for line in _text(reference_dir, name).splitlines(keepends=True))
    run = nccl_tests.parse(tagged, source="tagged.log")
    assert run.rows == plain.rows and run.facts == plain.facts


def test_perfkit_import_writes_each_run_with_its_own_fingerprint(reference_dir, tmp_path):
    from perfkit.core.results import load

    log = tmp_path / "loop.log"
    log.write_text(_text(reference_dir, "nccl-tests-nccl2.21.5-h100-2node-16rank-allreduce.txt")
                   + _text(reference_dir, "nccl-tests-2.18.5-gb10-2node-allgather-16G.txt"))
    out = subprocess.run([sys.executable, "-m", "perfkit.cli", "import", "nccl-tests", str(log), "--out",
                          str(tmp_path / "imp")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = load(tmp_path / "imp")
    by_run = rows.groupby("run_index").agg(op=("op", "first"), n=("world_size", "first"),
                                           device=("env_device_name", "first"), tool=("source_tool_version", "first"))
    got = by_run.to_dict("index")
    assert got[2] == {"op": "all_gather", "n": 2, "device": "NVIDIA GB10", "tool": "2.18.5"}
    assert (got[1]["op"], got[1]["n"], got[1]["device"]) == ("all_reduce", 16, "NVIDIA H100 80GB HBM3")
    assert got[1]["tool"] != got[1]["tool"]  # NaN: that run's file says no tool version
