"""Model FLOP utilisation (MFU) and its counted-FLOP companion, with the convention spelled out.

MFU (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT ``estimate_mfu``; torchtitan)::

    MFU = model FLOP per step / step time / (devices × dense peak FLOP/s of the dtype used)

The model FLOP are analytic (:mod:`perfkit.measuring.workloads.synthetic`: ``6·N + 12·L·H·Q·T`` per token for the
transformer), so recomputation under activation checkpointing is not counted (that would be HFU).
The counted-FLOP utilisation beside it divides the FLOP that :func:`perfkit.measuring.ops.counting.count_ops`
saw in one real step by the same time and peak: what ran between ``zero_grad`` and the end of the
backward (:mod:`perfkit.measuring.training.step`), i.e. the forward and the backward, with
activation checkpointing's recompute, SDPA's recomputed Q·Kᵀ and the elementwise work; not the
optimizer step, which the analytic FLOP leave out too. Both are NaN, with the reason, when the peak is unknown: an unknown GPU or a dtype the CPU
has no theoretical peak for is never given another device's or dtype's numbers.

Peaks: a GPU's spec-sheet dense peak (:func:`perfkit.core.specs.spec_peaks`, the exact part or
unknown) × the ranks (one GPU each), of the units the dtype's GEMMs run on
(:meth:`perfkit.core.specs.SpecPeaks.mfu_peak_key`: CDNA's fp32 on the matrix cores).
A CPU's theoretical cores × clock × FLOP/cycle
(:func:`perfkit.core.devices.cpu_theoretical_peak`) of the physical cores the run had: per rank
min(its threads, the physical cores of its affinity mask), summed over the ranks and capped at
the physical cores of their CPUs (:func:`perfkit.core.cpu_share.run_cores`); never the whole
machine's logical CPUs. The row states the threads and the cores counted. Nothing here touches
a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.specs import PRECISION_PEAK_KEY

__all__ = ["Peak", "PEAK_DTYPE", "peak_flop_per_s", "flop_convention", "mfu_convention",
           "utilisation"]

#: Which spec-sheet dtype a training precision runs its matmuls in (a device's spec row may
#: name other units for it: :meth:`perfkit.core.specs.SpecPeaks.mfu_peak_key`, CDNA's fp32 matrix).
PEAK_DTYPE = PRECISION_PEAK_KEY

_FLOP_CONVENTIONS = {
    "transformer": "PaLM 6N+12LHQT per token (N non-embedding, attention not halved for causal)",
    "mlp": "6·Σ in·out per sample",
    "convnet": "3 × forward conv/linear FLOP per sample",
}


@dataclass(kw_only=True, frozen=True)
class Peak:
    """The peak a utilisation divides by, or why there is none."""

    flop_per_s: float
    """devices × per-device dense peak; NaN when unknown."""
    description: str
    """What the peak is, for the convention column ("2 × spec dense bf16 peak of NVIDIA ...")."""
    source: str | None
    """Where the per-device number comes from (spec-sheet source, or the CPU formula)."""
    reason: str | None
    """Why ``flop_per_s`` is NaN; None when it is known."""
    cpu_cores: int | None = None
    """CPU: the physical cores the peak counts (all ranks); None on a GPU."""
    cpu_threads: int | None = None
    """CPU: the compute threads the run used (all ranks); None on a GPU or when not read."""


def peak_flop_per_s(*, device_kind: str, device_name: str, precision: str, devices: int,
                    cpu_peak=None, cpu_shares=None, compute_units: int | None = None) -> Peak:
    """The peak of ``devices`` devices of ``device_name`` in ``precision``.

    ``device_kind`` is ``cuda``, ``rocm`` or ``cpu`` (:class:`perfkit.core.devices.DeviceInfo`);
    ``compute_units`` the SMs/CUs the runtime reports (tells apart parts of one name).
    CPU: ``cpu_peak`` a :class:`perfkit.core.devices.CpuPeak` of the cores the whole run had, else
    one from ``cpu_shares`` (each rank's :class:`perfkit.core.cpu_share.CpuShare` or its
    ``as_dict()``), else from this process's share.
    """
    from ..core.cpu_share import CpuShare
    from ..core.devices import cpu_theoretical_peak
    from ..core.specs import spec_peaks

    dtype = PEAK_DTYPE.get(precision)
    if dtype is None:
        return Peak(flop_per_s=math.nan, description="unknown", source=None,
                    reason=f"no peak dtype for precision {precision!r}")
    if device_kind == "cpu":
        if cpu_peak is None:
            shares = [CpuShare(**s) if isinstance(s, dict) else s for s in cpu_shares or []]
            cpu_peak = cpu_theoretical_peak(shares=shares or None)
        peak = cpu_peak
        value = peak.flop_per_s.get(dtype)
        if value is None or not math.isfinite(value):
            return Peak(flop_per_s=math.nan, description="unknown", source=None,
                        reason=f"no theoretical {dtype} peak for this CPU ({device_name}); "
                               f"cores × clock × FLOP/cycle is known for "
                               f"{', '.join(sorted(peak.flop_per_s))} only")
        threads = f", {peak.threads} threads" if peak.threads is not None else ""
        return Peak(
            flop_per_s=value,
            description=f"CPU theoretical {dtype} peak of the {peak.cores} physical cores the run "
                        f"had (shared by {devices} rank{'s' if devices > 1 else ''}{threads}: "
                        f"per rank min(threads, physical cores of its CPUs), summed, capped at "
                        f"the physical cores of their CPUs)",
            source=f"{peak.cores} physical cores [{peak.cores_source}] × "
                   f"{peak.clock_hz / 1e9:.2f} GHz ({peak.clock_source}) × "
                   f"{peak.flop_per_cycle_per_core[dtype]} FLOP/cycle; {peak.assumption}",
            reason=None, cpu_cores=peak.cores, cpu_threads=peak.threads)
    row = spec_peaks(device_name, compute_units)
    if row is None:
        return Peak(flop_per_s=math.nan, description="unknown", source=None,
                    reason=f"unknown device {device_name!r}: not in perfkit's spec table")
    dtype = row.mfu_peak_key(precision)  # the units its GEMMs run on (CDNA fp32: matrix cores)
    if dtype not in row.flop_per_s:
        return Peak(flop_per_s=math.nan, description="unknown", source=row.source,
                    reason=f"the spec table has no dense {dtype} peak for {row.model}")
    return Peak(flop_per_s=devices * row.flop_per_s[dtype],
                description=f"{devices} × spec dense {dtype} peak of {row.model}",
                source=row.source, reason=None)


def flop_convention(model: str, own: str | None = None) -> str:
    """How a workload's analytic FLOP per step are counted: perfkit's rule for its own models,
    ``own`` (the workload's, e.g. a Hugging Face family's 6N rule) for the others."""
    return _FLOP_CONVENTIONS.get(model) or own or "unknown"


def mfu_convention(model: str, peak: Peak, own: str | None = None) -> str:
    """The text of the ``mfu_convention`` column: FLOP rule; peak."""
    return f"{flop_convention(model, own)}; recompute not counted; peak = {peak.description}"


def utilisation(flop_per_step: float, step_time_s: float, peak: Peak) -> float:
    """``flop_per_step / step_time_s / peak``; NaN when any of them is unknown."""
    if not (peak.flop_per_s > 0 and step_time_s > 0) or not math.isfinite(flop_per_step):
        return math.nan
    return flop_per_step / step_time_s / peak.flop_per_s
