"""Devices: what is attached, and what its spec sheet promises.

- :func:`detect` says which kind of device this is (``cuda``, ``rocm`` or ``cpu``) and names it.
- :data:`SPEC_TABLE` holds dense (no sparsity) spec-sheet peaks, each entry with its source
  (``shared/reference/peaks.md``). A device that matches no entry is reported as *unknown*:
  never another GPU's numbers (the wrong-MFU bugs of other tools came from such fallbacks).
- :func:`cpu_theoretical_peak` computes cores × clock × FLOP/cycle from the CPU's ISA and says
  which clock and which FMA-unit count it assumed. The cores are the *physical* cores the run
  could compute on (:func:`cpu_share`): its affinity mask mapped onto the core topology, and no
  more than its compute threads; hardware threads of one core share its FMA units.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = [
    "DeviceInfo",
    "SpecPeaks",
    "CpuPeak",
    "SPEC_TABLE",
    "detect",
    "resolve_device",
    "spec_peaks",
    "spec_ceilings",
    "cpu_theoretical_peak",
    "cpu_model_name",
    "cpu_clock_hz",
]

_T = 1e12  # spec sheets quote TFLOP/s and TB/s (10^12)


@dataclass(kw_only=True, frozen=True)
class DeviceInfo:
    """The device a measurement ran on."""

    kind: str
    """``cuda`` (NVIDIA), ``rocm`` (AMD, HIP; torch calls it ``cuda`` too) or ``cpu``."""
    torch_device: str
    """What to pass to ``torch.device``: ``cuda:0`` or ``cpu``."""
    name: str
    """Marketing name as the runtime reports it (``torch.cuda.get_device_name``, CPU model)."""
    count: int
    """Devices of this kind visible to the process (CPU: logical CPUs in its affinity mask)."""
    memory_bytes: int | None
    """Device memory (GPU) or system memory (CPU), when known."""
    capability: str | None = None
    """CUDA compute capability (``9.0``) or the ROCm gfx architecture (``gfx90a``)."""
    compute_units: int | None = None
    """SMs (CUDA) or CUs (ROCm, per GCD) of the device: what tells parts apart that share a
    runtime name (ROCm names MI250 and MI250X both "AMD Instinct MI250X / MI250")."""


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
        flop_per_s={
            "fp64": 9.7 * _T, "fp64_tensor": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T,
            "bf16": 312 * _T, "fp16": 312 * _T,
        },
        memory_bytes_per_s=1.555 * _T,
        memory_bytes=40e9,
        source="NVIDIA A100 datasheet (40 GB: 1,555 GB/s)",
    ),
    SpecPeaks(
        model="NVIDIA A100 80GB PCIe",
        pattern=r"\bA100\b.*\bPCIe\b",
        flop_per_s={
            "fp64": 9.7 * _T, "fp64_tensor": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T,
            "bf16": 312 * _T, "fp16": 312 * _T,
        },
        memory_bytes_per_s=None,  # not in the reference table: unknown, not the SXM figure
        memory_bytes=80e9,
        source="NVIDIA A100 datasheet (compute; PCIe bandwidth not in perfkit's table)",
    ),
    SpecPeaks(
        model="NVIDIA A100 80GB SXM",
        pattern=r"\bA100\b",
        flop_per_s={
            "fp64": 9.7 * _T, "fp64_tensor": 19.5 * _T, "fp32": 19.5 * _T, "tf32": 156 * _T,
            "bf16": 312 * _T, "fp16": 312 * _T,
        },
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
        flop_per_s={"fp32_matrix": 163.4 * _T, "bf16": 1307.4 * _T, "fp16": 1307.4 * _T, "fp8": 2614.9 * _T},
        memory_bytes_per_s=5.3 * _T,
        memory_bytes=192e9,
        source="AMD MI300X datasheet (as cited in torchao roofline utils)",
    ),
)


def spec_peaks(device_name: str, compute_units: int | None = None) -> SpecPeaks | None:
    """The spec-sheet row of the exact part ``device_name`` names, or None: unknown to perfkit.

    ``compute_units`` (SMs/CUs as the runtime reports them, :attr:`DeviceInfo.compute_units`)
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


# --------------------------------------------------------------------------------------------
# Detection

def resolve_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when a CUDA/ROCm device is visible, else ``cpu``; others validated."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = device.split(":")[0]
    if kind not in {"cpu", "cuda"}:
        from .errors import BadInputError

        raise BadInputError(f"device {device!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if kind == "cuda" and not torch.cuda.is_available():
        from .errors import BadInputError

        raise BadInputError(f"device {device!r} requested but torch sees no CUDA/ROCm device")
    return device


def detect(device: str = "auto") -> DeviceInfo:
    """Describe ``device`` (``auto``: the first GPU if any, else the CPU)."""
    import torch

    resolved = resolve_device(device)
    if resolved.startswith("cuda"):
        index = torch.device(resolved).index or 0
        props = torch.cuda.get_device_properties(index)
        is_hip = getattr(torch.version, "hip", None) is not None
        capability = getattr(props, "gcnArchName", None) if is_hip else f"{props.major}.{props.minor}"
        return DeviceInfo(
            kind="rocm" if is_hip else "cuda",
            torch_device=f"cuda:{index}",
            name=torch.cuda.get_device_name(index),
            count=torch.cuda.device_count(),
            memory_bytes=int(props.total_memory),
            capability=capability,
            compute_units=getattr(props, "multi_processor_count", None),
        )
    return DeviceInfo(
        kind="cpu",
        torch_device="cpu",
        name=cpu_model_name(),
        count=_usable_cores(),
        memory_bytes=_system_memory_bytes(),
        capability=platform.machine(),
    )


def _usable_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask)."""
    return len(_affinity())


def _affinity() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # macOS: no affinity masks
        return tuple(range(os.cpu_count() or 1))


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """First processor's block of /proc/cpuinfo (Linux); empty elsewhere."""
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cpu_model_name() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"


# --------------------------------------------------------------------------------------------
# CPU theoretical peak

@dataclass(kw_only=True, frozen=True)
class CpuPeak:
    """cores × clock × FLOP/cycle/core, with every factor and assumption stated."""

    flop_per_s: dict[str, float]
    """Theoretical peak per precision (``fp32``, ``fp64``)."""
    cores: int
    """Physical cores counted: those the run could compute on (:mod:`perfkit.cpu_share`;
    hardware threads of one core are not extra FMA units)."""
    clock_hz: float
    """Clock used."""
    clock_source: str
    """Which clock: cpufreq max (boost) or /proc/cpuinfo 'cpu MHz' (the current/nominal)."""
    isa: str
    """Widest SIMD ISA with FMA found in the CPU flags."""
    flop_per_cycle_per_core: dict[str, int]
    """FMA units × SIMD lanes × 2 (an FMA is 2 FLOP), per precision."""
    assumption: str
    """What could not be read from the hardware (the FMA unit count)."""
    threads: int | None = None
    """Compute threads the run used (all its processes); None when ``cores`` was given."""
    cores_source: str = "given"
    """How ``cores`` was counted (:func:`perfkit.cpu_share.run_cores`)."""


def cpu_clock_hz() -> tuple[float, str]:
    max_freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return float(max_freq.read_text()) * 1e3, "cpufreq cpuinfo_max_freq (max boost clock)"
    except (OSError, ValueError):
        pass
    mhz = _cpuinfo().get("cpu MHz")
    if mhz:
        return float(mhz) * 1e6, "/proc/cpuinfo 'cpu MHz' (reported clock; no cpufreq, e.g. a VM)"
    return float("nan"), "unknown (no cpufreq and no /proc/cpuinfo clock)"


def cpu_theoretical_peak(flags: set[str] | None = None, cores: int | None = None,
                         clock_hz: float | None = None, *, shares=None) -> CpuPeak:
    """Theoretical FP32/FP64 peak of the CPU cores a run had (arguments override what is read).

    Cores: ``cores`` if given, else those of ``shares`` (:class:`perfkit.cpu_share.CpuShare`
    of each process of the run, :func:`perfkit.cpu_share.run_cores`), else this process's
    share: physical cores of its affinity mask, no more than its compute threads.
    FLOP per cycle per core = FMA units × SIMD lanes × 2 (shared/reference/peaks.md): AVX-512
    with two 512-bit FMA units gives 2 × 16 × 2 = 64 FP32; AVX2 with two 256-bit units 32. The
    number of FMA units is not visible in cpuid: two is assumed (true of server Xeons since
    Skylake-SP Gold 6xxx/Platinum and of Zen 4/5), and stated in ``assumption``.
    """
    from .cpu_share import cpu_share, run_cores

    if flags is None:
        flags = set(_cpuinfo().get("flags", "").split())
    threads, cores_source = None, "given"
    if cores is None:
        cores, threads, cores_source = run_cores(list(shares) if shares else [cpu_share()])
    if clock_hz is None:
        clock_hz, clock_source = cpu_clock_hz()
    else:
        clock_source = "given"
    if "avx512f" in flags:
        isa, lanes32 = "avx512", 16
    elif "avx2" in flags and "fma" in flags:
        isa, lanes32 = "avx2+fma", 8
    elif "asimd" in flags or platform.machine() in {"aarch64", "arm64"}:
        isa, lanes32 = "neon", 4
    else:
        isa, lanes32 = "sse", 4
    fma_units = 2
    per_cycle = {"fp32": fma_units * lanes32 * 2, "fp64": fma_units * (lanes32 // 2) * 2}
    return CpuPeak(
        flop_per_s={k: cores * clock_hz * v for k, v in per_cycle.items()},
        cores=cores,
        clock_hz=clock_hz,
        clock_source=clock_source,
        isa=isa,
        flop_per_cycle_per_core=per_cycle,
        assumption=f"{fma_units} FMA units per core assumed ({isa})",
        threads=threads,
        cores_source=cores_source,
    )


def reference_ceilings(info: DeviceInfo, cpu_peak: CpuPeak | None = None) -> list[dict]:
    """Ceilings known without measuring: the spec sheet's (``origin="spec"``) for a GPU in the
    table, the theoretical cores × clock × FLOP/cycle (``origin="theoretical"``) for a CPU
    (``cpu_peak``, default: of this process's share of the CPU). Empty for an unknown GPU:
    perfkit draws no roof it cannot source."""
    if info.kind != "cpu":
        return spec_ceilings(info.name, info.compute_units)
    peak = cpu_peak if cpu_peak is not None else cpu_theoretical_peak()
    return [
        {"kind": "compute", "dtype": dtype, "level": None, "value": value, "unit": "FLOP/s",
         "origin": "theoretical",
         "source": f"{peak.cores} physical cores [{peak.cores_source}] x "
                   f"{peak.clock_hz / 1e9:.2f} GHz ({peak.clock_source}) x "
                   f"{peak.flop_per_cycle_per_core[dtype]} FLOP/cycle; {peak.assumption}",
         "method": "cores x clock x FLOP/cycle"}
        for dtype, value in peak.flop_per_s.items()
    ]
