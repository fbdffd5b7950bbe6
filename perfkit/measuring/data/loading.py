"""The data-loading benchmark: one :class:`LoaderConfig` in, one results row out.

A synthetic dataset (:mod:`perfkit.measuring.data.datasets`: generated once into a cache, reused) is
read through a ``torch.utils.data.DataLoader`` built from the configuration, in phases, each with
a fresh loader (fresh workers) whose workers are all shut down and joined when the phase ends:

1. **Loader only**: ``loader_batches`` batches as fast as the loader yields them:
   ``time_to_first_batch_s`` (from ``iter()``, worker start-up included), and the loader-only
   throughput of the batches after the first, ``samples_per_s`` and ``bytes_per_s`` (raw stored
   bytes read per second).
2. **Steps** (from storage through the page cache as it stands, or with ``evict_page_cache``
   after asking the kernel to drop the dataset from it): ``steps`` training steps, each
   ``next()`` on the loader, the host-to-device copy (``non_blocking`` from pinned memory on a
   GPU) and the compute: one of :mod:`perfkit.measuring.workloads.synthetic` (``model``: forward,
   backward, AdamW step) or a fixed
   ``step_compute_s``, during which the host sleeps as it waits on a GPU computing (the CPU stays
   free for the loader's workers). Per step after ``warmup_steps``: the step's wall time
   (``step_time_samples_s``), the time blocked in ``next()`` (``data_wait_samples_s``) and their
   ratio (``data_wait_share_samples``; ``data_wait_share`` is its median); ``bound`` is
   ``input-bound`` when that median exceeds ``input_bound_threshold`` (5 %, the TensorBoard
   profiler plugin's advice: :mod:`perfkit.analyse.dataloading`).
3. **Stall attribution** (``stall_attribution``; DS-Analyzer, Mohan et al., VLDB 2021): the
   same steps with the decoded batch already on the device (``ceiling_step_time_s``) and with
   the raw dataset cached in memory (``cached_step_time_s``: no read, no fetch delay, the same
   decode); ``prep_stall_s`` = cached − ceiling and ``fetch_stall_s`` = cold − cached, per step.

Page cache: just before the step phase's first read, ``page_cache_resident_fraction`` is the
share of the dataset's pages in the page cache, counted with ``mincore``
(:mod:`perfkit.measuring.data.page_cache`; NaN with ``page_cache_residency_note`` where it cannot be).
With ``evict_page_cache`` it is also measured before the request
(``page_cache_resident_fraction_before_eviction``) and ``page_cache_evicted`` says whether the
kernel dropped the dataset (at most 1 % left), not whether it was asked: on tmpfs it cannot.
``dataset_cache_dir`` and ``dataset_filesystem`` say where the dataset lies.

Pinning: on a GPU ``pin_memory`` pins batches in the loader's pin thread and copies them with
``non_blocking=True``, both inside the measured step. On a CPU there is no host-to-device copy to
speed up: the loader runs unpinned and the row says so (``pin_memory_applied`` False and
``pin_memory_note``), never silently.

Workers start with the platform's default start method (``fork`` on Linux) unless
``multiprocessing_context`` names one; the datasets reopen their files in each worker, so
``spawn`` and ``forkserver`` work too (slower to start: each worker imports torch).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields

import torch

from perfkit.analyse import dataloading as analysis
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.core import checks, status
from perfkit.core.status import OK, SKIPPED
from perfkit.core.timing import Measurement
from perfkit.measuring.data import datasets
from perfkit.measuring.data import page_cache
from perfkit.measuring.data.phases import PhaseTimes, Workers, ceiling_phase, run_phase
from perfkit.measuring.workloads import synthetic as workloads
from perfkit.measuring.training.step import synchronize

__all__ = ["LoaderConfig", "WORKLOAD", "run_loader_benchmark", "configs_from_params", "check_params",
           "raise_for_status"]

WORKLOAD = "dataloader"
_START_METHODS = ("fork", "spawn", "forkserver")
_LOADER_MODELS = ("mlp", "convnet")  # float inputs; the transformer's are token ids


def _set_sharing_strategy(strategy: str, worker_id: int) -> None:
    torch.multiprocessing.set_sharing_strategy(strategy)


@dataclass(kw_only=True, frozen=True)
class LoaderConfig:
    """One data-loading configuration; every field is a column of its row."""

    format: str = "files"
    """Storage format: ``parquet``, ``lmdb``, ``files`` (one ``.npy`` per sample), ``mmap``,
    ``tfrecord`` or ``webdataset`` (tar shards, :mod:`perfkit.measuring.data.shards`)."""
    n_samples: int = 256
    """Samples in the dataset; an epoch is ``n_samples // batch_size`` batches."""
    sample_bytes: int = 3072
    """Stored bytes per sample."""
    rows_per_group: int = 64
    """Parquet row-group size in rows."""
    shard_bytes: int = datasets.DatasetSpec.shard_bytes
    """Sample bytes per shard of a sharded format (``webdataset``)."""
    shuffle_buffer: int = 0
    """Sharded formats with ``shuffle``: samples each worker holds to yield from at random (0: the
    shard order is shuffled, the samples within a shard are not)."""
    decode_cost_s: float = 0.0
    """Per-sample decode: image-like CPU work lasting this long (:func:`datasets.decode`)."""
    decode_clock: str = "thread"
    """``thread``: the decode is this much CPU time; ``wall``: this much wall time, CPU busy."""
    fetch_delay_s: float = 0.0
    """Injected storage latency: a sleep before every sample read."""
    batch_size: int = 8
    """Samples per batch (``drop_last``: every batch is full)."""
    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the main process."""
    pin_memory: bool = False
    """Pin batches for a non-blocking host-to-device copy (GPU only; reported not applicable on CPU)."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (None: torch's default, 2); needs workers."""
    persistent_workers: bool = False
    """Keep workers alive across epochs (they are shut down when the configuration ends)."""
    multiprocessing_context: str | None = None
    """Workers' start method (``fork``, ``spawn``, ``forkserver``); None: the platform default."""
    sharing_strategy: str | None = None
    """How workers hand batches over (``torch.multiprocessing``): ``file_descriptor`` (torch's Linux
    default: each batch's shared memory passed as a file descriptor, a round trip to the worker's
    resource sharer) or ``file_system`` (shared memory by name: no round trip); None: torch's default."""
    shuffle: bool = True
    """Random order (random reads), a new permutation per epoch, seeded."""
    model: str | None = None
    """A workload of :mod:`perfkit.measuring.workloads.synthetic` to train (``mlp``, ``convnet``); None: a
    fixed ``step_compute_s``."""
    model_size: dict = field(default_factory=dict)
    """Fields of the workload config over its defaults."""
    step_compute_s: float = 0.0
    """Fixed compute time per step when ``model`` is None (the host sleeps, as while a GPU computes)."""
    steps: int = 20
    """Training steps per phase, warm-up included."""
    warmup_steps: int = 2
    """Leading steps of each phase left out of the samples."""
    loader_batches: int = 16
    """Batches of the loader-only phase (0: no loader-only phase; else at least 2)."""
    stall_attribution: bool = False
    """Also time the ingestion ceiling and the cached dataset (DS-Analyzer's stall split)."""
    evict_page_cache: bool = False
    """Ask the kernel to drop the dataset from the page cache before the step phase, so its reads
    come from storage; whether it did is measured (``page_cache_evicted``)."""
    device: str = "auto"
    """``auto`` (a GPU if any, else the CPU), ``cpu`` or ``cuda``."""
    seed: int = 0
    """Seeds the sample bytes, the shuffling and the workload."""
    cache_dir: str | None = None
    """Dataset cache (None: ``$PERFKIT_OUT/datasets`` or ``~/.cache/perfkit/datasets``)."""
    input_bound_threshold: float = analysis.INPUT_BOUND_SHARE
    """Median data-wait share above which the row is ``input-bound``."""
    worker_timeout_s: float = 120.0
    """Longest wait for one batch from a worker before the run fails (DataLoader ``timeout``)."""

    def __post_init__(self):
        self.dataset_spec()  # the format (its extra installed) and the dataset's sizes, before any data is made
        for name in ("n_samples", "sample_bytes", "rows_per_group", "batch_size", "steps", "shard_bytes"):
            checks.integer_at_least(name, getattr(self, name), 1)
        checks.integer_at_least("shuffle_buffer", self.shuffle_buffer, 0)
        sharded = {"shard_bytes": self.shard_bytes != datasets.DatasetSpec.shard_bytes,
                   "shuffle_buffer": self.shuffle_buffer > 0}
        for name, used in sharded.items():
            if used and self.format not in datasets.SHARDED:
                raise BadInputError(f"{name} applies to the sharded formats ({', '.join(datasets.SHARDED)}), "
                                    f"not {self.format!r}; leave it at its default")
        if self.shuffle_buffer and not self.shuffle:
            raise BadInputError("shuffle_buffer needs shuffle=True (it is how the samples are shuffled)")
        checks.integer_at_least("num_workers", self.num_workers, 0)
        checks.integer_at_least("warmup_steps", self.warmup_steps, 0)
        checks.integer_at_least("seed", self.seed, 0)
        checks.integer_at_least("loader_batches", self.loader_batches, 0)
        if self.loader_batches == 1:
            raise BadInputError("loader_batches must be 0 (no loader-only phase) or >= 2 "
                                "(the first batch is the time to first batch, the rest the throughput)")
        if self.warmup_steps >= self.steps:
            raise BadInputError(f"warmup_steps ({self.warmup_steps}) must be < steps ({self.steps})")
        if self.batch_size > self.n_samples:
            raise BadInputError(f"batch_size {self.batch_size} > n_samples {self.n_samples}: an epoch "
                                "would have no full batch; raise n_samples")
        for name in ("decode_cost_s", "fetch_delay_s", "step_compute_s"):
            checks.seconds_at_least_zero(name, getattr(self, name))
        checks.one_of("decode_clock", self.decode_clock, datasets.DECODE_CLOCKS)
        checks.one_of("device", self.device, ("auto", "cpu", "cuda"))
        if self.prefetch_factor is not None:
            checks.integer_at_least("prefetch_factor", self.prefetch_factor, 1)
        workers_only = {"prefetch_factor": self.prefetch_factor is not None,
                        "persistent_workers": self.persistent_workers,
                        "multiprocessing_context": self.multiprocessing_context is not None,
                        "sharing_strategy": self.sharing_strategy is not None}
        for name, used in workers_only.items():
            if used and self.num_workers == 0:
                raise BadInputError(f"{name} needs num_workers > 0 (with 0 workers torch loads in the "
                                    f"main process); set num_workers or leave {name} at its default")
        if self.multiprocessing_context is not None:
            checks.one_of("multiprocessing_context", self.multiprocessing_context, _START_METHODS)
        if self.sharing_strategy is not None:
            checks.one_of("sharing_strategy", self.sharing_strategy,
                          tuple(sorted(torch.multiprocessing.get_all_sharing_strategies())))
        if self.model is not None:
            checks.one_of("model", self.model, _LOADER_MODELS)
            if self.step_compute_s:
                raise BadInputError("set model or step_compute_s, not both: the step is one or the other")
            workloads.make_spec(self.model, **self.model_size)
        elif self.model_size:
            raise BadInputError("model_size needs a model")
        if not 0 < self.input_bound_threshold < 1:
            raise BadInputError(f"input_bound_threshold must be in (0, 1), got {self.input_bound_threshold!r}")
        if self.worker_timeout_s <= 0:
            raise BadInputError(f"worker_timeout_s must be > 0, got {self.worker_timeout_s!r}")

    def dataset_spec(self) -> datasets.DatasetSpec:
        return datasets.DatasetSpec(format=self.format, n_samples=self.n_samples,
                                    sample_bytes=self.sample_bytes, rows_per_group=self.rows_per_group,
                                    shard_bytes=self.shard_bytes, seed=self.seed)

    def as_row(self) -> dict:
        """Fields as results columns (``model_size`` as JSON text)."""
        row = asdict(self)
        row["model_size"] = json.dumps(self.model_size, sort_keys=True)
        return row


# ---- the step -----------------------------------------------------------------------------------


def _device(cfg: LoaderConfig) -> torch.device:
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigurationSkipped("device 'cuda' requested but no CUDA/ROCm device is visible")
    return torch.device("cuda", torch.cuda.current_device())


def _make_step(cfg: LoaderConfig, device: torch.device, non_blocking: bool
               ) -> tuple[Callable[[torch.Tensor], None], tuple[int, ...] | None]:
    """The step a batch goes through (copy + compute + synchronize) and the sample shape the
    workload takes (None: any)."""
    if cfg.model is None:
        def fixed_step(batch: torch.Tensor) -> None:
            batch.to(device, non_blocking=non_blocking)
            if cfg.step_compute_s:
                time.sleep(cfg.step_compute_s)
            synchronize(device)

        return fixed_step, None
    work = workloads.build(workloads.make_spec(cfg.model, **{**cfg.model_size, "seed": cfg.seed}),
                           device=device)
    example, targets = work.make_batch(cfg.batch_size, seed=cfg.seed)
    targets = targets.to(device)  # the loss needs targets; their values do not change the step's cost
    optimizer = torch.optim.AdamW(work.model.parameters(), lr=1e-3)

    def train_step(batch: torch.Tensor) -> None:
        inputs = batch.to(device, non_blocking=non_blocking)
        optimizer.zero_grad(set_to_none=True)
        work.loss_fn(work.model(inputs), targets).backward()
        optimizer.step()
        synchronize(device)

    return train_step, tuple(example.shape[1:])


# ---- loaders and phases -------------------------------------------------------------------------


def _loader(cfg: LoaderConfig, dataset, pin: bool) -> torch.utils.data.DataLoader:
    kwargs = {}
    if cfg.num_workers:
        kwargs = {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": cfg.persistent_workers,
                  "multiprocessing_context": cfg.multiprocessing_context, "timeout": cfg.worker_timeout_s}
        if cfg.sharing_strategy:  # set in each worker, the side that shares (a spawned one starts at the default)
            kwargs["worker_init_fn"] = functools.partial(_set_sharing_strategy, cfg.sharing_strategy)
    if isinstance(dataset, torch.utils.data.IterableDataset):  # sharded: it shuffles and splits itself,
        return torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                                           pin_memory=pin, drop_last=False, **kwargs)  # and drops nothing
    generator = torch.Generator().manual_seed(cfg.seed)
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=cfg.shuffle,
                                       generator=generator, num_workers=cfg.num_workers,
                                       pin_memory=pin, drop_last=True, **kwargs)


def _median(values) -> float:
    return statistics.median(values) if values else math.nan


def _loader_columns(cfg: LoaderConfig, phase: PhaseTimes | None) -> dict:
    if phase is None:
        return {"time_to_first_batch_s": math.nan, "samples_per_s": math.nan, "bytes_per_s": math.nan,
                "loader_batch_time_samples_s": []}
    waits, after_first = phase.waits, phase.waits[1:]
    rate = sum(phase.sizes[1:]) / sum(after_first)  # a sharded epoch's last batches may be short
    timing = Measurement(samples_s=tuple(after_first), label="loader batch").as_row("loader_batch_time")
    timing["loader_noisy"] = timing.pop("noisy")
    return {"time_to_first_batch_s": waits[0], "samples_per_s": rate,
            "bytes_per_s": rate * cfg.sample_bytes, **timing}


def _step_columns(cfg: LoaderConfig, phase: PhaseTimes) -> dict:
    waits, totals = phase.waits[cfg.warmup_steps:], phase.totals[cfg.warmup_steps:]
    shares = analysis.wait_shares(waits, totals)
    share = _median(shares)
    timing = Measurement(samples_s=tuple(totals), warmup_calls=cfg.warmup_steps,
                         label="loader step").as_row("step_time")
    return {**timing, "step_samples_per_s": cfg.batch_size / timing["step_time_s"],
            "data_wait_s": _median(waits), "data_wait_samples_s": waits,
            "data_wait_share": share, "data_wait_share_samples": shares,
            "data_wait_share_p90": Measurement(samples_s=tuple(shares)).percentile(90),
            "compute_time_s": _median([t - w for t, w in zip(totals, waits)]),
            "bound": analysis.bound(share, cfg.input_bound_threshold)}


def _page_cache_columns(cfg: LoaderConfig, path) -> dict:
    """Where the dataset lies and what the page cache held of it, eviction asked or not."""
    before = page_cache.residency(path).fraction if cfg.evict_page_cache else math.nan
    if cfg.evict_page_cache:
        page_cache.evict(path)
    now = page_cache.residency(path)
    return {"dataset_cache_dir": str(path.parent), "dataset_filesystem": page_cache.filesystem(path),
            "page_cache_resident_fraction_before_eviction": before,
            "page_cache_resident_fraction": now.fraction, "page_cache_residency_note": now.note,
            "page_cache_evicted": page_cache.evicted(now) if cfg.evict_page_cache else None}


def _benchmark(cfg: LoaderConfig, device: torch.device) -> dict:
    pin = cfg.pin_memory and device.type == "cuda"
    note = None
    if cfg.pin_memory and not pin:
        note = (f"not applicable on {device.type}: no host-to-device copy to speed up; "
                "the loader ran unpinned")
    step, out_shape = _make_step(cfg, device, non_blocking=pin)
    spec = cfg.dataset_spec()
    t0 = time.perf_counter()
    path, made = datasets.ensure(spec, cfg.cache_dir)
    generation_s = time.perf_counter() - t0
    sharded = {}
    if cfg.format in datasets.SHARDED:
        rank, world = _rank_and_world()
        sharded = {"shuffle": cfg.shuffle, "shuffle_buffer": cfg.shuffle_buffer, "rank": rank, "world_size": world}
    dataset = datasets.reader(path, spec, decode_cost_s=cfg.decode_cost_s, decode_clock=cfg.decode_clock,
                              fetch_delay_s=cfg.fetch_delay_s, out_shape=out_shape, **sharded)
    workers = Workers()
    loader_phase = None
    if cfg.loader_batches:
        loader_phase = run_phase(_loader(cfg, dataset, pin), cfg.loader_batches, None, workers)
    dataset.close()  # the main process's mapping, if the loader-only phase read in it
    cache = _page_cache_columns(cfg, path)  # measured last before the step phase's first read
    steps = run_phase(_loader(cfg, dataset, pin), cfg.steps, step, workers)
    row = {**cfg.as_row(), "workload": WORKLOAD, "status": OK, "error": None,
           "resolved_device": str(device), "pin_memory_applied": pin, "pin_memory_note": note,
           "non_blocking": pin,
           "prefetch_factor_effective": (cfg.prefetch_factor or 2) if cfg.num_workers else None,
           "sharing_strategy_effective": (cfg.sharing_strategy or torch.multiprocessing.get_sharing_strategy())
           if cfg.num_workers else None,
           "dataset_path": str(path), "dataset_generated": made, "dataset_generation_s": generation_s,
           "dataset_bytes": datasets.dataset_bytes(path), **cache,
           **_loader_columns(cfg, loader_phase), **_step_columns(cfg, steps), **_shard_columns(cfg, dataset,
                                                                                              loader_phase, steps)}
    stall = {"ceiling_step_time_s": math.nan, "ceiling_step_time_samples_s": [],
             "cached_step_time_s": math.nan, "cached_step_time_samples_s": []}
    if cfg.stall_attribution:
        cached = datasets.MemoryDataset(dataset)
        cached_totals = run_phase(_loader(cfg, cached, pin), cfg.steps, step, workers).totals
        on_device = torch.stack([torch.from_numpy(datasets.decode(cached.raw[i], out_shape=out_shape))
                                 for i in range(cfg.batch_size)]).to(device)
        ceiling = ceiling_phase(on_device, cfg.steps, step)[cfg.warmup_steps:]
        cached_totals = cached_totals[cfg.warmup_steps:]
        stall = {"ceiling_step_time_s": _median(ceiling), "ceiling_step_time_samples_s": ceiling,
                 "cached_step_time_s": _median(cached_totals), "cached_step_time_samples_s": cached_totals}
    row.update(stall)
    row.update(analysis.stall_attribution(stall["ceiling_step_time_s"], stall["cached_step_time_s"],
                                          row["step_time_s"]))
    # How the workers really started (their Popen), and any that outlived its phase.
    row["start_method"] = ", ".join(sorted(m for m in workers.methods if m)) or None
    row["workers_left_alive"] = workers.left_alive
    return row


def _rank_and_world() -> tuple[int, int]:
    """This process's rank and the world's size when torch.distributed is up, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _shard_columns(cfg: LoaderConfig, dataset, *phases: PhaseTimes | None) -> dict:
    """A sharded dataset's split and the epochs checked to hold each of this rank's samples once."""
    if cfg.format not in datasets.SHARDED:
        return {"shards": None, "shards_per_worker_min": None, "shard_rank": None, "shard_world_size": None,
                "epochs_checked": None}
    return {"shards": len(dataset.shards), "shards_per_worker_min": min(dataset.shards_per_worker(cfg.num_workers)),
            "shard_rank": dataset.rank, "shard_world_size": dataset.world_size,
            "epochs_checked": sum(p.epochs_checked for p in phases if p is not None)}


def run_loader_benchmark(cfg: LoaderConfig) -> dict:
    """Run ``cfg`` and return its row (``workload = "dataloader"``): ``status`` ``ok``, or
    ``skipped`` with the reason in ``error`` when this machine cannot honour it."""
    base = {**cfg.as_row(), "workload": WORKLOAD}
    try:
        return _benchmark(cfg, _device(cfg))
    except Exception as error:  # noqa: BLE001 - the row records every ending (an OOM is an edge)
        return status.error_row(base, error)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # after an OOM, give the next configuration a clean pool


# ---- notebooks ----------------------------------------------------------------------------------


def configs_from_params(params: Mapping[str, object]) -> list[LoaderConfig]:
    """The configurations of notebooks/dataloader.ipynb's parameters: one per
    (``num_workers``, ``pin_memory``) pair, each of which may be a value or a list of values."""
    names = {f.name for f in fields(LoaderConfig)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise BadInputError(f"unknown data-loading parameters {unknown}; valid names: {sorted(names)}")
    base = dict(params)

    def values(name):
        value = base.pop(name, getattr(LoaderConfig, name))
        return list(value) if isinstance(value, (list, tuple)) else [value]

    workers, pins = values("num_workers"), values("pin_memory")
    if not workers or not pins:
        raise BadInputError("num_workers and pin_memory need at least one value each")
    return [LoaderConfig(**base, num_workers=w, pin_memory=p) for w, p in itertools.product(workers, pins)]


def check_params(params: Mapping[str, object]) -> None:
    """The value check of notebooks/dataloader.ipynb (its metadata ``perfkit.check``): raise
    :class:`BadInputError` when its parameters make no valid configuration, before any data is
    generated."""
    configs_from_params(params)


def raise_for_status(rows: list[Mapping]) -> None:
    """For a notebook, after recording ``rows``: return if one is ``ok``; otherwise stop the
    notebook the way a row ended (:func:`perfkit.core.status.raise_for_status`: ``skipped`` only
    when every row was skipped; an ``oom`` row as :class:`~perfkit.core.status.OutOfMemoryError`)."""
    if not rows or any(r["status"] == OK for r in rows):
        return
    status.raise_for_status(next((r for r in rows if r["status"] != SKIPPED), rows[0]))