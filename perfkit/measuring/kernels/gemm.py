"""GEMM throughput: time ``A @ B`` per (size, dtype) and report achieved FLOP/s and bytes/s.

FLOP = 2·M·N·K and minimum bytes = (M·K + K·N)·s_in + M·N·s_out (shared/reference/formulas.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from perfkit.core.devices import resolve_device
from perfkit.core.formulas import gemm_flop, gemm_min_bytes
from perfkit.core.progress import progress
from perfkit.core.timing import measure

__all__ = ["DTYPES", "dtype_support", "measure_gemm"]

#: perfkit's precision names → torch dtypes (tf32 is fp32 storage with TF32 tensor-core math).
DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def dtype_support(dtype: str, device: str) -> str | None:
    """None when ``device`` can run ``dtype`` as asked, else the reason it cannot."""
    import torch

    if dtype not in DTYPES:
        return f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}"
    kind = device.split(":")[0]
    if dtype == "tf32":
        if kind != "cuda":
            return "tf32 is a GPU matrix-unit mode (NVIDIA sm_80+, AMD MI300+); this is a CPU"
        if getattr(torch.version, "hip", None):
            from perfkit.core.precision import support_reason

            return support_reason(dtype, device)
        if torch.cuda.get_device_capability(torch.device(device))[0] < 8:
            return "tf32 needs compute capability >= 8.0 (Ampere or later)"
    return None


def measure_gemm(
    sizes: Iterable[int],
    dtypes: Iterable[str],
    *,
    device: str = "auto",
    min_run_time_s: float = 0.2,
    seed: int = 0,
) -> list[dict]:
    """One row per (size, dtype): square M=N=K=size matmuls.

    A dtype the device cannot honour gives a ``skipped`` row with the reason, never a silent
    substitute (tf32 on CPU is not fp32).
    """
    import torch

    from perfkit.core.precision import math_mode

    device = resolve_device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    points = [(dtype, size) for dtype in dtypes for size in sizes]
    for dtype, size in progress(points, desc="GEMM", unit="point"):
        base = {"workload": "gemm", "size": int(size), "m": int(size), "n": int(size), "k": int(size), "dtype": dtype,
                "device": device}
        reason = dtype_support(dtype, device)
        if reason:
            rows.append({**base, "status": "skipped", "reason": reason})
            continue
        torch_dtype = getattr(torch, DTYPES[dtype])
        a = torch.randn(size, size, generator=gen).to(device=device, dtype=torch_dtype)
        b = torch.randn(size, size, generator=gen).to(device=device, dtype=torch_dtype)
        out = torch.empty(size, size, device=device, dtype=torch_dtype)
        # fp32 is IEEE fp32 (a user's allow_tf32 or oneDNN's bf16 mode would inflate it).
        with math_mode(dtype):
            m = measure(lambda: torch.matmul(a, b, out=out), min_run_time_s=min_run_time_s,
                        device=device, label=f"matmul {size}^3 {dtype}")
        flop = gemm_flop(size, size, size)
        nbytes = gemm_min_bytes(size, size, size, a.element_size())
        rows.append({
            **base, "status": "ok", "reason": None,
            "flop": flop, "bytes": nbytes,
            **m.as_row("time"),
            "flop_per_s": flop / m.median_s,
            "bytes_per_s": nbytes / m.median_s,
        })
    return rows
