"""Queries at scale: perfkit.load with columns/filters pushed down to pyarrow.dataset, and
`perfkit query` (DuckDB over the Parquet files in place), on real results folders whose files
have different columns (rows of different notebooks)."""

import json
import sys

import pandas as pd
import pyarrow.dataset as ds
import pytest

import perfkit
from perfkit.cli import main
from perfkit.core import results
from perfkit.core.errors import BadInputError
from perfkit.core.results import RunContext, record, write_rows

# More files than one pushdown chunk (results_scan._CHUNK), so chunks lacking the filtered column exist.
N_GEMM, N_TRAIN = 70, 30


def _mixed_folder(root):
    """GEMM rows (size, dtype, flop_per_s) in the first files, training rows (batch_size,
    tokens_per_s, step_time_s) after them, a failed configuration, and a column whose type
    differs between files (null in some, text in others; int in some, float in others)."""
    for i in range(N_GEMM):
        ctx = RunContext(results_path=root / "results" / f"gemm-{i:03d}.parquet", config_id=f"gemm-{i:03d}",
                         params={"sizes": [64 * (i % 4 + 1)]}, notebook="gemm.ipynb")
        record([{"size": 64 * (i % 4 + 1), "dtype": dt, "time_s": 1e-5 * (i + 1),
                 "flop_per_s": 1e9 * (i + 1) + (dt == "bf16"), "note": None}
                for dt in ("fp32", "bf16")], context=ctx)
    for i in range(N_TRAIN):
        ctx = RunContext(results_path=root / "results" / f"train_step-{i:03d}.parquet", config_id=f"train_step-{i:03d}",
                         params={"batch_size": [4, 8, 16][i % 3], "precision": "bf16"}, notebook="train_step.ipynb")
        status = "failed" if i == 7 else "ok"
        # note: text here, null in the GEMM files; size: float here, int64 there
        record({"step_time_s": 0.01 * (i + 1), "tokens_per_s": 1000.0 * (i + 1), "size": 0.5,
                "step_time_samples_s": [0.01 * (i + 1)] * 5, "note": f"n{i}"},
               status=status, reason="boom" if status == "failed" else None, context=ctx)
    return root


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return _mixed_folder(tmp_path_factory.mktemp("mixed"))


def test_pushdown_equals_full_load_then_filter(mixed):
    full = perfkit.load(mixed)
    # the filtered column exists only in the training files (later chunks): a chunk without it
    # is scanned with the type the other chunks found, and its rows (null there) are not kept
    got = perfkit.load(mixed, columns=["config_id", "tokens_per_s"], filters=[("batch_size", "==", 8)])
    want = full.loc[full["batch_size"] == 8, ["config_id", "tokens_per_s"]].reset_index(drop=True)
    assert len(want) == N_TRAIN // 3
    pd.testing.assert_frame_equal(got, want)
    assert list(got.columns) == ["config_id", "tokens_per_s"]  # the columns asked for, in that order
    # a column some files lack is null there; types promoted across files (int64 + double → double)
    got = perfkit.load(mixed, columns=["size", "tokens_per_s", "note"], filters=[("size", ">=", 0)])
    want = full.loc[full["size"] >= 0, ["size", "tokens_per_s", "note"]].reset_index(drop=True)
    assert len(got) == 2 * N_GEMM + N_TRAIN and got["size"].dtype == "float64"
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert got["tokens_per_s"].isna().sum() == 2 * N_GEMM and got["note"].isna().sum() == 2 * N_GEMM
    assert got.attrs["units"] == {"tokens_per_s": "tokens/s"}  # of the columns returned, from the files
    # the whole row order is the files' order, as load() without pushdown
    everything = perfkit.load(mixed, filters=[("status", "in", ["ok", "failed"])])
    assert everything["config_id"].tolist() == full["config_id"].tolist()
    assert set(everything.columns) == set(full.columns)


def test_filter_forms_and_statuses(mixed):
    full = perfkit.load(mixed)
    # an OR of ANDs (pyarrow's DNF) and the same as a pyarrow expression
    dnf = [[("dtype", "==", "bf16"), ("size", "==", 128)], [("batch_size", "in", [4, 16]), ("status", "==", "ok")]]
    expr = (((ds.field("dtype") == "bf16") & (ds.field("size") == 128))
            | (ds.field("batch_size").isin([4, 16]) & (ds.field("status") == "ok")))
    want = full[((full["dtype"] == "bf16") & (full["size"] == 128))
                | (full["batch_size"].isin([4, 16]) & (full["status"] == "ok"))]["config_id"].tolist()
    assert perfkit.load(mixed, columns=["config_id"], filters=dnf)["config_id"].tolist() == want
    assert perfkit.load(mixed, columns=["config_id"], filters=expr)["config_id"].tolist() == want
    # an expression naming a column only the later files have (found by retrying those chunks)
    only = perfkit.load(mixed, columns=["config_id"], filters=ds.field("tokens_per_s") > 25_000.0)
    assert only["config_id"].tolist() == full[full["tokens_per_s"] > 25_000]["config_id"].tolist()
    # statuses= is pushed down with the other filters
    failed = perfkit.load(mixed, columns=["config_id", "reason"], statuses=["failed"])
    assert failed.to_dict("records") == [{"config_id": "train_step-007", "reason": "boom"}]
    assert perfkit.load(mixed, statuses=["failed"])["config_id"].tolist() == ["train_step-007"]  # unchanged path


def _io_bytes() -> int:
    with open("/proc/self/io") as fh:  # rchar: bytes this process got from read()/pread()
        return int(next(line for line in fh if line.startswith("rchar")).split()[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/io (Linux)")
def test_pushdown_reads_a_fraction_of_the_bytes(tmp_path):
    # One configuration per file, as a sweep writes them, each with a large raw-samples column.
    # Asking for one column of one parameter value must not read the files whole: the other
    # columns' pages are never read, nor the data of files whose statistics rule the value out.
    import numpy as np

    for i in range(20):
        frame = pd.DataFrame([{"config_id": f"c{i}", "status": "ok", "batch_size": i, "tokens_per_s": float(i),
                               "step_time_samples_s": np.random.default_rng(i).random(300_000)}])
        write_rows(frame, tmp_path / "results" / f"c{i}.parquet")
    before = _io_bytes()
    full = perfkit.load(tmp_path)
    full_bytes = _io_bytes() - before
    before = _io_bytes()
    got = perfkit.load(tmp_path, columns=["tokens_per_s"], filters=[("batch_size", "==", 7)])
    pushed_bytes = _io_bytes() - before
    assert got["tokens_per_s"].tolist() == full.loc[full["batch_size"] == 7, "tokens_per_s"].tolist() == [7.0]
    # each file is ~2.4 MB of samples; what is left to read is the tail pyarrow reads for a
    # footer (64 KiB a file) and two small columns — reading the one matching file whole
    # would add 1/20 of the total
    assert pushed_bytes < 0.05 * full_bytes, (pushed_bytes, full_bytes)


def test_pushdown_bad_input(mixed, tmp_path):
    with pytest.raises(BadInputError, match="'nope' is in no results file"):
        perfkit.load(mixed, columns=["nope"])
    with pytest.raises(BadInputError, match="'nope' is in no results file"):
        perfkit.load(mixed, columns=["size"], filters=[("nope", "==", 1)])
    with pytest.raises(BadInputError, match="names a column that is in no results file"):
        perfkit.load(mixed, columns=["size"], filters=ds.field("nope") == 1)
    with pytest.raises(BadInputError, match="cannot read"):  # text column against a number
        perfkit.load(mixed, columns=["size"], filters=[("dtype", "==", 3)])
    with pytest.raises(BadInputError, match="list of names"):
        perfkit.load(mixed, columns="size")
    with pytest.raises(BadInputError, match="DNF list"):
        perfkit.load(mixed, filters=[("size", "~", 1)])
    empty = perfkit.load(tmp_path, columns=["size", "time_s"], filters=[("size", "==", 1)])
    assert empty.empty and list(empty.columns) == ["size", "time_s"]


def test_query_prints_and_writes_csv_and_parquet(mixed, tmp_path, capsys):
    sql = ("SELECT batch_size, count(*) AS n, sum(tokens_per_s) AS tokens_per_s FROM results "
           "WHERE status = 'ok' AND batch_size IS NOT NULL GROUP BY batch_size ORDER BY batch_size")
    full = perfkit.load(mixed)
    ok = full[(full["status"] == "ok") & full["batch_size"].notna()]
    want = ok.groupby("batch_size")["tokens_per_s"].agg(["count", "sum"]).reset_index()
    assert main(["query", str(mixed), sql]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["batch_size", "n", "tokens_per_s"] and len(printed) == 1 + len(want)
    # a batch size is printed as the whole number it is, though Parquet holds it as a float (issue 55)
    assert [line.split()[0] for line in printed[1:]] == [str(int(b)) for b in want["batch_size"]]
    assert main(["query", str(mixed), sql, "--csv", str(tmp_path / "out" / "a.csv")]) == 0
    csv = pd.read_csv(tmp_path / "out" / "a.csv")
    assert csv["batch_size"].tolist() == want["batch_size"].tolist()
    assert csv["n"].tolist() == want["count"].tolist() and csv["tokens_per_s"].tolist() == want["sum"].tolist()
    assert main(["query", str(mixed), "SELECT config_id, note, size FROM results ORDER BY config_id",
                 "--parquet", str(tmp_path / "b.parquet")]) == 0
    back = pd.read_parquet(tmp_path / "b.parquet")
    both = full.sort_values("config_id", kind="stable")[["config_id", "note", "size"]].reset_index(drop=True)
    # union by name: a column a file lacks is NULL; types promoted (null + text, int + double)
    pd.testing.assert_frame_equal(back, both, check_dtype=False)
    # more rows than --max-rows: the first ones, and a note on stderr
    assert main(["query", str(mixed), "SELECT config_id FROM results", "--max-rows", "3"]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 4 and "first 3 rows" in out.err


def test_query_function_returns_a_frame(mixed):
    from perfkit.view.query import query

    got = query(mixed, "SELECT config_id, reason FROM results WHERE status = 'failed'")
    assert got.to_dict("records") == [{"config_id": "train_step-007", "reason": "boom"}]


@pytest.mark.parametrize("args, message", [
    (["query", "{empty}", "SELECT 1"], "no results files under"),
    (["query", "{missing}", "SELECT 1"], "does not exist"),
    (["query", "{mixed}", "SELECT nope FROM results"], 'SQL: Binder Error: Referenced column "nope"'),
    (["query", "{mixed}", "SELEC 1"], "SQL: Parser Error"),
    (["query", "{mixed}", "SELECT 1", "--max-rows", "0"], "--max-rows"),
])
def test_query_bad_input_exits_2_with_one_line(mixed, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    fill = {"empty": tmp_path / "empty", "missing": tmp_path / "missing", "mixed": mixed}
    assert main([a.format(**fill) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_query_without_duckdb_names_the_extra(mixed, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "duckdb", None)  # what an environment without the extra looks like
    assert main(["query", str(mixed), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'perfkit[query]'" in err and len(err.strip().splitlines()) == 1


def test_load_skips_folders_marked_not_results(mixed, tmp_path):
    # an export's copies of the Parquet files (the MLflow store under DIR) are not rows of DIR
    import shutil

    shutil.copytree(mixed / "results", tmp_path / "results")
    shutil.copytree(mixed / "results", tmp_path / "store" / "artifacts")
    assert len(perfkit.load(tmp_path)) == 2 * len(perfkit.load(mixed))
    (tmp_path / "store" / results.IGNORE_MARKER).touch()
    assert len(perfkit.load(tmp_path)) == len(perfkit.load(mixed))
    assert json.loads(perfkit.load(tmp_path)["param_names"].iloc[0]) == ["sizes"]


@pytest.mark.parametrize("max_groups", [64, 0])
def test_query_keeps_each_files_types(tmp_path, monkeypatch, max_groups):
    # Same column names, different types: read as one schema, DuckDB would cast the second file's
    # values to the first's type (4.5 → 4) without a word. Files are grouped by their exact schema
    # (or, past the group limit, read with union_by_name): every value comes back as written.
    from perfkit.view import query as q

    monkeypatch.setattr(q, "_MAX_GROUPS", max_groups)
    write_rows(pd.DataFrame({"config_id": ["a"], "status": ["ok"], "x": [1], "tag": [None]}), tmp_path / "results" / "a.parquet")
    write_rows(pd.DataFrame({"config_id": ["b"], "status": ["ok"], "x": [4.5], "tag": ["t"]}), tmp_path / "results" / "b.parquet")
    write_rows(pd.DataFrame({"config_id": ["c"], "status": ["ok"], "x": [2], "extra_s": [0.25]}), tmp_path / "results" / "c.parquet")
    got = q.query(tmp_path, "SELECT config_id, x, tag, extra_s FROM results ORDER BY config_id")
    assert got["config_id"].tolist() == ["a", "b", "c"] and got["x"].tolist() == [1.0, 4.5, 2.0]
    assert got["tag"].isna().tolist() == [True, False, True] and got["tag"][1] == "t"
    assert got["extra_s"].isna().tolist() == [True, True, False] and got["extra_s"][2] == 0.25


def test_whole_numbers_stored_as_floats_print_as_integers(tmp_path, capsys):
    """A batch size in a file where another row has none is a float column in Parquet: the table
    prints 16, not 16.0, and an empty cell blank (issue 55); measured floats stay floats."""
    from perfkit.core.results import write_rows

    write_rows(pd.DataFrame({"config_id": ["a", "b", "c"], "workload": ["train_step", "train_step", "gemm"],
                             "status": ["ok", "ok", "ok"], "batch_size": [16.0, 32.0, float("nan")],
                             "time_s": [0.5, 0.25, 0.125]}), tmp_path / "results" / "x.parquet")
    assert main(["query", str(tmp_path), "SELECT config_id, batch_size, time_s FROM results ORDER BY config_id"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines[1:]] == [["a", "16", "0.500"], ["b", "32", "0.250"], ["c", "0.125"]]
