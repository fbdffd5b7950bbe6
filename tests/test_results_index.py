"""The derived query index of a results folder (DIR/.perfkit-index): the answers it gives equal a
scan of the files, after files are added, changed and removed, with files of different schemas
(a column int in one notebook and bool in another); a damaged index, a read-only folder and two
builders at once never give a wrong answer; `perfkit query` and `perfkit index` use it."""

import contextlib
import fcntl
import json
import os
import subprocess
import sys

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import perfkit
from perfkit.cli import main
from perfkit.core import results, results_index, results_scan
from perfkit.core.errors import BadInputError
from perfkit.core.results import write_rows
from perfkit.core.results_index import INDEX_DIR, NO_INDEX_ENV

N = 36  # per notebook: 72 files, more than one plain-scan chunk (results_scan._CHUNK)

QUESTIONS = [
    dict(columns=["tokens_per_s"], filters=[("batch_size", "==", 8)]),
    dict(columns=["config_id", "row", "size", "note"], filters=[("size", ">=", 128)]),
    dict(filters=[("status", "==", "failed")]),  # every column: order of first appearance, types promoted
    dict(columns=["config_id", "reason"], statuses=["failed", "oom"]),
    dict(columns=["config_id", "tokens_per_s"], filters=ds.field("tokens_per_s") > 20_000.0),
    dict(columns=["config_id", "row"], filters=[[("dtype", "==", "bf16")], [("batch_size", "in", [4, 16])]]),
    dict(columns=["config_id", "count"], filters=[("row", "==", 1)]),  # int beside bool: an error both ways
    dict(columns=["config_id", "busbw_bytes_per_s"], filters=[("busbw_bytes_per_s", ">", 0)]),
]


def _train(root, i, rows=3, scale=1.0):
    status = "failed" if i % 7 == 3 else "ok"
    write_rows(pd.DataFrame([{
        "config_id": f"c{i:03d}-train", "status": status, "reason": "boom" if status != "ok" else None, "row": r,
        "batch_size": [4, 8, 16][i % 3], "tokens_per_s": scale * (1000.0 * i + r), "count": 10 * i + r,
        "step_time_samples_s": [0.01 * i, 0.02 * i]} for r in range(rows)]),
        root / "results" / f"c{i:03d}-train.parquet")


def _gemm(root, i):
    write_rows(pd.DataFrame([{
        "config_id": f"c{i:03d}-gemm", "status": "ok", "reason": None, "row": r, "size": 64 * (i % 4 + 1),
        "dtype": dt, "flop_per_s": 1e9 * i, "count": i % 2 == 0, "note": None if i % 5 else f"n{i}"}
        for r, dt in enumerate(("fp32", "bf16"))]), root / "results" / f"c{i:03d}-gemm.parquet")


def _folder(root):
    # names interleave the notebooks, so the files' order alternates schemas
    for i in range(N):
        _train(root, i)
        _gemm(root, i)
    return root


def _answer(root, **question):
    try:
        frame = perfkit.load(root, **question)
        return frame, frame.attrs["units"]
    except BadInputError:
        return "BadInputError", None


def _check(root, monkeypatch, questions=QUESTIONS):
    """Every question answered from the index (the plain scan would fail) equals the plain scan."""
    for question in questions:
        monkeypatch.setenv(NO_INDEX_ENV, "1")
        want = _answer(root, **question)
        monkeypatch.delenv(NO_INDEX_ENV)
        with monkeypatch.context() as m:
            if not isinstance(want[0], str):  # an error falls back to the plain scan, for its message
                m.setattr(results_scan, "_file_sources", _no_plain_scan)
            got = _answer(root, **question)
        if isinstance(want[0], str):
            assert got[0] == want[0], question
        else:
            pd.testing.assert_frame_equal(got[0], want[0], obj=str(question))
            assert got[1] == want[1], question


def _no_plain_scan(files, q=None):
    raise AssertionError(f"the plain scan ran over {len(files)} files: the index was not used")


def _manifest(root):
    return json.loads((root / INDEX_DIR / "manifest.json").read_text())


@contextlib.contextmanager
def _builder_lock(root):
    """Hold the index's lock as another builder would: questions then fold nothing in."""
    with open(root / INDEX_DIR / ".lock", "ab") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@pytest.fixture
def small_index(monkeypatch):
    monkeypatch.setattr(results_index, "_MIN_FILES", 0)


@pytest.mark.slow
def test_index_answers_equal_the_files_after_adds_changes_and_removals(tmp_path, monkeypatch, small_index):
    root = _folder(tmp_path)
    _check(root, monkeypatch)  # the first question builds the index
    m = _manifest(root)
    # train: reason null or text; gemm: note null or text: four Arrow schemas, four parts
    assert len(m["files"]) == 2 * N and len(m["parts"]) == 4 and m["summary"]["not_indexed"] == 0
    for name in m["parts"]:  # rows in the files' order, which is config_id order here
        ids = pq.read_table(root / INDEX_DIR / name, columns=["config_id"])["config_id"].to_pylist()
        assert ids == sorted(ids)

    with _builder_lock(root):  # another builder holds the lock: changes are read directly, removals masked
        _train(root, 5, rows=5, scale=2.0)  # changed: more rows, other values
        (root / "results" / "c010-gemm.parquet").unlink()
        (root / "results" / "c011-train.parquet").unlink()
        # a new schema, first in the listing, its own column first (columns come in order of first
        # appearance), `size` float where the gemm files have int64
        write_rows(pd.DataFrame([{"busbw_bytes_per_s": 3e9, "config_id": "a000-nccl", "status": "ok", "row": 0,
                                  "size": 0.5}]), root / "results" / "a000-nccl.parquet")
        _gemm(root, 99)
        _check(root, monkeypatch)
        assert _manifest(root) == m  # nothing folded in
    _check(root, monkeypatch)  # folded in: appended parts
    m = _manifest(root)
    assert m["summary"]["read"] == 3 and m["summary"]["removed"] == 2 and m["summary"]["changed"] == 1
    for i in range(0, N, 2):  # over a quarter of the train rows dead: that schema's parts rewritten as one
        (root / "results" / f"c{i:03d}-train.parquet").unlink()
    _check(root, monkeypatch)
    m = _manifest(root)
    assert m["summary"]["rewritten_parts"] >= 1 and len(m["files"]) == len(list((root / "results").iterdir()))
    for i in range(40, 40 + results_index._MAX_PARTS + 1):  # one new file per question: parts appended, then merged
        _gemm(root, i)
        perfkit.load(root, columns=["row"], filters=[("row", "==", 0)])
    gemm_parts = [p for p in _manifest(root)["parts"].values() if p["key"] == _manifest(root)["parts"][
        _manifest(root)["files"]["results/c001-gemm.parquet"][1]]["key"]]
    assert len(gemm_parts) <= results_index._MAX_PARTS
    _check(root, monkeypatch)
    for f in (root / "results").glob("*-gemm.parquet"):  # no int-beside-bool column left: every column
        f.unlink()  # can be asked for, and a full load concatenates in Arrow
    _check(root, monkeypatch)
    with _builder_lock(root):  # a file read directly, first in the listing: its new column comes first
        write_rows(pd.DataFrame([{"algbw_bytes_per_s": 1e9, "config_id": "a001-nccl", "status": "failed"}]),
                   root / "results" / "a001-nccl.parquet")
        _check(root, monkeypatch)
    monkeypatch.setenv(NO_INDEX_ENV, "1")
    want = perfkit.load(root)
    monkeypatch.delenv(NO_INDEX_ENV)
    with monkeypatch.context() as m:
        m.setattr(results, "_read_many", _no_plain_scan)
        got = perfkit.load(root)
    pd.testing.assert_frame_equal(got, want)
    assert got.attrs["units"] == want.attrs["units"] and got["count"].dtype == "float64"  # null in a000-nccl


def test_query_and_full_load_over_the_index_equal_the_files(tmp_path, monkeypatch, small_index):
    from perfkit.view.query import query

    root = _folder(tmp_path)
    sql = ("SELECT config_id, row, status, reason, size, note, count, tokens_per_s FROM results "
           "WHERE row < 2 ORDER BY config_id, row, tokens_per_s")  # rows of a changed file repeat (config_id, row)

    def same():
        monkeypatch.setenv(NO_INDEX_ENV, "1")
        want_sql, want_all = query(root, sql), perfkit.load(root)
        monkeypatch.delenv(NO_INDEX_ENV)
        with monkeypatch.context() as m:
            m.setattr("perfkit.view.query._by_schema", lambda con, files: _no_plain_scan(files, None)
                      if len(files) > 8 else [files] if files else [])
            got_sql = query(root, sql)
            m.setattr(results, "_read_many", _no_plain_scan)
            got_all = perfkit.load(root)
        pd.testing.assert_frame_equal(got_sql, want_sql)
        # load(DIR) from the index equals reading the files: rows, order, dtypes, `count` (int64
        # in one notebook, bool in the other) as Python objects, units
        pd.testing.assert_frame_equal(got_all, want_all)
        assert got_all.attrs["units"] == want_all.attrs["units"] and got_all["count"].dtype == object

    query(root, "SELECT 1")  # builds the index (a full load uses one, never builds one)
    assert (root / INDEX_DIR / "manifest.json").exists()
    same()
    with _builder_lock(root):
        _train(root, 2, rows=4, scale=3.0)
        (root / "results" / "c003-gemm.parquet").unlink()
        same()  # a changed file read directly, a removed one masked
    same()
    _train(root, 3, rows=2, scale=5.0)  # a sweep adds a file between two loads
    before = _manifest(root)
    monkeypatch.setenv(NO_INDEX_ENV, "1")
    want = perfkit.load(root)
    monkeypatch.delenv(NO_INDEX_ENV)
    pd.testing.assert_frame_equal(perfkit.load(root), want)
    assert _manifest(root) == before  # a plain load reads the new file directly and writes nothing


def test_a_damaged_index_is_rebuilt_never_answers(tmp_path, monkeypatch, small_index):
    root = _folder(tmp_path)
    question = dict(columns=["config_id", "tokens_per_s"], filters=[("batch_size", "==", 8)])
    monkeypatch.setenv(NO_INDEX_ENV, "1")
    want = perfkit.load(root, **question)
    monkeypatch.delenv(NO_INDEX_ENV)
    pd.testing.assert_frame_equal(perfkit.load(root, **question), want)
    index = root / INDEX_DIR

    def damage_part():
        part = index / next(iter(_manifest(root)["parts"]))
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])  # a partial part

    def other_format():
        m = _manifest(root)
        (index / "manifest.json").write_text(json.dumps({**m, "format": results_index.FORMAT + 1}))

    def bad_entry():
        m = _manifest(root)
        m["files"][next(iter(m["files"]))][1] = "part-missing.parquet"
        (index / "manifest.json").write_text(json.dumps(m))

    def not_json():
        (index / "manifest.json").write_text('{"format": 1, "parts": {')

    def swapped_part():  # whole, readable, but not the rows the manifest says
        first, second = list(_manifest(root)["parts"])[:2]
        (index / first).write_bytes((index / second).read_bytes())

    def lost_part():
        (index / next(iter(_manifest(root)["parts"]))).unlink()

    for damage in (damage_part, other_format, bad_entry, not_json, swapped_part, lost_part):
        before = set(_manifest(root)["parts"])
        damage()
        pd.testing.assert_frame_equal(perfkit.load(root, **question), want, obj=damage.__name__)
        assert set(_manifest(root)["parts"]).isdisjoint(before), damage.__name__  # rebuilt
        pd.testing.assert_frame_equal(perfkit.load(root, **question), want)
    # a results file that is not Parquet: recorded as not indexed, read directly: the scan's error
    (root / "results" / "c050-junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(BadInputError, match="cannot read"):
        perfkit.load(root, **question)
    assert _manifest(root)["files"]["results/c050-junk.parquet"][1] is None


@contextlib.contextmanager
def _read_only(path):
    """``path`` read-only for this process: a read-only bind mount as root, else no write permission."""
    ro = path.parent / f"{path.name}-ro"
    ro.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "--bind", str(path), str(ro)], capture_output=True).returncode == 0
        if not mounted or subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode:
            subprocess.run(["umount", str(ro)], capture_output=True)
            pytest.skip("a read-only folder needs a bind mount as root (mount refused here)")
        try:
            yield ro
        finally:
            subprocess.run(["umount", str(ro)], check=True)
            ro.rmdir()
    else:
        ro.rmdir()
        os.chmod(path, 0o555)
        os.chmod(path / "results", 0o555)
        try:
            yield path
        finally:
            os.chmod(path, 0o755)
            os.chmod(path / "results", 0o755)


def test_a_read_only_folder_is_scanned_and_its_index_still_used_where_current(tmp_path, monkeypatch, small_index):
    root = _folder(tmp_path / "dir")
    with _read_only(root) as ro:  # no index, none can be written: the plain scan
        with pytest.raises(OSError):
            (ro / "probe").touch()
        monkeypatch.setenv(NO_INDEX_ENV, "1")
        want = perfkit.load(ro, columns=["config_id", "row"], filters=[("row", "<=", 1)])
        monkeypatch.delenv(NO_INDEX_ENV)
        pd.testing.assert_frame_equal(perfkit.load(ro, columns=["config_id", "row"], filters=[("row", "<=", 1)]), want)
        assert not (ro / INDEX_DIR).exists()
    perfkit.load(root, columns=["row"], filters=[("row", "==", 0)])  # writable again: builds the index
    _train(root, 4, rows=6)  # then a change the read-only folder cannot fold in
    (root / "results" / "c007-gemm.parquet").unlink()
    m = _manifest(root)
    with _read_only(root) as ro:
        _check(ro, monkeypatch)
        assert _manifest(ro) == m


_BUILDER = """
import sys, time
from pathlib import Path
import perfkit
from perfkit.core import results_index
results_index._LOCK = sys.argv[2] == "lock"  # no lock: as on a filesystem without flock
results_index._RETIRE_S = 0.0  # retired parts deleted at once: the races as bad as they get
results_index._MIN_FILES = 0
for i in range(int(sys.argv[3])):
    results_index.refresh(Path(sys.argv[1]), rebuild=i % 2 == 0, wait=True)
    perfkit.load(sys.argv[1], columns=["row"], filters=[("row", "==", 0)])
"""


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["lock", "nolock"])
def test_two_builders_at_once_never_leave_a_wrong_index(tmp_path, monkeypatch, small_index, lock):
    root = _folder(tmp_path)
    builders = [subprocess.Popen([sys.executable, "-c", _BUILDER, str(root), lock, "4"]) for _ in range(2)]
    for i in range(6):  # the folder changes under them
        _train(root, i, rows=4, scale=1.5)
        (root / "results" / f"c{30 + i:03d}-gemm.parquet").unlink()
    assert [b.wait(timeout=120) for b in builders] == [0, 0]
    _check(root, monkeypatch, QUESTIONS[:6])


def test_a_file_replaced_while_the_index_reads_it_is_read_again(tmp_path, monkeypatch, small_index):
    # The manifest keeps the signature of the bytes read (fstat of the open file): a writer that
    # replaces the file meanwhile (write_rows renames a new file over it) leaves a signature that
    # no longer matches, so the new rows are read, never the old ones served as current.
    root = _folder(tmp_path)
    real, replaced = os.fstat, []

    def racing(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not replaced and name.endswith("c005-train.parquet"):  # open, its bytes not yet read
            replaced.append(name)
            _train(root, 5, rows=4, scale=9.0)  # another process records while the index reads
        return real(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "fstat", racing)
        results_index.refresh(root)
    assert replaced
    _check(root, monkeypatch, QUESTIONS[:1] + QUESTIONS[4:6])


def test_small_folders_leave_no_index_and_the_env_turns_it_off(tmp_path, monkeypatch):
    for i in range(3):
        _train(tmp_path, i)
    perfkit.load(tmp_path, columns=["row"], filters=[("row", "==", 0)])
    assert not (tmp_path / INDEX_DIR).exists()  # under _MIN_FILES files: scanned, nothing written
    monkeypatch.setattr(results_index, "_MIN_FILES", 0)
    perfkit.load(tmp_path)
    assert not (tmp_path / INDEX_DIR).exists()  # a full load uses an index, never builds one
    monkeypatch.setenv(NO_INDEX_ENV, "1")
    perfkit.load(tmp_path, columns=["row"], filters=[("row", "==", 0)])
    assert not (tmp_path / INDEX_DIR).exists()
    monkeypatch.delenv(NO_INDEX_ENV)
    perfkit.load(tmp_path, columns=["row"], filters=[("row", "==", 0)])
    assert (tmp_path / INDEX_DIR / results_index.IGNORE_MARKER).exists()
    assert len(perfkit.load(tmp_path)) == 9  # the parts are never read as results


def test_index_command_builds_refreshes_and_rebuilds(tmp_path, capsys):
    for i in range(4):
        _train(tmp_path, i)
        _gemm(tmp_path, i)
    assert main(["index", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "8 results files, 20 rows in 4 parts" in out and "read 8 files" in out
    (tmp_path / "results" / "c000-gemm.parquet").unlink()
    assert main(["index", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "7 results files" in out and "read 0 files" in out and "1 removed" in out
    assert main(["index", str(tmp_path), "--rebuild"]) == 0
    assert "read 7 files" in capsys.readouterr().out
    assert main(["index", str(tmp_path / "missing")]) == 2


def _rewrite_in_place(path, frame):
    """``path``'s bytes replaced by those of ``frame`` in place (same inode), same size, mtime put
    back (as `cp -p`, `rsync -t` or an editor keeping timestamps would): only ctime tells."""
    tmp = path.with_name("tmp-" + path.name)
    write_rows(frame, tmp)
    new, st = tmp.read_bytes(), path.stat()
    tmp.unlink()
    assert len(new) == st.st_size and new != path.read_bytes()  # the precondition: a same-size rewrite
    with open(path, "r+b") as fh:
        fh.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _same_size(value):
    return pd.DataFrame([{"config_id": "c000-x", "status": "ok", "tokens_per_s": value}])


def _tick(probe):
    """Wait for the filesystem's clock (the one writes stamp ctime with, coarser than ns) to move
    past ``probe``'s ctime: a condition polled, not a duration assumed."""
    since = probe.stat().st_ctime_ns
    mark = probe.with_name("tick-probe")
    while True:
        mark.touch()
        if mark.stat().st_ctime_ns > since:
            return mark.unlink()


def test_a_same_size_rewrite_in_place_with_mtime_restored_is_read_anew(tmp_path, monkeypatch, small_index):
    path = tmp_path / "results" / "c000-x.parquet"
    write_rows(_same_size(1111.0), path)
    _tick(path)  # the file is older than the index built next: its (size, mtime, inode, ctime) is trusted
    question = dict(columns=["tokens_per_s"], filters=[("status", "==", "ok")])
    assert perfkit.load(path.parent.parent, **question)["tokens_per_s"].tolist() == [1111.0]
    assert _manifest(tmp_path)["files"]["results/c000-x.parquet"][7] is None  # no digest: the signature alone
    _rewrite_in_place(path, _same_size(2222.0))
    assert perfkit.load(tmp_path, **question)["tokens_per_s"].tolist() == [2222.0]
    assert perfkit.load(tmp_path)["tokens_per_s"].tolist() == [2222.0]


class _Frozen:
    """A stat whose times never move: a filesystem clock that does not tick during the test (the
    rewrite lands within one timestamp tick of the index reading the file, as it can on any
    filesystem: ext4 stamps with a clock of jiffies, some NFS and FAT with seconds)."""

    def __init__(self, st):
        self.st_size, self.st_ino, self.st_mtime_ns, self.st_ctime_ns = st.st_size, st.st_ino, 0, 0


def test_a_same_size_rewrite_within_one_timestamp_tick_is_read_anew(tmp_path, monkeypatch, small_index):
    signature = results_index._signature
    monkeypatch.setattr(results_index, "_signature", lambda st: signature(_Frozen(st)))
    path = tmp_path / "results" / "c000-x.parquet"
    write_rows(_same_size(1111.0), path)
    question = dict(columns=["tokens_per_s"], filters=[("status", "==", "ok")])
    assert perfkit.load(tmp_path, **question)["tokens_per_s"].tolist() == [1111.0]
    assert (tmp_path / INDEX_DIR / "manifest.json").exists()
    _rewrite_in_place(path, _same_size(2222.0))
    assert perfkit.load(tmp_path, **question)["tokens_per_s"].tolist() == [2222.0]
    assert perfkit.load(tmp_path)["tokens_per_s"].tolist() == [2222.0]
