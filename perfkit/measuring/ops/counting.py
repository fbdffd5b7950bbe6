"""Dispatch-level counting: FLOPs, minimum bytes and time of every aten op that actually ran.

A :class:`OpCounter` is a ``TorchDispatchMode``: it sees each aten op after autograd and
composite-implicit decompositions (``linear`` arrives as ``t`` + ``addmm``, ``layer_norm`` as
``native_layer_norm``), forward and backward, and never the ops a kernel calls internally, so
nothing is counted twice. It does not decompose further: a fused op (CPU SDPA arrives as
``_scaled_dot_product_flash_attention_for_cpu``) is one row, as it is one kernel.

Conventions: FLOP and minimum bytes per op are those of :mod:`perfkit.measuring.ops.op_formulas`
(its docstring states them, since every number depends on them). Time:

- ``time_s`` is host wall time around the op, with the device synchronized before and after on
  an accelerator, so it is device time plus launch overhead; use it for coverage shares. On CPU
  it is the op's time plus dispatch overhead (microseconds): fine for ops that are not tiny;
  :func:`profile_op_times` gives profiler times to join with
  :func:`perfkit.analyse.roofline.join_counts_with_times`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfkit.core.errors import BadInputError
from perfkit.measuring.ops.op_formulas import distinct_bytes, dtype_name, op_rule, tensors_in

if TYPE_CHECKING:  # pandas only where a frame is built: a rank counting its step never loads it
    import pandas as pd

__all__ = [
    "FAMILIES",
    "COLUMNS",
    "OpCounter",
    "count_ops",
    "UncountedOp",
    "CoverageReport",
    "coverage",
    "profile_op_times",
]

FAMILIES = ("matmul", "conv", "attention", "norm", "softmax", "reduction", "elementwise",
            "embedding", "loss", "other")
COLUMNS = ("op", "family", "flop", "bytes_read", "bytes_written", "input_shapes", "dtype",
           "time_s", "counted")


# ---- the mode -------------------------------------------------------------------------------

def _default_synchronize(devices: set[str]) -> None:
    if "cuda" in devices:  # CUDA and ROCm/HIP alike
        torch.cuda.synchronize()
    elif devices - {"cpu", "meta"} and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


class OpCounter(TorchDispatchMode):
    """Records one row per aten op call (see :data:`COLUMNS`); use as a context manager.

    ``clock`` (seconds) and ``synchronize`` (called with the set of device types an op touched)
    are injectable so tests need not rely on wall-clock time.
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Callable[[set[str]], None] = _default_synchronize):
        super().__init__()
        self._clock = clock
        self._synchronize = synchronize
        self.rows: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {t.device.type for t in tensors_in((args, kwargs))}
        self._synchronize(devices)
        start = self._clock()
        out = func(*args, **kwargs)
        self._synchronize(devices | {t.device.type for t in tensors_in(out)})
        self.rows.append(self._describe(func, args, kwargs, out, self._clock() - start))
        return out

    @staticmethod
    def _describe(func, args, kwargs, out, time_s: float) -> dict:
        inputs = [v for k, v in kwargs.items() if k != "out"]
        if out is None and func._overloadpacket.__name__.endswith("_") and args:
            out = args[0]  # in-place list ops (_foreach_add_) return nothing; they write self
        try:
            rule = op_rule(func, args, kwargs, out)
        except (ValueError, TypeError, IndexError, AssertionError, AttributeError, RuntimeError):
            rule = None  # a rule that cannot read these arguments: reported as uncounted
        if rule is None:
            family, flop, read, written, counted = "other", 0, math.nan, math.nan, False
        else:
            family, flop, override = rule
            read, written = override or (distinct_bytes(tensors_in((args, inputs))), distinct_bytes(tensors_in(out)))
            counted = True
        return {
            "op": str(func), "family": family, "flop": int(flop), "bytes_read": float(read),
            "bytes_written": float(written),
            "input_shapes": tuple(tuple(t.shape) for t in tensors_in((args, inputs))),
            "dtype": dtype_name(args, kwargs, out), "time_s": float(time_s), "counted": counted,
        }

    def frame(self) -> pd.DataFrame:
        """The rows recorded so far, in call order."""
        import pandas as pd

        df = pd.DataFrame(self.rows, columns=list(COLUMNS))
        return df.astype({"flop": "int64", "bytes_read": "float64", "bytes_written": "float64",
                          "time_s": "float64", "counted": "bool"})


def count_ops(fn: Callable, *args, **kwargs) -> pd.DataFrame:
    """Run ``fn(*args, **kwargs)`` once under an :class:`OpCounter`; one row per aten op call."""
    if not callable(fn):
        raise BadInputError(f"count_ops needs a callable first argument, got {type(fn).__name__}")
    with OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.frame()


# ---- coverage -------------------------------------------------------------------------------

@dataclass(kw_only=True, frozen=True)
class UncountedOp:
    """An op the counter has no FLOP/bytes rule for."""

    op: str
    """The aten overload, e.g. ``aten.cummax.default``."""
    calls: int
    """How many times it was called."""
    time_s: float
    """Its summed ``time_s``."""
    time_share: float
    """Its share of the total time of all op calls (NaN when that total is 0)."""


@dataclass(kw_only=True, frozen=True)
class CoverageReport:
    """How much of what ran the counter could count."""

    uncounted: tuple[UncountedOp, ...]
    """Ops without a rule, most time first."""
    counted_time_share: float
    """Share of total op time spent in counted ops (NaN when the total time is 0)."""
    counted_calls: int
    """Calls of counted ops."""
    total_calls: int
    """All op calls."""
    total_time_s: float
    """Summed ``time_s`` of all op calls."""

    def frame(self) -> pd.DataFrame:
        """The uncounted ops as a DataFrame (op, calls, time_s, time_share)."""
        import pandas as pd

        return pd.DataFrame([vars(u) for u in self.uncounted],
                            columns=["op", "calls", "time_s", "time_share"])


def coverage(ops: pd.DataFrame | Iterable[Mapping]) -> CoverageReport:
    """Summarise which ops of a :func:`count_ops` frame (or an :class:`OpCounter`'s ``rows``, as a
    rank has them) were not counted, and their time share."""
    columns = getattr(ops, "columns", None)
    records = ops.to_dict("records") if columns is not None else list(ops)
    present = set(columns) if columns is not None else (set(records[0]) if records else set(COLUMNS))
    missing = {"op", "time_s", "counted"} - present
    if missing:
        raise BadInputError(f"coverage needs a count_ops frame; missing columns {sorted(missing)}")
    total = counted_time = 0.0
    counted_calls = 0
    groups: dict[str, list] = {}  # uncounted op -> [calls, time_s], in first-call order
    for r in records:
        time_s = float(r["time_s"])
        total += time_s
        if bool(r["counted"]):
            counted_calls, counted_time = counted_calls + 1, counted_time + time_s
        else:
            group = groups.setdefault(str(r["op"]), [0, 0.0])
            group[0], group[1] = group[0] + 1, group[1] + time_s
    share = (lambda t: t / total) if total > 0 else (lambda t: math.nan)
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))  # most time, then most calls
    return CoverageReport(
        uncounted=tuple(UncountedOp(op=op, calls=calls, time_s=time_s, time_share=share(time_s))
                        for op, (calls, time_s) in ranked),
        counted_time_share=share(counted_time), counted_calls=counted_calls, total_calls=len(records),
        total_time_s=total)


from perfkit.measuring.ops.profiling import profile_op_times  # noqa: E402,F401 - re-exported: counts and times go together
