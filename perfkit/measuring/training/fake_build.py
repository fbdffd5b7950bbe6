"""A workload built on fake tensors for :mod:`perfkit.measuring.training.memory_fit`: built on
the meta device, its parameters made fake tensors of the target device (tied ones kept tied), its
batches fake tensors of the real batches' shapes, strides and dtypes."""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["fake_builder"]


def fake_builder(fake_mode):
    """A ``build`` for :func:`~perfkit.measuring.training.step_setup.prepare`: the workload on the
    meta device (outside fake mode: the builders compare devices and seed generators), its
    parameters then made fake tensors on the target device. Its batches are drawn on the meta
    device (nothing allocated; a user's ``make_batch`` may close over tensors its builder made,
    on meta here), else, when the draw mixes in CPU tensors of the builder (perfkit's tasks), on
    the CPU; then given as fake tensors of their shapes, strides and dtypes. No value is needed:
    memory depends on shapes and dtypes."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from perfkit.measuring.workloads import catalog
    from perfkit.measuring.workloads.workload import map_tensors

    def build(spec, *, device, dtype):
        with unset_fake_temporarily():
            work = catalog.build(spec, device="meta", dtype=dtype)
        tied = _shared_parameters(work.model)
        with fake_mode:
            work.model.to_empty(device=device)
        _retie(work.model, tied)
        draw = work._batch

        def batch(n: int, generator):
            with unset_fake_temporarily():
                try:  # nothing allocated; a closure's tensors made on the meta device work here
                    with torch.device("meta"):
                        inputs, targets = draw(n, generator)
                except RuntimeError:  # a closure's tensors on the CPU (perfkit's tasks): drawn there
                    inputs, targets = draw(n, generator)
            with fake_mode:
                fake = lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)  # noqa: E731
                return map_tensors(inputs, fake), map_tensors(targets, fake)

        return dataclasses.replace(work, _batch=batch)

    return build


def _shared_parameters(model: torch.nn.Module) -> list[list[tuple[str, str]]]:
    """Each parameter held by several modules (tied embeddings: the token embedding and the lm
    head), as ``[(module name, attribute), ...]``, the first one the owner."""
    where: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for attr, param in module._parameters.items():
            if param is not None:
                where.setdefault(id(param), []).append((module_name, attr))
    return [list(dict.fromkeys(places)) for places in where.values() if len(set(places)) > 1]


def _retie(model: torch.nn.Module, tied: list[list[tuple[str, str]]]) -> None:
    """Share again what ``to_empty`` split: it makes a new tensor per module, so a tied weight
    became two, and the fake step counted gemma3's or a tied llama's embedding twice (131,072 B
    of parameters, twice as much optimizer state, at vocab 512 × hidden 64 in fp32)."""
    for (owner, attr), *others in tied:
        shared = getattr(model.get_submodule(owner), attr)
        for module_name, other_attr in others:
            setattr(model.get_submodule(module_name), other_attr, shared)
