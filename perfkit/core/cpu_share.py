"""The part of the CPU a run computes on: physical cores under its affinity mask and threads.

A theoretical CPU peak is cores × clock × FLOP/cycle/core (:func:`perfkit.core.devices.
cpu_theoretical_peak`), and which cores count decides whether an MFU means anything:

- **Physical cores, not logical CPUs.** The hardware threads of one core (SMT, Hyper-Threading)
  share its FMA units, so two siblings add no FLOP/cycle. The cores come from the kernel's CPU
  topology (``/sys/devices/system/cpu/cpuN/topology``: ``core_cpus_list``, formerly
  ``thread_siblings_list``, names the logical CPUs of one core; ``physical_package_id`` and
  ``core_id`` identify it where those lists are missing).
- **The run's share, not the machine.** A sweep slot or a torchrun rank may run only on the
  CPUs of its affinity mask, and computes with ``torch.get_num_threads()`` threads
  (``OMP_NUM_THREADS``); one process counts ``min(threads, physical cores of its CPUs)`` cores.
- **Several processes** (ranks of one run): each process's count, summed per host, capped at the
  physical cores of the union of their CPUs on that host (two ranks pinned to the same core
  share it), summed over hosts (:func:`run_cores`).

Everything reads the topology under ``root`` so tests can build a fake one.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["SYS_CPU", "THREAD_VARIABLES", "CpuShare", "affinity_cpus", "cpu_share", "parse_cpu_list",
           "physical_core_ids", "run_cores", "thread_env", "threads_from_env", "with_threads"]

#: Where Linux describes its CPUs (sysfs).
SYS_CPU = Path("/sys/devices/system/cpu")


#: The variables that set a process's compute threads, the one that leads first. torch reads
#: ``MKL_NUM_THREADS`` after ``OMP_NUM_THREADS`` and lets it win ("MKL_NUM_THREADS takes precedence
#: over OMP_NUM_THREADS": PyTorch docs, Threading Environment Variables,
#: https://docs.pytorch.org/docs/stable/threading_environment_variables.html): a rank given
#: ``OMP_NUM_THREADS=1`` beside an inherited ``MKL_NUM_THREADS=2`` computes with 2 threads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """The environment giving a process ``threads`` compute threads: every variable of
    :data:`THREAD_VARIABLES`, so none inherited from a parent can override the count."""
    return {name: str(int(threads)) for name in THREAD_VARIABLES}


def with_threads(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """``overrides`` over ``base``, where an override of ``OMP_NUM_THREADS`` alone (a variant's
    env, a caller's per-rank count) also sets the followers it does not name: it means the
    thread count, and an inherited ``MKL_NUM_THREADS`` would otherwise change it. This is the one
    rule for every environment perfkit gives a child (kernel, torchrun, ranks)."""
    env = dict(base)
    leader, *followers = THREAD_VARIABLES
    if leader in overrides:
        for name in followers:
            if name not in overrides:
                env[name] = overrides[leader]
    env.update(overrides)
    return env


def affinity_cpus() -> tuple[int, ...]:
    """The logical CPUs this process may run on (its affinity mask), sorted; every CPU where
    there are no affinity masks (macOS)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:
        return tuple(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` (the kernel's cpulist format) → ``(0, 1, 2, 3, 8, 10, 11)``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(cpus))


@lru_cache(maxsize=4096)
def _core_id(root: str, cpu: int) -> tuple[str, str]:
    """(key naming the physical core of logical ``cpu``, where it was read)."""
    topo = Path(root) / f"cpu{cpu}" / "topology"
    for name in ("core_cpus_list", "thread_siblings_list"):
        try:
            siblings = parse_cpu_list((topo / name).read_text())
        except (OSError, ValueError):
            continue
        if siblings:
            return "cpus " + ",".join(map(str, siblings)), f"sysfs {name}"
    try:
        package = int((topo / "physical_package_id").read_text())
        core = int((topo / "core_id").read_text())
        return f"package {package} core {core}", "sysfs physical_package_id/core_id"
    except (OSError, ValueError):
        # No topology (not Linux, or a container hiding sysfs): each logical CPU counts as a
        # core, an upper bound that the source says so.
        return f"cpu {cpu}", "no CPU topology readable: each logical CPU counted as a core"


def physical_core_ids(cpus: Iterable[int],
                      root: str | Path | None = None) -> tuple[tuple[str, ...], str]:
    """(the distinct physical cores of logical ``cpus``, how they were found); the topology is
    read under ``root`` (default :data:`SYS_CPU`)."""
    root = str(SYS_CPU if root is None else root)
    keys, sources = set(), set()
    for cpu in cpus:
        key, source = _core_id(root, int(cpu))
        keys.add(key)
        sources.add(source)
    return tuple(sorted(keys)), "; ".join(sorted(sources)) or "no CPUs"


@dataclass(kw_only=True, frozen=True)
class CpuShare:
    """The CPU one process computes on."""

    host: str
    """Host name: shares on different hosts never share cores."""
    cpus: tuple[int, ...]
    """Logical CPUs of the process's affinity mask."""
    core_ids: tuple[str, ...]
    """The distinct physical cores those CPUs belong to."""
    threads: int
    """Compute threads the process uses (``torch.get_num_threads()``: ``OMP_NUM_THREADS`` or
    ``torch.set_num_threads``)."""
    topology_source: str
    """Where the cores were read (or that they could not be)."""

    def __post_init__(self):
        # Rows travel as JSON between ranks: lists come back, the dataclass stays hashable.
        object.__setattr__(self, "cpus", tuple(self.cpus))
        object.__setattr__(self, "core_ids", tuple(self.core_ids))

    @property
    def physical_cores(self) -> int:
        return len(self.core_ids)

    @property
    def cores(self) -> int:
        """Cores counted: threads beyond the cores share their FMA units, cores beyond the
        threads stay idle."""
        return min(self.threads, self.physical_cores)

    def as_dict(self) -> dict:
        return asdict(self)


def threads_from_env(environ: Mapping[str, str]) -> int | None:
    """The intra-op threads torch starts with in a process of environment ``environ``:
    ``OMP_NUM_THREADS``, else ``MKL_NUM_THREADS`` (torch 2.13 honours either), else None (the
    affinity mask's CPUs)."""
    for name in THREAD_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process; where torch is not imported (the sweep engine
    describing a row it writes), what torch would start with (:func:`threads_from_env`)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    return threads_from_env(os.environ)


def cpu_share(*, cpus: Iterable[int] | None = None, threads: int | None = None,
              root: str | Path | None = None, host: str | None = None) -> CpuShare:
    """This process's share (arguments override what is read, for tests and other processes)."""
    cpus = affinity_cpus() if cpus is None else tuple(sorted(int(c) for c in cpus))
    if threads is None:
        threads = _torch_threads() or int(os.environ.get("OMP_NUM_THREADS") or 0) or len(cpus)
    core_ids, source = physical_core_ids(cpus, root)
    return CpuShare(host=host or socket.gethostname(), cpus=cpus, core_ids=core_ids,
                    threads=int(threads), topology_source=source)


def run_cores(shares: Sequence[CpuShare]) -> tuple[int, int, str]:
    """(cores counted, threads used, how) for the processes of one run (module docstring)."""
    if not shares:
        raise ValueError("run_cores needs at least one CpuShare")
    cores, parts = 0, []
    hosts = sorted({s.host for s in shares})
    for host in hosts:
        mine = [s for s in shares if s.host == host]
        union = set().union(*(s.core_ids for s in mine))
        counted = min(sum(s.cores for s in mine), len(union))
        cores += counted
        cpus = set().union(*(s.cpus for s in mine))
        if len(mine) == 1:
            s = mine[0]
            parts.append(f"min({s.threads} threads, {s.physical_cores} physical cores of "
                         f"{len(cpus)} allowed logical CPUs) = {counted}")
        else:
            parts.append(f"{len(mine)} processes: Σ min(threads, physical cores of its CPUs) = "
                         f"{sum(s.cores for s in mine)}, capped at the {len(union)} physical "
                         f"cores of their {len(cpus)} logical CPUs = {counted}")
    threads = sum(s.threads for s in shares)
    sources = "; ".join(sorted({s.topology_source for s in shares}))
    where = "" if len(hosts) == 1 else f" over {len(hosts)} hosts"
    return cores, threads, f"{' + '.join(parts)}{where} ({sources})"
