"""Collective benchmarks in the nccl-tests manner: per-iteration times, busbw, a correctness check.

:func:`collectives_rank` is the rank target (``perfkit.measuring.collectives.benchmark:collectives_rank``) that
:func:`perfkit.run.launch.launch` runs on every rank of an initialised process group; it returns one
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
- t is nccl-tests' default time (its ``-a 1``): each rank's wall time of the timed loop divided
  by the iterations, averaged over ranks; per-iteration samples, medians and the max over ranks
  are kept beside it (:mod:`perfkit.measuring.collectives.timing` defines every time column).
- The check (nccl-tests ``-c``) fills inputs with rank-dependent small integers (exact in every
  dtype, bf16 included), runs the collective once more and counts elements that differ from the
  expected result, summed over ranks (nccl-tests' ``#wrong``).
- The knob check (nccl only) reads ``NCCL_DEBUG=INFO`` logs of a separate short pass that runs
  every point once with the same knobs; the timed launch runs without NCCL's debug variables,
  since rank 0's TUNING line per call costs host time inside the timed loop.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from perfkit.analyse import nccl_log
from perfkit.measuring.collectives.buffers import check as _check, point_buffers
from perfkit.measuring.collectives.timing import reduce_times, time_loop
from perfkit.core import checks
from perfkit.core.errors import BadInputError, ExecutionFailed
from perfkit.core.formulas import COLLECTIVES, busbw_factor, message_bytes

__all__ = [
    "CollectivesConfig",
    "collectives_rank",
    "knob_pass_rank",
    "reduce_rank_results",
    "run_collectives",
]

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
KNOB_CHECK_PASSES = ("separate", "off")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BadInputError(f"unknown torch dtype {name!r}")
    return dtype


@dataclass(kw_only=True, frozen=True)
class CollectivesConfig:
    """One collectives benchmark: which ops, which sizes, on which ranks, with which knobs."""

    ops: tuple[str, ...] = COLLECTIVES
    """Collectives to run, from :data:`perfkit.core.formulas.COLLECTIVES`."""
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
    knob_check_pass: str = "separate"
    """nccl only. ``separate``: before the timed launch, a short launch runs every point once
    with the knobs and ``NCCL_DEBUG=INFO`` (INIT,ENV,TUNING), and its logs say whether the knobs
    were honoured; the timed launch gets the knobs without any ``NCCL_DEBUG*`` variable (rank 0's
    TUNING line per call would cost host time inside the timed loop). ``off``: no check pass;
    the knobs reach the timed launch as given. gloo prints nothing to check either way."""
    timeout_s: float = 300.0
    """Deadline for the launches together (knob check pass, timed launch, profile pass); a hung
    or dead rank ends the run as timeout/killed."""
    profile: bool = False
    """After the timed launch, a profile pass: every point ``profile_iters`` times under
    ``torch.profiler``, one ``ProfilerStep`` per point, one gzipped trace per rank
    (:mod:`perfkit.measuring.ops.trace_capture`). Separate so the profiler never touches the timings."""
    profile_iters: int = 3
    trace_dir: str | None = None
    """Where the profile pass writes ``rank<r>.json.gz``; None: beside the configuration's results."""

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
        if self.profile_iters < 1:
            raise BadInputError(f"profile_iters must be >= 1, got {self.profile_iters}")
        checks.one_of("knob_check_pass", self.knob_check_pass, KNOB_CHECK_PASSES)

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


def _points(cfg: CollectivesConfig):
    """(rank, device, points) where each point is (op, inplace, count, size_bytes, buffers) in
    the order every rank runs them; the buffers of a point are built when it is reached."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if n != cfg.world_size:
        raise BadInputError(f"process group has {n} ranks, config says {cfg.world_size}")
    if cfg.backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dtype = _dtype(cfg.dtype)
    elem = torch.empty((), dtype=dtype).element_size()

    def points():
        for op in cfg.ops:
            unit = message_bytes(op, 1, elem, n)
            counts = sorted({max(1, s // unit) for s in cfg.sizes()})
            for inplace in [f for f in _FORMS[op] if f in cfg.inplace]:
                for count in counts:
                    buffers = point_buffers(op, inplace, count, n, rank, dtype, device)
                    yield op, inplace, count, count * unit, buffers

    return rank, device, points()


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collectives_rank(config: dict) -> dict:
    """Rank target: run every (op, size, form) of ``config`` (a :class:`CollectivesConfig` as a
    dict) on this rank of the initialised process group; return this rank's times."""
    cfg = CollectivesConfig(**config)
    rank, device, points = _points(cfg)
    entries = []
    for op, inplace, count, size_bytes, (call, fills, expected, result) in points:
        for _ in range(cfg.warmup_iters):
            call()
        _sync(device)
        dist.barrier()  # nccl-tests: the timed loop starts right after a barrier
        loop_time_s, samples = time_loop(call, cfg.iters, device)
        wrong = None
        if cfg.check:
            corrupt = op in cfg.corrupt and rank == cfg.world_size - 1
            wrong = _check(call, fills, expected, result, corrupt, device)
        entries.append({"op": op, "inplace": inplace, "count": count, "size_bytes": size_bytes,
                        "loop_time_s": loop_time_s, "samples_s": samples, "wrong_elements": wrong})
        del call, fills, expected, result
    # What NCCL logging the timed loop ran under (the launch adds to the caller's environment).
    return {"rank": rank, "world_size": cfg.world_size, "backend": cfg.backend, "device": str(device),
            "dtype": cfg.dtype, "nccl_debug": os.environ.get("NCCL_DEBUG"), "entries": entries}


def knob_pass_rank(config: dict) -> dict:
    """Rank target of the knob check pass: every point of ``config`` once, untimed, so that rank
    0's NCCL log holds one TUNING line per (op, size) for :func:`reduce_rank_results`."""
    cfg = CollectivesConfig(**config)
    rank, device, points = _points(cfg)
    ran = 0
    for _, _, _, _, (call, *_) in points:
        call()
        ran += 1
    _sync(device)
    return {"rank": rank, "points": ran}


def profile_pass_rank(config: dict) -> dict:
    """Rank target of the profile pass: each point ``profile_iters`` times, one profiler step per
    point (named by a span ``<op> <size> B <form>``), this rank's trace written gzipped."""
    from perfkit.measuring.ops.trace_capture import ProfileSettings, StepProfiler

    cfg = CollectivesConfig(**config)
    rank, device, points = _points(cfg)
    points = list(points)
    settings = ProfileSettings(warmup=0, active=len(points))
    with warnings.catch_warnings():  # "won't be using warmup": every point was warmed up by the timed launch
        warnings.filterwarnings("ignore", message=".*warmup.*", category=UserWarning)
        profiler = StepProfiler(settings, Path(cfg.trace_dir) / f"rank{rank}.json.gz", device=device.type)
        with profiler:
            for op, inplace, _, size_bytes, (call, *_) in points:
                with torch.profiler.record_function(f"{op} {size_bytes} B {'in-place' if inplace else 'out-of-place'}"):
                    for _ in range(cfg.profile_iters):
                        call()
                    _sync(device)
                profiler.step()
    return {"rank": rank, "trace_path": str(profiler.path) if profiler.path else None, "trace_reason": profiler.reason}


# ---------------------------------------------------------------- reduction


def _knob_columns(cfg: CollectivesConfig, op: str, size_bytes: int, logs) -> dict:
    """``logs``: (rank 0's parsed log, every rank's parsed log), or None."""
    if cfg.backend != "nccl":
        return {"knob_check": "not_verifiable", "algo_observed": None, "proto_observed": None,
                "knob_check_detail": f"{cfg.backend} prints no algorithm/protocol choice; knobs recorded, not checked"}
    if cfg.knob_check_pass == "off":
        return {"knob_check": "not_checked", "algo_observed": None, "proto_observed": None,
                "knob_check_detail": "knob_check_pass is 'off': no check pass ran"}
    if not logs:
        return {"knob_check": "unverifiable", "algo_observed": None, "proto_observed": None,
                "knob_check_detail": "no rank logs from the knob check pass"}
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
    """One row per (op, inplace, size) from every rank's :func:`collectives_rank` result;
    ``rank_logs``: every rank's log of the knob check pass (rank 0 first), if one ran."""
    import pandas as pd
    if not rank_results or any(r is None for r in rank_results):
        raise BadInputError("every rank must have returned a result")
    n = rank_results[0]["world_size"]
    logs = None
    if cfg.backend == "nccl" and cfg.knob_check_pass == "separate" and rank_logs:
        logs = (nccl_log.parse(rank_logs[0]), nccl_log.parse("\n".join(rank_logs)))
    rows = []
    per_rank = [r["entries"] for r in rank_results]
    for i, entry in enumerate(per_rank[0]):
        mine = [entries[i] for entries in per_rank]
        key = (entry["op"], entry["inplace"], entry["size_bytes"])
        if any((e["op"], e["inplace"], e["size_bytes"]) != key for e in mine):
            raise BadInputError(f"ranks disagree on entry {i}: {[e['op'] for e in mine]}")
        times = reduce_times(mine)
        algbw = entry["size_bytes"] / times["time_s"] if times["time_s"] > 0 else math.inf
        wrong = [e["wrong_elements"] for e in mine]
        rows.append({
            "op": entry["op"], "inplace": entry["inplace"], "size_bytes": entry["size_bytes"],
            "count": entry["count"], "dtype": rank_results[0]["dtype"], "world_size": n,
            "backend": rank_results[0]["backend"], "device": rank_results[0]["device"],
            **times, "warmup_iters": cfg.warmup_iters,
            "algbw_bytes_per_s": algbw,
            "busbw_bytes_per_s": algbw * busbw_factor(entry["op"], n),
            "wrong_elements": None if None in wrong else sum(wrong),
            "rank_wrong_elements": wrong,
            "knobs": json.dumps(dict(cfg.env), sort_keys=True),
            "knob_check_pass": cfg.knob_check_pass,
            "timed_nccl_debug": rank_results[0].get("nccl_debug"),
            **_knob_columns(cfg, entry["op"], entry["size_bytes"], logs),
        })
    return pd.DataFrame(rows)


def _debug_env(cfg: CollectivesConfig) -> dict[str, str]:
    """The knob check pass's environment: the knobs plus NCCL's debug variables."""
    # INIT and ENV for the banner, init lines and env echoes; TUNING for the algo/proto choice
    # (2.20+; rank 0 only). COLL is left out: one line per call per rank floods the logs.
    subsys = [s for s in cfg.env.get("NCCL_DEBUG_SUBSYS", "").split(",") if s]
    subsys += [s for s in ("INIT", "ENV", "TUNING") if s not in subsys]
    return {**cfg.env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": ",".join(subsys)}


def _timed_env(cfg: CollectivesConfig) -> dict[str, str]:
    """The timed launch's environment: with a separate check pass, the knobs without NCCL's debug
    variables (they were the check pass's instrumentation)."""
    if cfg.backend == "nccl" and cfg.knob_check_pass == "separate":
        return {k: v for k, v in cfg.env.items() if not k.startswith("NCCL_DEBUG")}
    return dict(cfg.env)


def run_collectives(cfg: CollectivesConfig):
    """Launch :func:`collectives_rank` on ``cfg.world_size`` ranks and reduce the results; on
    nccl with ``knob_check_pass="separate"``, first launch :func:`knob_pass_rank` with NCCL
    logging on and check the knobs from its logs.

    Raises :class:`perfkit.core.errors.ExecutionFailed` (status ``failed``/``oom``/``killed``/
    ``timeout``, the failing rank's error in the message) when a launch did not end ``ok``.
    """
    from perfkit.run.launch import launch

    used_s = 0.0  # one deadline for both launches

    def run(target, env, what):
        nonlocal used_s
        left_s = cfg.timeout_s - used_s
        if left_s <= 0:
            raise ExecutionFailed(status="timeout", error_name="CollectivesLaunchFailed",
                                  message=f"{what}: no time left of timeout_s={cfg.timeout_s}")
        t0 = time.monotonic()
        result = launch(target, cfg.to_dict(), world_size=cfg.world_size, backend=cfg.backend,
                        timeout_s=left_s, env=env, device="cuda" if cfg.backend == "nccl" else "cpu",
                        preload=(target.partition(":")[0],))
        used_s += time.monotonic() - t0
        if not result.ok:
            where = what if result.failed_rank is None else f"{what}, rank {result.failed_rank}"
            raise ExecutionFailed(status=result.status, error_name="CollectivesLaunchFailed",
                                  message=f"{where}: {result.error}")
        return result

    ambient = os.environ.get("NCCL_DEBUG", "").upper()
    if cfg.backend == "nccl" and ambient in ("INFO", "TRACE") and "NCCL_DEBUG" not in _timed_env(cfg):
        warnings.warn(f"NCCL_DEBUG={os.environ['NCCL_DEBUG']} is set in this environment and reaches "
                      "the timed ranks (rows say so in timed_nccl_debug); unset it for clean timings")
    logs = ()
    if cfg.backend == "nccl" and cfg.knob_check_pass == "separate":
        logs = run("perfkit.measuring.collectives.benchmark:knob_pass_rank", _debug_env(cfg), "knob check pass").rank_logs
    timed = run("perfkit.measuring.collectives.benchmark:collectives_rank", _timed_env(cfg), "timed launch")
    rows = reduce_rank_results(timed.rank_results, cfg, logs)
    if cfg.profile:
        if cfg.trace_dir is None:
            from perfkit.measuring.ops.trace_capture import current_trace_dir

            cfg = replace(cfg, trace_dir=str(current_trace_dir("collectives")))
        traced = run("perfkit.measuring.collectives.benchmark:profile_pass_rank", _timed_env(cfg), "profile pass").rank_results
        from perfkit.measuring.ops.trace_capture import summary_columns

        rows = rows.assign(trace_path=traced[0]["trace_path"], trace_reason=traced[0]["trace_reason"],
                           rank_trace_paths=[[r["trace_path"] for r in traced]] * len(rows),
                           **summary_columns(r["trace_path"] for r in traced))
    return rows
