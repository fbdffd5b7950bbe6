"""Users' own models: the workload contract of an entry point ``package.module:function``, and
what every user family (entry points, ``hf:``, ``torchvision:``) shares.

An entry point is called with ``model_size``'s keys as keyword arguments plus ``seed`` (and
``seq_len`` when its signature names it) and returns a mapping, or a :class:`UserModel`, with:

- ``model``: an ``nn.Module``;
- ``make_batch(batch_size, seed) -> (inputs, targets)``: inputs a tensor (``model(x)``), a tuple
  (``model(*x)``) or a dict (``model(**x)``), drawn on the CPU from ``seed`` alone;
- optionally ``loss_fn(output, targets)`` (absent: the output is the loss, or has ``.loss``),
  ``blocks`` (the repeated submodules, as modules or qualified names: FSDP2 shards per block,
  activation checkpointing wraps each, pipeline stages split at them), ``tokens_per_sample``,
  ``flop_per_sample`` (analytic FLOP of one training step per sample, for MFU), ``tp_plan``
  (``{"qualified.name": "colwise" | "rowwise" | ParallelStyle}``, torch's ``parallelize_module``),
  and ``stem``/``head`` (the submodules before and after the blocks): a model whose forward is
  ``head(blocks(stem(x)))``, each a module applied to the previous output of one tensor, names
  them, and pipeline parallelism splits it at its blocks (:class:`SequentialStage`; it needs a
  tensor input and ``loss_fn``).

What perfkit cannot know about a user's model (analytic FLOP, an activation model) is NaN with
the reason, never guessed; counted FLOP, measured memory and traces need nothing from the user.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from perfkit.core import checks
from perfkit.core.entry_points import load_entry_point
from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads.workload import Workload, constructing_on

__all__ = ["UserModel", "UserModelSpec", "SequentialStage", "load_entry_point", "build_entry", "find_blocks",
           "block_names_of", "seed_generator_batch", "non_embedding_params", "image_task"]


@dataclass(kw_only=True, frozen=True)
class UserModel:
    """What an entry point returns (a mapping with these keys works too)."""

    model: nn.Module
    """The model, on the CPU in fp32; perfkit moves it to the device and precision."""
    make_batch: Callable[[int, int], tuple]
    """``make_batch(batch_size, seed) -> (inputs, targets)``, on the CPU."""
    loss_fn: Callable | None = None
    """``loss_fn(output, targets)``; None: the output is the loss or has ``.loss``."""
    blocks: Sequence[nn.Module | str] | None = None
    """The repeated submodules (modules of ``model`` or their qualified names)."""
    tokens_per_sample: int | None = None
    """Tokens per sample, for tokens/s."""
    flop_per_sample: float | None = None
    """Analytic FLOP of one training step (forward + backward) per sample, for MFU."""
    tp_plan: Mapping[str, object] | None = None
    """``{"qualified.name": "colwise" | "rowwise" | ParallelStyle}``."""
    stem: Sequence[nn.Module | str] | None = None
    """What the forward runs before the blocks, in order (modules or names): with ``head``, the
    model is ``head(blocks(stem(x)))`` and pipeline stages split it at its blocks."""
    head: Sequence[nn.Module | str] | None = None
    """What the forward runs after the blocks, in order."""
    split_batch: Callable[[tuple, int, int], tuple] | None = None
    """``split_batch((inputs, targets), lo, hi) -> (inputs, targets)``: samples ``[lo, hi)`` of a
    global batch, for data-parallel ranks; None: rows ``[lo, hi)`` of every tensor (a batch whose
    tensors all have the samples on dim 0)."""


class SequentialStage(nn.Module):
    """Blocks ``[lo, hi)`` of a model whose forward is ``head(blocks(stem(x)))`` (an entry
    point's ``stem``/``blocks``/``head``), as a pipeline stage: the stem before them on the first
    stage, the head after them on the last, each module applied to the previous output. A
    workload's ``stage`` is this class with the three name lists bound (:func:`build_entry`)."""

    def __init__(self, model: nn.Module, lo: int, hi: int, *, first: bool, last: bool, autocast=None,
                 stem: Sequence[str], blocks: Sequence[str], head: Sequence[str]):
        super().__init__()
        part = lambda names: nn.ModuleList(model.get_submodule(n) for n in names)  # noqa: E731
        self.stem = part(stem if first else ())
        self.blocks = part(blocks[lo:hi])
        self.head = part(head if last else ())
        self.autocast = autocast

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            for module in (*self.stem, *self.blocks, *self.head):
                x = module(x)
        return x


@dataclass(kw_only=True, frozen=True)
class UserModelSpec:
    """A user's model by name, with the sizes and seed it is built with: what a configuration
    trains when ``model`` is not one of perfkit's synthetic workloads."""

    name: str
    """The model as the configuration names it: ``pkg.mod:fn``, ``hf:llama``, ``torchvision:resnet18``."""
    family: str
    """``entry``, ``hf`` or ``torchvision``."""
    target: str
    """The part after the family's prefix: ``pkg.mod:fn``, ``llama``, ``resnet18``."""
    size: tuple[tuple[str, object], ...] = ()
    """``model_size``'s items, sorted (hashable, so a check can be cached)."""
    seed: int = 0
    seq_len: int | None = None
    """Tokens per sample for a text model (its batches' length)."""
    model_path: str | None = None
    """A folder put first on ``sys.path`` before an entry point is imported."""

    @property
    def sizes(self) -> dict:
        return dict(self.size)


def _call_entry(spec: UserModelSpec) -> UserModel:
    fn = load_entry_point(spec.target, spec.model_path)
    kwargs = {**spec.sizes, "seed": spec.seed}
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None  # no signature to check against (a builtin): let the call say
    if signature is not None:
        if spec.seq_len is not None and "seq_len" in signature.parameters and "seq_len" not in kwargs:
            kwargs["seq_len"] = spec.seq_len
        try:
            signature.bind(**kwargs)
        except TypeError as err:
            raise BadInputError(f"entry point {spec.target!r} does not take {sorted(kwargs)}: {err}") from None
    result = fn(**kwargs)
    return _as_user_model(spec.target, result)


def _as_user_model(target: str, result) -> UserModel:
    names = {f.name for f in fields(UserModel)}
    if isinstance(result, UserModel):
        found = result
    elif isinstance(result, Mapping):
        if missing := [k for k in ("model", "make_batch") if k not in result]:
            raise BadInputError(f"entry point {target!r} returned a mapping without {missing}: it "
                                "needs 'model' (an nn.Module) and 'make_batch(batch_size, seed)'")
        if unknown := sorted(set(result) - names):
            raise BadInputError(f"entry point {target!r} returned unknown keys {unknown}; "
                                f"valid: {sorted(names)}")
        found = UserModel(**result)
    else:
        raise BadInputError(f"entry point {target!r} returned {type(result).__name__}: it must return "
                            "a mapping (or perfkit's UserModel) with 'model' and 'make_batch'")
    if not isinstance(found.model, nn.Module):
        raise BadInputError(f"entry point {target!r}: 'model' is a {type(found.model).__name__}, "
                            "not an nn.Module")
    if not callable(found.make_batch):
        raise BadInputError(f"entry point {target!r}: 'make_batch' is not callable")
    return found


def block_names_of(model: nn.Module, blocks: Sequence[nn.Module | str] | None, what: str,
                   kind: str = "blocks") -> tuple[str, ...]:
    """Qualified names of ``blocks`` (modules of ``model`` or names: the blocks, a stem, a head),
    checked to exist."""
    if not blocks:
        return ()
    by_id = {id(m): name for name, m in model.named_modules()}
    names = []
    for block in blocks:
        if isinstance(block, str):
            try:
                model.get_submodule(block)
            except AttributeError:
                raise BadInputError(f"{what}: {kind} {block!r} is not a submodule of the model") from None
            names.append(block)
        elif isinstance(block, nn.Module) and id(block) in by_id and by_id[id(block)]:
            names.append(by_id[id(block)])
        else:
            raise BadInputError(f"{what}: every one of {kind} must be a submodule of the model (or its name)")
    return tuple(names)


def find_blocks(model: nn.Module) -> tuple[str, ...]:
    """The repeated blocks of a library's model: among the children of its ``ModuleList`` and
    ``Sequential`` containers that hold submodules of their own, the class whose instances hold
    the most parameters (a decoder's layers, a ResNet's residual blocks), outermost first. A
    decoder whose layers are of several classes (jamba's Mamba and attention layers, a hybrid's
    linear and full attention) is one container holding them all: its children are the blocks."""
    candidates: dict[type, list[str]] = {}
    containers: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            for child_name, child in module.named_children():
                if any(True for _ in child.children()):
                    full = f"{name}.{child_name}" if name else child_name
                    candidates.setdefault(type(child), []).append(full)
                    containers.setdefault(name, []).append(full)
    if not candidates:
        return ()
    weight = lambda names: sum(p.numel() for n in names for p in model.get_submodule(n).parameters())  # noqa: E731
    best = max(candidates.values(), key=lambda names: (weight(names), len(names)))
    # the one container holding the best class's blocks and blocks of other classes beside them
    mixed = [children for children in containers.values()
             if set(best) < set(children) and len({type(model.get_submodule(c)) for c in children}) > 1]
    if mixed:
        best = min(mixed, key=len)
    return tuple(best) if len(best) > 1 else ()


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside the ``nn.Embedding`` tables (token, position, segment embeddings)."""
    # Each table once: an encoder-decoder's token embedding is one weight under several modules (t5's
    # shared, encoder.embed_tokens and decoder.embed_tokens), as model.parameters() lists it once.
    embedding = {id(p): p.numel() for m in model.modules() if isinstance(m, nn.Embedding)
                 for p in m.parameters(recurse=False)}
    return sum(p.numel() for p in model.parameters()) - sum(embedding.values())


def image_task(channels: int, image_size: int, n_classes: int, seed: int) -> Callable[[int, int], tuple]:
    """perfkit's image classification task for a library's classifier (as the convnet's in
    :mod:`perfkit.measuring.workloads.synthetic`): a class prototype, fixed by the model's seed,
    plus noise; ``batch(n, seed) -> (images, labels)``."""
    shape = (n_classes, channels, image_size, image_size)
    prototypes = torch.randn(shape, generator=torch.Generator().manual_seed(1_000_003 + seed))

    def batch(n: int, batch_seed: int):
        gen = torch.Generator().manual_seed(batch_seed)
        labels = torch.randint(0, n_classes, (n,), generator=gen)
        return prototypes[labels] + 0.5 * torch.randn((n, *shape[1:]), generator=gen), labels

    return batch


def seed_generator_batch(make_batch: Callable[[int, int], tuple]) -> Callable[[int, torch.Generator], tuple]:
    """A ``make_batch(batch_size, seed)`` as a workload's ``_batch(batch_size, generator)``: the
    generator's seed is what the user's function gets."""
    def batch(n: int, generator: torch.Generator):
        result = make_batch(n, int(generator.initial_seed()))
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise BadInputError(f"make_batch must return (inputs, targets), got {type(result).__name__}")
        return tuple(result)
    return batch


def build_entry(spec: UserModelSpec, *, device="cpu", dtype=torch.float32) -> Workload:
    """The workload of an entry point: its model on ``device`` in ``dtype``."""
    checks.one_of("family", spec.family, ("entry",))
    with torch.random.fork_rng(devices=[]), constructing_on(device):
        torch.manual_seed(spec.seed)
        user = _call_entry(spec)
    model = user.model
    n_params = sum(p.numel() for p in model.parameters())
    flop = math.nan if user.flop_per_sample is None else float(user.flop_per_sample)
    what = f"entry point {spec.target!r}"
    blocks = block_names_of(model, user.blocks, what)
    stem, head = block_names_of(model, user.stem, what, "stem"), block_names_of(model, user.head, what, "head")
    stage = None
    if blocks and (stem or head):  # declared sequential: pp splits it at its blocks
        stage = functools.partial(SequentialStage, stem=stem, blocks=blocks, head=head)
    return Workload(
        spec=spec, model=model.to(device=device, dtype=dtype), loss_fn=user.loss_fn,
        n_params=n_params, n_params_non_embedding=non_embedding_params(model),
        flop_per_sample=flop,
        flop_reason=None if user.flop_per_sample is not None else
        f"the entry point {spec.target!r} gives no flop_per_sample",
        flop_convention="the entry point's flop_per_sample" if user.flop_per_sample is not None else None,
        tokens_per_sample=user.tokens_per_sample,
        block_names=blocks, stem_names=stem, head_names=head, stage=stage,
        tp_plan=dict(user.tp_plan) if user.tp_plan else None, family="entry", split=user.split_batch,
        _batch=seed_generator_batch(user.make_batch))
