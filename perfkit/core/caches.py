"""The data caches the OS reports for a set of CPUs, and the working set past which a stream is memory-fed.

Sizes come from Linux sysfs (``/sys/devices/system/cpu/cpuN/cache/index*/{level,type,size,
shared_cpu_list}``): per level, the sum over the distinct cache instances of the CPUs (with one
thread per core a private L1/L2 holds that core's share, so the aggregate is what a level holds;
a shared L3 counts once per instance, e.g. once per CCD on an EPYC).

**When a working set is memory-fed.** Server caches are non-inclusive (Intel since Skylake-SP)
or victim caches (AMD Zen's L3), so a line lives in L2 *or* L3 and a stream can occupy the sum of
the levels; on a Sapphire Rapids socket the L2s (56 × 2 MiB) even exceed the L3 (105 MB). Adaptive
replacement keeps part of a stream larger than that capacity ``C`` rather than thrashing, up to a
fraction of about ``C / ws`` of its bytes. At ``ws >= 8 C`` at most 1/8 comes from caches and a
triad reads at most 1 / (1 − 1/8) ≈ 1.14× the memory bandwidth, so only such working sets are
called DRAM (:data:`MEMORY_FACTOR`); STREAM's rule asks for each array >= 4× the caches, 12× for
triad's three (https://www.cs.virginia.edu/stream/ref.html#size).

Everything reads under ``root`` so tests can build a fake sysfs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import cpu_share

__all__ = ["MEMORY_FACTOR", "Caches", "cache_capacities", "cpu_caches", "cpu_cache_sizes",
           "memory_threshold_bytes", "sweep_top_bytes"]

#: A working set is memory-fed (DRAM/HBM) at >= this many times the total cache capacity.
MEMORY_FACTOR = 8


@dataclass(frozen=True, kw_only=True)
class Caches:
    """Data-cache capacity per level of a set of CPUs (or a GPU), and where it was read."""

    sizes_bytes: Mapping[str, int] = field(default_factory=dict)
    """Level name → bytes, summed over the distinct instances (``{"L1": 64 << 10, ...}``)."""
    source: str = ""
    """Where the sizes were read, or why none could be (then ``sizes_bytes`` is empty)."""

    @property
    def known(self) -> bool:
        return bool(self.sizes_bytes)

    @property
    def capacity_bytes(self) -> int | None:
        """Bytes a stream can occupy in all levels together (non-inclusive caches); None if unknown."""
        return sum(self.sizes_bytes.values()) if self.sizes_bytes else None


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _level_order(name: str) -> tuple[int, int]:
    match = re.fullmatch(r"L(\d+)", name)
    return (0, int(match.group(1))) if match else (1, 0)  # L1, L2, L3, then MALL and others


def cpu_caches(cpus: Sequence[int] | None = None, root: str | Path | None = None) -> Caches:
    """Data-cache sizes of ``cpus`` (default: the CPUs this process may run on), per level in
    level order, from sysfs under ``root`` (default :data:`perfkit.core.cpu_share.SYS_CPU`);
    empty with the reason when unreadable."""
    root = Path(root if root is not None else cpu_share.SYS_CPU)
    if cpus is None:
        cpus = cpu_share.affinity_cpus()
    seen, sizes, problems = set(), {}, []
    for cpu in cpus:
        indexes = sorted(Path(root, f"cpu{cpu}", "cache").glob("index*"))
        if not indexes:
            problems.append(f"no {Path(root, f'cpu{cpu}', 'cache', 'index*')}")
        for index in indexes:
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                key = (level, (index / "shared_cpu_list").read_text().strip())
                size = _parse_size((index / "size").read_text())
            except (OSError, ValueError) as exc:
                problems.append(f"{index}: {type(exc).__name__}")
                continue
            if key not in seen:
                seen.add(key)
                sizes[f"L{level}"] = sizes.get(f"L{level}", 0) + size
    if not sizes:
        why = "; ".join(problems[:2]) or "no CPUs given"
        return Caches(sizes_bytes={}, source=f"cache sizes unreadable from sysfs ({why})")
    ordered = dict(sorted(sizes.items(), key=lambda kv: _level_order(kv[0])))
    return Caches(sizes_bytes=ordered, source=f"sysfs {Path(root)}/cpuN/cache of CPUs {_cpu_span(cpus)}")


def _cpu_span(cpus: Sequence[int]) -> str:
    cpus = list(cpus)
    return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0]) if cpus else "none"


def cpu_cache_sizes(cpus: Sequence[int] | None = None, root: str | Path | None = None) -> dict[str, int]:
    """:func:`cpu_caches`' sizes alone (``{}`` when unreadable)."""
    return dict(cpu_caches(cpus, root).sizes_bytes)


def cache_capacities(sizes: Mapping[str, int]) -> dict[str, int]:
    """Level → bytes a stream can occupy through that level (its own and every lower level's,
    caches being non-inclusive), in level order."""
    out, total = {}, 0
    for name, size in sorted(sizes.items(), key=lambda kv: _level_order(kv[0])):
        total += size
        out[name] = total
    return out


def memory_threshold_bytes(sizes: Mapping[str, int]) -> int | None:
    """The smallest working set called memory-fed: :data:`MEMORY_FACTOR` × the total capacity;
    None when the sizes are unknown."""
    return MEMORY_FACTOR * sum(sizes.values()) if sizes else None


def sweep_top_bytes(sizes: Mapping[str, int], *, octaves_past: int, fallback_llc_bytes: int,
                    free_bytes: int, max_fraction_of_free: float = 0.25) -> int:
    """The largest working set of a bandwidth sweep: ``octaves_past`` octaves beyond the memory
    threshold (rounded up to a half octave, ``2**(k/2)``: a point of the sweep's grid, so the
    memory plateau has its points from the threshold on; rounding to a whole octave swept up to
    1.4× further, 1 GiB instead of 724 MiB here); with unknown sizes ``2**octaves_past`` ×
    ``fallback_llc_bytes``. Capped at a fraction of free memory (the sweep allocates 1.5× its
    largest working set), and at least 1 MiB."""
    threshold = memory_threshold_bytes(sizes)
    base = threshold if threshold is not None else fallback_llc_bytes
    want = int(2 ** (math.ceil(2 * math.log2(base) - 1e-9) / 2)) * 2 ** octaves_past
    return max(1 << 20, min(want, int(free_bytes * max_fraction_of_free)))
