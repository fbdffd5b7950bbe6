"""The OOM edge: the largest global batch a training configuration fits, measured beside predicted.

:func:`find_max_batch_size` runs :func:`perfkit.measuring.training.step.run_training` at growing batch
sizes, every probe in processes of its own (``isolate=True``, on every device): an OOM ends its
probe and the memory it held, never the search or the probes after it. (Run in the caller, one
OOM on the H200 left 134 GiB held by the calling process: every later probe ran out of memory,
the search reported 1024 where isolated probes found 1920, and the next four runs of that
process ended ``oom``.) It puts the edges predicted beside the one it measured:
:func:`perfkit.measuring.training.memory_model.predicted_max_batch` (the analytic model, from shapes) and
:func:`perfkit.measuring.training.memory_edge.largest_batch` (the step run on fake tensors).
"""

from __future__ import annotations

from dataclasses import replace

from perfkit.core.errors import BadInputError
from perfkit.core.status import OK, OOM
from perfkit.measuring.training import memory_edge, memory_fit, memory_model
from perfkit.measuring.training.config import TrainConfig, config_device
from perfkit.measuring.training.step import run_training

__all__ = ["find_max_batch_size"]


def _fake_edge(cfg: TrainConfig, budget: int | None, step: int) -> int | None:
    """The fake-tensor step's largest batch for ``budget``, down to a multiple of ``step``."""
    if budget is None or memory_fit.fit_reason(cfg):
        return None
    batch, _ = memory_edge.largest_batch(cfg, memory_fit.predict(cfg), budget)
    return None if batch is None else batch // step * step or None


def find_max_batch_size(cfg: TrainConfig, *, start: int, limit: int, timeout_s: float = 600.0,
                        multiple_of: int | None = None, memory_budget_bytes: int | None = None,
                        predict_fake: bool = False) -> dict:
    """Largest global batch in [start, limit] that trains without OOM: double from ``start``
    until a run OOMs (or ``limit``), then bisect between the last fit and the first OOM down to
    ``multiple_of`` (default: the data-parallel size). On CPU set
    ``address_space_headroom_bytes``, or the kernel's OOM killer ends the search instead.

    Returns ``max_batch_size`` (None if ``start`` does not fit), ``probes`` (batch size, status),
    ``stopped_by`` (a row whose status was neither ok nor oom, else None) and, beside the measured
    edge, the predicted ones for ``memory_budget_bytes`` per rank (default: the address-space
    headroom, else the GPU's memory; None without a budget) as a row has them:
    ``max_batch_size_predicted_analytic`` by :func:`perfkit.measuring.training.memory_model.predicted_max_batch`,
    ``max_batch_size_predicted_fake`` by :func:`perfkit.measuring.training.memory_edge.largest_batch`
    from the fake-tensor step at ``start`` when ``predict_fake`` (two fake steps on this CPU
    first: seconds for a large model; None without it, without a budget or where the fake step
    does not model the configuration: ``memory_fit.fit_reason``), and ``max_batch_size_predicted``,
    the fake one where there is one, else the analytic one (``max_batch_size_predicted_source``).
    Both count tensors; a CPU's address space holds more (the allocator's and BLAS's own), so the
    measured edge lies at or below them.
    """
    step = multiple_of or cfg.dp_size
    if not 1 <= start <= limit or start % step or step < 1:
        raise BadInputError(f"need 1 <= start <= limit and start a multiple of {step}")
    budget = memory_budget_bytes or memory_model.memory_budget(cfg, config_device(cfg))[0]
    analytic = None if budget is None else memory_model.predicted_max_batch(cfg, budget, multiple_of=step)
    fake = _fake_edge(replace(cfg, batch_size=start), budget, step) if predict_fake else None
    edge, source = memory_edge.chosen_edge(fake, analytic)
    predicted = {"max_batch_size_predicted": None if source is None else edge,
                 "max_batch_size_predicted_source": source, "max_batch_size_predicted_analytic": analytic,
                 "max_batch_size_predicted_fake": fake, "memory_budget_bytes": budget}
    probes: list[tuple[int, str]] = []

    def fits(batch: int) -> bool | dict:
        row = run_training(replace(cfg, batch_size=batch), timeout_s, isolate=True)
        probes.append((batch, row["status"]))
        return True if row["status"] == OK else False if row["status"] == OOM else row

    good, bad, batch = None, None, start
    while True:
        verdict = fits(batch)
        if isinstance(verdict, dict):
            return {"max_batch_size": good, "probes": probes, "stopped_by": verdict, **predicted}
        if not verdict:
            bad = batch
            break
        good = batch
        if batch >= limit:
            break
        batch = min(batch * 2, limit // step * step)
        if batch <= good:
            break
    while good is not None and bad is not None and bad - good > step:
        mid = (good + bad) // 2 // step * step
        if mid <= good:
            break
        verdict = fits(mid)
        if isinstance(verdict, dict):
            return {"max_batch_size": good, "probes": probes, "stopped_by": verdict, **predicted}
        good, bad = (mid, bad) if verdict else (good, mid)
    return {"max_batch_size": good, "probes": probes, "stopped_by": None, **predicted}
