"""The timer, driven by a seeded fake clock: no wall-clock assertions (STYLE.md §4)."""

import random
import statistics

import pytest

from perfkit.core.timing import Measurement, SpanTimer, measure


class FakeClock:
    """A clock that only moves when the timed function 'runs' (like torch's _MockTimer)."""

    def __init__(self):
        self.now = 0.0
        self.calls = 0

    def __call__(self):
        return self.now

    def op(self, duration_s):
        def fn():
            self.calls += 1
            self.now += duration_s() if callable(duration_s) else duration_s
        return fn


def test_constant_op_gives_exact_samples_and_block_size():
    clock = FakeClock()
    m = measure(clock.op(1e-5), clock=clock, synchronize=lambda: None,
                min_run_time_s=0.1, min_block_time_s=0.01, warmup_calls=5)
    # Block size doubles from 1 until a block lasts >= 10 ms: 1024 calls x 10 us = 10.24 ms.
    assert m.calls_per_sample == 1024
    assert all(s == pytest.approx(1e-5) for s in m.samples_s)
    # Samples are taken until their blocks add up to >= 0.1 s: ceil(0.1 / 0.01024) = 10 blocks.
    assert len(m.samples_s) == 10
    assert m.median_s == pytest.approx(1e-5) and m.iqr_s == pytest.approx(0, abs=1e-15)
    assert not m.noisy
    assert m.warmup_calls == 5


def test_a_call_longer_than_the_run_still_gives_min_samples():
    """A 0.3 s call (Triton's interpreter) against a 0.05 s run: 3 samples by default, the kernels'
    10 when asked (a speedup's CI, perfkit compare's 5 a side)."""
    clock = FakeClock()
    slow = dict(clock=clock, synchronize=lambda: None, min_run_time_s=0.05, min_block_time_s=0.0025, warmup_calls=1)
    assert len(measure(clock.op(0.3), **slow).samples_s) == 3
    m = measure(clock.op(0.3), min_samples=10, **slow)
    assert len(m.samples_s) == 10 and m.calls_per_sample == 1


def test_warmup_is_discarded():
    clock = FakeClock()
    # The first three calls are slow (lazy init, cold caches); they must not appear in samples.
    durations = iter([1.0, 1.0, 1.0] + [1e-3] * 100_000)
    m = measure(clock.op(lambda: next(durations)), clock=clock, synchronize=lambda: None,
                warmup_calls=3, min_run_time_s=0.05, min_block_time_s=0.004)
    assert max(m.samples_s) == pytest.approx(1e-3)


def test_statistics_match_numpy_definitions():
    rng = random.Random(1234)
    samples = tuple(rng.uniform(1e-3, 2e-3) for _ in range(101))
    m = Measurement(samples_s=samples)
    ordered = sorted(samples)
    assert m.median_s == pytest.approx(statistics.median(samples))
    q1, q3 = statistics.quantiles(samples, n=4, method="inclusive")[0], statistics.quantiles(samples, n=4, method="inclusive")[2]
    assert m.iqr_s == pytest.approx(q3 - q1)
    assert m.min_s == ordered[0]
    assert m.percentile(100) == ordered[-1]


def test_noisy_flag_threshold():
    # IQR/median = (1.2 - 1.0) / 1.1 ≈ 0.18 > 0.1 → noisy; a spread of 1 % → not noisy.
    assert Measurement(samples_s=(1.0, 1.0, 1.1, 1.2, 1.2)).noisy
    assert not Measurement(samples_s=(1.0, 1.005, 1.01, 1.0, 1.01)).noisy


def test_seeded_jitter_is_reflected_in_iqr():
    clock = FakeClock()
    rng = random.Random(7)
    m = measure(clock.op(lambda: 1e-3 * rng.choice([1.0, 1.5])), clock=clock, synchronize=lambda: None,
                min_block_time_s=1e-9, min_run_time_s=0.2, warmup_calls=1)
    # Blocks of one call: every sample is 1.0 or 1.5 ms, so the quartiles are too.
    assert m.calls_per_sample == 1
    assert set(round(s * 1e4) for s in m.samples_s) <= {10, 15}
    assert m.iqr_s == pytest.approx(5e-4)
    assert m.noisy


def test_synchronize_brackets_every_block():
    clock = FakeClock()
    events = []
    op = clock.op(1e-3)

    def fn():
        events.append("call")
        op()

    measure(fn, clock=clock, synchronize=lambda: events.append("sync"), min_block_time_s=1e-9,
            min_run_time_s=0.005, warmup_calls=1)
    # Every call sits between two synchronizations (blocks of one call here).
    for i, e in enumerate(events):
        if e == "call":
            assert events[i - 1] == "sync" and events[i + 1] == "sync"


def test_as_row_keeps_raw_samples_in_seconds():
    m = Measurement(samples_s=(1e-3, 2e-3, 3e-3), calls_per_sample=4)
    row = m.as_row("step")
    assert row["step_samples_s"] == [1e-3, 2e-3, 3e-3]
    assert row["step_s"] == pytest.approx(2e-3)
    assert row["step_calls_per_sample"] == 4


@pytest.mark.parametrize("bad", [(), (float("nan"),), (-1.0,)])
def test_invalid_samples_rejected(bad):
    with pytest.raises(ValueError):
        Measurement(samples_s=bad)


def test_default_warmup_outlasts_a_start_up_transient():
    # Seven slow first calls (12 ms: thread-pool start-up, as seen on this machine class), then
    # 11 us. The default warm-up is time-based, so none of the slow calls reaches the samples.
    clock = FakeClock()
    durations = iter([12e-3] * 7 + [11e-6] * 10_000_000)
    m = measure(clock.op(lambda: next(durations)), clock=clock, synchronize=lambda: None,
                min_run_time_s=0.05, min_warmup_s=0.1)
    assert m.warmup_calls >= 7
    assert max(m.samples_s) == pytest.approx(11e-6)


class FakeCuda:
    """The parts of ``torch.cuda`` the timer uses, on a fake clock; device 0 is current.

    Records which device each synchronization waited on and which device's stream each event
    went on, so a test can see that work on ``cuda:1`` is timed on device 1, not device 0."""

    def __init__(self, clock):
        self.clock = clock
        self.synchronized = []
        self.recorded_on = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, stream=None):
                # torch: no stream means the current device's current stream.
                fake.recorded_on.append(stream.device_index if stream is not None else 0)
                self.t = fake.clock()

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3

        self.Event = Event

    def current_device(self):
        return 0

    def synchronize(self, device=None):
        self.synchronized.append(0 if device is None else int(getattr(device, "index", device)))

    def current_stream(self, device=None):
        return type("Stream", (), {"device_index": 0 if device is None else int(device)})()


@pytest.mark.parametrize("device, index", [("cuda:1", 1), ("cuda", 0)])
def test_cuda_timing_waits_and_records_on_the_work_device(monkeypatch, device, index):
    import torch

    clock = FakeClock()
    fake = FakeCuda(clock)
    for name in ("Event", "current_device", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    m = measure(clock.op(1e-3), device=device, min_run_time_s=0.01, min_block_time_s=1e-3,
                warmup_calls=1)
    assert m.median_s == pytest.approx(1e-3)  # the events' time, read on the fake clock
    assert fake.synchronized and set(fake.synchronized) == {index}
    assert fake.recorded_on and set(fake.recorded_on) == {index}


def test_a_span_times_its_block_by_the_clock_on_cpu_and_by_events_on_a_gpu(monkeypatch):
    import torch

    clock = FakeClock()
    span = SpanTimer("cpu", clock=clock)
    with span:
        clock.op(0.25)()
    clock.op(1.0)()  # after the span: not in it
    assert span.last_s() == 0.25
    fake = FakeCuda(clock)
    for name in ("Event", "current_device", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    span = SpanTimer("cuda:1", clock=clock)
    with span:
        clock.op(0.5)()
    assert span.last_s() == pytest.approx(0.5) and set(fake.recorded_on) == {1}
    assert fake.synchronized == []  # no synchronization of its own: the step it sits in is not changed


@pytest.mark.gpu
def test_cuda_1_is_timed_on_device_1():
    """On a 2-GPU node: a matmul on cuda:1 while device 0 is current is timed on device 1
    (device 0 idle would otherwise time ~nothing), the same as with device 1 current."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA/ROCm devices")
    a = torch.randn(4096, 4096, device="cuda:1")
    torch.cuda.set_device(0)
    on_0 = measure(lambda: a @ a, device="cuda:1", min_run_time_s=0.2)
    with torch.cuda.device(1):
        on_1 = measure(lambda: a @ a, device="cuda:1", min_run_time_s=0.2)
    assert on_0.median_s == pytest.approx(on_1.median_s, rel=0.25)
    assert on_0.median_s > 1e-5  # ~137 GFLOP: not the ~us of an empty device-0 stream
