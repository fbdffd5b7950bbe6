"""Spec sheets: what each known device promises, every figure with its source.

- :data:`SPEC_TABLE` holds dense (no sparsity) spec-sheet peaks, each entry with its source
  (``shared/reference/peaks.md``). A device that matches no entry is reported as *unknown*:
  never another GPU's numbers (the wrong-MFU bugs of other tools came from such fallbacks).
- Which peak an MFU divides by (:meth:`SpecPeaks.mfu_peak_key`): the peak of the units the
  precision's GEMMs run on. The spec key of the same name, except where a row says otherwise:

  ======================== ======= ============ ====== ============ ====== ======
  device                   fp32    tf32         bf16   bf16-pure    fp16   fp8
  ======================== ======= ============ ====== ============ ====== ======
  NVIDIA A100/H100/H200    fp32    tf32         bf16   bf16         fp16   fp8
  AMD MI250X (per GCD)     fp32_m  (none)       bf16   bf16         fp16   (none)
  AMD MI300X               fp32_m  (none)       bf16   bf16         fp16   fp8
  ======================== ======= ============ ====== ============ ====== ======

  (fp32_m: ``fp32_matrix``; a blank in the reference is unknown, NaN.) NVIDIA: IEEE fp32 GEMMs
  run on the CUDA cores (the 19.5/67 TFLOP/s figure), tf32 on the tensor cores. CDNA2/CDNA3:
  rocBLAS/hipBLASLt fp32 GEMMs run on the matrix cores (MFMA ``v_mfma_f32_*_f32``: MI250X 47.9
  TFLOP/s per GCD, vector 23.9; MI300X 163.4, its vector figure not in the reference), so the
  vector figure would overstate fp32 MFU up to 2×. torchtitan's ``get_peak_flops`` (and the
  forks of it found) give bf16 peaks only (MI250X 191.5e12 per GCD, MI300X 1300e12), no fp32
  convention to follow; no Primus source with one was found.
- :data:`SPEC_LINKS` holds the per-direction link bandwidth (NVLink) an intra-node busbw can
  approach, by device-name pattern, with sources.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

__all__ = ["SpecPeaks", "PRECISION_PEAK_KEY", "SPEC_TABLE", "SPEC_LINKS", "spec_peaks", "spec_ceilings", "spec_link"]

_T = 1e12  # spec sheets quote TFLOP/s and TB/s (10^12)


#: A100 dense compute peaks, the same on every A100 part (NVIDIA A100 datasheet); the parts
#: differ in memory only.
_A100_FLOP_PER_S = {
    "fp64": 9.7 * _T, "fp64_tensor": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T,
    "bf16": 312 * _T, "fp16": 312 * _T,
}


#: Which spec-sheet key a training precision (or compute dtype) runs its matmuls in, before a
#: row's :attr:`SpecPeaks.matmul_keys` override (bf16-pure computes in bf16).
PRECISION_PEAK_KEY = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bf16-pure": "bf16",
                      "fp16": "fp16", "fp8": "fp8"}


@dataclass(kw_only=True, frozen=True)
class SpecPeaks:
    """One spec-sheet row: dense peaks of one device model, with the source they come from."""

    model: str
    """The model this row describes."""
    pattern: str
    """Regular expression matched against the runtime's device name."""
    flop_per_s: dict[str, float] = field(default_factory=dict)
    """Dense peak FLOP/s per precision key (``fp64``, ``fp64_tensor``, ``fp32``,
    ``fp32_matrix``, ``tf32``, ``bf16``, ``fp16``, ``fp8``); a missing key is unknown."""
    memory_bytes_per_s: float | None = None
    """Peak HBM bandwidth, bytes/s; None when unknown."""
    memory_bytes: float | None = None
    """Memory capacity per device as sold (10^9 GB), bytes."""
    source: str = ""
    """Where the numbers come from."""
    compute_units: int | None = None
    """SMs/CUs per device of this part, when they tell it apart from a part of the same runtime
    name: a device that reports another count is not this part."""
    shared_name_pattern: str | None = None
    """A runtime name this part shares with other parts; it matches only when ``compute_units``
    confirms the part."""
    matmul_keys: dict[str, str] = field(default_factory=dict)
    """Per :data:`PRECISION_PEAK_KEY` key, the ``flop_per_s`` key of the units that dtype's GEMMs
    run on where it is another one (CDNA: ``{"fp32": "fp32_matrix"}``)."""

    def mfu_peak_key(self, precision: str) -> str | None:
        """The ``flop_per_s`` key an MFU in ``precision`` divides by (module docstring's table);
        None for a precision perfkit has no peak dtype for."""
        key = PRECISION_PEAK_KEY.get(precision)
        return self.matmul_keys.get(key, key)


# Every value below is copied from shared/reference/peaks.md (dense, no sparsity); a blank there
# is a missing key here. A pattern names one part: model numbers are whole tokens (``\bH200\b``
# is not GH200, ``\bA100\b`` not RTX A1000), and variants absent from the table (H100/H200 NVL,
# GH200, H800, MI250, other memory sizes, A100 PCIe bandwidth) are excluded rather than given
# another part's numbers. Order matters: the first matching pattern wins, so specific variants
# (PCIe, 40 GB) come before the generic name. Names seen from the runtimes: "NVIDIA H100 80GB
# HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB",
# "AMD Instinct MI250X" or, on some ROCm versions for MI250 and MI250X alike, "AMD Instinct
# MI250X / MI250".
SPEC_TABLE: tuple[SpecPeaks, ...] = (
    SpecPeaks(
        model="NVIDIA H100 PCIe",
        pattern=r"\bH100\b.*\bPCIe\b",
        flop_per_s={"bf16": 756 * _T, "fp16": 756 * _T, "fp8": 1513 * _T},
        memory_bytes_per_s=2.0 * _T,
        memory_bytes=80e9,
        source="NVIDIA H100 datasheet (PCIe column, dense)",
    ),
    SpecPeaks(
        model="NVIDIA H100 SXM5",
        pattern=r"\bH100\b(?!.*\b(PCIe|NVL)\b)(?!.*\b(?!80GB\b)\d+GB\b)",
        flop_per_s={
            "fp64": 34 * _T, "fp64_tensor": 67 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T,
            "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T,
        },
        memory_bytes_per_s=3.35 * _T,
        memory_bytes=80e9,
        source="NVIDIA H100 datasheet, SXM5 column ('1/2 lower without sparsity' applied)",
    ),
    SpecPeaks(
        model="NVIDIA H200 SXM",
        pattern=r"\bH200\b(?!.*\bNVL\b)(?!.*\b(?!141GB\b)\d+GB\b)",
        flop_per_s={
            "fp64": 34 * _T, "fp32": 67 * _T, "tf32": 494.7 * _T,
            "bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp8": 1978.9 * _T,
        },
        memory_bytes_per_s=4.8 * _T,
        memory_bytes=141e9,
        source="NVIDIA H200 product page (compute as H100 SXM)",
    ),
    SpecPeaks(
        model="NVIDIA A100 40GB",
        pattern=r"\bA100\b.*\b40GB\b",
        flop_per_s=dict(_A100_FLOP_PER_S),
        memory_bytes_per_s=1.555 * _T,
        memory_bytes=40e9,
        source="NVIDIA A100 datasheet (40 GB: 1,555 GB/s)",
    ),
    SpecPeaks(
        model="NVIDIA A100 80GB PCIe",
        pattern=r"\bA100\b.*\bPCIe\b",
        flop_per_s=dict(_A100_FLOP_PER_S),
        memory_bytes_per_s=None,  # not in the reference table: unknown, not the SXM figure
        memory_bytes=80e9,
        source="NVIDIA A100 datasheet (compute; PCIe bandwidth not in perfkit's table)",
    ),
    SpecPeaks(
        model="NVIDIA A100 80GB SXM",
        pattern=r"\bA100\b",
        flop_per_s=dict(_A100_FLOP_PER_S),
        memory_bytes_per_s=2.039 * _T,
        memory_bytes=80e9,
        source="NVIDIA A100 datasheet; torchtitan get_peak_flops uses 312e12",
    ),
    SpecPeaks(
        model="AMD Instinct MI250X (per GCD)",
        # MI250 (104 CUs per GCD, other peaks) is not in the table: it must never get these.
        pattern=r"\bMI250X\b(?!\s*/\s*MI250\b)",
        shared_name_pattern=r"\bMI250X\s*/\s*MI250\b",
        compute_units=110,
        matmul_keys={"fp32": "fp32_matrix"},  # fp32 GEMMs run on the matrix cores (MFMA)
        flop_per_s={
            "fp64": 23.9 * _T, "fp64_tensor": 47.9 * _T, "fp32": 23.9 * _T,
            "fp32_matrix": 47.9 * _T, "bf16": 191.5 * _T, "fp16": 191.5 * _T,
        },
        memory_bytes_per_s=1.6 * _T,
        memory_bytes=64e9,
        source="AMD MI250X spec (383 BF16 TFLOP/s and 3.2 TB/s per two-GCD module, halved per "
        "GCD); torchtitan uses 191.5e12 per GCD; 110 CUs per GCD (MI250: 104), ROCm docs 'AMD "
        "GPU specifications' (rocm.docs.amd.com/en/latest/reference/gpu-specs.html)",
    ),
    SpecPeaks(
        model="AMD Instinct MI300X",
        pattern=r"\bMI300X\b",
        matmul_keys={"fp32": "fp32_matrix"},  # fp32 GEMMs run on the matrix cores (MFMA)
        flop_per_s={"fp32_matrix": 163.4 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T, "fp8": 2614.9 * _T},
        memory_bytes_per_s=5.3 * _T,
        memory_bytes=192e9,
        source="AMD MI300X datasheet (as cited in torchao roofline utils)",
    ),
)


def spec_peaks(device_name: str, compute_units: int | None = None) -> SpecPeaks | None:
    """The spec-sheet row of the exact part ``device_name`` names, or None: unknown to perfkit.

    ``compute_units`` (SMs/CUs as the runtime reports them, :attr:`perfkit.core.devices.DeviceInfo.compute_units`)
    settles a name several parts share (ROCm's "AMD Instinct MI250X / MI250": 110 CUs per GCD is
    an MI250X); without it such a name is unknown, and a count that contradicts the name is too.
    """
    for row in SPEC_TABLE:
        if re.search(row.pattern, device_name, flags=re.IGNORECASE):
            contradicted = (compute_units is not None and row.compute_units is not None
                            and compute_units != row.compute_units)
            return None if contradicted else row
        if (row.shared_name_pattern is not None and compute_units is not None
                and compute_units == row.compute_units
                and re.search(row.shared_name_pattern, device_name, flags=re.IGNORECASE)):
            return row
    return None


def spec_ceilings(device_name: str, compute_units: int | None = None) -> list[dict]:
    """Spec ceilings as rows of the ceilings table (``origin="spec"``), empty when unknown."""
    row = spec_peaks(device_name, compute_units)
    if row is None:
        return []
    rows = [
        {"kind": "compute", "dtype": dtype, "level": None, "value": value, "unit": "FLOP/s",
         "origin": "spec", "source": row.source, "method": f"spec sheet: {row.model}"}
        for dtype, value in row.flop_per_s.items()
    ]
    if row.memory_bytes_per_s is not None:
        rows.append(
            {"kind": "memory", "dtype": None, "level": "HBM", "value": row.memory_bytes_per_s,
             "unit": "bytes/s", "origin": "spec", "source": row.source,
             "method": f"spec sheet: {row.model}"}
        )
    return rows


#: Spec-sheet per-direction link bandwidth (bytes/s) by device-name pattern, with sources: what
#: an intra-node busbw can approach. Anything else is unknown (NaN), never another part's number.
#: Model numbers are whole tokens (H200 is not GH200) and each figure belongs to one part: PCIe
#: and NVL cards (NVLink only through bridges) are unknown, as is any part not named here.
SPEC_LINKS: tuple[tuple[str, float, str], ...] = (
    (r"(?i)\b(H100|H200|H800|A100)\b.*\b(PCIe|NVL)\b", math.nan,
     "PCIe/NVL card: NVLink only with bridges; unknown without the topology"),
    (r"\bH800\b", 200e9, "NVIDIA H800 SXM5: NVLink 400 GB/s bidirectional (NVIDIA's H800 "
     "spec as quoted in aiwiki.ai/wiki/nvidia_h800; H100's is 900)"),
    (r"\b(H100|H200)\b", 450e9, "NVIDIA H100/H200 datasheet: NVLink 4, 900 GB/s bidirectional"),
    (r"\bA100\b", 300e9, "NVIDIA A100 datasheet: NVLink 3, 600 GB/s bidirectional"),
)


def spec_link(device_name: str | None) -> tuple[float, str | None]:
    """(per-direction link bytes/s, source) for a device name; (NaN, None) when unknown."""
    for pattern, value, source in SPEC_LINKS:
        if device_name and re.search(pattern, device_name):
            return value, source
    return math.nan, None
