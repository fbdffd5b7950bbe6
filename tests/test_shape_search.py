"""perfkit.measuring.kernels.shape_search on made-up throughput surfaces (no timing: the rate is a function)."""

from __future__ import annotations

import math

import pytest

from perfkit.measuring.kernels.shape_search import search_best_shape


def peaked(best_n: float, width_octaves: float = 1.0, peak: float = 100e9):
    """A smooth bump in log2(size) centred on ``best_n`` (the cube root of M·N·K), 10 % lower
    for shapes that are not square."""
    def rate(shape):
        n = (shape[0] * shape[1] * shape[2]) ** (1 / 3)
        square = 1.0 if len(set(shape)) == 1 else 0.9
        return square * peak * math.exp(-((math.log2(n / best_n) / width_octaves) ** 2))
    return rate


def recorder(rate):
    calls = []

    def wrapped(shape):
        calls.append(shape)
        return rate(shape)
    return wrapped, calls


def test_finds_a_best_size_that_a_fixed_list_of_powers_of_two_misses():
    # The best square is 3000: not in {512, 1024, 2048}, the old quick fp32 list.
    rate = peaked(3000)
    result = search_best_shape(rate, 1024, min_n=128, max_n=4096)
    grid_best = max(rate((n, n, n)) for n in range(512, 4097, 64))
    assert result.best == (2880, 2880, 2880)
    assert result.best_flop_per_s >= 0.95 * grid_best
    assert max(rate((n, n, n)) for n in (512, 1024, 2048)) < 0.9 * grid_best  # what the old list got


def test_the_walk_stops_after_two_steps_that_do_not_improve():
    rate, calls = recorder(lambda shape: 50e9)  # flat: nothing beats the start by > 2 %
    result = search_best_shape(rate, 1024, min_n=128, max_n=8192, aspects=(), confirm=0)
    squares = [s[0] for s in calls]
    # x2: up two misses, down two misses; sqrt(2): one new size each way, then a revisit.
    assert squares == [1024, 2048, 4096, 512, 256, 1472, 704]
    assert result.best == (1024, 1024, 1024)
    assert len(set(calls)) == len(calls)  # a revisit reads the earlier measurement


def test_gains_under_min_gain_do_not_keep_the_walk_going():
    # +0.9 % per doubling: noise-sized, so the search stops two steps later as on a flat surface.
    rate, calls = recorder(lambda shape: 50e9 * 1.009 ** math.log2(shape[0]))
    search_best_shape(rate, 1024, min_n=128, max_n=1 << 20, aspects=())
    assert max(s[0] for s in calls) == 4096


def test_shrinks_when_growing_does_not_help():
    result = search_best_shape(peaked(256), 1024, min_n=64, max_n=4096)
    assert result.best == (256, 256, 256)


def test_an_aspect_ratio_can_win_and_is_reported():
    def rate(shape):  # deep K is 30 % faster; the size peaks at 1024 (cube root of M·N·K)
        m, n, k = shape
        return 80e9 * (1.3 if k >= 2 * m else 1.0) * math.exp(-abs(math.log2((m * n * k) ** (1 / 3) / 1024)))

    result = search_best_shape(rate, 1024, min_n=128, max_n=4096)
    assert result.best == (704, 704, 2048)  # 1024/sqrt(2), rounded to 64; 2 x 1024: the same FLOP
    assert result.best_flop_per_s == pytest.approx(rate((704, 704, 2048)))


def test_a_shape_that_does_not_fit_is_never_measured():
    rate, calls = recorder(peaked(8192))  # bigger is better up to 8192 ...
    too_slow = lambda shape, best: shape[0] * shape[1] * shape[2] <= 2048 ** 3  # noqa: E731 ... but not allowed
    result = search_best_shape(rate, 1024, min_n=128, max_n=16384, fits=too_slow)
    assert all(m * n * k <= 2048 ** 3 for m, n, k in calls)
    assert result.best == (2048, 2048, 2048)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        search_best_shape(peaked(1024), 8192, min_n=128, max_n=4096)


def h200_like():
    """The H200's bf16 matmul (../shared/reference/gpu-h200/probes/matmul_reference_vs_ceiling.json:
    681 TFLOP/s at 4096, 765 at 8192, 781 at 16384), where the first measurement of each shape
    past 4096 reads 12 % low (clocks and power settling while it runs: the plain matmul's
    16384 median was 702 against its best 781)."""
    seen: set = set()

    def rate(shape):
        n = (shape[0] * shape[1] * shape[2]) ** (1 / 3)
        true = 1e12 * min(781.0, 681.0 + 100.0 * max(0.0, math.log2(n / 4096)) / 2)
        first = shape not in seen
        seen.add(shape)
        return true * (0.88 if first and n > 4096 else 1.0)
    return rate


def test_on_a_gpu_every_square_is_tried_and_the_leaders_measured_again():
    best_true = 781e12
    climbed = search_best_shape(h200_like(), 4096, min_n=1024, max_n=16384, confirm=0)  # as it was
    assert climbed.best_flop_per_s < 0.9 * best_true  # the climb alone: ended on the first, low readings
    swept = search_best_shape(h200_like(), 4096, min_n=1024, max_n=16384, exhaustive=True)
    assert swept.best_flop_per_s >= 0.97 * best_true
    assert swept.best == (16384,) * 3
    squares = {shape[0] for shape, _ in swept.tried if len(set(shape)) == 1}
    assert {1024, 2048, 4096, 8192, 11584, 16384} <= squares
    assert len(swept.confirmed) == 2 and all(shape in dict(swept.tried) for shape, _ in swept.confirmed)


def test_the_exhaustive_sweep_stops_at_the_first_square_that_does_not_fit():
    rate, calls = recorder(peaked(4096))
    search_best_shape(rate, 1024, min_n=1024, max_n=16384, exhaustive=True, aspects=(), confirm=0,
                      fits=lambda shape, best: shape[0] <= 4096)
    assert max(shape[0] for shape in calls) == 4096
