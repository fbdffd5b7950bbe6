"""Which matmul shape reaches a device's best throughput: a search, not a fixed list of sizes.

A fixed set of sizes misses the best one as soon as a machine differs from the one the list was
written on (on an AVX2-only CPU the quick set's best fp32 matmul was 0.91x the best size
between 512 and 4096). The search climbs instead:

1. squares, growing (then, if growing did not help, shrinking) by 2x from a start size, until
   two steps in a row do not beat the best by more than ``min_gain``;
2. the same walk by sqrt(2) around the best square;
3. a few aspect ratios of the best square (deep K; wide M, N with short K).

On a GPU (``exhaustive=True``) the large squares are cheap (a 16384-cubed bf16 matmul is 11 ms on
an H200) and the climb's stop rule ended on noise: on the H200 it stopped at 4096 (681 TFLOP/s)
where a plain matmul reached 781 at 16384. There step 1 is every square from ``min_n`` to
``max_n`` by sqrt(2) that fits. Either way the ``confirm`` best shapes are then measured again
(the ceiling is the best of every measurement, so one unlucky sample of the winner cannot
hide it).

A candidate that would take longer than the caller's budget per call, or not fit in memory, is
not tried (``fits``). The search knows nothing about devices or timing: ``rate(shape)`` measures,
so tests drive it with a made-up throughput surface.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ASPECTS", "SearchResult", "search_best_shape"]

Shape = tuple[int, int, int]

#: (M, N, K) multipliers of the best square tried in step 3, each keeping its FLOP (so its time
#: per call): deep K (more work per output element), and wide M, N with short K (the GPU
#: 8192x8192x2048 kind of shape).
ASPECTS: tuple[tuple[float, float, float], ...] = ((2 ** -0.5, 2 ** -0.5, 2), (2 ** 0.5, 2 ** 0.5, 0.5))


@dataclass(kw_only=True, frozen=True)
class SearchResult:
    """What the search tried, in order, and which shape won."""

    tried: tuple[tuple[Shape, float], ...]
    """(shape, FLOP/s) per measured shape, in the order measured (each shape's best)."""
    confirmed: tuple[tuple[Shape, float], ...] = ()
    """(shape, FLOP/s) of the leaders measured again, in the order measured."""

    @property
    def best(self) -> Shape:
        """The shape of the highest measured FLOP/s (the climb's ``min_gain`` only decides when
        to stop, not which measurement is the ceiling)."""
        return max(self.tried + self.confirmed, key=lambda item: item[1])[0]

    @property
    def best_flop_per_s(self) -> float:
        return max(rate for _, rate in self.tried + self.confirmed)


def _aligned(n: float, align: int) -> int:
    return max(align, int(round(n / align)) * align)


def search_best_shape(rate: Callable[[Shape], float], start_n: int, *, min_n: int, max_n: int,
                      align: int = 64, min_gain: float = 0.02, patience: int = 2,
                      aspects=ASPECTS, fits: Callable[[Shape, float], bool] = lambda shape, best: True,
                      exhaustive: bool = False, confirm: int = 2) -> SearchResult:
    """Climb from ``start_n``-cubed to the shape of highest ``rate`` (FLOP/s); see the module doc.

    ``fits(shape, best_flop_per_s)`` vetoes a candidate (too slow per call, too large); ``align``
    rounds every dimension (multiples of 64 keep vector/tensor-core tiles whole). ``exhaustive``:
    every square that fits instead of the climb; ``confirm``: how many of the best shapes are
    measured a second time at the end.
    """
    if not 0 < min_n <= start_n <= max_n:
        raise ValueError(f"need 0 < min_n <= start_n <= max_n, got {min_n}, {start_n}, {max_n}")
    measured: dict[Shape, float] = {}
    best = (start_n,) * 3
    measured[best] = rate(best)

    def better(shape: Shape) -> bool:
        """Measure ``shape`` once (a revisit reads the earlier value) and say if it beat the best."""
        nonlocal best
        if shape not in measured:
            if not fits(shape, measured[best]):
                return False
            measured[shape] = rate(shape)
        if measured[shape] > measured[best] * (1 + min_gain):
            best = shape
            return True
        return False

    def walk(factor: float) -> None:
        start = best[0]
        for step in (factor, 1 / factor):
            i, misses, improved = 0, 0, False
            while misses < patience:
                i += 1
                n = _aligned(start * step ** i, align)  # from start, not compounding the rounding
                if not min_n <= n <= max_n or ((n,) * 3 not in measured and not fits((n,) * 3, measured[best])):
                    break
                if better((n,) * 3):
                    misses, improved = 0, True
                else:
                    misses += 1
            if improved:  # the other direction leads away from an improvement
                return

    if exhaustive:
        i = 0
        while (n := _aligned(min_n * math.sqrt(2.0) ** i, align)) <= max_n:
            i += 1
            if (n,) * 3 not in measured and not fits((n,) * 3, max(measured.values())):
                break  # the larger squares would not fit either
            better((n,) * 3)
        best = max(measured, key=measured.get)
    else:
        walk(2.0)
        walk(math.sqrt(2.0))
    square = best[0]
    for aspect in aspects:
        shape = tuple(_aligned(square * a, align) for a in aspect)
        if min(shape) >= min_n:
            better(shape)
    leaders = sorted(measured, key=measured.get, reverse=True)[:confirm]
    return SearchResult(tried=tuple(measured.items()), confirmed=tuple((shape, rate(shape)) for shape in leaders))
