"""The benchmark's synthetic datasets: every format reads back what was generated, the cache is
reused and never serves a half-written dataset, and the decode meets its cost on both clocks."""

from __future__ import annotations

import math
import os
import pickle
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import REPO, filesystem_type
from perfkit.core.errors import BadInputError
from perfkit.measuring.data import datasets
from perfkit.measuring.data import page_cache


@pytest.mark.parametrize("fmt", datasets.FORMATS)
def test_each_format_reads_back_the_generated_samples_in_random_order_and_is_generated_once(tmp_path, fmt):
    # 70 samples in row groups of 32: three groups, the last one partial.
    spec = datasets.DatasetSpec(format=fmt, n_samples=70, sample_bytes=300, rows_per_group=32, seed=3)
    path, made = datasets.ensure(spec, tmp_path)
    assert made and path.parent == tmp_path
    ds = datasets.reader(path, spec, out_shape=(5, 7))
    for i in np.random.default_rng(0).permutation(70):
        raw = ds.read_raw(int(i))
        np.testing.assert_array_equal(raw, datasets.sample_raw(spec, int(i)))
    # A reader with its handle open pickles without it (spawned workers get it so) and reopens.
    clone = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(clone.read_raw(33), datasets.sample_raw(spec, 33))
    sample = ds[69]
    assert sample.dtype == torch.float32 and tuple(sample.shape) == (5, 7)
    np.testing.assert_allclose(sample.numpy().ravel(), datasets.decode(datasets.sample_raw(spec, 69))[:35])
    with pytest.raises(IndexError):
        ds[70]
    mtime = (path / "dataset.json").stat().st_mtime_ns
    again, made_again = datasets.ensure(spec, tmp_path)
    assert (again, made_again) == (path, False)
    assert (path / "dataset.json").stat().st_mtime_ns == mtime  # reused, not rewritten
    other, _ = datasets.ensure(datasets.DatasetSpec(format=fmt, n_samples=70, sample_bytes=300,
                                                    rows_per_group=32, seed=4), tmp_path)
    assert other != path  # the key covers every parameter


def test_the_default_cache_is_under_perfkit_out_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFKIT_OUT", str(tmp_path))
    assert datasets.default_cache_dir() == tmp_path / "datasets"
    monkeypatch.delenv("PERFKIT_OUT")
    assert datasets.default_cache_dir() == datasets.Path.home() / ".cache" / "perfkit" / "datasets"


def test_an_unknown_format_is_bad_input():
    with pytest.raises(BadInputError, match="unknown format 'recordio'; use one of parquet, lmdb, files, mmap, tfrecord"):
        datasets.DatasetSpec(format="recordio")


_KILLED_MIDWAY = """
import os, signal, sys
from perfkit.measuring.data import datasets, page_cache
real = datasets._write_files
def half_then_killed(spec, root):
    datasets.np.save(root / "half.npy", datasets.sample_raw(spec, 0))
    (root / "samples").mkdir()
    datasets.np.save(root / "samples" / "00000000.npy", datasets.sample_raw(spec, 0))
    os.kill(os.getpid(), signal.SIGKILL)
datasets._WRITERS["files"] = half_then_killed
datasets.ensure(datasets.DatasetSpec(format="files", n_samples=20, sample_bytes=64), sys.argv[1])
"""


@pytest.mark.slow
def test_a_generation_killed_midway_is_never_reused_and_its_leftovers_are_removed(tmp_path):
    spec = datasets.DatasetSpec(format="files", n_samples=20, sample_bytes=64)
    out = subprocess.run([sys.executable, "-c", _KILLED_MIDWAY, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-"), leftovers  # never the dataset's name
    assert not (tmp_path / spec.name).exists()
    # Another node's generation (a cache in a shared home folder): its pid means nothing here.
    other = tmp_path / leftovers[0].replace(f"@{socket.gethostname()}", "@another-node")
    other.mkdir()
    path, made = datasets.ensure(spec, tmp_path)
    assert made
    # The dead generation's temp is gone; the other host's is left to it.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([spec.name, other.name])
    assert len(list((path / "samples").iterdir())) == 20


@pytest.mark.parametrize("clock,tick", [("thread", time.thread_time), ("wall", time.perf_counter)])
def test_the_decode_lasts_its_cost_on_its_clock_and_its_values_do_not_depend_on_it(clock, tick):
    raw = np.arange(20_000, dtype=np.int64).astype(np.uint8)
    plain = datasets.decode(raw)
    t0 = tick()
    costly = datasets.decode(raw, 0.005, clock)
    spent = tick() - t0
    # Until the clock says so; on the thread clock that is CPU time, which a sleep would not spend.
    assert spent >= 0.005
    np.testing.assert_array_equal(plain, costly)


@pytest.mark.parametrize("cache_on", ["disk", "tmpfs"], indirect=True)
@pytest.mark.parametrize("fmt", ["files", "mmap"])
def test_residency_follows_reads_and_evictions_as_the_kernel_does_them(cache_on, fmt):
    fs = filesystem_type(cache_on)
    if fs != "tmpfs" and fs not in ("ext2/ext3", "xfs", "btrfs"):
        pytest.skip(f"cache on {fs}: whether it drops clean pages on request is not known here")
    spec = datasets.DatasetSpec(format=fmt, n_samples=64, sample_bytes=8192)
    path, _ = datasets.ensure(spec, cache_on)
    page_cache.evict(path)
    # Drops on a disk filesystem (clean pages, mapped by nobody); tmpfs has nowhere to drop them to.
    dropped = fs != "tmpfs"
    assert page_cache.residency(path).fraction == (0.0 if dropped else 1.0)
    ds = datasets.reader(path, spec)
    for i in range(0, 32):  # the first half of the samples: resident after the read
        ds.read_raw(i)
    ds.close()
    half = page_cache.residency(path)
    assert half.pages >= 64 * 8192 // os.sysconf("SC_PAGE_SIZE")
    assert (0.3 < half.fraction < 1.0) if dropped and fmt == "files" else half.fraction > 0.3
    page_cache.evict(path)
    after = page_cache.residency(path)
    assert after.note is None and after.fraction <= (0.01 if dropped else 1.0)
    assert page_cache.evicted(after) is dropped


def test_residency_without_mincore_is_unknown_with_the_reason(tmp_path, monkeypatch):
    spec = datasets.DatasetSpec(format="mmap", n_samples=8)
    path, _ = datasets.ensure(spec, tmp_path)
    monkeypatch.setattr(page_cache, "_mincore", lambda: (None, "mincore(2) is not available on plan9"))
    unknown = page_cache.residency(path)
    assert math.isnan(unknown.fraction) and unknown.note == "mincore(2) is not available on plan9"
    assert page_cache.evicted(unknown) is None
