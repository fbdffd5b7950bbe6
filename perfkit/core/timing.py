"""Timing: raw samples in seconds, statistics derived from them, a verdict on noise.

The method follows ``torch.utils.benchmark.Timer.blocked_autorange``: calls are grouped into
blocks long enough for the clock's resolution not to matter, each block gives one sample (block
time / calls per block), and blocks repeat until a minimum run time is spent. Around every block
the device is synchronized; on CUDA/ROCm the block is timed with device events so host launch
latency is not mistaken for kernel time.

The clock and the synchronization are injectable, so tests drive the timer with a fake clock
(as torch's ``_MockTimer`` does) instead of asserting on wall-clock time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Measurement", "measure", "SpanTimer", "NOISY_IQR_OVER_MEDIAN"]

#: A point whose IQR/median exceeds this is flagged noisy (DESIGN.md, measurement rules).
NOISY_IQR_OVER_MEDIAN = 0.1


def _quantile(sorted_samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, 'linear'), on pre-sorted samples."""
    if not sorted_samples:
        return math.nan
    position = (len(sorted_samples) - 1) * q
    lo = math.floor(position)
    hi = math.ceil(position)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (position - lo)


@dataclass(kw_only=True, frozen=True)
class Measurement:
    """Per-call times of one timed callable: raw samples kept, statistics derived."""

    samples_s: tuple[float, ...]
    """Seconds per call, one sample per timed block, in the order they were taken."""
    calls_per_sample: int = 1
    """How many calls each sample averages over (the block size)."""
    warmup_calls: int = 0
    """Calls made before the first sample and discarded."""
    label: str = ""
    """What was timed, for display."""
    _sorted: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.samples_s:
            raise ValueError("a Measurement needs at least one sample")
        if any(not math.isfinite(s) or s < 0 for s in self.samples_s):
            raise ValueError(f"samples must be finite and non-negative, got {self.samples_s!r}")
        if self.calls_per_sample < 1:
            raise ValueError("calls_per_sample must be >= 1")
        object.__setattr__(self, "_sorted", tuple(sorted(self.samples_s)))

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100) of the per-call time, in seconds."""
        return _quantile(self._sorted, q / 100.0)

    @property
    def median_s(self) -> float:
        return self.percentile(50)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.samples_s)

    @property
    def min_s(self) -> float:
        return self._sorted[0]

    @property
    def iqr_s(self) -> float:
        return self.percentile(75) - self.percentile(25)

    @property
    def noisy(self) -> bool:
        """True when IQR/median exceeds :data:`NOISY_IQR_OVER_MEDIAN`."""
        median = self.median_s
        return median > 0 and self.iqr_s / median > NOISY_IQR_OVER_MEDIAN

    def as_row(self, prefix: str = "time") -> dict:
        """Columns for a results row: median, IQR, noise flag and the raw samples, in seconds."""
        return {
            f"{prefix}_s": self.median_s,
            f"{prefix}_iqr_s": self.iqr_s,
            f"{prefix}_p10_s": self.percentile(10),
            f"{prefix}_p90_s": self.percentile(90),
            f"{prefix}_samples_s": list(self.samples_s),
            f"{prefix}_calls_per_sample": self.calls_per_sample,
            "noisy": self.noisy,
        }

    def __repr__(self) -> str:
        flag = " NOISY" if self.noisy else ""
        return (
            f"Measurement({self.label or 'fn'}: median {self.median_s * 1e6:.2f} us, "
            f"IQR {self.iqr_s * 1e6:.2f} us, {len(self.samples_s)} samples "
            f"x {self.calls_per_sample} calls{flag})"
        )


class _BlockTimer:
    """Times a block of calls: with ``hooks.new_event`` (CUDA/ROCm) by device events recorded on
    the work's device, else by ``clock`` between two synchronizations."""

    def __init__(self, clock: Callable[[], float], hooks: "_DeviceHooks"):
        self._clock = clock
        self._synchronize = hooks.synchronize
        self._hooks = hooks

    def __call__(self, fn: Callable[[], object], calls: int) -> float:
        if self._hooks.new_event is not None:
            start, end = self._hooks.new_event(), self._hooks.new_event()
            self._synchronize()
            self._hooks.record(start)
            for _ in range(calls):
                fn()
            self._hooks.record(end)
            end.synchronize()
            return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
        self._synchronize()
        t0 = self._clock()
        for _ in range(calls):
            fn()
        self._synchronize()
        return self._clock() - t0


@dataclass(frozen=True)
class _DeviceHooks:
    """How the timer waits for, and times, work on one device."""

    synchronize: Callable[[], None]
    """Waits until the device is idle (on CPU: nothing to wait for)."""
    new_event: Callable[[], object] | None = None
    """A timing event (``torch.cuda.Event(enable_timing=True)``), or None to time by the clock."""
    record: Callable[[object], None] = lambda event: None
    """Records an event on the current stream of the device the work runs on."""


def _device_index(device, cuda) -> int:
    """``cuda:N`` → N; a bare ``cuda`` is the current device, as torch resolves it."""
    _, _, index = str(device).partition(":")
    return int(index) if index else cuda.current_device()


def _device_hooks(device) -> _DeviceHooks:
    """Synchronization and events for ``device`` (a str or ``torch.device``).

    On ``cuda:N`` both are bound to device N: ``torch.cuda.synchronize()`` without a device
    waits on the *current* device, and an event recorded without a stream goes on the current
    device's stream; timing work on ``cuda:1`` while device 0 is current would wait on and time
    device 0 (ROCm/HIP devices are ``cuda`` in torch too).
    """
    kind = str(device).split(":")[0] if device is not None else "cpu"
    if kind != "cuda":
        return _DeviceHooks(synchronize=lambda: None)
    import torch

    cuda = torch.cuda
    index = _device_index(device, cuda)
    return _DeviceHooks(
        synchronize=lambda: cuda.synchronize(index),
        new_event=lambda: cuda.Event(enable_timing=True),
        record=lambda event: event.record(cuda.current_stream(index)),
    )


class SpanTimer:
    """The time of one span inside a longer timed region, with no synchronization of its own (so
    it does not change what it times): device events on a GPU, read once the caller has
    synchronized past the span; the clock on a CPU, whose work is done when its call returns.

    ``with span: ...`` then ``span.last_s()`` after the region's closing synchronize."""

    def __init__(self, device, clock: Callable[[], float] = time.perf_counter):
        self._hooks, self._clock = _device_hooks(device), clock
        self._start = self._end = None

    def __enter__(self) -> "SpanTimer":
        if self._hooks.new_event is not None:
            self._start, self._end = self._hooks.new_event(), self._hooks.new_event()
            self._hooks.record(self._start)
        else:
            self._start = self._clock()
        return self

    def __exit__(self, *exc) -> None:
        if self._hooks.new_event is not None:
            self._hooks.record(self._end)
        else:
            self._end = self._clock()

    def last_s(self) -> float:
        """The last span, in seconds."""
        if self._hooks.new_event is not None:
            return self._start.elapsed_time(self._end) / 1e3  # elapsed_time is in milliseconds
        return self._end - self._start


def measure(
    fn: Callable[[], object],
    *,
    min_run_time_s: float = 0.2,
    min_block_time_s: float = 0.01,
    warmup_calls: int | None = None,
    min_warmup_s: float = 0.1,
    max_samples: int = 10_000,
    min_samples: int = 3,
    device=None,
    clock: Callable[[], float] = time.perf_counter,
    synchronize: Callable[[], None] | None = None,
    label: str = "",
) -> Measurement:
    """Time ``fn()``: warm up, choose a block size, collect samples until ``min_run_time_s``.

    - Warm-up: ``warmup_calls`` calls, or by default calls for at least ``min_warmup_s``, so
      caches, allocators, thread pools and lazy initialisation are out of the timed region.
    - Block size: doubled until one block lasts ``min_block_time_s`` (as
      ``blocked_autorange``'s ``_estimate_block_size``), so clock resolution and per-block
      synchronization cost are small against the block.
    - Samples: blocks until their total reaches ``min_run_time_s`` and there are ``min_samples``
      (at least 3, so an IQR exists), capped at ``max_samples``.

    ``device`` selects synchronization (``"cuda:N"``: ``torch.cuda.synchronize(N)`` and CUDA
    events recorded on device N's current stream, bare ``"cuda"`` meaning the current device;
    anything else: none). ``clock`` and ``synchronize`` override the host clock and the
    synchronization (tests pass a fake clock; device events are then not used).
    """
    if min_run_time_s <= 0 or min_block_time_s <= 0:
        raise ValueError("min_run_time_s and min_block_time_s must be positive")
    hooks = _device_hooks(device)
    if synchronize is not None or clock is not time.perf_counter:
        # An injected clock must be read: time by the clock, not by device events.
        hooks = _DeviceHooks(synchronize=synchronize or hooks.synchronize)
    timer = _BlockTimer(clock, hooks)

    # Warm-up. With ``warmup_calls`` given, exactly that many calls. By default it is time-based:
    # calls until ``min_warmup_s`` has passed (and at least two). A call count alone is not enough:
    # in a fresh process the first fp32 matmuls on two OpenMP threads took ~12 ms each for ~85 ms
    # before settling at ~11 us (seen on this project's 2-core VMs); a one-call warm-up measured
    # that transient as the op's time.
    if warmup_calls is None:
        spent, warmup_calls, block = 0.0, 0, 1
        while spent < min_warmup_s or warmup_calls < 2:
            t = timer(fn, block)
            spent += t
            warmup_calls += block
            if t < min_block_time_s / 4 and block < 1 << 20:
                block *= 2
    elif warmup_calls > 0:
        timer(fn, warmup_calls)

    calls = 1
    while True:
        block_s = timer(fn, calls)
        if block_s >= min_block_time_s or calls >= 1 << 20:
            break
        calls *= 2

    samples = [block_s / calls]
    spent = block_s
    while (spent < min_run_time_s or len(samples) < max(3, min_samples)) and len(samples) < max_samples:
        block_s = timer(fn, calls)
        spent += block_s
        samples.append(block_s / calls)
    return Measurement(
        samples_s=tuple(samples), calls_per_sample=calls, warmup_calls=warmup_calls, label=label
    )
