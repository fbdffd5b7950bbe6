"""WebDataset tar shards: written once, read in order, split over ranks and workers, every sample
delivered exactly once per epoch — and checked, never assumed.

**Layout** (``format: "webdataset"``): ``shards/shard-000000.tar``, … each a POSIX tar of the
samples in index order, one member per sample, ``<index:08d>.bin`` holding its raw bytes (the
WebDataset convention: the key before the first dot groups a sample's files), a shard closed once
it holds ``shard_bytes`` of sample bytes (at least one sample). ``shards.json`` lists each shard's
file and its first and past-the-end sample index: the reader checks every shard delivered exactly
those, so a truncated shard fails instead of ending an epoch short. Shards are read through the
``webdataset`` package's tar iterator and key grouping (the ``webdataset`` extra).

**Split** (:func:`assign_shards`): an epoch's shard order is one seeded permutation (``shuffle``)
or the stored order, the same in every rank and worker; global worker ``g = rank * workers +
worker`` of ``G = world_size * workers`` reads shards ``g, g + G, …``. The assignments of all
``G`` workers partition the shards, so each sample is read once — the property that a sharded
format without a split lacks (each worker reading every shard returns each sample ``workers``
times). Fewer shards than ``G`` leaves workers idle, which the row reports (``shards_per_worker_min``).

**Shuffle**: the shard order per epoch, then a buffer of ``shuffle_buffer`` samples in each worker
(WebDataset's ``.shuffle(n)``): a sample is yielded from a random slot of the full buffer. Seeded
by (seed, epoch, global worker), so a configuration is repeatable.

**The check** (:class:`DeliveryCheck`): samples come with their index; per epoch the indices a rank
received must be exactly the samples of its shards. A duplicate or a missing sample raises
:class:`DeliveryError` with the counts: the configuration fails, it never reports a faster number
from a short or doubled epoch.
"""

from __future__ import annotations

import collections
import io
import json
import random
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from perfkit.core.errors import BadInputError
from perfkit.measuring.data.datasets import DatasetSpec, decode, sample_raw

__all__ = ["SHARDS", "MANIFEST", "CorruptShardError", "DeliveryError", "check_available", "write", "manifest",
           "assign_shards", "ShardedReader", "DeliveryCheck"]

SHARDS = "shards"
MANIFEST = "shards.json"
_SUFFIX = "bin"


class CorruptShardError(ValueError):
    """A shard that does not hold what the manifest says: the file, and how far the read got."""

    def __init__(self, path: Path, offset: int, what: str):
        super().__init__(f"{path}: {what} (read up to byte offset {offset})")
        self.path, self.offset = path, offset


class DeliveryError(RuntimeError):
    """An epoch that delivered a sample twice or missed one."""


def check_available() -> None:
    """Raise :class:`BadInputError` (exit 2, before any data is generated) without ``webdataset``."""
    try:
        import webdataset  # noqa: F401
    except ImportError:
        raise BadInputError("format 'webdataset' reads its tar shards with the webdataset package: "
                            "pip install 'perfkit[webdataset]' (or webdataset)") from None


# ---- writing --------------------------------------------------------------------------------------


def write(spec: DatasetSpec, root: Path) -> list[Path]:
    """``spec``'s samples as tar shards of about ``spec.shard_bytes`` and their manifest."""
    folder = root / SHARDS
    folder.mkdir()
    shards, written, first, tar = [], [], 0, None
    payload = 0
    for i in range(spec.n_samples):
        if tar is None:
            path = folder / f"shard-{len(shards):06d}.tar"
            tar, first, payload = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT), i, 0
        data = sample_raw(spec, i).tobytes()
        member = tarfile.TarInfo(f"{i:08d}.{_SUFFIX}")
        member.size, member.mtime, member.mode = len(data), 0, 0o444
        tar.addfile(member, io.BytesIO(data))
        payload += len(data)
        if payload >= spec.shard_bytes or i == spec.n_samples - 1:
            tar.close()
            shards.append({"file": f"{SHARDS}/{path.name}", "first": first, "end": i + 1})
            written.append(path)
            tar = None
    (root / MANIFEST).write_text(json.dumps({"shards": shards}))
    return [*written, root / MANIFEST]


def manifest(path: Path) -> list[dict]:
    """The shards of the dataset at ``path``: ``file`` (relative), ``first`` and ``end`` sample."""
    return json.loads((Path(path) / MANIFEST).read_text())["shards"]


# ---- the split ------------------------------------------------------------------------------------


def assign_shards(n_shards: int, *, rank: int, world_size: int, worker: int, workers: int,
                  epoch: int, seed: int, shuffle: bool) -> list[int]:
    """The shards global worker ``rank * workers + worker`` reads in ``epoch``, in reading order."""
    order = list(range(n_shards))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)  # str seeds: the same in every process
    return order[rank * workers + worker::world_size * workers]


# ---- reading --------------------------------------------------------------------------------------


class ShardedReader(IterableDataset):
    """This rank's share of a WebDataset: ``(index, decoded tensor)`` per sample, each worker
    reading its own shards in order through a shuffle buffer."""

    def __init__(self, path: str | Path, spec: DatasetSpec, *, decode_cost_s: float = 0.0,
                 decode_clock: str = "thread", fetch_delay_s: float = 0.0,
                 out_shape: tuple[int, ...] | None = None, shuffle: bool = True, shuffle_buffer: int = 0,
                 rank: int = 0, world_size: int = 1):
        self.path, self.spec = Path(path), spec
        self.decode_cost_s, self.decode_clock, self.fetch_delay_s = decode_cost_s, decode_clock, fetch_delay_s
        self.out_shape = tuple(out_shape) if out_shape is not None else None
        self.shuffle, self.shuffle_buffer = shuffle, shuffle_buffer
        self.rank, self.world_size = rank, world_size
        self.shards = manifest(self.path)
        self.epoch = 0  # set by the loop in the main process (fresh workers copy it each epoch)
        self._iterations = 0  # epochs this copy has run (persistent workers keep their copy)
        self._last = None  # read_raw's last shard: (its manifest entry, {index: raw bytes})

    def close(self) -> None:
        """Nothing stays open between reads (the interface of the map-style readers)."""
        self._last = None

    def read_raw(self, index: int) -> np.ndarray:
        """One sample's raw bytes, found by a scan of its shard (the in-memory copy's source)."""
        shard = next((s for s in self.shards if s["first"] <= index < s["end"]), None)
        if shard is None:
            raise IndexError(f"sample {index} of a {self.spec.n_samples}-sample dataset")
        if self._last is None or self._last[0] is not shard:  # consecutive indices: one scan per shard
            self._last = shard, dict(self._samples(self.path / shard["file"], shard))
        return self._last[1][index]

    def __getitem__(self, index: int) -> torch.Tensor:
        """One sample decoded, by a scan of its shard: a tar shard has no random access (the
        DataLoader iterates the reader instead; this serves checks and the in-memory copy)."""
        return torch.from_numpy(decode(self.read_raw(index), self.decode_cost_s, self.decode_clock, self.out_shape))

    def iter_raw(self) -> Iterator[tuple[int, np.ndarray]]:
        """Every sample's raw bytes in stored order, shard after shard (a sequential read)."""
        for shard in self.shards:
            yield from self._samples(self.path / shard["file"], shard)

    def expected(self, workers: int, epoch: int) -> collections.Counter:
        """The sample indices this rank receives in ``epoch`` with ``workers`` workers, once each."""
        out = collections.Counter()
        for worker in range(max(workers, 1)):
            for s in self._assigned(worker, max(workers, 1), epoch):
                out.update(range(self.shards[s]["first"], self.shards[s]["end"]))
        return out

    def shards_per_worker(self, workers: int) -> list[int]:
        return [len(self._assigned(w, max(workers, 1), 0)) for w in range(max(workers, 1))]

    def _assigned(self, worker: int, workers: int, epoch: int) -> list[int]:
        return assign_shards(len(self.shards), rank=self.rank, world_size=self.world_size, worker=worker,
                             workers=workers, epoch=epoch, seed=self.spec.seed, shuffle=self.shuffle)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch
        if info is not None:  # a persistent worker's copy is not set again: it counts its epochs
            epoch += self._iterations
            self._iterations += 1
        stream = (sample for s in self._assigned(worker, workers, epoch)
                  for sample in self._samples(self.path / self.shards[s]["file"], self.shards[s]))
        if self.shuffle and self.shuffle_buffer > 1:
            global_worker = self.rank * workers + worker
            stream = _buffered(stream, self.shuffle_buffer,
                               random.Random(f"{self.spec.seed}:{epoch}:{global_worker}"))
        for index, raw in stream:
            yield index, torch.from_numpy(decode(raw, self.decode_cost_s, self.decode_clock, self.out_shape))

    def _samples(self, path: Path, shard: dict) -> Iterator[tuple[int, np.ndarray]]:
        """The samples of one shard in stored order, checked against the manifest."""
        from webdataset.tariterators import group_by_keys, tar_file_expander

        want = shard["first"]
        with open(path, "rb") as f:
            def fail(what: str):
                return CorruptShardError(path, f.tell(), what)

            try:
                for sample in group_by_keys(tar_file_expander([{"url": str(path), "stream": f}])):
                    if self.fetch_delay_s:
                        time.sleep(self.fetch_delay_s)
                    index = int(sample["__key__"])
                    if index != want or _SUFFIX not in sample:
                        raise fail(f"sample {index} where the manifest says {want}")
                    yield index, np.frombuffer(sample[_SUFFIX], dtype=np.uint8)
                    want += 1
            except (tarfile.TarError, ValueError, OSError) as error:
                if isinstance(error, CorruptShardError):
                    raise
                said = str(error.args[0] if error.args else error).split(" @ ")[0]  # webdataset appends the stream
                raise fail(f"unreadable at or after sample {want}: {said}") from None
            if want != shard["end"]:
                raise fail(f"ends after {want - shard['first']} of its {shard['end'] - shard['first']} samples "
                           f"(cut short?)")


def _buffered(stream, size: int, rng: random.Random):
    buffer = []
    for item in stream:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = rng.randrange(size)
        buffer[slot], item = item, buffer[slot]
        yield item
    rng.shuffle(buffer)
    yield from buffer


class DeliveryCheck:
    """Counts the indices each epoch delivered against the ones it should have."""

    def __init__(self, reader: ShardedReader, workers: int):
        self.reader, self.workers = reader, workers
        self.epochs_checked = 0
        self._seen: collections.Counter = collections.Counter()

    def add(self, indices) -> None:
        self._seen.update(int(i) for i in indices)

    def end_epoch(self, epoch: int, *, complete: bool) -> None:
        """Check the epoch that just ended (``complete``: its iterator was exhausted; a phase that
        stopped mid-epoch is only checked for duplicates)."""
        want = self.reader.expected(self.workers, epoch)
        seen, self._seen = self._seen, collections.Counter()
        twice = sum(c - 1 for c in seen.values() if c > 1)
        stray = sum(c for i, c in seen.items() if i not in want)
        missing = sum(1 for i in want if i not in seen) if complete else 0
        if twice or stray or missing:
            raise DeliveryError(
                f"epoch {epoch} of rank {self.reader.rank}/{self.reader.world_size} with {self.workers} workers "
                f"delivered {sum(seen.values())} samples of its {len(want)}: {twice} twice, {missing} missing, "
                f"{stray} not of its shards")
        self.epochs_checked += complete


Reader = ShardedReader  # the name :func:`perfkit.measuring.data.datasets.reader` looks up
