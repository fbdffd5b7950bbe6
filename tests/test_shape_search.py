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
    result = search_best_shape(rate, 1024, min_n=128, max_n=8192, aspects=())
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
