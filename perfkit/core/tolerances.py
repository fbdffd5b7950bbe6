"""How close two results of floating-point work must be to count as the same, by precision.

Two tables, one source each:

- :data:`ASSERT_CLOSE`: ``torch.testing.assert_close``'s default ``(rtol, atol)`` per dtype (the
  table in its documentation): what a kernel's output is held to against its reference. ``tf32``
  is an fp32 tensor and keeps fp32's pair (a TF32 matmul's own error is the user's to allow).
- :data:`LOSS_RTOL_PER_STEP`: the relative budget one training step adds to a loss trajectory,
  by the precision the step runs in. Where ``assert_close`` has a default for the dtype it is that
  rtol (fp64, fp32, fp16, bf16); ``tf32`` takes fp16's (both keep 10 mantissa bits in the
  multiply); ``fp8`` (e4m3 GEMM inputs, 3 mantissa bits) takes its unit roundoff 2⁻⁴ = 0.0625:
  torch has no float8 default, and fp8 recipes keep weights, optimizer and reductions in
  bf16/fp32, quantizing the GEMM inputs only.

A trajectory of ``n`` steps is held to ``k × rtol`` at its ``k``-th step (:func:`loss_tolerance`):
a first-order budget in which each step's rounding adds to what came before. Long runs diverge
faster than that (training is chaotic), so compare short runs; two sides of different precision
are held to the looser precision's budget.
"""

from __future__ import annotations

__all__ = ["ASSERT_CLOSE", "LOSS_RTOL_PER_STEP", "loss_rtol", "loss_tolerance"]

ASSERT_CLOSE = {"fp64": (1e-7, 1e-7), "fp32": (1.3e-6, 1e-5), "tf32": (1.3e-6, 1e-5),
                "bf16": (1.6e-2, 1e-5), "fp16": (1e-3, 1e-5)}
"""``torch.testing.assert_close``'s defaults, ``(rtol, atol)`` by dtype."""

LOSS_RTOL_PER_STEP = {"fp64": 1e-7, "fp32": 1.3e-6, "tf32": 1e-3, "fp16": 1e-3, "bf16": 1.6e-2,
                      "bf16-pure": 1.6e-2, "fp8": 0.0625}
"""Relative loss budget per training step, by the step's precision (the module's docstring)."""

LOSS_ATOL = 1e-5
"""Floor of a loss's magnitude in a relative deviation (``assert_close``'s atol for fp32/bf16/fp16)."""


def loss_rtol(precision_base: str | None, precision_new: str | None) -> tuple[float, str]:
    """The per-step budget of a pair (the looser side's) and how it reads ("bf16 vs fp32");
    a precision not recorded is taken as fp32 and said."""
    names = []
    rtols = []
    for p in (precision_new, precision_base):
        known = p if p in LOSS_RTOL_PER_STEP else "fp32"
        names.append(p if p in LOSS_RTOL_PER_STEP else f"{p or 'unrecorded'} (as fp32)")
        rtols.append(LOSS_RTOL_PER_STEP[known])
    pair = names[0] if names[0] == names[1] else f"{names[0]} vs {names[1]}"
    return max(rtols), pair


def loss_tolerance(rtol_per_step: float, step: int) -> float:
    """The relative deviation allowed at step ``step`` (1-based): ``step × rtol_per_step``."""
    return step * rtol_per_step
