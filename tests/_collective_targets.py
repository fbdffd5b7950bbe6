"""Rank targets for tests/test_collectives.py: the real benchmark with a rank made to misbehave.

Run by :func:`perfkit.run.launch.launch` in the ranks' processes (``launch`` hands them the caller's
``sys.path``, so ``_collective_targets:...`` imports there). Rank 1 wraps ``dist.all_reduce`` so
that it misbehaves on its ``die_on_call``-th call: inside the timed iterations of the benchmark,
while rank 0 is in (or about to enter) the same collective.
"""

from __future__ import annotations

import os
import signal
import time

import torch.distributed as dist

from perfkit.measuring.collectives.benchmark import collectives_rank

__all__ = ["die_mid_benchmark", "hang_mid_benchmark", "raise_mid_benchmark"]


def _sabotage(config: dict, misbehave) -> dict:
    config = dict(config)
    die_on_call = config.pop("die_on_call", 3)
    if dist.get_rank() == 1:
        real, calls = dist.all_reduce, [0]

        def all_reduce(*args, **kwargs):
            calls[0] += 1
            if calls[0] == die_on_call:
                misbehave()
            return real(*args, **kwargs)

        dist.all_reduce = all_reduce  # collectives_rank calls dist.all_reduce through the module
    return collectives_rank(config)


def _sigkill():
    print("rank 1: killing itself mid-benchmark", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _hang():
    print("rank 1: hanging mid-benchmark", flush=True)
    while True:
        time.sleep(1)


def _raise():
    raise RuntimeError("deliberate failure of rank 1 mid-benchmark")


def die_mid_benchmark(config: dict) -> dict:
    return _sabotage(config, _sigkill)


def hang_mid_benchmark(config: dict) -> dict:
    return _sabotage(config, _hang)


def raise_mid_benchmark(config: dict) -> dict:
    return _sabotage(config, _raise)
