"""One training step (forward + backward) on the roofline: its ops counted, profiled and timed.

:func:`profile_step` runs a :class:`perfkit.measuring.workloads.synthetic.Workload` step three ways, all on the same
batch: once under :func:`perfkit.measuring.ops.counting.count_ops` (FLOP and minimum bytes of every aten op
that ran), ``profile_steps`` times under the profiler (per-call op times, joined to the counts by
:func:`perfkit.analyse.roofline.join_counts_with_times`), and under :func:`perfkit.measure` (the step
time, with its raw samples). The profiler times are inclusive and carry the profiler's own
overhead, so on tiny ops the time shares of all ops can add up to more than the step.

:func:`step_ceilings` builds the ceilings a step is placed against (spec or theoretical rows,
plus the measured ones for the step's precision only, to keep a quick run quick), and
:func:`placement_origin` picks which origin's roofs the points are read against;
:func:`phase_columns` places one counted inference phase (prefill, decode) the same way.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from perfkit.measuring.ops.counting import count_ops, profile_op_times
from perfkit.core.errors import BadInputError
from perfkit.core.precision import math_mode
from perfkit.analyse.roofline import join_counts_with_times
from perfkit.core.timing import Measurement, measure

__all__ = [
    "PRECISIONS",
    "StepProfile",
    "torch_dtype",
    "unsupported_reason",
    "step_ceilings",
    "placement_origin",
    "profile_step",
    "point_rows",
    "phase_columns",
]

#: Precisions a step can run in: the model's parameters and inputs are cast to the dtype.
PRECISIONS = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
              "fp16": torch.float16}
#: Origins in the order the roofline prefers them: what this machine reached first.
_ORIGINS = ("measured", "spec", "theoretical")


def torch_dtype(precision: str) -> torch.dtype:
    """``"bf16"`` → ``torch.bfloat16``; BadInputError for a precision a step cannot run in."""
    if precision not in PRECISIONS:
        raise BadInputError(f"precision {precision!r} is not supported by a roofline step; "
                            f"valid: {', '.join(PRECISIONS)} (tf32/fp8 need autocast settings)")
    return PRECISIONS[precision]


def unsupported_reason(precision: str, device: str = "auto") -> str | None:
    """Why ``device`` cannot honour ``precision`` natively (for :func:`perfkit.skip`), or None."""
    from perfkit.measuring.kernels.ceilings import compute_dtypes
    from perfkit.core.devices import resolve_device

    torch_dtype(precision)
    return compute_dtypes(resolve_device(device)).get(precision)


def step_ceilings(device: str = "auto", precision: str = "fp32", *, measure: bool = True,
                  quick: bool = True) -> pd.DataFrame:
    """The ceilings table (:func:`perfkit.measuring.kernels.peaks.peaks_table` columns) for a step in ``precision``.

    The reference rows (spec sheet for a GPU, cores × clock × FLOP/cycle for a CPU), and, when
    ``measure``, the measured compute roof of ``precision`` and the measured memory roofs.
    """
    from perfkit.measuring.kernels.ceilings import measure_ceilings
    from perfkit.core.devices import detect
    from perfkit.measuring.kernels.peaks import CEILING_COLUMNS, peaks_table

    torch_dtype(precision)
    table = peaks_table(device, quick=quick, measure=False)
    if measure:
        info = detect(device)
        measured = measure_ceilings(device=info.torch_device, quick=quick, dtypes=[precision])
        table = pd.concat([table.dropna(axis=1, how="all"), measured], ignore_index=True)
        for col in CEILING_COLUMNS:
            if col not in table:
                table[col] = None
        table = table[CEILING_COLUMNS + [c for c in table.columns if c not in CEILING_COLUMNS]]
        table.attrs["device_name"] = info.name
    return table


def placement_origin(ceilings: pd.DataFrame, precision: str) -> str | None:
    """The origin whose rows hold both a compute roof for ``precision`` and a memory roof:
    measured, else spec, else theoretical; None when no origin has both (a CPU without
    measuring has no memory roof: perfkit draws no roof it cannot source)."""
    if ceilings is None or ceilings.empty:
        return None
    for origin in _ORIGINS:
        rows = ceilings[ceilings["origin"] == origin]
        has_compute = ((rows["kind"] == "compute") & (rows["dtype"] == precision)).any()
        if has_compute and (rows["kind"] == "memory").any():
            return origin
    return None


@dataclass(kw_only=True, frozen=True)
class StepProfile:
    """What :func:`profile_step` measured."""

    ops: pd.DataFrame = field(repr=False)
    """One row per aten op call of one step (:data:`perfkit.measuring.ops.counting.COLUMNS`), ``time_s``
    replaced by the profiler's mean time per call, and ``time_match`` saying how it matched."""
    step: Measurement
    """The whole step's timing: median, IQR and raw samples."""
    trace_path: str | None = None
    """The profiled steps as a gzipped Chrome trace, when asked for (``profile_step(trace_path=...)``)."""
    trace_reason: str | None = None

    @property
    def step_time_s(self) -> float:
        """Median time of one step (forward + backward), seconds."""
        return self.step.median_s


def profile_step(workload, batch_size: int, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, profile_steps: int = 3,
                 min_run_time_s: float = 0.2, seed: int = 0, trace_path=None) -> StepProfile:
    """Count, profile and time one training step (zero grads, forward, loss, backward).

    The model is already on ``device`` in ``dtype`` (:func:`perfkit.measuring.workloads.synthetic.build`); the batch
    is drawn from ``seed``. No optimizer step: the roofline is of what autograd runs. The step
    runs under :func:`perfkit.core.precision.math_mode` of its precision: fp32 matmuls *and* cuDNN
    convolutions in IEEE fp32 (cuDNN's default allows TF32, which would put an fp32 point above
    the fp32 roof), and on ``cuda:N`` with device N current, so the profiler's synchronizations
    wait on the device the step runs on. ``trace_path``: also keep the profiled steps' trace there.
    """
    if profile_steps < 1:
        raise BadInputError(f"profile_steps must be >= 1, got {profile_steps!r}")
    precision = next((name for name, d in PRECISIONS.items() if d == dtype), None)
    if precision is None:
        raise BadInputError(f"dtype {dtype} is not one a roofline step runs in; valid: "
                            f"{', '.join(str(d) for d in PRECISIONS.values())}")
    kind = str(device).split(":")[0]
    on_device = (torch.cuda.device(torch.device(device)) if kind == "cuda"
                 else contextlib.nullcontext())
    with math_mode(precision), on_device:
        return _profile_step(workload, batch_size, device=device, dtype=dtype,
                             profile_steps=profile_steps, min_run_time_s=min_run_time_s, seed=seed,
                             trace_path=trace_path)


def _profile_step(workload, batch_size: int, *, device, dtype, profile_steps, min_run_time_s,
                  seed, trace_path) -> StepProfile:
    inputs, targets = workload.make_batch(batch_size, seed=seed, device=device, dtype=dtype)
    model, loss_fn = workload.model, workload.loss_fn

    def step():
        model.zero_grad(set_to_none=True)  # every step allocates fresh grads: same ops each time
        loss_fn(model(inputs), targets).backward()

    def steps():
        for _ in range(profile_steps):
            step()

    kind = str(device).split(":")[0]
    step()  # warm-up: lazy initialisation and allocator growth stay out of every measurement
    counts = count_ops(step)
    # The join takes each op's mean time per call, so profiling several steps averages them.
    times = profile_op_times(steps, device="cuda" if kind == "cuda" else "cpu", trace_path=trace_path)
    timing = measure(step, min_run_time_s=min_run_time_s, device=device, label="train step")
    return StepProfile(ops=join_counts_with_times(counts, times), step=timing,
                       trace_path=times.attrs.get("trace_path"), trace_reason=times.attrs.get("trace_reason"))


def point_rows(points: pd.DataFrame, profile: StepProfile) -> pd.DataFrame:
    """Rows to record from :func:`perfkit.analyse.roofline.roofline_points` of ``profile``'s ops.

    Adds ``headroom`` (1 − achieved/attainable: the fraction of the roof left, negative above
    it) and, on the ``<step>`` row, the step timing's IQR, noise flag and raw samples.
    """
    from perfkit.analyse.roofline import STEP_OP

    rows = points.copy()
    rows["headroom"] = 1.0 - rows["percent_of_roof"] / 100.0
    if profile.trace_path or profile.trace_reason:
        rows["trace_path"], rows["trace_reason"] = profile.trace_path, profile.trace_reason
    timing = profile.step.as_row("time")
    timing.pop("time_s")  # the step row's time_s is already the median
    is_step = rows["op"] == STEP_OP
    for col, value in timing.items():
        rows[col] = pd.Series([value if s else None for s in is_step], index=rows.index,
                              dtype=object)
    return rows


def phase_columns(phase: str, ops: pd.DataFrame | None, time_s: float,
                   ceilings: pd.DataFrame | None, precision: str) -> tuple[dict, str | None]:
    """``<phase>_flop``, ``_bytes``, intensity, achieved and attainable rates, percent of roof
    and bound of one counted step (``ops``, an inference prefill or decode) taking ``time_s``;
    and why it is not placed, or None."""
    from perfkit.analyse.roofline import STEP_OP, roofline_points

    cols = {f"{phase}_{k}": math.nan for k in ("flop", "bytes", "intensity_flop_per_byte", "flop_per_s",
                                                "bytes_per_s", "attainable_flop_per_s", "percent_of_roof")}
    cols[f"{phase}_bound"] = None
    if ops is None:
        return cols, f"no {phase} step counted"
    counted = ops[ops["counted"]]
    flop = float(counted["flop"].sum())
    nbytes = float((counted["bytes_read"] + counted["bytes_written"]).sum())
    cols.update({f"{phase}_flop": flop, f"{phase}_bytes": nbytes,
                 f"{phase}_intensity_flop_per_byte": flop / nbytes if nbytes else math.nan,
                 f"{phase}_flop_per_s": flop / time_s if time_s > 0 else math.nan,
                 f"{phase}_bytes_per_s": nbytes / time_s if time_s > 0 else math.nan})
    origin = placement_origin(ceilings, precision)
    if origin is None or not time_s > 0:
        return cols, (f"no {precision} compute roof with a memory roof of the same origin "
                      "(set ceilings fast or quick)")
    step = roofline_points(ops, ceilings, dtype=precision, step_time_s=time_s, origin=origin)
    step = step[step["op"] == STEP_OP].iloc[0]
    cols.update({f"{phase}_attainable_flop_per_s": float(step["attainable_flop_per_s"]),
                 f"{phase}_percent_of_roof": float(step["percent_of_roof"]),
                 f"{phase}_bound": step["bound"]})
    return cols, None
