"""A built workload, whoever's model it is: the model, its batches, its loss, and what perfkit
knows about it (parameters, analytic FLOP or why not, its repeated blocks, a tensor-parallel plan).

Every measurement that trains or runs a model takes a :class:`Workload`, built by
:func:`perfkit.measuring.workloads.catalog.build` from a model name: perfkit's own (``mlp``,
``transformer``, ``convnet``), a user's entry point, ``hf:<model_type>`` or
``torchvision:<name>``. A batch's inputs are a tensor (``model(x)``), a tuple (``model(*x)``) or
a dict (``model(**x)``); :func:`call_model`, :func:`map_tensors` and :func:`slice_batch` treat all
three alike, so the training step, the data-parallel split and the device copy never ask which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from perfkit.core import checks
from perfkit.core.errors import BadInputError

__all__ = ["Workload", "call_model", "map_tensors", "slice_batch", "output_loss",
           "checkpoint_blocks", "constructing_on", "FAMILIES"]

#: The ``model_family`` column: where a workload's model comes from.
FAMILIES = ("builtin", "entry", "hf", "torchvision")


@dataclass(kw_only=True, frozen=True)
class Workload:
    """A built workload: model, batch generator, loss and what is known of its size and FLOP."""

    spec: object
    """What it was built from (a synthetic config or a :class:`~perfkit.measuring.workloads.user.UserModelSpec`)."""
    model: nn.Module = field(repr=False)
    """The model, on the device and dtype given to the builder."""
    loss_fn: Callable | None
    """``loss_fn(output, targets)`` gives the scalar training loss; None: the output is the loss
    or has ``.loss`` (:func:`output_loss`)."""
    n_params: int
    """All parameters (= sum of ``p.numel()``)."""
    n_params_non_embedding: int
    """Parameters minus the input embedding tables (= n_params for models without one)."""
    flop_per_sample: float
    """Analytic FLOP of one training step (forward + backward) per sample; NaN when unknown
    (:attr:`flop_reason` says why)."""
    flop_per_sample_first_input_grad: float = 0
    """The part of flop_per_sample that is the first layer's input gradient, which autograd
    skips when the inputs do not require grad."""
    flop_reason: str | None = None
    """Why :attr:`flop_per_sample` is NaN (None when it is known)."""
    flop_convention: str | None = None
    """How :attr:`flop_per_sample` was counted, for the row (None: perfkit's synthetic rules)."""
    tokens_per_sample: int | None = None
    """Tokens per sample for sequence models, None otherwise."""
    block_names: tuple[str, ...] = ()
    """Qualified names of the repeated submodules (``blocks.0``, ``model.layers.3``): FSDP2 shards
    each as a unit, activation checkpointing recomputes each, pipeline stages split at them."""
    tp_plan: Mapping[str, object] | None = None
    """Tensor-parallel plan: qualified module name -> ``"colwise"``/``"rowwise"`` or a torch
    ``ParallelStyle``; None: the model has none."""
    stem_names: tuple[str, ...] = ()
    head_names: tuple[str, ...] = ()
    """Pipeline stages: the submodules the first stage runs before its blocks (embeddings) and
    the last after them (final norm, head); both empty when the model cannot be split into
    stages (its ``stage`` is None)."""
    stage: Callable | None = field(default=None, repr=False)
    """``stage(model, lo, hi, first=, last=, autocast=) -> nn.Module``: blocks ``[lo, hi)`` of
    ``model`` as a pipeline stage (the stem on the first, the head on the last); None: no pp."""
    family: str = "builtin"
    """One of :data:`FAMILIES`."""
    config_note: str | None = None
    """What perfkit changed in the model's config to build it (a special token id past a shrunk
    vocabulary, cleared), for the row's ``model_config_note``; None: nothing."""
    split: Callable[[tuple, int, int], tuple] | None = field(default=None, repr=False)
    """``split((inputs, targets), lo, hi) -> (inputs, targets)``: samples ``[lo, hi)`` of a global
    batch (an entry point's ``split_batch``: an ``nn.EmbeddingBag``'s flat indices and offsets);
    None: rows ``[lo, hi)`` of every tensor (:func:`slice_batch`)."""
    _batch: Callable[[int, torch.Generator], tuple] = field(repr=False)

    def __post_init__(self):
        checks.one_of("family", self.family, FAMILIES)

    @property
    def name(self) -> str:
        return self.spec.name

    def blocks(self, model: nn.Module | None = None) -> list[nn.Module]:
        """The block modules of ``model`` (default: this workload's), by :attr:`block_names`."""
        model = self.model if model is None else model
        return [model.get_submodule(name) for name in self.block_names]

    def make_batch(self, batch_size: int, *, seed: int | None = None,
                   generator: torch.Generator | None = None, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> tuple:
        """``(inputs, targets)`` of ``batch_size`` samples on ``device``.

        Random draws come from ``generator`` or, if None, a CPU generator seeded with ``seed``
        (default 0), and are made on the CPU, so a batch is the same on every device (a user's
        ``make_batch(batch_size, seed)`` gets the generator's seed). ``dtype`` applies to
        floating-point tensors; tokens and class labels keep theirs.
        """
        checks.integer_at_least("batch_size", batch_size, 1)
        if generator is not None and seed is not None:
            raise BadInputError("pass seed or generator, not both")
        if generator is None:
            generator = torch.Generator().manual_seed(0 if seed is None else seed)
        inputs, targets = self._batch(batch_size, generator)
        to = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)  # noqa: E731
        return map_tensors(inputs, to), map_tensors(targets, to)

    def rank_slice(self, inputs, targets, lo: int, hi: int, batch_size: int | None = None) -> tuple:
        """Samples ``[lo, hi)`` of a global batch of ``batch_size``, as copies: what one data-parallel
        rank trains on. Without ``split``, a tensor whose dim 0 is not the batch is refused (one line)."""
        if self.split is None:
            if batch_size is not None and (reason := self._unsplittable(inputs, targets, batch_size, hi - lo)):
                raise BadInputError(reason)
            return slice_batch(inputs, lo, hi), slice_batch(targets, lo, hi)
        part = self.split((inputs, targets), lo, hi)
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise BadInputError(f"split_batch must return (inputs, targets), got {type(part).__name__}")
        return map_tensors(part[0], torch.Tensor.clone), map_tensors(part[1], torch.Tensor.clone)

    def _unsplittable(self, inputs, targets, batch_size: int, size: int) -> str | None:
        for name, tensor in _named_tensors({"inputs": inputs, "targets": targets}):
            if tensor.dim() and tensor.shape[0] != batch_size:
                return (f"{self.name}: {name} has {tensor.shape[0]} rows on dim 0, not batch_size {batch_size}, so "
                        f"it cannot be split by rows over data-parallel ranks ({size} samples each); give the entry "
                        "point a split_batch((inputs, targets), lo, hi) that returns samples [lo, hi)")
        return None

    def check_split(self, batch_size: int, ranks: int) -> None:
        """Refuse (one line, before any rank starts) a batch that does not split over ``ranks``
        data-parallel ranks: without ``split``, a tensor whose dim 0 is not the batch (an
        ``EmbeddingBag``'s flat indices); with it, a ``split_batch`` that raises. A batch this
        workload cannot draw (built on the meta device, its ``make_batch`` uses tensors made then)
        is left to the ranks, which check their own (:meth:`rank_slice`)."""
        try:
            inputs, targets = self.make_batch(batch_size, seed=0)
        except BadInputError:
            raise
        except Exception:  # noqa: BLE001 - cannot tell here; each rank checks its batch
            return
        size = batch_size // ranks
        for rank in range(ranks):
            try:
                self.rank_slice(inputs, targets, rank * size, (rank + 1) * size, batch_size)
            except BadInputError:
                raise
            except Exception as error:  # noqa: BLE001 - the user's function: its error in one line
                raise BadInputError(f"{self.name}: split_batch of samples [{rank * size}, {(rank + 1) * size}) "
                                    f"of {batch_size} failed: {type(error).__name__}: {error}") from None

    def loss(self, output, targets) -> torch.Tensor:
        """The scalar training loss of ``output``, in fp32 whatever the compute dtype."""
        if self.loss_fn is None:
            return output_loss(output).float()
        if isinstance(output, torch.Tensor):
            output = output.float()
        return self.loss_fn(output, targets)


def call_model(model: nn.Module, inputs):
    """``model`` on a batch's inputs: a dict as keywords, a tuple or list positionally."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def output_loss(output) -> torch.Tensor:
    """The loss a model returned: the output itself (a scalar tensor) or its ``.loss``."""
    loss = output if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise BadInputError(f"the model's output ({type(output).__name__}) is neither a scalar loss "
                            "nor has a .loss, and the workload gives no loss_fn")
    return loss


def map_tensors(tree, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``tree`` (a tensor, or a tuple, list or dict of them, nested) with ``fn`` applied to each
    tensor; anything else is kept as it is."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, Mapping):
        return {k: map_tensors(v, fn) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(v, fn) for v in tree)
    return tree


def _named_tensors(tree, prefix: str = ""):
    """``(path, tensor)`` of every tensor in ``tree`` (``inputs[0]``, ``inputs['ids']``)."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _named_tensors(v, f"{prefix}[{k!r}]" if prefix else str(k))
    elif isinstance(tree, (tuple, list)):
        for i, v in enumerate(tree):
            yield from _named_tensors(v, f"{prefix}[{i}]")


def slice_batch(tree, lo: int, hi: int):
    """Samples ``[lo, hi)`` of every tensor of ``tree`` (dim 0), as copies: a rank holds its slice
    only, not a view keeping the whole batch alive."""
    return map_tensors(tree, lambda t: t[lo:hi].clone() if t.dim() else t)


def checkpoint_blocks(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Recompute each of ``blocks``' activations in backward instead of keeping them
    (non-reentrant ``torch.utils.checkpoint``, which composes with DDP, FSDP2 and torch.compile;
    keyword arguments pass through, as a decoder layer's attention mask and position embeddings).
    perfkit's own models switch it themselves (``model.activation_checkpointing``); another
    model's blocks get their ``forward`` wrapped in place, so parameter names do not change."""
    from torch.utils.checkpoint import checkpoint

    if hasattr(model, "activation_checkpointing"):
        model.activation_checkpointing = True
        return
    for block in blocks:
        forward = block.forward

        def checkpointed(*args, _forward=forward, _block=block, **kwargs):
            if not _block.training:
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed


def constructing_on(device) -> contextlib.AbstractContextManager:
    """Where a model is constructed: on the meta device directly (no memory, no init: what a
    check or a prediction needs), elsewhere on the CPU (then moved, so weights do not depend on
    the device)."""
    return torch.device("meta") if str(device) == "meta" else contextlib.nullcontext()
