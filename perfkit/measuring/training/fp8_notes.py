"""Why an fp8 training row is as fast (or slow) as it is: what torchao's float8 training needs to pay.

On the H200 the built-in transformer (d_model 1024) trained in fp8 at 0.1059 s a step against
bf16's 0.0333 (batch 128; 5.5x slower at batch 32) with nothing said (issue 43). Two facts of
torchao's own explain it, and an fp8 row now carries them (``fp8_reason``):

- **Eager**: torchao's float8 training is meant to run under ``torch.compile``, which fuses its
  dynamic scaling (the amax of every input, weight and gradient, the casts to e4m3/e5m2) into
  few kernels; eager, each is a kernel of its own ("With torch.compile on, we demonstrate e2e
  pretraining throughput speedups": docs.pytorch.org/ao, workflows/training). The H200 measured
  it: fp8 + compile 0.0379 s against fp8 eager 0.1059.
- **Small GEMMs**: scaling costs more than the fp8 matmul saves below torchao's thresholds for its
  default (tensorwise) recipe, measured on H100: a Linear is worth converting only when
  ``out_features > 4096 or in_features > 1024`` (``torchao.float8.float8_linear_utils.
  _auto_filter_for_tensorwise``: ``K, N = weight.shape; if K <= 4096 and N <= 1024: skip``, whose
  comment cites the float8 README's tensorwise benchmarks). perfkit converts every Linear (no
  filter), so the row counts the ones below.

The row's MFU divides by the device's dense fp8 peak (``mfu_convention`` says so): an upper bound
of what fp8 could do, though only the converted Linears' matmuls run in fp8.
"""

from __future__ import annotations

from torch import nn

__all__ = ["TENSORWISE_WORTH", "worth_converting", "fp8_columns"]

#: torchao's tensorwise auto-filter (H100 benchmarks): a Linear pays in fp8 when its weight's
#: out_features exceed the first or its in_features the second.
TENSORWISE_WORTH = (4096, 1024)


def worth_converting(out_features: int, in_features: int) -> bool:
    """Whether torchao's tensorwise float8 is expected to pay for a Linear of this weight shape."""
    return out_features > TENSORWISE_WORTH[0] or in_features > TENSORWISE_WORTH[1]


def _linear_shapes(cfg) -> list[tuple[int, int]]:
    """(out_features, in_features) of every Linear of ``cfg``'s model, built on the meta device."""
    from perfkit.measuring.training.config import workload_spec
    from perfkit.measuring.workloads import catalog

    model = catalog.meta(workload_spec(cfg)).model
    return [(m.out_features, m.in_features) for m in model.modules() if isinstance(m, nn.Linear)]


def fp8_columns(cfg) -> dict:
    """An fp8 row's ``fp8_reason`` (eager, and the Linears below torchao's threshold), the counts
    ``fp8_linears`` and ``fp8_linears_below_threshold``; no columns for another precision."""
    if cfg.precision != "fp8":
        return {}
    try:
        shapes = _linear_shapes(cfg)
    except Exception as error:  # noqa: BLE001 - a model the meta device cannot build keeps its row
        return {"fp8_reason": f"the model's Linear shapes could not be read on the meta device: {error}",
                "fp8_linears": None, "fp8_linears_below_threshold": None}
    small = [s for s in shapes if not worth_converting(*s)]
    parts = []
    if not cfg.compile:
        parts.append("fp8 runs eager: torchao's float8 training is meant to run under torch.compile, which fuses "
                     "its per-tensor scaling and casts (eager, each is a kernel of its own; set compile=True)")
    if small:
        shown = ", ".join(f"{o}x{i}" for o, i in sorted(set(small)))
        parts.append(f"{len(small)} of {len(shapes)} Linears (out x in: {shown}) are below torchao's tensorwise "
                     f"threshold (out_features > {TENSORWISE_WORTH[0]} or in_features > {TENSORWISE_WORTH[1]}, "
                     "H100 benchmarks), where the scaling costs more than the fp8 matmul saves")
    return {"fp8_reason": "; ".join(parts) or None, "fp8_linears": len(shapes),
            "fp8_linears_below_threshold": len(small)}
