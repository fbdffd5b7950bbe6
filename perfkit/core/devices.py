"""Devices: what is attached, and the ceilings known for it without measuring.

- :func:`detect` says which kind of device this is (``cuda``, ``rocm`` or ``cpu``) and names it.
- The spec-sheet peaks live in :mod:`perfkit.core.specs`; :func:`reference_ceilings` gives them
  for a GPU, the theoretical peak for a CPU, as rows of the ceilings table.
- :func:`cpu_theoretical_peak` computes cores × clock × FLOP/cycle from the CPU's ISA and says
  which clock and which FMA-unit count it assumed. The cores are the *physical* cores the run
  could compute on (:func:`cpu_share`): its affinity mask mapped onto the core topology, and no
  more than its compute threads; hardware threads of one core share its FMA units.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .specs import spec_ceilings

__all__ = [
    "DeviceInfo",
    "CpuPeak",
    "TorchBuild",
    "torch_build",
    "detect",
    "resolve_device",
    "cpu_theoretical_peak",
    "cpu_model_name",
    "cpu_clock_hz",
]


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


# --------------------------------------------------------------------------------------------
# Detection

@dataclass(kw_only=True, frozen=True)
class TorchBuild:
    """What the installed torch was built for, read from ``torch/version.py`` without importing
    torch (1.5 s of CPU): the sweep engine describes the rows it writes itself with it."""

    version: str
    cuda: str | None
    hip: str | None

    @property
    def gpu(self) -> bool:
        """Built for CUDA or ROCm: only then can torch see a GPU (and only torch can say which)."""
        return self.cuda is not None or self.hip is not None


@lru_cache(maxsize=1)
def torch_build() -> TorchBuild:
    """The installed torch's build (:class:`TorchBuild`); torch's own values when it is imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        spec = importlib.util.find_spec("torch")  # finds the package without running it
        where = spec.submodule_search_locations if spec else None
        if where:
            path = Path(list(where)[0]) / "version.py"
            version_spec = importlib.util.spec_from_file_location("_perfkit_torch_version", path)
            if version_spec is not None and path.is_file():
                module = importlib.util.module_from_spec(version_spec)
                version_spec.loader.exec_module(module)
                return TorchBuild(version=module.__version__, cuda=module.cuda, hip=getattr(module, "hip", None))
        import torch
    return TorchBuild(version=str(torch.__version__), cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))


def _gpu_visible() -> bool:
    """A CUDA/ROCm device is visible: torch's answer where torch is loaded (it has the last word,
    mocks included), and never on a CPU-only build that no one has imported yet."""
    if "torch" not in sys.modules and not torch_build().gpu:
        return False
    import torch

    return torch.cuda.is_available()


def resolve_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when a CUDA/ROCm device is visible, else ``cpu``; others validated."""
    if device == "auto":
        return "cuda" if _gpu_visible() else "cpu"
    kind = device.split(":")[0]
    if kind not in {"cpu", "cuda"}:
        from .errors import BadInputError

        raise BadInputError(f"device {device!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if kind == "cuda" and not _gpu_visible():
        from .errors import BadInputError

        raise BadInputError(f"device {device!r} requested but torch sees no CUDA/ROCm device")
    return device


def detect(device: str = "auto") -> DeviceInfo:
    """Describe ``device`` (``auto``: the first GPU if any, else the CPU)."""
    resolved = resolve_device(device)
    if resolved.startswith("cuda"):
        import torch

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
    from .cpu_share import affinity_cpus

    return len(affinity_cpus())


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
    """Physical cores counted: those the run could compute on (:mod:`perfkit.core.cpu_share`;
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
    """How ``cores`` was counted (:func:`perfkit.core.cpu_share.run_cores`)."""


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

    Cores: ``cores`` if given, else those of ``shares`` (:class:`perfkit.core.cpu_share.CpuShare`
    of each process of the run, :func:`perfkit.core.cpu_share.run_cores`), else this process's
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
