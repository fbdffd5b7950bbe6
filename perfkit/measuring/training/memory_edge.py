"""The largest batch a training step fits, from its step on fake tensors, and the OOM edge a row says.

At a fixed sequence length each phase's peak (forward, backward, the optimizer's step) is a line
in the per-rank batch, through the prediction (:func:`perfkit.measuring.training.memory_fit.predict`)
and the one with a sample more per rank: two points, not the batch-scaled categories alone
(autocast's 16-bit weight copies are made in the forward and held to backward, yet do not grow
with the batch; a 7B Llama's are 13 GB). The lines are solved for the budget, then once more
through the answer and a sample more (far from a small batch the peak's moment can move);
``check`` steps the answer while off.

A training row's ``max_batch_size_predicted`` (:func:`edge_columns`) is this edge wherever the
fake step models the configuration, else the analytic model's
(:func:`perfkit.measuring.training.memory_model.predicted_max_batch`), both beside it and the
source named (:func:`chosen_edge`): on the H200 the fake step's edge was the measured one,
1920 samples, the analytic model's then 2816 (issue 43).
"""

from __future__ import annotations

import dataclasses
import math

from perfkit.measuring.training.memory_fit import PHASES, StepMemory, fit_reason, predict, predict_elsewhere

__all__ = ["largest_batch", "one_more_per_rank", "edge_columns", "chosen_edge"]

_PROBES = 3  # most fake steps largest_batch takes beyond its first, each way


def one_more_per_rank(cfg):
    """``cfg`` with one more sample per data-parallel rank: the second point of the batch fit."""
    return dataclasses.replace(cfg, batch_size=cfg.batch_size + cfg.dp_size)


def _largest_per_rank(n0: int, at_n0: StepMemory, at_n1: StepMemory, budget_bytes: float) -> int:
    """The most samples per rank whose every phase's peak fits ``budget_bytes``, each phase's
    peak a line through its bytes at ``n0`` and ``n0 + 1`` samples. Phase by phase: at a small
    batch the optimizer's step holds the step's peak and does not grow with the batch, and a
    line through the step's peak alone (one byte a sample) put a 1 GiB mlp's edge at 3.2 million
    samples where backward's own line puts it at 50 thousand."""
    phases = [p for p in PHASES if p in at_n0.phase_peak_bytes and p in at_n1.phase_peak_bytes]
    lines = ([(at_n0.phase_peak_bytes[p], at_n1.phase_peak_bytes[p]) for p in phases]
             or [(at_n0.peak_bytes, at_n1.peak_bytes)])
    most = math.inf
    for here, more in lines:
        if more > here:
            most = min(most, n0 + math.floor((budget_bytes - here) / (more - here)))
        elif here > budget_bytes:  # a phase the batch does not move, over the budget at any batch
            return 0
    # Nothing grows with the batch (no phase holds a batch-sized tensor at its peak): no edge to find.
    return int(most) if math.isfinite(most) else 2**40


def largest_batch(cfg, prediction: StepMemory, budget_bytes: float, *, one_more: StepMemory | None = None,
                  check: bool = False) -> tuple[int | None, StepMemory | None]:
    """The largest global batch (a multiple of the data-parallel size) whose predicted peak fits
    ``budget_bytes`` per rank, and its prediction when ``check`` made one. The peak is a line in
    the per-rank batch through ``prediction`` and ``one_more`` (the prediction of
    :func:`one_more_per_rank`, made here when not given): two points, because part of what the
    step holds does not grow with the batch though it is made in the forward (autocast's 16-bit
    weight copies). ``check``: the answer predicted, and stepped by one sample per rank while it
    is off (at most a few steps). (None, None) when not even one sample per rank fits."""
    dp = cfg.dp_size
    n0 = cfg.batch_size // dp
    one_more = one_more or predict(one_more_per_rank(cfg))
    n = _largest_per_rank(n0, prediction, one_more, budget_bytes)
    if n > 2 * n0 and n < 2**40:
        # Far from the two points the peak's moment can move (a small batch's backward peaks
        # as weight gradients appear, a large one's at the activation gradients): the line
        # again through the answer and a sample more, where the edge is.
        near = [predict(dataclasses.replace(cfg, batch_size=k * dp)) for k in (n, n + 1)]
        n = _largest_per_rank(n, *near, budget_bytes)
    if not check:
        return (n * dp, None) if n >= 1 else (None, None)
    at = lambda k: predict(dataclasses.replace(cfg, batch_size=k * dp))  # noqa: E731
    n = max(n, 1)
    got = at(n)
    # The peak is linear in the batch, so the guess is off by a step at most; a few probes each
    # way bound the cost if a model's peak moves between phases.
    if got.peak_bytes <= budget_bytes:
        for _ in range(_PROBES):
            more = at(n + 1)
            if more.peak_bytes > budget_bytes:
                break
            n, got = n + 1, more
        return n * dp, got
    for _ in range(_PROBES):
        if n == 1:
            break
        n -= 1
        got = at(n)
        if got.peak_bytes <= budget_bytes:
            return n * dp, got
    return None, None


def edge_columns(cfg, budget_bytes: int | None, analytic_edge: float,
                 prediction: StepMemory | None = None) -> dict:
    """The row's predicted OOM edge, ``max_batch_size_predicted``: the fake-tensor step's
    (:func:`largest_batch` through ``prediction``, made here when not given, and one sample more
    per rank) wherever it models ``cfg`` and a per-rank budget exists, else the analytic model's
    (``analytic_edge``, :func:`perfkit.measuring.training.memory_model.predicted_max_batch`);
    both beside it (``max_batch_size_predicted_fake``, ``_analytic``), which one it is
    (``max_batch_size_predicted_source``) and why there is no fake one. On the H200 the fake
    step's edge was the measured one (1920 samples), the analytic model's then 47 % above it."""
    reason = fit_reason(cfg) or (None if budget_bytes else "no per-rank memory budget")
    fake = math.nan
    if reason is None:
        try:
            # The line through the analytic edge and a sample more, where it models the step (within
            # 10 % of the fake one): two fake steps near the answer, where a line from the row's own
            # batch needs two more there to correct it (the refit in largest_batch).
            seeded = (dataclasses.replace(cfg, batch_size=int(analytic_edge))
                      if analytic_edge is not None and math.isfinite(analytic_edge) and analytic_edge >= cfg.dp_size
                      else cfg)
            base = prediction if prediction is not None and seeded is cfg else predict_elsewhere(seeded)
            batch, _ = largest_batch(seeded, base, budget_bytes,
                                     one_more=predict_elsewhere(one_more_per_rank(seeded)))
            fake = math.nan if batch is None else batch
            reason = None if batch is not None else "not one sample per rank fits the budget"
        except Exception as error:  # noqa: BLE001 - a model fake tensors cannot run keeps its row
            reason = f"the fake-tensor step failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    edge, source = chosen_edge(fake, analytic_edge)
    return {"max_batch_size_predicted": edge, "max_batch_size_predicted_source": source,
            "max_batch_size_predicted_fake": fake, "max_batch_size_predicted_fake_reason": reason}


def chosen_edge(fake: float | None, analytic: float | None) -> tuple[float, str | None]:
    """(the predicted OOM edge a row and the advice use, its source): the fake-tensor step's
    where there is one (it runs the step's own code: the H200's edge to the sample), else the
    analytic model's; (NaN, None) without either."""
    def given(x) -> bool:
        return x is not None and not math.isnan(x)

    if given(fake):
        return fake, "fake-tensor step"
    return (analytic, "analytic model") if given(analytic) else (math.nan, None)
