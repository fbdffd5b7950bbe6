"""Random-read and sequential-read throughput of the storage formats, as ratios to one file per
sample, same run.

The datasets of ``perfkit.measuring.data.datasets`` (``--n-samples`` samples of ``--sample-bytes`` seeded
random bytes; Parquet in row groups of ``--rows-per-group``, WebDataset in tar shards of
``--shard-bytes``), generated once into a temporary cache. Each round reads every sample of every
format once, in this process (no decode, no DataLoader: the format's read alone), in two orders:

- ``random``: a fresh random permutation, sample by sample (``read_raw``). A tar shard has no
  random access: a WebDataset read scans its shard up to the sample, which is the point;
- ``sequential``: stored order (``read_raw`` 0, 1, …; WebDataset and TFRecord stream their
  files, ``iter_raw``/``iter_records``, no index; Parquet reads each row group once).

The formats go in a rotated order each round so drift hits them alike; with ``--cold`` the
dataset's pages are dropped from the page cache (``posix_fadvise DONTNEED``) before each format's
read. Reported per order: the median over rounds of samples/s and MB/s per format and its ratio to
``files`` (the median of the per-round ratios, each round's formats measured back to back).

    python benchmarks/dataloading_formats.py [--n-samples 2048] [--sample-bytes 3072] [--rounds 5] [--cold]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfkit.measuring.data import datasets, page_cache, tfrecord  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=2048)
    parser.add_argument("--sample-bytes", type=int, default=3072)
    parser.add_argument("--rows-per-group", type=int, default=64)
    parser.add_argument("--shard-bytes", type=int, default=datasets.DatasetSpec.shard_bytes)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each format's round")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.n_samples} samples of "
          f"{args.sample_bytes} B, parquet row groups of {args.rows_per_group}, {args.rounds} rounds, "
          f"{'cold' if args.cold else 'warm'} page cache")
    cache = tempfile.mkdtemp(prefix="perfkit-formats-")
    atexit.register(shutil.rmtree, cache, True)  # the generated dataset goes with the run
    readers = {}
    for fmt in datasets.FORMATS:
        spec = datasets.DatasetSpec(format=fmt, n_samples=args.n_samples, sample_bytes=args.sample_bytes,
                                    rows_per_group=args.rows_per_group, shard_bytes=args.shard_bytes)
        t0 = time.perf_counter()
        path, _ = datasets.ensure(spec, cache)
        readers[fmt] = datasets.reader(path, spec)
        print(f"  generated {fmt:<10} {datasets.dataset_bytes(path) / 1e6:8.2f} MB in {time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    order = list(datasets.FORMATS)
    for mode in ("random", "sequential"):
        rates: dict[str, list[float]] = {fmt: [] for fmt in datasets.FORMATS}
        ratios: dict[str, list[float]] = {fmt: [] for fmt in datasets.FORMATS}
        for r in range(args.rounds):
            this_round = {}
            for fmt in order[r % len(order):] + order[:r % len(order)]:
                reader = readers[fmt]
                if args.cold:
                    reader.close()  # an open mapping (mmap, LMDB) would keep its pages cached
                    page_cache.evict(reader.path)
                indices = rng.permutation(args.n_samples).tolist() if mode == "random" else None
                t0 = time.perf_counter()
                read = _read_random(reader, indices) if indices is not None else _read_in_order(fmt, reader)
                this_round[fmt] = read / (time.perf_counter() - t0)
                assert read == args.n_samples, (fmt, mode, read)
                rates[fmt].append(this_round[fmt])
            for fmt in datasets.FORMATS:
                ratios[fmt].append(this_round[fmt] / this_round["files"])
        print(f"{mode} reads: {'format':<10} {'samples/s':>12} {'MB/s':>9} {'x files':>8}  (median of {args.rounds} "
              "rounds; x files: median of the per-round ratios)")
        for fmt in datasets.FORMATS:
            rate = statistics.median(rates[fmt])
            print(f"{'':<{len(mode) + 7}} {fmt:<10} {rate:12.0f} {rate * args.sample_bytes / 1e6:9.1f} "
                  f"{statistics.median(ratios[fmt]):8.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _read_random(reader, indices) -> int:
    for i in indices:
        reader.read_raw(i)
    return len(indices)


def _read_in_order(fmt: str, reader) -> int:
    if fmt == "webdataset":
        return sum(1 for _ in reader.iter_raw())
    if fmt == "tfrecord":
        return sum(1 for _ in tfrecord.iter_records(reader.path / tfrecord.FILE))
    if fmt == "parquet":  # row group after row group, each decoded once
        import pyarrow.parquet as pq

        return sum(len(b) for b in pq.ParquetFile(reader.path / "data.parquet").iter_batches(columns=["data"]))
    for i in range(reader.spec.n_samples):
        reader.read_raw(i)
    return reader.spec.n_samples


if __name__ == "__main__":
    main()
