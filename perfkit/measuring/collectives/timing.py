"""How one collective benchmark point is timed on a rank, and how the ranks' times reduce to t.

The convention is nccl-tests' default, read from its ``src/common.cu`` (NVIDIA/nccl-tests,
``BenchTime`` and ``Allreduce``; commit 01d6761): after a barrier each rank starts a host clock,
issues ``iters`` calls back to back, waits for the device to finish (a stream synchronization)
and divides the elapsed time by ``iters``; the ranks' values are then combined as its
``-a, --average`` option says (0 rank 0, 1 mean, 2 min, 3 max; default ``average = 1``, the
mean over ranks). In the terms of ``shared/reference/formulas.md``, **t is that mean**, and
algbw = S / t, busbw = algbw × factor, both from the averaged t as nccl-tests computes them
(``getBw`` takes the averaged ``deltaSec``), never an average of per-rank bandwidths.

Row columns (seconds; lists are per rank in rank order):

- ``time_s``: t above, the mean over ranks of ``rank_time_s`` (nccl-tests ``-a 1``).
- ``rank_time_s``: each rank's timed-loop wall time / iters (nccl-tests' per-rank ``deltaSec``).
- ``time_max_over_ranks_s``: the max of ``rank_time_s`` (nccl-tests ``-a 3``); ``slowest_rank``
  is that rank.
- ``rank_time_samples_s``: every rank's per-iteration times, the raw samples. On CPU they are the
  differences of clock reads at the iteration boundaries, so they sum to the rank's loop time; on
  GPU they come from CUDA events between the calls (the loop itself is timed on the host, as
  nccl-tests does).
- ``time_samples_s``: per iteration, the mean over ranks of that iteration's time (their mean is
  ``time_s`` on CPU); ``time_median_s``, ``time_iqr_s`` and ``noisy`` are their median, IQR and
  noise verdict (DESIGN.md measurement rules).
- ``rank_median_time_s``: each rank's median per-iteration time, and
  ``time_median_max_over_ranks_s`` their max: the t perfkit reported before it followed
  nccl-tests (a robust, slowest-rank view, kept for comparison).
"""

from __future__ import annotations

import statistics
import time

import torch

from perfkit.core.errors import BadInputError
from perfkit.core.timing import Measurement

__all__ = ["TIME_CONVENTION", "time_loop", "reduce_times"]

#: Recorded on every row next to the number it describes.
TIME_CONVENTION = "nccl-tests -a 1: timed-loop wall time / iters, mean over ranks"


def time_loop(call, iters: int, device) -> tuple[float, list[float]]:
    """(wall seconds of ``iters`` back-to-back calls, seconds of each call) on this rank.

    The caller synchronizes the device and the ranks (a barrier) right before, as nccl-tests
    does. CPU: one ``perf_counter`` read per iteration boundary, no other work in the loop. GPU:
    the host clock spans issuing every call plus the final synchronize; CUDA events between the
    calls give the per-iteration samples (host launch latency is not device time).
    """
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        t0 = time.perf_counter()
        events[0].record()
        for end in events[1:]:
            call()
            end.record()
        torch.cuda.synchronize(device)
        loop_s = time.perf_counter() - t0
        return loop_s, [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]  # ms -> s
    stamps = [time.perf_counter()]
    for _ in range(iters):
        call()
        stamps.append(time.perf_counter())
    return stamps[-1] - stamps[0], [b - a for a, b in zip(stamps, stamps[1:])]


def reduce_times(entries) -> dict:
    """The time columns of one point from every rank's entry (``loop_time_s``: the rank's timed
    loop wall time; ``samples_s``: its per-iteration times), as the module docstring defines."""
    iters = {len(e["samples_s"]) for e in entries}
    if len(iters) != 1 or 0 in iters:
        raise BadInputError(f"ranks timed different or no iterations: {sorted(iters)}")
    (n_iters,) = iters
    rank_time = [e["loop_time_s"] / n_iters for e in entries]
    slowest = max(range(len(entries)), key=rank_time.__getitem__)
    per_iteration = [statistics.fmean(ranks) for ranks in zip(*(e["samples_s"] for e in entries))]
    meas = Measurement(samples_s=tuple(per_iteration), label="collective")
    medians = [statistics.median(e["samples_s"]) for e in entries]
    return {
        "time_s": statistics.fmean(rank_time),
        "time_convention": TIME_CONVENTION,
        "rank_time_s": rank_time,
        "time_max_over_ranks_s": rank_time[slowest], "slowest_rank": slowest,
        "time_samples_s": per_iteration,
        "time_median_s": meas.median_s, "time_iqr_s": meas.iqr_s, "noisy": meas.noisy,
        "rank_median_time_s": medians, "time_median_max_over_ranks_s": max(medians),
        "rank_time_samples_s": [list(e["samples_s"]) for e in entries],
        "iters": n_iters,
    }
