"""Formulas several packages share: what a measurement computes and an analysis re-derives.

Each one cites its source (``shared/reference/formulas.md``); living here, below both, they
let an analysis use them without importing a measuring module.

- Collectives (nccl-tests ``doc/PERFORMANCE.md``): S per op (:func:`message_bytes`) and
  busbw / algbw (:func:`busbw_factor`).
- GEMM: FLOP = 2·M·N·K (:func:`gemm_flop`) and its minimum bytes (:func:`gemm_min_bytes`).
"""

from __future__ import annotations

from .errors import BadInputError

__all__ = ["COLLECTIVES", "PER_RANK_CHUNK", "busbw_factor", "message_bytes", "gemm_flop", "gemm_min_bytes"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
# S counts every rank's chunk for these (formulas.md: count × elem_size × n).
PER_RANK_CHUNK = frozenset({"all_gather", "reduce_scatter", "all_to_all"})


def busbw_factor(op: str, world_size: int) -> float:
    """busbw / algbw for ``op`` on ``world_size`` ranks (nccl-tests PERFORMANCE.md)."""
    if op not in COLLECTIVES:
        raise BadInputError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    if world_size < 1:
        raise BadInputError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n  # reduce-scatter then all-gather: each moves (n-1)/n of S
    if op in PER_RANK_CHUNK:
        return (n - 1) / n
    return 1.0


def message_bytes(op: str, count: int, elem_size: int, world_size: int) -> int:
    """S of formulas.md: ``count × elem_size``, times ``world_size`` for per-rank-chunk ops."""
    if op not in COLLECTIVES:
        raise BadInputError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    return count * elem_size * (world_size if op in PER_RANK_CHUNK else 1)


def gemm_flop(m: int, n: int, k: int) -> int:
    """2·M·N·K: one multiply and one add per term of each of the M·N dot products of length K."""
    return 2 * m * n * k


def gemm_min_bytes(m: int, n: int, k: int, elem_bytes: int) -> int:
    """Each operand read once and the result written once: (M·K + K·N + M·N) · element size."""
    return (m * k + k * n + m * n) * elem_bytes
