"""The configurations of perfkit's synthetic workloads (``mlp``, ``transformer``, ``convnet``):
frozen, validated, named; what :mod:`~perfkit.measuring.workloads.models` builds its modules from
and :mod:`~perfkit.measuring.workloads.synthetic` its tasks and analytic FLOP from."""

from __future__ import annotations

from dataclasses import dataclass

from perfkit.core import checks
from perfkit.core.errors import BadInputError

__all__ = ["MLPConfig", "TransformerConfig", "ConvNetConfig", "WorkloadSpec", "make_spec", "NAMES", "positive_ints"]


def positive_ints(**values: int) -> None:
    """Each of ``values`` an ``int`` >= 1 (:func:`perfkit.core.checks.integer_at_least`)."""
    for name, value in values.items():
        checks.integer_at_least(name, value, 1)


@dataclass(kw_only=True, frozen=True)
class MLPConfig:
    """A stack of Linear+ReLU layers regressing onto a fixed random linear teacher."""

    in_features: int = 64
    """Width of the input."""
    hidden_features: int = 128
    """Width of every hidden layer."""
    depth: int = 3
    """Number of Linear layers (depth - 1 hidden activations); 1 is a single linear map."""
    out_features: int = 16
    """Width of the output (the teacher's output)."""
    bias: bool = False
    """Linear biases. Not counted in FLOP (elementwise), nor by FlopCounterMode."""
    seed: int = 0
    """Seeds the weight initialisation and the teacher."""

    name = "mlp"

    def __post_init__(self):
        positive_ints(in_features=self.in_features, hidden_features=self.hidden_features,
                  depth=self.depth, out_features=self.out_features)


@dataclass(kw_only=True, frozen=True)
class TransformerConfig:
    """A GPT-style pre-LN decoder with an untied lm head."""

    n_layers: int = 2
    """Number of transformer blocks (L)."""
    d_model: int = 64
    """Residual width."""
    n_heads: int = 4
    """Attention heads (H); must divide d_model."""
    seq_len: int = 32
    """Tokens per sample (T)."""
    vocab_size: int = 64
    """Vocabulary size (V)."""
    mlp_ratio: int = 4
    """MLP hidden width = mlp_ratio · d_model."""
    bias: bool = False
    """Biases in the Linear layers and LayerNorms (nanoGPT's ``bias`` switch)."""
    seed: int = 0
    """Seeds the weight initialisation."""

    name = "transformer"

    def __post_init__(self):
        positive_ints(n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                  seq_len=self.seq_len, vocab_size=self.vocab_size, mlp_ratio=self.mlp_ratio)
        if self.d_model % self.n_heads:
            raise BadInputError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")
        if self.vocab_size < 2:
            raise BadInputError("vocab_size must be at least 2")

    @property
    def head_dim(self) -> int:
        """Q in the PaLM formula."""
        return self.d_model // self.n_heads


@dataclass(kw_only=True, frozen=True)
class ConvNetConfig:
    """A ResNet-style net: 3×3 stem, stages of BasicBlocks, global average pool, linear head."""

    in_channels: int = 3
    """Channels of the input images."""
    image_size: int = 16
    """Height = width of the input images."""
    widths: tuple[int, ...] = (16, 32)
    """Channels of each stage; every stage after the first halves the resolution (stride 2)."""
    blocks_per_stage: int = 1
    """BasicBlocks per stage."""
    n_classes: int = 10
    """Classes of the synthetic classification task."""
    seed: int = 0
    """Seeds the weight initialisation and the class prototypes."""

    name = "convnet"

    def __post_init__(self):
        object.__setattr__(self, "widths", tuple(self.widths))
        positive_ints(in_channels=self.in_channels, image_size=self.image_size,
                  blocks_per_stage=self.blocks_per_stage, n_classes=self.n_classes)
        if not self.widths:
            raise BadInputError("widths needs at least one stage")
        positive_ints(**{f"widths[{i}]": w for i, w in enumerate(self.widths)})
        if self.n_classes < 2:
            raise BadInputError("n_classes must be at least 2")


WorkloadSpec = MLPConfig | TransformerConfig | ConvNetConfig
_CONFIGS = {c.name: c for c in (MLPConfig, TransformerConfig, ConvNetConfig)}
#: Workload names, as :func:`make_spec` takes them.
NAMES = tuple(_CONFIGS)


def make_spec(name: str, **params) -> WorkloadSpec:
    """The config of workload ``name`` from plain parameters (as a notebook's parameters cell has)."""
    if name not in _CONFIGS:
        raise BadInputError(f"unknown workload {name!r}; valid names: {', '.join(_CONFIGS)}")
    try:
        return _CONFIGS[name](**params)
    except TypeError as err:  # an unknown keyword
        raise BadInputError(f"workload {name!r}: {err}") from None
