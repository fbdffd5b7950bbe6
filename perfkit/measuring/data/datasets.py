"""Synthetic datasets for the data-loading benchmark: made locally once, read as torch Datasets.

A dataset is ``n_samples`` samples of ``sample_bytes`` seeded random bytes (incompressible, as JPEG-coded
images are) in one of the formats the studies compare (Ofeidis et al., "An Overview of the Data-Loader
Landscape", 2022; SURF, "Best practice for data formats in deep learning") or teams train from:

- ``files``: one ``.npy`` file per sample (``samples/00000042.npy``), the ImageFolder layout;
- ``mmap``: one ``(n_samples, sample_bytes)`` uint8 ``.npy`` read through ``np.load(mmap_mode="r")``;
- ``parquet``: a table (``index``, ``data``) in row groups of ``rows_per_group`` rows, no
  compression; a random read decodes the row group holding the sample (Parquet's unit of
  random access), so small row groups read faster at random and large ones scan faster;
- ``lmdb``: one LMDB environment, key ``b"%08d" % index``, read-only, no readahead;
- ``tfrecord``: records of ``tf.train.Example`` with an index of offsets, every CRC checked
  (:mod:`perfkit.measuring.data.tfrecord`; no TensorFlow, the ``tfrecord`` extra's crc32c);
- ``webdataset``: tar shards of ``shard_bytes`` read in order, split over ranks and workers, each
  sample once per epoch, checked (:mod:`perfkit.measuring.data.shards`, the ``webdataset`` extra).

**Cache.** A dataset lives in ``<cache>/<format>-<n>x<bytes>-<hash>``, the hash over every
:class:`DatasetSpec` field and the layout version: equal parameters reuse one generation across
configurations and processes. Default cache: ``$PERFKIT_OUT/datasets``, else ``~/.cache/perfkit/datasets``.
Generation writes a hidden ``.tmp-...`` sibling, fsyncs every file, writes ``dataset.json`` last and renames the
folder into place (atomic on POSIX): a killed generation leaves only a temp folder, never a dataset that is
reused; the next generation removes temp folders whose process is gone. The page cache: :mod:`.page_cache`.

**Reading.** :class:`SampleDataset` and its per-format subclasses are ``torch.utils.data.Dataset``s
returning one decoded float32 tensor per index. Each process opens its own handle (file, mmap,
``ParquetFile``, LMDB environment) on first use and drops it when pickled, so the classes work
under the ``fork`` and ``spawn`` start methods alike (LMDB forbids using an environment across a
fork). Per read, in this order:

1. ``fetch_delay_s``: a sleep before the read, standing for slow storage (a remote filesystem's
   latency): the process waits without using the CPU, as it would on I/O.
2. the read of the raw bytes from the format (the *fetch*);
3. :func:`decode` (the *preparation*), then ``np.resize`` to ``out_shape`` when given.

:class:`MemoryDataset` holds the raw bytes of every sample in this process's memory: the same
decode without any read, what DS-Analyzer calls the dataset cached in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from perfkit.core import checks
from perfkit.core.durable import fsync_dir
from perfkit.core.errors import BadInputError

__all__ = ["FORMATS", "DECODE_CLOCKS", "DatasetSpec", "default_cache_dir", "ensure", "decode",
           "dataset_bytes", "reader", "SHARDED", "sample_raw", "SampleDataset",
           "FilesDataset", "MmapDataset", "ParquetDataset", "LmdbDataset", "MemoryDataset"]

FORMATS = ("parquet", "lmdb", "files", "mmap", "tfrecord", "webdataset")
SHARDED = ("webdataset",)  # read in order as an IterableDataset, split over ranks and workers by shard
#: Formats with a module of their own (it builds on this one), imported by name on first use:
#: its ``write(spec, root)``, ``Reader`` and ``check_available()`` (an extra it needs).
_FORMAT_MODULES = {"tfrecord": "perfkit.measuring.data.tfrecord", "webdataset": "perfkit.measuring.data.shards"}
_LEFT_OUT = {"mds": "mosaicml-streaming 0.13 requires torchvision (a CUDA build that cannot import against the "
                    "CPU torch), numpy<2.2 and transformers<5; use webdataset (tar shards) or tfrecord"}
#: ``thread``: the decode burns this thread's CPU time (``time.thread_time``); ``wall``: it burns
#: CPU until this much wall time passed (``time.perf_counter``).
DECODE_CLOCKS = ("thread", "wall")
_LAYOUT_VERSION = 1
_META = "dataset.json"
_TMP_PREFIX = ".tmp-"
# The decode's augmentation rounds work on a slice this long, so one round lasts a few
# microseconds and the decode overshoots its target by about that much at most.
_ROUND_ELEMENTS = 4096


@dataclass(kw_only=True, frozen=True)
class DatasetSpec:
    """What a dataset holds and how it is stored; equal specs share one cached generation."""

    format: str
    """Storage format: one of :data:`FORMATS`."""
    n_samples: int = 256
    """Samples in the dataset."""
    sample_bytes: int = 3072
    """Raw bytes per sample (3072: a 32×32 RGB uint8 image)."""
    rows_per_group: int = 64
    """Parquet row-group size in rows (part of every format's key, so one spec is one dataset)."""
    shard_bytes: int = 65536
    """Sample bytes per shard of a sharded format (production shards hold 100s of MB; the small
    default gives the small default dataset a dozen shards to split over ranks and workers)."""
    seed: int = 0
    """Seeds the sample bytes: sample ``i`` is the same in every format."""

    def __post_init__(self):
        if self.format in _LEFT_OUT:
            raise BadInputError(f"format {self.format!r} is not supported: {_LEFT_OUT[self.format]}")
        if self.format not in FORMATS:
            raise BadInputError(f"unknown format {self.format!r}; use one of {', '.join(FORMATS)}")
        for name in ("n_samples", "sample_bytes", "rows_per_group", "shard_bytes"):
            checks.integer_at_least(name, getattr(self, name), 1)
        if self.format in _FORMAT_MODULES:
            _format_module(self.format).check_available()
        checks.integer_at_least("seed", self.seed, 0)

    @property
    def name(self) -> str:
        """The cache folder's name: readable parameters and a hash of all of them."""
        blob = json.dumps({**asdict(self), "layout": _LAYOUT_VERSION}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return f"{self.format}-{self.n_samples}x{self.sample_bytes}-{digest}"


def default_cache_dir() -> Path:
    """``$PERFKIT_OUT/datasets`` when ``PERFKIT_OUT`` is set, else ``~/.cache/perfkit/datasets``."""
    out = os.environ.get("PERFKIT_OUT")
    return Path(out) / "datasets" if out else Path.home() / ".cache" / "perfkit" / "datasets"


def sample_raw(spec: DatasetSpec, index: int) -> np.ndarray:
    """The raw bytes of sample ``index`` (uint8, ``sample_bytes`` long), from ``(seed, index)``."""
    return np.random.default_rng((spec.seed, index)).integers(0, 256, spec.sample_bytes, dtype=np.uint8)


# ---- generation ---------------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_files(spec: DatasetSpec, root: Path) -> list[Path]:
    folder = root / "samples"
    folder.mkdir()
    paths = []
    for i in range(spec.n_samples):
        path = folder / f"{i:08d}.npy"
        np.save(path, sample_raw(spec, i))
        paths.append(path)
    return paths


def _write_mmap(spec: DatasetSpec, root: Path) -> list[Path]:
    path = root / "data.npy"
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8,
                                      shape=(spec.n_samples, spec.sample_bytes))
    for i in range(spec.n_samples):
        array[i] = sample_raw(spec, i)
    array.flush()
    del array
    return [path]


def _write_parquet(spec: DatasetSpec, root: Path) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "data.parquet"
    schema = pa.schema([("index", pa.int64()), ("data", pa.binary(spec.sample_bytes))])
    # Random bytes do not compress: no codec, as JPEG-coded images are stored.
    with pq.ParquetWriter(path, schema, compression="none") as writer:
        for lo in range(0, spec.n_samples, spec.rows_per_group):
            idx = range(lo, min(lo + spec.rows_per_group, spec.n_samples))
            data = pa.array([sample_raw(spec, i).tobytes() for i in idx], pa.binary(spec.sample_bytes))
            writer.write_table(pa.table({"index": pa.array(idx, pa.int64()), "data": data}, schema=schema),
                               row_group_size=spec.rows_per_group)
    return [path]


def _write_lmdb(spec: DatasetSpec, root: Path) -> list[Path]:
    import lmdb

    folder = root / "lmdb"
    # map_size is the most the environment may grow to (a sparse reservation, not an allocation).
    env = lmdb.open(str(folder), map_size=2 * spec.n_samples * (spec.sample_bytes + 64) + (64 << 20),
                    subdir=True, metasync=True, sync=True)
    try:
        with env.begin(write=True) as txn:
            for i in range(spec.n_samples):
                txn.put(b"%08d" % i, sample_raw(spec, i).tobytes())
        env.sync(True)
    finally:
        env.close()
    return sorted(folder.iterdir())


_WRITERS = {"files": _write_files, "mmap": _write_mmap, "parquet": _write_parquet, "lmdb": _write_lmdb}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


def _temp_name(spec: DatasetSpec) -> str:
    # The generating host and pid after the last "@": a cache in a home folder shared by the
    # nodes of a cluster must not take another host's live generation for a dead one.
    return f"{_TMP_PREFIX}{spec.name}-{uuid.uuid4().hex[:8]}-{os.getpid()}@{socket.gethostname()}"


def _remove_stale_temps(cache: Path) -> None:
    """Remove this host's temp folders of generations whose process is gone (killed midway)."""
    for entry in cache.glob(f"{_TMP_PREFIX}*"):
        rest, _, host = entry.name.rpartition("@")
        try:
            pid = int(rest.rsplit("-", 1)[-1])
        except ValueError:
            continue
        if host == socket.gethostname() and not _pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)


def _complete(path: Path, spec: DatasetSpec) -> bool:
    try:
        meta = json.loads((path / _META).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("spec") == asdict(spec) and meta.get("layout") == _LAYOUT_VERSION


def ensure(spec: DatasetSpec, cache_dir: str | Path | None = None) -> tuple[Path, bool]:
    """The folder of ``spec``'s dataset, generated first if the cache lacks it: ``(path, made)``
    with ``made`` True when this call generated it. Safe against kills and concurrent callers."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    final = cache / spec.name
    if _complete(final, spec):
        return final, False
    cache.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(cache)
    if final.exists():  # not made by ensure (only complete folders are renamed into place)
        raise BadInputError(f"{final} exists but is not a complete dataset of these parameters; "
                            "remove it and run again")
    tmp = cache / _temp_name(spec)
    tmp.mkdir()
    try:
        t0 = time.perf_counter()
        written = (_WRITERS.get(spec.format) or _format_module(spec.format).write)(spec, tmp)
        meta = {"spec": asdict(spec), "layout": _LAYOUT_VERSION, "generation_s": time.perf_counter() - t0,
                "bytes": sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())}
        (tmp / _META).write_text(json.dumps(meta))
        for path in [*written, tmp / _META]:  # all on disk before the rename publishes them
            _fsync_file(path)
        for folder in {p.parent for p in written} | {tmp}:
            fsync_dir(folder)
        try:
            os.rename(tmp, final)
        except OSError:
            if _complete(final, spec):  # another process finished the same dataset first
                shutil.rmtree(tmp, ignore_errors=True)
                return final, False
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(cache)
    return final, True


def dataset_bytes(path: Path) -> int:
    """Bytes the dataset's files take (as recorded at generation)."""
    return int(json.loads((Path(path) / _META).read_text())["bytes"])


# ---- decode -------------------------------------------------------------------------------------


def decode(raw: np.ndarray, cost_s: float = 0.0, clock: str = "thread",
           out_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An image-like decode of ``raw`` uint8 bytes to float32 in [-0.5, 0.5], lasting ``cost_s``.

    The base decode converts and normalises the bytes; then augmentation rounds (flip, brightness
    and contrast jitter, clip: numpy elementwise work on a slice of the image) repeat until
    ``cost_s`` has passed on ``clock`` since the decode began:

    - ``thread`` (default): this thread's CPU time (``time.thread_time``), so a decode is a fixed
      amount of CPU work: contention for the cores stretches it in wall time, as it stretches a
      real JPEG decode, and more workers than cores do not decode faster.
    - ``wall``: wall time (``time.perf_counter``), burning the CPU all the while: a fixed duration
      whatever the neighbours, for checks that must not depend on the machine's load.

    A busy loop on a clock, not rounds calibrated beforehand (a calibration the load would skew). The
    rounds work on a scratch copy: the values returned do not depend on how many rounds ran.
    """
    tick = time.thread_time if clock == "thread" else time.perf_counter
    t0 = tick()
    image = raw.astype(np.float32)
    image *= 1.0 / 255.0
    image -= 0.5
    if cost_s > 0:
        scratch = image[:_ROUND_ELEMENTS].copy()
        out = np.empty_like(scratch)
        while tick() - t0 < cost_s:
            np.multiply(scratch[::-1], 1.01, out=out)  # horizontal flip, contrast
            out += 0.001  # brightness
            np.clip(out, -0.5, 0.5, out=scratch)
    return image if out_shape is None else np.resize(image, out_shape)


# ---- readers ------------------------------------------------------------------------------------


class SampleDataset(Dataset):
    """Samples of one stored dataset, each read (after ``fetch_delay_s``) and decoded."""

    def __init__(self, path: str | Path, spec: DatasetSpec, *, decode_cost_s: float = 0.0,
                 decode_clock: str = "thread", fetch_delay_s: float = 0.0,
                 out_shape: tuple[int, ...] | None = None):
        self.path = Path(path)
        self.spec = spec
        self.decode_cost_s = decode_cost_s
        self.decode_clock = decode_clock
        self.fetch_delay_s = fetch_delay_s
        self.out_shape = tuple(out_shape) if out_shape is not None else None
        self._handle = None
        self._pid = None

    def __len__(self) -> int:
        return self.spec.n_samples

    def __getstate__(self):
        # Open handles never travel to another process (spawn pickles the dataset; fork copies it,
        # and the pid check below reopens there).
        return {**self.__dict__, "_handle": None, "_pid": None}

    def _opened(self):
        if self._handle is None or self._pid != os.getpid():
            self._handle, self._pid = self._open(), os.getpid()
        return self._handle

    def _open(self):
        return None

    def close(self) -> None:
        """Drop this process's handle (an open mapping keeps its pages in the page cache)."""
        if self._handle is not None and self._pid == os.getpid() and hasattr(self._handle, "close"):
            self._handle.close()
        self._handle = self._pid = None

    def read_raw(self, index: int) -> np.ndarray:
        """The raw uint8 bytes of sample ``index`` from storage (no delay, no decode)."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.spec.n_samples:
            raise IndexError(f"sample {index} of a {self.spec.n_samples}-sample dataset")
        if self.fetch_delay_s:
            time.sleep(self.fetch_delay_s)
        raw = self.read_raw(index)
        return torch.from_numpy(decode(raw, self.decode_cost_s, self.decode_clock, self.out_shape))


class FilesDataset(SampleDataset):
    """One ``.npy`` file per sample: an open, a header parse and a read per sample."""

    def read_raw(self, index: int) -> np.ndarray:
        return np.load(self.path / "samples" / f"{index:08d}.npy")


class MmapDataset(SampleDataset):
    """One memory-mapped ``.npy``: a sample is a row, copied out of the mapping."""

    def _open(self):
        return np.load(self.path / "data.npy", mmap_mode="r")

    def read_raw(self, index: int) -> np.ndarray:
        return np.array(self._opened()[index])


class ParquetDataset(SampleDataset):
    """Parquet row groups: a random read decodes the whole row group holding the sample."""

    def _open(self):
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.path / "data.parquet")

    def read_raw(self, index: int) -> np.ndarray:
        group, row = divmod(index, self.spec.rows_per_group)
        table = self._opened().read_row_group(group, columns=["data"], use_threads=False)
        return np.frombuffer(table.column(0)[row].as_py(), dtype=np.uint8)


# LMDB allows one open environment per path and process: the readers of a path share it.
_LMDB_ENVS: dict[tuple[int, str], object] = {}


class LmdbDataset(SampleDataset):
    """An LMDB environment opened read-only once per process, without readahead (random reads)."""

    def _opened(self):
        import lmdb

        key = (os.getpid(), str(self.path))
        if key not in _LMDB_ENVS:
            _LMDB_ENVS[key] = lmdb.open(str(self.path / "lmdb"), readonly=True, lock=False, readahead=False,
                                        subdir=True, max_readers=512)
        return _LMDB_ENVS[key]

    def close(self) -> None:
        env = _LMDB_ENVS.pop((os.getpid(), str(self.path)), None)
        if env is not None:
            env.close()

    def read_raw(self, index: int) -> np.ndarray:
        with self._opened().begin(buffers=False) as txn:
            value = txn.get(b"%08d" % index)
        return np.frombuffer(value, dtype=np.uint8)


class MemoryDataset(SampleDataset):
    """Every sample's raw bytes in this process's memory: no read, no fetch delay (DS-Analyzer's
    dataset cached in memory). Workers get the array by fork (shared copy-on-write) or by pickle."""

    def __init__(self, source: SampleDataset):
        super().__init__(source.path, source.spec, decode_cost_s=source.decode_cost_s,
                         decode_clock=source.decode_clock, fetch_delay_s=0.0, out_shape=source.out_shape)
        self.raw = np.stack([source.read_raw(i) for i in range(source.spec.n_samples)])

    def read_raw(self, index: int) -> np.ndarray:
        return self.raw[index]


_READERS = {"files": FilesDataset, "mmap": MmapDataset, "parquet": ParquetDataset, "lmdb": LmdbDataset}


def reader(path: str | Path, spec: DatasetSpec, **options) -> SampleDataset:
    """The reader of the dataset of ``spec`` at ``path`` (``options``: ``decode_cost_s``,
    ``decode_clock``, ``fetch_delay_s``, ``out_shape``)."""
    return (_READERS.get(spec.format) or _format_module(spec.format).Reader)(path, spec, **options)


def _format_module(name: str):
    import importlib

    return importlib.import_module(_FORMAT_MODULES[name])
