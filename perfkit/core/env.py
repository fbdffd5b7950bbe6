"""The environment fingerprint: everything that can change a performance number.

Every recorded row carries it (flattened as ``env_*`` columns plus the whole JSON), so two rows
measured on different software or hardware are never compared without it being visible. A row's
fingerprint describes the device *that row measured* (its ``device``/``resolved_device`` column,
:func:`row_device`), not the first GPU: a ``device="cpu"`` row on a GPU node carries the CPU. The
CPU facts say which part of the CPU the recording process had: its threads, the logical CPUs of
its affinity mask and the physical cores they belong to (:mod:`perfkit.core.cpu_share`). The
model libraries a user's model is built from (transformers, torchvision: :data:`MODEL_LIBRARIES`)
are in it by their installed versions, read from the package metadata without importing them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import __version__
from .devices import cpu_clock_hz, cpu_model_name, detect, torch_build

__all__ = ["fingerprint", "fingerprint_id", "PERF_ENV_PREFIXES", "PERF_ENV_NAMES", "flat_columns",
           "row_device", "fingerprint_columns", "measured_devices", "Described", "MODEL_LIBRARIES",
           "library_version"]

# Environment variables that change what runs or how fast: collective libraries, threading,
# device visibility, allocators, compilers.
PERF_ENV_PREFIXES = ("NCCL_", "RCCL_", "GLOO_", "TORCH_NCCL_", "UCX_", "FI_", "HSA_", "TORCHINDUCTOR_")
PERF_ENV_NAMES = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF", "TORCH_CUDNN_V8_API_ENABLED", "KMP_AFFINITY", "GOMP_CPU_AFFINITY",
)


def _perf_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v for k, v in sorted(environ.items())
        if k in PERF_ENV_NAMES or k.startswith(PERF_ENV_PREFIXES)
    }


@dataclass(frozen=True)
class Described:
    """Another process of this machine and interpreter, as a fingerprint describes it: its
    environment (thread share, performance variables) and working directory (git checkout). The
    sweep engine writes the row of how a configuration ended as its kernel ran."""

    environ: Mapping[str, str]
    cwd: str | Path


def _git(cwd: Path) -> dict:
    """sha and dirty flag of the repository holding ``cwd``, or nulls outside a repository."""
    def run(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = run("rev-parse", "HEAD")
    if sha is None:
        return {"git_sha": None, "git_dirty": None}
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "git_dirty": bool(status) if status is not None else None}


def _torch_facts() -> dict:
    build = torch_build()  # a CPU-only build is described without importing torch
    facts = {"torch": build.version, "torch_cuda": build.cuda, "torch_hip": build.hip, "nccl": None, "cudnn": None}
    if not build.gpu:
        return facts
    import torch

    if torch.cuda.is_available():
        try:
            facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL still has a fingerprint
            facts["nccl"] = None
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


#: Libraries a user's model may be built from (perfkit.measuring.workloads): a new version can
#: change the model code and so the numbers, as a new torch can.
MODEL_LIBRARIES = ("transformers", "torchvision")


def library_version(package: str) -> str | None:
    """The installed version of ``package`` as the package itself says it (``__version__``, with
    its build tag: torchvision's '0.26.0+cu130' where its metadata says '0.26.0', as torch's
    says '2.11.0+cu130'), read from the imported module or from its ``version.py``/``__init__.py``
    without importing it (a CUDA torchvision does not import beside a CPU torch); its metadata's
    where neither names one; None if absent."""
    module = sys.modules.get(package)
    if isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for name in ("version.py", "__init__.py"):
            try:
                text = Path(folder, name).read_text(errors="replace")
            except OSError:
                continue
            if found := re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M):
                return found[1]
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    """GPU driver version from nvidia-smi or the amdgpu module, when present."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return "nvidia " + out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    amd = Path("/sys/module/amdgpu/version")
    if amd.exists():
        return "amdgpu " + amd.read_text().strip()
    return None


@lru_cache(maxsize=8)
def _static(device: str) -> dict:
    """The parts that cannot change within a process, for ``device`` (``auto``, ``cpu``,
    ``cuda``, ``cuda:N``)."""
    from .cpu_share import physical_core_ids

    info = detect(device)
    machine_cpus = range(os.cpu_count() or 1)
    facts = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "perfkit": __version__,
        **_torch_facts(),
        **{package: library_version(package) for package in MODEL_LIBRARIES},
        "device": info.torch_device,
        "device_kind": info.kind,
        "device_name": info.name,
        "device_count": info.count,
        "device_memory_bytes": info.memory_bytes,
        "device_capability": info.capability,
        "device_compute_units": info.compute_units,
        "driver": _driver() if info.kind != "cpu" else None,
        "cpu_model": cpu_model_name(),
        "cpu_logical_cpus": os.cpu_count(),
        "cpu_cores": len(physical_core_ids(machine_cpus)[0]),  # physical, whole machine
    }
    facts["cpu_clock_hz"], _ = cpu_clock_hz()
    return facts


def _cpu_share_facts(threads: int | None = None) -> dict:
    """What this process has of the CPU now (threads and affinity can change at run time), or a
    process of ``threads`` compute threads with this affinity."""
    from .cpu_share import cpu_share

    share = cpu_share(threads=threads)
    return {"torch_threads": share.threads, "cpu_threads": share.threads,
            "cpu_affinity_cpus": len(share.cpus), "cpu_affinity_cores": share.physical_cores,
            "cpu_cores_counted": share.cores, "cpu_topology_source": share.topology_source}


def _describable(device: str) -> str:
    """``device`` if this process can describe it, else ``auto`` (a row that asked for a GPU
    the machine lacks, e.g. a skipped one, is described by what the machine has)."""
    from .errors import BadInputError

    try:
        detect(device) if device != "auto" else None
    except BadInputError:
        return "auto"
    return device


def _dynamic(cwd: str | Path | None, process: Described | None = None) -> dict:
    """The facts that can change while a process runs: this one's, or ``process``'s."""
    from .cpu_share import threads_from_env

    if process is not None:
        cwd = process.cwd
    facts = _git(Path(cwd) if cwd else Path.cwd())
    facts.update(_cpu_share_facts(threads_from_env(process.environ) if process is not None else None))
    facts["env_vars"] = _perf_env(process.environ if process is not None else os.environ)
    facts["argv0"] = Path(sys.executable).name
    return facts


def fingerprint(device: str = "auto", cwd: str | Path | None = None) -> dict:
    """The environment of a measurement on ``device`` as a flat JSON-serialisable dict (see
    module docstring); ``auto`` is the first GPU if any, else the CPU."""
    return {**_static(_describable(device)), **_dynamic(cwd)}


_TORCH_DEVICE = re.compile(r"^(cpu|cuda)(:\d+)?$")
#: Columns naming the device a row measured, most specific first: a row's own ``device``
#: (``cuda:1``), else what ``auto`` resolved to (``resolved_device`` of training rows).
_DEVICE_COLUMNS = ("device", "resolved_device")


def row_device(row) -> str:
    """The device a row (a mapping) measured: its first :data:`_DEVICE_COLUMNS` value that is a
    torch device (``cpu``, ``cuda``, ``cuda:N``), else ``auto``."""
    for col in _DEVICE_COLUMNS:
        value = row.get(col)
        if isinstance(value, str) and _TORCH_DEVICE.match(value):
            return value
    return "auto"


def fingerprint_columns(frame, process: Described | None = None):
    """The :func:`flat_columns` of every row of ``frame``, each for the device it measured
    (:func:`row_device`); a DataFrame aligned with ``frame`` by position. ``process``: the process
    that measured them, where it is not this one."""
    import pandas as pd

    cols = [c for c in _DEVICE_COLUMNS if c in frame.columns]
    devices = ([row_device(r) for r in frame[cols].to_dict("records")] if cols
               else ["auto"] * len(frame))
    dynamic = _dynamic(None, process)  # git and the CPU share: read once per record, not per device
    flat = {d: flat_columns({**_static(_describable(d)), **dynamic}) for d in set(devices)}
    return pd.DataFrame([flat[d] for d in devices], index=range(len(frame)))


def fingerprint_id(facts: dict) -> str:
    """A short stable hash of the fingerprint, ignoring nothing: equal id, equal environment."""
    blob = json.dumps(facts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flat_columns(facts: dict) -> dict:
    """The fingerprint as row columns: key facts as ``env_*`` columns, the whole as JSON."""
    keys = ("hostname", "torch", "torch_cuda", "torch_hip", "nccl", *MODEL_LIBRARIES, "device", "device_kind",
            "device_name", "device_count", "device_compute_units", "driver", "cpu_model",
            "cpu_threads", "cpu_cores_counted", "git_sha", "git_dirty", "perfkit", "python")
    cols = {f"env_{k}": facts.get(k) for k in keys}
    cols["env_fingerprint_id"] = fingerprint_id(facts)
    cols["env_json"] = json.dumps(facts, sort_keys=True, default=str)
    return cols


def measured_devices(df):
    """Per row of recorded ``df``: the device it measured, as ``kind`` (``cpu``, ``cuda``,
    ``rocm``), ``name`` and ``compute_units`` (a DataFrame aligned with ``df``).

    The row's own device column decides the kind, so a CPU row is a CPU row even when its
    fingerprint describes a GPU (rows recorded before fingerprints followed the row's device);
    a GPU row whose fingerprint describes no GPU has an unknown (None) name: no peaks are drawn
    for it rather than another device's.
    """
    import pandas as pd

    out = []
    for row in df.to_dict("records"):
        device = row_device(row)
        env_kind, env_name = row.get("env_device_kind"), row.get("env_device_name")
        units = row.get("env_device_compute_units")
        units = int(units) if isinstance(units, (int, float)) and units == units else None
        if device.startswith("cpu"):
            name = row.get("env_cpu_model") or (env_name if env_kind == "cpu" else None)
            out.append(("cpu", name, None))
        elif device.startswith("cuda"):
            gpu = env_kind in ("cuda", "rocm")
            out.append((env_kind if gpu else "cuda", env_name if gpu else None, units if gpu else None))
        else:
            out.append((env_kind, env_name, units))
    return pd.DataFrame(out, columns=["kind", "name", "compute_units"], index=df.index)
