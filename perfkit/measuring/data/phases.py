"""The timed phases of the data-loading benchmark (:mod:`perfkit.measuring.data.loading`): batches
pulled from a fresh DataLoader, each through a step or none, and every worker joined at the end.

A sharded dataset (:class:`~perfkit.measuring.data.shards.ShardedReader`) yields each sample with
its index: here the indices of every batch are counted per epoch (:class:`~perfkit.measuring.data.
shards.DeliveryCheck`), an exhausted epoch must have delivered exactly this rank's samples, and a
phase that ends mid-epoch must not have delivered one twice. Its batches may be short at an
epoch's end (a worker's last batch: no ``drop_last``, which would drop samples), so the phase
also returns each batch's sample count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from perfkit.measuring.data.shards import DeliveryCheck, ShardedReader

__all__ = ["Workers", "PhaseTimes", "run_phase", "ceiling_phase"]


@dataclass
class Workers:
    """What the phases' worker processes were: their start methods, and how many outlived a phase."""

    methods: set = field(default_factory=set)
    left_alive: int = 0


@dataclass
class PhaseTimes:
    """Per batch: seconds blocked in ``next()`` (a new epoch's ``iter()`` included), the whole
    step's seconds, and its samples."""

    waits: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    epochs_checked: int = 0
    """Epochs of a sharded dataset read to their end and found to hold each sample once."""


def _shutdown(loader, iterators: list, workers: Workers) -> None:
    """Shut down and join every worker the phase started; count any still alive after that."""
    unique = {id(it): it for it in [*iterators, getattr(loader, "_iterator", None)] if it is not None}
    processes = []
    for it in unique.values():
        processes += list(getattr(it, "_workers", []))
        stop = getattr(it, "_shutdown_workers", None)  # what the iterator's __del__ calls
        if stop is not None:
            stop()
    loader._iterator = None  # persistent workers: the loader holds its iterator
    for process in processes:
        # multiprocessing's Popen classes name their start method ("fork", "spawn", "forkserver").
        workers.methods.add(getattr(getattr(process, "_popen", None), "method", None))
        process.join(timeout=5)
    alive = [p for p in processes if p.is_alive()]
    for process in alive:  # torch's shutdown terminates stragglers already; belt and braces
        process.terminate()
        process.join(timeout=5)
    workers.left_alive += len(alive)


def run_phase(loader, n: int, step: Callable[[torch.Tensor], None] | None, workers: Workers) -> PhaseTimes:
    """``n`` batches through ``step`` across as many epochs as it takes."""
    times, iterators, it = PhaseTimes(), [], None
    dataset = loader.dataset
    empty_epochs = 0
    check = DeliveryCheck(dataset, loader.num_workers) if isinstance(dataset, ShardedReader) else None
    epoch = -1
    if loader.num_workers:  # a handle open here must not cross a fork (LMDB forbids it)
        dataset.close()
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            batch = None
            while batch is None:
                if it is None:
                    epoch += 1
                    if check is not None:
                        dataset.epoch = epoch  # fresh workers copy it; persistent ones count their own
                    it = iter(loader)
                    iterators.append(it)
                try:
                    batch = next(it)
                    empty_epochs = 0
                except StopIteration:
                    it = None
                    if check is not None:
                        check.end_epoch(epoch, complete=True)
                    empty_epochs += 1
                    if empty_epochs == 2:  # not one batch in a whole epoch: it would loop forever
                        raise RuntimeError(_NOTHING.format(epoch=epoch, rank=getattr(dataset, "rank", 0),
                                                           world=getattr(dataset, "world_size", 1)))
            t1 = time.perf_counter()
            if check is not None:
                indices, batch = batch
                check.add(indices)
            if step is not None:
                step(batch)
            times.waits.append(t1 - t0)
            times.totals.append(time.perf_counter() - t0)
            times.sizes.append(len(batch))
            del batch
        if check is not None:
            check.end_epoch(epoch, complete=False)
            times.epochs_checked = check.epochs_checked
    finally:
        _shutdown(loader, iterators, workers)
    return times


_NOTHING = ("epoch {epoch} delivered no batch to rank {rank} of {world}: this rank's share of the dataset is "
            "empty (a sharded dataset with fewer shards than ranks × workers: lower shard_bytes or the workers)")


def ceiling_phase(batch: torch.Tensor, n: int, step) -> list[float]:
    """``n`` steps on one batch already on the device: compute only (DS-Analyzer's ceiling)."""
    totals = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(batch)
        totals.append(time.perf_counter() - t0)
    return totals
