"""The environment fingerprint: everything that can change a performance number.

Every recorded row carries it (flattened as ``env_*`` columns plus the whole JSON), so two rows
measured on different software or hardware are never compared without it being visible.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from . import __version__
from .devices import cpu_clock_hz, cpu_model_name, detect

__all__ = ["fingerprint", "fingerprint_id", "PERF_ENV_PREFIXES", "PERF_ENV_NAMES", "flat_columns"]

# Environment variables that change what runs or how fast: collective libraries, threading,
# device visibility, allocators, compilers.
PERF_ENV_PREFIXES = ("NCCL_", "RCCL_", "GLOO_", "TORCH_NCCL_", "UCX_", "FI_", "HSA_", "TORCHINDUCTOR_")
PERF_ENV_NAMES = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF", "TORCH_CUDNN_V8_API_ENABLED", "KMP_AFFINITY", "GOMP_CPU_AFFINITY",
)


def _perf_env() -> dict[str, str]:
    return {
        k: v for k, v in sorted(os.environ.items())
        if k in PERF_ENV_NAMES or k.startswith(PERF_ENV_PREFIXES)
    }


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
    import torch

    facts = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "nccl": None,
        "cudnn": None,
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        try:
            facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL still has a fingerprint
            facts["nccl"] = None
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


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
    """The parts that cannot change within a process."""
    info = detect(device)
    facts = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "perfkit": __version__,
        **_torch_facts(),
        "device_kind": info.kind,
        "device_name": info.name,
        "device_count": info.count,
        "device_memory_bytes": info.memory_bytes,
        "device_capability": info.capability,
        "driver": _driver() if info.kind != "cpu" else None,
        "cpu_model": cpu_model_name(),
        "cpu_cores": os.cpu_count(),
    }
    facts["cpu_clock_hz"], _ = cpu_clock_hz()
    return facts


def fingerprint(device: str = "auto", cwd: str | Path | None = None) -> dict:
    """The environment as a flat JSON-serialisable dict (see module docstring)."""
    facts = dict(_static(device))
    facts.update(_git(Path(cwd) if cwd else Path.cwd()))
    facts["env_vars"] = _perf_env()
    facts["argv0"] = Path(sys.executable).name
    return facts


def fingerprint_id(facts: dict) -> str:
    """A short stable hash of the fingerprint, ignoring nothing: equal id, equal environment."""
    blob = json.dumps(facts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flat_columns(facts: dict) -> dict:
    """The fingerprint as row columns: key facts as ``env_*`` columns, the whole as JSON."""
    keys = ("hostname", "torch", "torch_cuda", "torch_hip", "nccl", "device_kind", "device_name",
            "device_count", "driver", "cpu_model", "git_sha", "git_dirty", "perfkit", "python")
    cols = {f"env_{k}": facts.get(k) for k in keys}
    cols["env_fingerprint_id"] = fingerprint_id(facts)
    cols["env_json"] = json.dumps(facts, sort_keys=True, default=str)
    return cols
