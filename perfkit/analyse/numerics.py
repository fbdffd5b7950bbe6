"""Is the faster side still right? The numerics of a compared point, beside its speed.

Each row carries what it can show of its results (:func:`evidence`):

- **training** rows their loss trajectory (``losses``, one per step): the new side's against the
  base's, step by step, each step ``k`` held to ``k ×`` the per-step budget of the looser
  precision of the pair (:mod:`perfkit.core.tolerances`, torch.testing's rtol per dtype). Parallel
  layouts at one global batch and ``torch.compile`` do the same math in another order: fp32's
  1.3e-6 a step. A gradient halved on one rank, a dropped bucket, a wrong loss scale move a loss
  by 1e-2 or more within a step or two.
- **inference** rows their greedy token ids (``greedy_token_ids``; older rows their
  ``tokens_digest``): equal, or parting only at near-ties. Where a sequence first parts, the
  base's top-2 logit margin (``greedy_margins``, from the untimed warm-up) is compared with what
  the pair's rounding can move: 2 × rtol × |top logit|, each logit off by torch.testing's rtol of
  the looser precision. Within it, the choice was a tie the precision cannot resolve (``same``,
  said); beyond it, ``differs``. Only the first parting of a sequence is comparable: later tokens
  follow another prefix.
- **kernel** rows (``perfkit kernels``) the errors measured against their reference: ``correct``
  within the recorded ``rtol``/``atol``, and the largest errors.

:func:`judge` gives a point ``same``, ``differs`` (with the largest deviation) or ``n/a`` (with
why), over every pair of its base and new rows (the rounds of an A/B sweep).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.tolerances import LOSS_ATOL, loss_rtol, loss_tolerance

__all__ = ["NUMERICS", "Evidence", "Numerics", "evidence", "judge"]

NUMERICS = ("same", "differs", "n/a")


@dataclass(frozen=True)
class Evidence:
    """What one row shows of its results."""

    kind: str
    """``losses``, ``tokens``, ``kernel``; ``none`` for a row that records no numerics."""
    workload: str | None
    precision: str | None = None
    losses: tuple[float, ...] = ()
    tokens: tuple[int, ...] | None = None
    tokens_digest: str | None = None
    margins: tuple[float, ...] | None = None
    """Per token, top-1 minus top-2 logit (``greedy_margins``), flattened as ``tokens``."""
    top_logits: tuple[float, ...] | None = None
    sequences: int = 1
    """Sequences the flattened tokens hold (the batch)."""
    correct: bool | None = None
    max_abs_error: float = math.nan
    max_rel_error: float = math.nan
    tolerance: str = ""


@dataclass(frozen=True)
class Numerics:
    """A point's numerics verdict."""

    verdict: str
    """``same``, ``differs`` or ``n/a``."""
    deviation: float
    """The largest deviation found (relative loss, share of tokens, kernel relative error); NaN if none."""
    basis: str
    """What was compared: "bf16 vs fp32, 5 steps", "128 greedy tokens", "kernel errors"."""
    why: str
    """One sentence a reader acts on."""


def _list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) and len(value) else None


def _text(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def evidence(row: dict) -> Evidence:
    """What ``row`` (a results row as a dict) shows of its numerics."""
    workload = _text(row.get("workload"))
    precision = _text(row.get("precision"))
    losses = _list(row.get("losses"))
    if losses is not None:
        return Evidence("losses", workload, precision=precision, losses=tuple(float(x) for x in losses))
    tokens = _list(row.get("greedy_token_ids"))
    digest = _text(row.get("tokens_digest"))
    if tokens is not None or digest is not None:
        margins, tops = _list(row.get("greedy_margins")), _list(row.get("greedy_top_logits"))
        batch = row.get("batch_size")
        return Evidence("tokens", workload, precision=precision,
                        tokens=None if tokens is None else tuple(int(t) for t in tokens), tokens_digest=digest,
                        margins=None if margins is None else tuple(float(m) for m in margins),
                        top_logits=None if tops is None else tuple(float(t) for t in tops),
                        sequences=int(batch) if isinstance(batch, (int, float)) and batch == batch and batch > 0 else 1)
    correct = row.get("correct")
    if correct is not None and not (isinstance(correct, float) and math.isnan(correct)):
        rtol, atol = row.get("rtol"), row.get("atol")
        return Evidence("kernel", workload, precision=_text(row.get("dtype")), correct=bool(correct),
                        max_abs_error=float(row.get("max_abs_error", math.nan)),
                        max_rel_error=float(row.get("max_rel_error", math.nan)),
                        tolerance=f"rtol {rtol:g}, atol {atol:g}" if rtol is not None and atol is not None else "")
    return Evidence("none", workload, precision=precision)


def _na(why: str) -> Numerics:
    return Numerics("n/a", math.nan, "", why)


def _losses(base: Sequence[Evidence], new: Sequence[Evidence]) -> Numerics:
    rtol, pair = loss_rtol(base[0].precision, new[0].precision)
    steps = min(len(e.losses) for e in (*base, *new))
    worst_excess, worst, first = -math.inf, (0.0, 0, 0.0), None
    for b in base:
        for n in new:
            for k in range(steps):
                lb, ln = b.losses[k], n.losses[k]
                if not (math.isfinite(lb) and math.isfinite(ln)):
                    if math.isfinite(lb) != math.isfinite(ln):
                        return Numerics("differs", math.inf, f"{pair}, {steps} steps",
                                        f"the loss at step {k + 1} is {ln:g} on the new side and {lb:g} on the base")
                    continue
                dev = abs(ln - lb) / max(abs(lb), LOSS_ATOL)
                allowed = loss_tolerance(rtol, k + 1)
                if dev > allowed and (first is None or k + 1 < first[1]):
                    first = (dev, k + 1, allowed)
                if dev / allowed > worst_excess:
                    worst_excess, worst = dev / allowed, (dev, k + 1, allowed)
    lengths = {len(e.losses) for e in (*base, *new)}
    basis = f"{pair}, {steps} steps"
    cut = f" (the first {steps} of {max(lengths)} steps: the sides ran different step counts)" if len(lengths) > 1 else ""
    dev, step, allowed = worst
    how = (f"relative loss deviation {dev:.2g} at step {step}, the nearest its budget of {allowed:.2g} "
           f"({step} × {rtol:g} a step, {pair.split(' (')[0]}'s rtol)")
    if first is not None:
        start = (f"at step {first[1]} ({first[0]:.2g} against {first[2]:.2g} allowed); "
                 if first[1] != step else "")
        return Numerics("differs", max(dev, first[0]), basis, f"the loss trajectories part {start}{how}{cut}")
    return Numerics("same", max(dev, 0.0), basis, f"within tolerance: {how}{cut}")


def _parting(b: Evidence, n: Evidence) -> list[tuple[int, int]]:
    """(flat index, step) where each sequence of ``n`` first parts from ``b``'s greedy tokens
    (later tokens follow another prefix: only the first choice is comparable)."""
    per = len(b.tokens) // b.sequences if len(b.tokens) % b.sequences == 0 else len(b.tokens)
    out = []
    for seq in range(len(b.tokens) // per):
        row_b, row_n = b.tokens[seq * per:(seq + 1) * per], n.tokens[seq * per:(seq + 1) * per]
        first = next((i for i, (x, y) in enumerate(zip(row_b, row_n)) if x != y), None)
        if first is not None:
            out.append((seq * per + first, first))
    return out


def _near_tie(b: Evidence, flat: int, rtol: float) -> float | None:
    """How far the base's top-2 margin at ``flat`` is inside the pair's rounding, as margin ÷
    allowance (≤ 1: a near-tie that the precision cannot resolve); None without margins."""
    if b.margins is None or b.top_logits is None or flat >= len(b.margins):
        return None
    # Each of the two logits may move by rtol × its size (torch.testing's rtol of the looser
    # precision), so a margin under 2 × rtol × |top logit| can flip: rounding, not a defect.
    allowance = 2 * rtol * max(abs(b.top_logits[flat]), 1.0)
    return b.margins[flat] / allowance


def _tokens(base: Sequence[Evidence], new: Sequence[Evidence]) -> Numerics:
    pair = base[0].precision if base[0].precision == new[0].precision else f"{new[0].precision} vs {base[0].precision}"
    rtol = loss_rtol(base[0].precision, new[0].precision)[0]
    if all(e.tokens is not None for e in (*base, *new)):
        total = len(base[0].tokens)
        basis = f"{total} greedy tokens ({pair})"
        worst, ties, unexplained = None, 0, False
        for b in base:
            for n in new:
                if len(b.tokens) != len(n.tokens):
                    return Numerics("differs", 1.0, basis,
                                    f"{len(n.tokens)} greedy tokens on the new side, {len(b.tokens)} on the base")
                diff = sum(x != y for x, y in zip(b.tokens, n.tokens))
                parts = _parting(b, n)
                scores = [_near_tie(b, flat, rtol) for flat, _ in parts]
                ties += sum(s is not None and s <= 1 for s in scores)
                unexplained |= any(s is None or s > 1 for s in scores)
                if diff and (worst is None or diff > worst[0]):
                    worst = (diff, parts[0][1] if parts else 0, parts[0][0] if parts else 0, scores)
        if worst is None:
            return Numerics("same", 0.0, basis, f"the {total} greedy token ids are equal")
        n_diff, step, flat, scores = worst
        if not unexplained:
            return Numerics("same", n_diff / total, basis,
                            f"the greedy tokens part only at near-ties ({ties} sequence(s)): the base's top-2 logit "
                            f"margin there is within 2 × {rtol:g} × |top logit|, which {pair.split(' vs ')[0]}'s "
                            f"rounding can flip; later tokens follow the other prefix")
        said = next((s for s in scores if s is not None and s > 1), None)
        if said is not None:
            margin = f"; the base's top-2 margin there is {said:.3g}× what {pair}'s rounding can flip"
        elif base[0].precision != new[0].precision:
            margin = ("; the base row has no greedy_margins to tell a near-tie of the top two logits (which "
                      "two precisions may part at) from a defect: --accept-numerics if that is expected")
        else:
            margin = ""
        return Numerics("differs", n_diff / total, basis,
                        f"{n_diff} of {total} greedy token ids differ; a sequence first parts at step {step + 1} "
                        f"(flat index {flat}){margin}")
    digests_b = {e.tokens_digest for e in base}
    digests_n = {e.tokens_digest for e in new}
    if None in digests_b | digests_n:
        return _na("a side recorded neither its greedy token ids nor their digest")
    if digests_b == digests_n and len(digests_b) == 1:
        return Numerics("same", 0.0, f"greedy tokens' digest ({pair})", "the greedy tokens' digests are equal")
    return Numerics("differs", math.nan, f"greedy tokens' digest ({pair})",
                    "the greedy tokens' digests differ (rows recorded before perfkit kept the token ids "
                    "cannot say where)")


def _kernels(new: Sequence[Evidence]) -> Numerics:
    wrong = [e for e in new if not e.correct]
    rel = max((e.max_rel_error for e in new), default=math.nan)
    tol = new[0].tolerance or "the recorded tolerance"
    basis = f"kernel against its reference ({new[0].precision}, {tol})"
    if wrong:
        e = max(wrong, key=lambda x: x.max_abs_error)
        return Numerics("differs", e.max_rel_error, basis,
                        f"not within {tol} of its reference: max abs error {e.max_abs_error:.3g}, "
                        f"max rel error {e.max_rel_error:.3g}")
    return Numerics("same", rel, basis, f"within {tol} of its reference (max rel error {rel:.3g})")


def judge(base: Sequence[Evidence], new: Sequence[Evidence]) -> Numerics:
    """The point's numerics: its new rows against its base rows (kernel rows: against the
    reference each recorded)."""
    if not base or not new:
        return _na("a side has no ok row")
    kinds_b, kinds_n = {e.kind for e in base}, {e.kind for e in new}
    if kinds_n == {"kernel"}:
        return _kernels(new)
    if kinds_b != kinds_n or len(kinds_b) != 1:
        return _na(f"the sides record different things (base: {', '.join(sorted(kinds_b))}; "
                   f"new: {', '.join(sorted(kinds_n))})")
    kind = kinds_b.pop()
    if kind == "losses":
        return _losses(base, new)
    if kind == "tokens":
        return _tokens(base, new)
    workload = new[0].workload or "these"
    return _na(f"{workload} rows record no results to compare (losses, greedy tokens or kernel errors)")
