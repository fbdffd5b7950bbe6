"""Precision policy: what a named precision means for torch's math settings, on every device.

One policy for every place perfkit names a precision (the training step, the roofline step, GEMM,
the measured ceilings), so "fp32" means IEEE fp32 everywhere and tf32 only where it is asked for:

- :func:`math_mode` sets, for the block, the process-global fp32 math of matmuls (cuBLAS/hipBLASLt
  and oneDNN) *and* of cuDNN/MIOpen convolutions and RNNs, then restores what was there. cuDNN's
  own default lets fp32 convolutions run in TF32 (``torch.backends.cudnn.allow_tf32`` is True
  out of the box, PyTorch docs, notes/cuda "TensorFloat-32 (TF32) on Ampere (and later)
  devices"), so a step that only turned off matmul TF32 put fp32 points above the fp32 roof.
- ROCm: upstream PyTorch runs fp32 matmuls in TF32 (hipBLASLt xf32) from torch 2.7 on, and only
  with ``HIPBLASLT_ALLOW_TF32=1`` in the environment (pytorch/pytorch#143549; read at each check
  since #147186, once per process before it; earlier ROCm builds ignored ``allow_tf32``).
  :func:`math_mode` sets the variable for a tf32 block and verifies that torch then reports
  TF32 on; :func:`support_reason` says why not, before any work, where it cannot be honoured.
- fp8: MI300 (gfx942) computes in the "fnuz" e4m3 variant, MI350 (gfx950) and RDNA4 (gfx12) in
  OCP e4m3 (hipBLASLt docs, "Data type support": ``hipblaslt_f8_fnuz`` only on gfx942,
  ``hipblaslt_f8`` only on gfx950 and gfx12); :func:`fp8_e4m3_dtype` picks by the device's arch.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

from .errors import BadInputError, ConfigurationSkipped

__all__ = ["PRECISIONS", "ROCM_TF32_ENV", "math_mode", "fp8_e4m3_dtype", "fp8_reason",
           "rocm_tf32_reason", "support_reason"]

#: Every precision perfkit names (training step, roofline step, GEMM, ceilings).
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "bf16-pure", "fp8")
#: The variable upstream PyTorch (>= 2.7) on ROCm reads before it lets fp32 matmuls use TF32.
ROCM_TF32_ENV = "HIPBLASLT_ALLOW_TF32"
#: First torch release whose ROCm build runs TF32 matmuls at all (pytorch/pytorch#143549).
_ROCM_TF32_TORCH = (2, 7)

# The fine-grained knobs of torch >= 2.9 (torch.backends.<backend>.<op>.fp32_precision). Set next
# to the legacy ones so that both views agree: torch raises when code reads a legacy flag that
# the other API left in a different state ("mix of legacy and new APIs").
_FINE_KNOBS = (("cuda", "matmul"), ("cudnn", "conv"), ("cudnn", "rnn"),
               ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))


def _knob(backend: str, op: str):
    return getattr(getattr(torch.backends, backend), op)


def _has_fine_knobs() -> bool:
    return hasattr(torch.backends, "cudnn") and hasattr(torch.backends.cudnn, "conv")


def _save() -> dict:
    """Every TF32 setting the policy touches, raw, so that exactly it can be put back."""
    saved = {}
    # A legacy read raises when the user left the two APIs disagreeing (e.g. oneDNN matmul set
    # to bf16 with the legacy precision "highest"); the fine knobs then restore that state.
    for key, read in (("matmul_precision", torch.get_float32_matmul_precision),
                      ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32)):
        try:
            saved[key] = read()
        except RuntimeError:
            saved[key] = None
    if _has_fine_knobs():
        saved["fine"] = {k: _knob(*k).fp32_precision for k in _FINE_KNOBS}
        saved["fine"].update({(b, "all"): getattr(torch.backends, b).fp32_precision
                              for b in ("cudnn", "mkldnn")})
    return saved


def _restore(saved: dict) -> None:
    if saved["matmul_precision"] is not None:
        torch.set_float32_matmul_precision(saved["matmul_precision"])
    if saved["cudnn_allow_tf32"] is not None:
        torch.backends.cudnn.allow_tf32 = saved["cudnn_allow_tf32"]
    for (backend, op), value in saved.get("fine", {}).items():
        target = getattr(torch.backends, backend) if op == "all" else _knob(backend, op)
        target.fp32_precision = value


def _apply(tf32: bool) -> None:
    # Legacy flags: what torch < 2.9 reads, and what most user code reads back.
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if _has_fine_knobs():
        # Explicit per-op values: "none" would inherit torch.backends.fp32_precision, which a
        # user may have set to tf32. oneDNN stays IEEE: its bf16 mode is not fp32 either.
        mode = "tf32" if tf32 else "ieee"
        for backend, op in _FINE_KNOBS:
            _knob(backend, op).fp32_precision = mode if backend != "mkldnn" else "ieee"


def _cublas_tf32_on() -> bool:
    """What torch reports for matmul TF32 now (on ROCm it already applies the env gate)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


@contextlib.contextmanager
def math_mode(precision: str) -> Iterator[None]:
    """fp32 math as ``precision`` names it, for the block; the previous settings after it.

    ``tf32``: TF32 for fp32 matmuls and cuDNN convolutions/RNNs (on ROCm with
    ``HIPBLASLT_ALLOW_TF32=1`` set for the block, and :class:`ConfigurationSkipped` when this torch
    still does not run TF32). Any other precision (``fp32``, ``fp64``, ``bf16``, ``fp16``,
    ``bf16-pure``, ``fp8``): IEEE fp32 for every fp32 op, so an op left in fp32 (a loss, a
    norm, an autocast exclusion) is not silently TF32. Settings are process-global, so blocks
    must not run concurrently in threads with different precisions.
    """
    if precision not in PRECISIONS:
        raise BadInputError(f"precision {precision!r} is not one perfkit knows; valid: "
                            f"{', '.join(PRECISIONS)}")
    tf32 = precision == "tf32"
    saved = _save()
    hip = bool(getattr(torch.version, "hip", None))
    env_before = os.environ.get(ROCM_TF32_ENV)
    try:
        if tf32 and hip:
            os.environ[ROCM_TF32_ENV] = "1"
        _apply(tf32)
        if tf32 and hip and not _cublas_tf32_on():
            raise ConfigurationSkipped(
                f"tf32 on ROCm: torch {torch.__version__} still reports TF32 off with "
                f"{ROCM_TF32_ENV}=1 set in-process (a build that reads it once at start-up); "
                f"launch with {ROCM_TF32_ENV}=1 in the environment")
        yield
    finally:
        _restore(saved)
        if tf32 and hip:
            if env_before is None:
                os.environ.pop(ROCM_TF32_ENV, None)
            else:
                os.environ[ROCM_TF32_ENV] = env_before


def _torch_release(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _gfx(arch: str) -> str:
    """``"gfx942:sramecc+:xnack-"`` → ``"gfx942"``."""
    return (arch or "").split(":")[0].strip().lower()


def rocm_tf32_reason(arch: str, torch_version: str | None = None) -> str | None:
    """Why a ROCm device of ``arch`` cannot run tf32 under this torch, or None."""
    version = torch_version or torch.__version__
    if _torch_release(version) < _ROCM_TF32_TORCH:
        return (f"tf32 on ROCm needs torch >= 2.7 (pytorch/pytorch#143549); this is "
                f"torch {version}, whose ROCm build ignores allow_tf32")
    if not _gfx(arch).startswith(("gfx94", "gfx95")):
        return f"tf32 on ROCm needs MI300-class hardware (gfx94x/gfx95x); this is {arch}"
    return None


def fp8_e4m3_dtype(arch: str | None) -> torch.dtype | None:
    """The e4m3 fp8 dtype the device computes in: OCP ``float8_e4m3fn`` on NVIDIA (``arch``
    None), gfx950 and gfx12; ``float8_e4m3fnuz`` on gfx94x (MI300); None when it has no fp8."""
    if arch is None:
        return torch.float8_e4m3fn
    gfx = _gfx(arch)
    if gfx.startswith("gfx94"):
        return torch.float8_e4m3fnuz
    if gfx.startswith(("gfx95", "gfx12")):
        return torch.float8_e4m3fn
    return None


def fp8_reason(arch: str) -> str | None:
    """Why a ROCm device of ``arch`` has no fp8 matmul, or None."""
    if fp8_e4m3_dtype(arch) is None:
        return (f"fp8 on ROCm needs gfx942 (MI300, fnuz e4m3), gfx950 (MI350) or gfx12 "
                f"(OCP e4m3); this is {arch}")
    return None


def _rocm_arch(device: str) -> str:
    return torch.cuda.get_device_properties(torch.device(device)).gcnArchName


def support_reason(precision: str, device: str) -> str | None:
    """ROCm's part of "can ``device`` honour ``precision``": why not, or None.

    Only the ROCm-specific conditions live here (the torch release and arch tf32 needs, the fp8
    variant); NVIDIA's and the CPU's are the callers' capability checks. A missing
    ``HIPBLASLT_ALLOW_TF32`` is no reason: :func:`math_mode` sets it for the block.
    """
    if str(device).split(":")[0] != "cuda" or not getattr(torch.version, "hip", None):
        return None
    arch = _rocm_arch(device)
    if precision == "tf32":
        return rocm_tf32_reason(arch)
    if precision == "fp8":
        return fp8_reason(arch)
    return None
