"""Collective benchmarks in the nccl-tests manner: per-iteration times, busbw, a correctness check.

:func:`collectives_rank` is the rank target (``perfkit.collectives:collectives_rank``) that
:func:`perfkit.launch.launch` runs on every rank of an initialised process group; it returns one
entry per (collective, message size, in-place) with that rank's raw samples.
:func:`run_collectives` launches it and reduces the ranks into one DataFrame row per entry.

Conventions (nccl-tests, ``doc/PERFORMANCE.md`` and the ``*GetBw`` functions of its ``src/``;
``shared/reference/formulas.md``):

- ``size_bytes`` is S of the formulas table: ``count × elem_size`` for all_reduce, broadcast and
  send_recv, ``count × elem_size × n`` for all_gather, reduce_scatter and all_to_all, with
  ``count`` the elements per rank (per peer chunk for all_to_all). A requested size is rounded
  down to a whole count, as nccl-tests does.
- algbw = S / t, busbw = algbw × factor, factor 2(n−1)/n for all_reduce, (n−1)/n for all_gather,
  reduce_scatter and all_to_all, 1 for broadcast and send_recv.
- t is the max over ranks of each rank's median per-iteration time (nccl-tests ``-a 3`` reduces
  with the max; the slowest rank bounds the collective), every rank's samples kept.
- The check (nccl-tests ``-c``) fills inputs with rank-dependent small integers (exact in every
  dtype, bf16 included), runs the collective once more and counts elements that differ from the
  expected result, summed over ranks (nccl-tests' ``#wrong``).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
import torch.distributed as dist

from perfkit import nccl_log
from perfkit.errors import BadInputError, ExecutionFailed
from perfkit.timing import Measurement

__all__ = [
    "COLLECTIVES",
    "CollectivesConfig",
    "busbw_factor",
    "message_bytes",
    "collectives_rank",
    "reduce_rank_results",
    "run_collectives",
]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
# S counts every rank's chunk for these (formulas.md: count × elem_size × n).
_PER_RANK_CHUNK = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
# The in-place forms torch.distributed offers: all_reduce and broadcast write into their input;
# all_gather_into_tensor/reduce_scatter_tensor take an input that is the rank's slice of the
# output (nccl-tests' in-place layout); all_to_all_single and send/recv have separate buffers.
_FORMS = {
    "all_reduce": (True,), "broadcast": (True,), "all_gather": (False, True),
    "reduce_scatter": (False, True), "all_to_all": (False,), "send_recv": (False,),
}
# The NCCL function name a TUNING line gives each collective; the p2p ones print none.
_NCCL_FUNC = {"all_reduce": "AllReduce", "all_gather": "AllGather",
              "reduce_scatter": "ReduceScatter", "broadcast": "Broadcast"}
_ROOT = 0
_PATTERN_MOD = 17  # pattern values 1..17: sums over ranks stay exact integers in bf16 up to n=15


def busbw_factor(op: str, world_size: int) -> float:
    """busbw / algbw for ``op`` on ``world_size`` ranks (nccl-tests PERFORMANCE.md)."""
    if op not in COLLECTIVES:
        raise BadInputError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    if world_size < 1:
        raise BadInputError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n  # reduce-scatter then all-gather: each moves (n-1)/n of S
    if op in _PER_RANK_CHUNK:
        return (n - 1) / n
    return 1.0


def message_bytes(op: str, count: int, elem_size: int, world_size: int) -> int:
    """S of formulas.md: ``count × elem_size``, times ``world_size`` for per-rank-chunk ops."""
    if op not in COLLECTIVES:
        raise BadInputError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    return count * elem_size * (world_size if op in _PER_RANK_CHUNK else 1)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BadInputError(f"unknown torch dtype {name!r}")
    return dtype


@dataclass(kw_only=True, frozen=True)
class CollectivesConfig:
    """One collectives benchmark: which ops, which sizes, on which ranks, with which knobs."""

    ops: tuple[str, ...] = COLLECTIVES
    """Collectives to run, from :data:`COLLECTIVES`."""
    min_bytes: int = 1024
    """Smallest message size S (bytes, formulas.md definition per op)."""
    max_bytes: int = 1 << 20
    """Largest message size S (bytes); sizes are min_bytes × factor^k up to this."""
    factor: int = 4
    """Ratio between successive sizes (nccl-tests ``-f``)."""
    dtype: str = "float32"
    """Element type, a ``torch`` attribute name (``float32``, ``bfloat16``, ``int32``...)."""
    inplace: tuple[bool, ...] = (False, True)
    """Forms to run: False out-of-place, True in-place; an op runs the requested forms it has."""
    warmup_iters: int = 5
    """Untimed iterations per (op, size, form) before the timed ones."""
    iters: int = 20
    """Timed iterations; every iteration's time is kept as a sample."""
    check: bool = True
    """Run the correctness check (nccl-tests ``-c``) after timing."""
    corrupt: tuple[str, ...] = ()
    """Ops whose checked result is deliberately corrupted (one element, on the last rank) so a
    test can show the check catches it. Never set outside tests."""
    world_size: int = 2
    """Number of ranks."""
    backend: str = "gloo"
    """``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors; RCCL on ROCm)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Knobs (NCCL_ALGO, NCCL_PROTO, NCCL_MIN_NCHANNELS, NCCL_BUFFSIZE, GLOO_SOCKET_IFNAME...)
    set in the launched processes only, and recorded on every row."""
    knob_check: bool = True
    """On nccl, add ``NCCL_DEBUG=INFO`` (INIT,ENV,TUNING) and check the logs for what ran. The
    rank-0 TUNING line per call costs host time; set False for the cleanest timings."""
    timeout_s: float = 300.0
    """Deadline for the whole launch; a hung or dead rank ends it as timeout/killed."""

    def __post_init__(self):
        ops = tuple(self.ops)
        object.__setattr__(self, "ops", ops)
        object.__setattr__(self, "inplace", tuple(bool(x) for x in self.inplace))
        object.__setattr__(self, "corrupt", tuple(self.corrupt))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        if not ops or any(op not in COLLECTIVES for op in ops):
            raise BadInputError(f"ops must be a non-empty subset of {COLLECTIVES}, got {ops}")
        if any(op not in ops for op in self.corrupt):
            raise BadInputError(f"corrupt {self.corrupt} names ops that are not run ({ops})")
        if not 1 <= self.min_bytes <= self.max_bytes:
            raise BadInputError(f"need 1 <= min_bytes <= max_bytes, got {self.min_bytes}, {self.max_bytes}")
        if self.factor < 2:
            raise BadInputError(f"factor must be an integer >= 2, got {self.factor}")
        _dtype(self.dtype)
        if not self.inplace:
            raise BadInputError("inplace must name at least one form (False, True)")
        for op in ops:
            if not set(_FORMS[op]) & set(self.inplace):
                form = "in-place" if _FORMS[op] == (True,) else "out-of-place"
                raise BadInputError(f"{op} has only the {form} form in torch.distributed")
        if self.warmup_iters < 0 or self.iters < 1:
            raise BadInputError(f"need warmup_iters >= 0 and iters >= 1, got {self.warmup_iters}, {self.iters}")
        if self.world_size < 1:
            raise BadInputError(f"world_size must be >= 1, got {self.world_size}")
        if "send_recv" in ops and self.world_size < 2:
            raise BadInputError("send_recv needs world_size >= 2 (a rank cannot send to itself)")
        if self.backend not in ("gloo", "nccl"):
            raise BadInputError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not self.timeout_s > 0:
            raise BadInputError(f"timeout_s must be positive, got {self.timeout_s}")

    def sizes(self) -> list[int]:
        """Requested message sizes S in bytes: min_bytes × factor^k <= max_bytes."""
        sizes, s = [], self.min_bytes
        while s <= self.max_bytes:
            sizes.append(s)
            s *= self.factor
        return sizes

    def to_dict(self) -> dict:
        """JSON-serialisable form, the config :func:`collectives_rank` receives."""
        d = asdict(self)
        d["env"] = dict(self.env)
        return d


# ---------------------------------------------------------------- rank side


def _pattern(rank: int, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Known data for the check: small positive integers depending on rank and index."""
    i = torch.arange(numel, dtype=torch.int64, device=device)
    return ((i * 7 + rank * 3) % _PATTERN_MOD + 1).to(dtype)


def _buffers(op, inplace, count, n, rank, dtype, device):
    """(call, fills, expected, result) for one op/form: ``call()`` runs the collective once;
    ``fills`` are (buffer, value) copies that put the check's known inputs in place and a sentinel
    (0) in the outputs; ``expected()`` builds the expected result (only when checking: at large
    sizes it is as big as the buffers)."""
    zeros = lambda k: torch.zeros(k, dtype=dtype, device=device)  # noqa: E731
    pat = lambda r, k: _pattern(r, k, dtype, device)  # noqa: E731
    chunk = slice(rank * count, (rank + 1) * count)
    if op == "all_reduce":
        buf = zeros(count)
        expected = lambda: sum(pat(q, count).to(torch.float64) for q in range(n))  # noqa: E731
        return (lambda: dist.all_reduce(buf)), [(buf, lambda: pat(rank, count))], expected, buf
    if op == "broadcast":
        buf = zeros(count)
        return ((lambda: dist.broadcast(buf, src=_ROOT)), [(buf, lambda: pat(rank, count))],
                lambda: pat(_ROOT, count), buf)
    if op == "all_gather":
        out = zeros(n * count)
        inp = out[chunk] if inplace else zeros(count)
        fills = [(out, lambda: zeros(n * count)), (inp, lambda: pat(rank, count))]
        expected = lambda: torch.cat([pat(q, count) for q in range(n)])  # noqa: E731
        return (lambda: dist.all_gather_into_tensor(out, inp)), fills, expected, out
    if op == "reduce_scatter":
        inp = zeros(n * count)
        out = inp[chunk] if inplace else zeros(count)
        # input last: in place, it holds the output
        fills = [(out, lambda: zeros(count)), (inp, lambda: pat(rank, n * count))]
        expected = lambda: sum(pat(q, n * count)[chunk].to(torch.float64) for q in range(n))  # noqa: E731
        return (lambda: dist.reduce_scatter_tensor(out, inp)), fills, expected, out
    if op == "all_to_all":
        inp, out = zeros(n * count), zeros(n * count)
        # Rank q's input chunk r goes to rank r's output chunk q.
        expected = lambda: torch.cat([pat(q, n * count)[chunk] for q in range(n)])  # noqa: E731
        fills = [(out, lambda: zeros(n * count)), (inp, lambda: pat(rank, n * count))]
        return (lambda: dist.all_to_all_single(out, inp)), fills, expected, out
    # send_recv: a ring of pairs, rank r sends to r+1 and receives from r-1 (nccl-tests sendrecv).
    send, recv = zeros(count), zeros(count)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]

    def call():
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    fills = [(recv, lambda: zeros(count)), (send, lambda: pat(rank, count))]
    return call, fills, lambda: pat((rank - 1) % n, count), recv


def _time_iterations(call, iters: int, device) -> list[float]:
    """Seconds of each iteration: CUDA events around each call on GPU (host launch latency is
    not device time), perf_counter around each blocking call on CPU; no barrier in between."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)]
        torch.cuda.synchronize()
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in events]  # ms -> s
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def _check(call, fills, expected, result, corrupt: bool, device) -> int:
    for buf, value in fills:
        buf.copy_(value())
    call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if corrupt:
        result.view(-1)[0] += 1
    return int((result.to(torch.float64) != expected().to(torch.float64)).sum().item())


def collectives_rank(config: dict) -> dict:
    """Rank target: run every (op, size, form) of ``config`` (a :class:`CollectivesConfig` as a
    dict) on this rank of the initialised process group; return this rank's samples."""
    cfg = CollectivesConfig(**config)
    rank, n = dist.get_rank(), dist.get_world_size()
    if n != cfg.world_size:
        raise BadInputError(f"process group has {n} ranks, config says {cfg.world_size}")
    if cfg.backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dtype = _dtype(cfg.dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    entries = []
    for op in cfg.ops:
        unit = message_bytes(op, 1, elem, n)
        counts = sorted({max(1, s // unit) for s in cfg.sizes()})
        for inplace in [f for f in _FORMS[op] if f in cfg.inplace]:
            for count in counts:
                call, fills, expected, result = _buffers(op, inplace, count, n, rank, dtype, device)
                dist.barrier()  # start each point together; outside the timed region
                for _ in range(cfg.warmup_iters):
                    call()
                samples = _time_iterations(call, cfg.iters, device)
                wrong = None
                if cfg.check:
                    wrong = _check(call, fills, expected, result,
                                   op in cfg.corrupt and rank == n - 1, device)
                entries.append({
                    "op": op, "inplace": inplace, "count": count,
                    "size_bytes": count * unit, "samples_s": samples, "wrong_elements": wrong,
                })
                del call, fills, expected, result
    return {"rank": rank, "world_size": n, "backend": cfg.backend, "device": str(device),
            "dtype": cfg.dtype, "entries": entries}


# ---------------------------------------------------------------- reduction


def _knob_columns(cfg: CollectivesConfig, op: str, size_bytes: int, logs) -> dict:
    """``logs``: (rank 0's parsed log, every rank's parsed log), or None."""
    if cfg.backend != "nccl":
        return {"knob_check": "not_verifiable", "algo_observed": None, "proto_observed": None,
                "knob_check_detail": f"{cfg.backend} prints no algorithm/protocol choice; knobs recorded, not checked"}
    if not cfg.knob_check or not logs:
        return {"knob_check": "unverifiable", "algo_observed": None, "proto_observed": None,
                "knob_check_detail": "knob_check disabled or no rank logs"}
    # TUNING lines are printed by rank 0 only; env echoes by every rank.
    func = _NCCL_FUNC.get(op)
    check = nccl_log.knob_check(logs[0], cfg.env, func=func, nbytes=size_bytes,
                                env_text=logs[1], point_to_point=func is None)
    seen = {what: nccl_log.observed(logs[0], what, func=func, nbytes=size_bytes) if func else None
            for what in ("algo", "proto")}
    return {
        "knob_check": nccl_log.summarize_check(check),
        "algo_observed": seen["algo"], "proto_observed": seen["proto"],
        "knob_check_detail": json.dumps(check.to_dict(orient="records")),
    }


def reduce_rank_results(rank_results, cfg: CollectivesConfig, rank_logs=()):
    """One row per (op, inplace, size) from every rank's :func:`collectives_rank` result."""
    if not rank_results or any(r is None for r in rank_results):
        raise BadInputError("every rank must have returned a result")
    n = rank_results[0]["world_size"]
    logs = None
    if cfg.backend == "nccl" and cfg.knob_check and rank_logs:
        logs = (nccl_log.parse(rank_logs[0]), nccl_log.parse("\n".join(rank_logs)))
    rows = []
    per_rank = [r["entries"] for r in rank_results]
    for i, entry in enumerate(per_rank[0]):
        mine = [entries[i] for entries in per_rank]
        key = (entry["op"], entry["inplace"], entry["size_bytes"])
        if any((e["op"], e["inplace"], e["size_bytes"]) != key for e in mine):
            raise BadInputError(f"ranks disagree on entry {i}: {[e['op'] for e in mine]}")
        medians = [statistics.median(e["samples_s"]) for e in mine]
        slowest = max(range(len(mine)), key=medians.__getitem__)
        meas = Measurement(samples_s=tuple(mine[slowest]["samples_s"]), label=entry["op"])
        time_s = medians[slowest]
        algbw = entry["size_bytes"] / time_s if time_s > 0 else math.inf
        wrong = [e["wrong_elements"] for e in mine]
        rows.append({
            "op": entry["op"], "inplace": entry["inplace"], "size_bytes": entry["size_bytes"],
            "count": entry["count"], "dtype": rank_results[0]["dtype"], "world_size": n,
            "backend": rank_results[0]["backend"], "device": rank_results[0]["device"],
            "time_s": time_s,
            "time_mean_s": max(statistics.fmean(e["samples_s"]) for e in mine),
            "time_iqr_s": meas.iqr_s, "noisy": meas.noisy, "slowest_rank": slowest,
            "time_samples_s": list(meas.samples_s),
            "rank_median_time_s": medians,
            "rank_time_samples_s": [list(e["samples_s"]) for e in mine],
            "iters": len(entry["samples_s"]), "warmup_iters": cfg.warmup_iters,
            "algbw_bytes_per_s": algbw,
            "busbw_bytes_per_s": algbw * busbw_factor(entry["op"], n),
            "wrong_elements": None if None in wrong else sum(wrong),
            "rank_wrong_elements": wrong,
            "knobs": json.dumps(dict(cfg.env), sort_keys=True),
            **_knob_columns(cfg, entry["op"], entry["size_bytes"], logs),
        })
    return pd.DataFrame(rows)


def _debug_env(cfg: CollectivesConfig) -> dict[str, str]:
    if cfg.backend != "nccl" or not cfg.knob_check:
        return {}
    # INIT and ENV for the banner, init lines and env echoes; TUNING for the algo/proto choice
    # (2.20+; rank 0 only). COLL is left out: one line per call per rank floods the logs.
    subsys = [s for s in cfg.env.get("NCCL_DEBUG_SUBSYS", "").split(",") if s]
    subsys += [s for s in ("INIT", "ENV", "TUNING") if s not in subsys]
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": ",".join(subsys)}


def run_collectives(cfg: CollectivesConfig):
    """Launch :func:`collectives_rank` on ``cfg.world_size`` ranks and reduce the results.

    Raises :class:`perfkit.errors.ExecutionFailed` (status ``failed``/``oom``/``killed``/
    ``timeout``, the failing rank's error in the message) when the launch did not end ``ok``.
    """
    from perfkit.launch import launch

    env = {**cfg.env, **_debug_env(cfg)}
    result = launch(
        "perfkit.collectives:collectives_rank", cfg.to_dict(), world_size=cfg.world_size,
        backend=cfg.backend, timeout_s=cfg.timeout_s, env=env,
        device="cuda" if cfg.backend == "nccl" else "cpu",
    )
    if not result.ok:
        raise ExecutionFailed(status=result.status, error_name="CollectivesLaunchFailed",
                              message=f"rank {result.failed_rank}: {result.error}")
    return reduce_rank_results(result.rank_results, cfg, result.rank_logs)
