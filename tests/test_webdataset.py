"""WebDataset tar shards (issue 31): written and read back byte-equal, split over ranks and workers
so that every epoch delivers each sample exactly once — checked at run time, a broken split a failed
configuration with the counts — and a truncated shard a failure naming the file."""

from __future__ import annotations

import collections
import sys
import tarfile

import numpy as np
import pytest
import torch

from conftest import samples_digest
from perfkit.core.errors import BadInputError
from perfkit.measuring.data import datasets, loading, shards

SPEC = datasets.DatasetSpec(format="webdataset", n_samples=60, sample_bytes=300, shard_bytes=1500, seed=5)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path, made = datasets.ensure(SPEC, tmp_path_factory.mktemp("cache"))
    assert made
    return path


def test_written_as_tar_shards_and_read_back_byte_equal(stored):
    manifest = shards.manifest(stored)
    assert len(manifest) == 12 and [s["end"] - s["first"] for s in manifest] == [5] * 12  # 1500 B: 5 samples
    with tarfile.open(stored / manifest[3]["file"]) as tar:  # a plain tar, the WebDataset naming
        assert tar.getnames() == [f"{i:08d}.bin" for i in range(15, 20)]
    expected = samples_digest(datasets.sample_raw(SPEC, i) for i in range(SPEC.n_samples))
    reader = datasets.reader(stored, SPEC, shuffle=False)
    in_order = [reader.read_raw(i) for i in range(SPEC.n_samples)]
    assert samples_digest(in_order) == expected
    streamed = dict(reader.iter_raw())
    assert samples_digest(streamed[i] for i in range(SPEC.n_samples)) == expected


@pytest.mark.parametrize("n_shards", [1, 5, 12, 13])
@pytest.mark.parametrize("world_size,workers", [(1, 1), (1, 3), (2, 2), (3, 2)])
def test_the_split_partitions_the_shards_in_every_epoch(n_shards, world_size, workers):
    for epoch in range(3):
        got = [s for rank in range(world_size) for w in range(workers)
               for s in shards.assign_shards(n_shards, rank=rank, world_size=world_size, worker=w, workers=workers,
                                             epoch=epoch, seed=1, shuffle=True)]
        assert sorted(got) == list(range(n_shards))


def _epochs(stored, *, world_size, workers, epochs=2, persistent=False, shuffle_buffer=8):
    """Indices each epoch delivered, over all ranks, each rank through a real DataLoader."""
    per_epoch = [collections.Counter() for _ in range(epochs)]
    for rank in range(world_size):
        reader = datasets.reader(stored, SPEC, shuffle=True, shuffle_buffer=shuffle_buffer, rank=rank,
                                 world_size=world_size)
        kwargs = {"persistent_workers": True} if persistent else {}
        loader = torch.utils.data.DataLoader(reader, batch_size=4, num_workers=workers, **kwargs)
        for epoch in range(epochs):
            reader.epoch = epoch
            for indices, batch in loader:
                per_epoch[epoch].update(int(i) for i in indices)
                for i, row in zip(indices, batch):  # the bytes are the sample's (decoded as it is)
                    assert np.allclose(row.numpy(), datasets.decode(datasets.sample_raw(SPEC, int(i))))
    return per_epoch


@pytest.mark.parametrize("world_size,workers", [(1, 0), (1, 1), (1, 2), (2, 2)],
                         ids=["0-workers", "1-worker", "2-workers", "2-ranks-x-2-workers"])
def test_every_epoch_delivers_each_sample_exactly_once(stored, world_size, workers):
    first, second = _epochs(stored, world_size=world_size, workers=workers)
    assert sorted(first.elements()) == list(range(SPEC.n_samples))  # none twice, none missing
    assert sorted(second.elements()) == list(range(SPEC.n_samples))


def test_persistent_workers_shuffle_each_epoch_anew_and_still_deliver_each_sample_once(stored):
    reader = datasets.reader(stored, SPEC, shuffle=True, shuffle_buffer=8)
    loader = torch.utils.data.DataLoader(reader, batch_size=4, num_workers=2, persistent_workers=True)
    orders = [[int(i) for indices, _ in loader for i in indices] for _ in range(2)]
    assert [sorted(o) for o in orders] == [list(range(SPEC.n_samples))] * 2
    assert orders[0] != orders[1]


def _config(cache, **kw):
    base = dict(format="webdataset", n_samples=SPEC.n_samples, sample_bytes=SPEC.sample_bytes,
                shard_bytes=SPEC.shard_bytes, seed=SPEC.seed, batch_size=4, num_workers=2, steps=20,
                loader_batches=20, shuffle_buffer=8, step_compute_s=0.001, cache_dir=str(cache), device="cpu")
    return loading.LoaderConfig(**{**base, **kw})


def test_the_benchmark_checks_each_epoch_and_reports_the_split(stored):
    row = loading.run_loader_benchmark(_config(stored.parent))
    assert row["status"] == "ok", row["error"]
    # 20 batches of 4 over 60 samples: each phase reads past one whole epoch, both checked.
    assert row["shards"] == 12 and row["shards_per_worker_min"] == 6 and row["epochs_checked"] == 2
    assert (row["shard_rank"], row["shard_world_size"]) == (0, 1)


def test_a_split_that_repeats_samples_fails_the_configuration_with_the_counts(stored, monkeypatch):
    # Each worker reading every shard: what a sharded format without a split does.
    monkeypatch.setattr(shards, "assign_shards", lambda n_shards, **kw: list(range(n_shards)))
    monkeypatch.setattr(shards.ShardedReader, "expected", lambda self, workers, epoch: collections.Counter(
        range(SPEC.n_samples)))
    row = loading.run_loader_benchmark(_config(stored.parent, loader_batches=0, steps=40))
    assert row["status"] == "failed" and row["error"].startswith("perfkit.measuring.data.shards.DeliveryError: "), row
    assert "delivered 120 samples of its 60: 60 twice, 0 missing" in row["error"]


def test_a_truncated_shard_fails_with_the_file_and_offset(tmp_path):
    path, _ = datasets.ensure(SPEC, tmp_path)
    shard = shards.manifest(path)[4]
    tar = path / shard["file"]
    blob = tar.read_bytes()
    reader = datasets.reader(path, SPEC, shuffle=False)
    tar.write_bytes(blob[:512 * 3 + 100])  # inside the second sample's bytes
    with pytest.raises(shards.CorruptShardError, match=rf"{shard['file']}: unreadable at or after sample 20: "
                                                       rf"unexpected end of data \(read up to byte offset 1636\)"):
        list(reader)
    tar.write_bytes(blob[:512 * 4])  # cut at a member's end: the tar reads as complete but short
    with pytest.raises(shards.CorruptShardError, match=r"ends after 2 of its 5 samples \(cut short\?\) "
                                                       r"\(read up to byte offset 2048\)"):
        list(reader)
    row = loading.run_loader_benchmark(_config(tmp_path, loader_batches=0))
    assert row["status"] == "failed" and f"{shard['file']}: ends after 2 of its 5 samples" in row["error"]


def test_bad_settings_are_refused_before_any_data_is_made(tmp_path, monkeypatch):
    with pytest.raises(BadInputError, match=r"shard_bytes applies to the sharded formats \(webdataset\), not 'lmdb'"):
        loading.LoaderConfig(format="lmdb", shard_bytes=1024)
    with pytest.raises(BadInputError, match="shuffle_buffer needs shuffle=True"):
        loading.LoaderConfig(format="webdataset", shuffle=False, shuffle_buffer=8)
    monkeypatch.setitem(sys.modules, "webdataset", None)  # import webdataset now raises ImportError
    with pytest.raises(BadInputError, match=r"pip install 'perfkit\[webdataset\]'"):
        loading.LoaderConfig(format="webdataset", cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_mds_is_refused_with_the_reason():
    with pytest.raises(BadInputError, match=r"format 'mds' is not supported: mosaicml-streaming 0.13 requires "
                                            r"torchvision .* use webdataset"):
        loading.LoaderConfig(format="mds")


def test_a_rank_without_a_shard_fails_instead_of_looping(tmp_path):
    from perfkit.measuring.data.phases import Workers, run_phase

    one = datasets.DatasetSpec(format="webdataset", n_samples=6, sample_bytes=300, shard_bytes=10**6, seed=5)
    path, _ = datasets.ensure(one, tmp_path)
    assert len(shards.manifest(path)) == 1
    reader = datasets.reader(path, one, shuffle=False, rank=1, world_size=2)  # rank 0 holds the one shard
    loader = torch.utils.data.DataLoader(reader, batch_size=2)
    with pytest.raises(RuntimeError, match="delivered no batch to rank 1 of 2: this rank's share of the dataset "
                                           "is empty"):
        run_phase(loader, 4, None, Workers())
