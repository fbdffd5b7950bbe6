"""Measured ceilings: the best matmul throughput per dtype, and the table of every ceiling.

- Compute: the best ``torch.matmul`` FLOP/s per dtype over shapes searched until the best stops
  improving (``perfkit.measuring.kernels.shape_search``); FLOP = 2·M·N·K, and the winning (M, N, K) is in the row.
- Memory: the STREAM triad's bandwidth curve (:mod:`perfkit.measuring.kernels.stream`), its plateaus
  found and named (L1, L2, L3, DRAM or HBM) as the Empirical Roofline Toolkit does (Lo et al.,
  PMBS 2014; :mod:`perfkit.analyse.levels`); DRAM/HBM only at >= 8× the caches the OS reports
  (:mod:`perfkit.core.caches`). Every roof of a machine (``perfkit peaks``, the roofline and
  inference notebooks) comes from this one default sweep and rule.

:func:`measure_ceilings` returns the ceilings table shared with the roofline analysis
(``origin="measured"``); spec ceilings are appended elsewhere (``perfkit.core.specs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from perfkit.core.devices import resolve_device
from perfkit.core.errors import BadInputError
from perfkit.core.formulas import gemm_flop
from perfkit.core.timing import measure
from perfkit.analyse.levels import detect_levels
from perfkit.measuring.kernels.gemm import DTYPES
from perfkit.measuring.kernels.shape_search import SearchResult, search_best_shape
from perfkit.measuring.kernels.stream import caches, free_memory_bytes, measure_bandwidth_curve

__all__ = [
    "CEILING_COLUMNS",
    "MATMUL_SHAPE_COLUMNS",
    "compute_dtypes",
    "measure_ceilings",
    "measure_matmul_throughput",
]

#: Columns of the ceilings table, shared with the roofline analysis and the spec rows.
CEILING_COLUMNS = ("kind", "dtype", "level", "value", "unit", "origin", "source", "method", "iqr",
                   "noisy", "working_set_bytes")
#: Extra columns of compute ceilings: the (M, N, K) of the matmul that reached the ceiling (and
#: ``shapes_tried``: every measurement of the search, "MxNxK FLOP/s", in the order measured).
MATMUL_SHAPE_COLUMNS = ("m", "n", "k")

# Where the shape search (perfkit.measuring.kernels.shape_search) starts and how far it may go. The best size
# differs between machines (cores, vector width, matrix units, cache sizes), hence a search.
# CPU starts stay small: half precision without matrix units runs at a few GFLOP/s. A candidate
# whose one call would outlast the max seconds per call (estimated from the best rate so far)
# is not tried: it keeps `perfkit peaks` quick on a 2-core machine.
_CPU_START_N = {"fp64": 512, "fp32": 1024, "bf16": 512}
_SEARCH = {  # (device kind, quick) → (min_n, max_n, max seconds per call)
    ("cpu", True): (128, 4096, 0.5), ("cpu", False): (128, 8192, 4.0),
    ("gpu", True): (1024, 16384, 0.5), ("gpu", False): (1024, 32768, 4.0),
}


# --------------------------------------------------------------------------------------------
# Compute ceilings

def _kind(device: str) -> str:
    return device.split(":")[0]


def compute_dtypes(device: str = "cpu") -> dict[str, str | None]:
    """Every precision perfkit knows → None if ``device`` can run it natively, else why not."""
    import torch

    out = dict.fromkeys(("fp64", "fp32", "tf32", "bf16", "fp16", "fp8"), None)
    if _kind(device) == "cpu":
        out["tf32"] = "tf32 is a tensor-core mode of NVIDIA GPUs; a CPU cannot honour it"
        out["fp16"] = "fp16 matmul on CPU is not measured (perfkit's CPU ceilings: fp64, fp32, bf16)"
        out["fp8"] = "fp8 matmul needs Hopper/Ada (sm_89+) or MI300 hardware"
        return out
    props = torch.cuda.get_device_properties(torch.device(device))
    arch = getattr(props, "gcnArchName", "") or ""
    if getattr(torch.version, "hip", None):
        from perfkit.core.precision import fp8_reason, rocm_tf32_reason

        out["tf32"], out["fp8"] = rocm_tf32_reason(arch), fp8_reason(arch)
        return out
    cap = (props.major, props.minor)
    if cap < (8, 0):
        out["tf32"] = out["bf16"] = f"needs compute capability >= 8.0; this is {cap[0]}.{cap[1]}"
    if cap < (8, 9):
        out["fp8"] = f"fp8 needs compute capability >= 8.9; this is {cap[0]}.{cap[1]}"
    return out


def _search(device: str, dtype: str, quick: bool, rate) -> SearchResult:
    """Search the shape of ``dtype``'s best matmul throughput on ``device`` (rate measures one)."""
    on_cpu = _kind(device) == "cpu"
    min_n, max_n, max_call_s = _SEARCH[("cpu" if on_cpu else "gpu", quick)]
    free = free_memory_bytes(device)

    def fits(shape, best_flop_per_s: float) -> bool:
        m, n, k = shape
        # fp32 sources + converted operands + output: at most 12 bytes per element of A, B, C.
        return (gemm_flop(m, n, k) / best_flop_per_s <= max_call_s
                and 12 * (m * k + k * n + m * n) <= free // 2)

    start = _CPU_START_N.get(dtype, 512) if on_cpu else 4096
    # A GPU's squares up to 16384 take milliseconds: all of them, not a climb that stops on noise.
    return search_best_shape(rate, start, min_n=min_n, max_n=max_n, fits=fits, exhaustive=not on_cpu)


def _matmul_fn(device: str, dtype: str, m: int, n: int, k: int):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=gen, device=device)
    b = torch.randn(k, n, generator=gen, device=device)
    if dtype == "fp8":
        # torch._scaled_mm wants e4m3 operands, B column-major, and float32 scales; the e4m3
        # variant is the device's (MI300: fnuz, MI350 and NVIDIA: OCP).
        from perfkit.core.precision import fp8_e4m3_dtype

        hip = getattr(torch.version, "hip", None)
        f8 = fp8_e4m3_dtype(torch.cuda.get_device_properties(torch.device(device)).gcnArchName
                            if hip else None)
        a8, b8 = a.to(f8), b.t().contiguous().to(f8).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch_dtype = getattr(torch, DTYPES[dtype])
    a, b = a.to(torch_dtype), b.to(torch_dtype)
    if _kind(device) != "cpu":
        # As a model's code calls it (the H200 reference: a plain `a @ b`): the caching allocator
        # makes the output's allocation free, and cuBLAS picks its kernel for this call, not an out=.
        return lambda: a @ b
    out = torch.empty(m, n, device=device, dtype=torch_dtype)  # a CPU's malloc of C per call is not free
    return lambda: torch.matmul(a, b, out=out)


def measure_matmul_throughput(device: str = "cpu", *, quick: bool = True,
                              dtypes: Sequence[str] | None = None,
                              shapes: Sequence[tuple[int, int, int]] | None = None,
                              min_run_time_s: float | None = None) -> pd.DataFrame:
    """One row per (dtype, shape): ``torch.matmul`` timed with :func:`perfkit.core.timing.measure`.

    ``dtypes`` defaults to every precision the device supports; asking for one it cannot honour
    raises :class:`BadInputError` with the reason. ``shapes`` (M, N, K) are measured as given;
    without them each dtype's shapes are searched (:mod:`perfkit.measuring.kernels.shape_search`) until the best
    stops improving, and the rows are the shapes the search measured (``searched`` True).
    """
    from perfkit.core.precision import math_mode

    device = resolve_device(device)
    support = compute_dtypes(device)
    if dtypes is None:
        dtypes = [d for d, reason in support.items() if reason is None]
    for d in dtypes:
        if d not in support:
            raise BadInputError(f"unknown dtype {d!r}; choose from {', '.join(support)}")
        if support[d] is not None:
            raise BadInputError(f"{d} on {device}: {support[d]}")
    # Quick: 0.1 s per shape, since the search measures ~8 shapes per dtype (the 3-sample
    # minimum and the IQR flag still hold).
    run_s = min_run_time_s if min_run_time_s is not None else (0.1 if quick else 1.0)
    rows = []
    for dtype in dtypes:
        def rate(shape, dtype=dtype) -> float:
            m, n, k = shape
            fn = _matmul_fn(device, dtype, m, n, k)
            flop = gemm_flop(m, n, k)
            # A call estimated (from this dtype's best rate so far) to last >= 0.1 s is its own
            # warm-up: one call outlasts the start-up transient that measure()'s time-based
            # warm-up exists for, and a second would only make the search slower.
            prior = max((r["flop_per_s"] for r in rows if r["dtype"] == dtype), default=None)
            warmup = 1 if prior and flop / prior >= 0.1 else None
            with math_mode(dtype):  # fp32 is IEEE fp32, tf32 only when asked (perfkit.core.precision)
                meas = measure(fn, min_run_time_s=run_s, warmup_calls=warmup, device=device,
                               label=f"matmul {m}x{n}x{k} {dtype}")
            rows.append({"device": device, "dtype": dtype, "m": m, "n": n, "k": k, "flop": flop, **meas.as_row("time"),
                         "flop_per_s": flop / meas.median_s,
                         # FLOP/s quantiles are FLOP / time quantiles, in reverse order
                         "flop_per_s_iqr": flop / meas.percentile(25) - flop / meas.percentile(75),
                         "searched": shapes is None})
            return rows[-1]["flop_per_s"]

        if shapes is None:
            _search(device, dtype, quick, rate)
        else:
            for shape in shapes:
                rate(tuple(shape))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The ceilings table

def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def measure_ceilings(device: str = "cpu", quick: bool = True, *, dtypes: Sequence[str] | None = None,
                     shapes: Sequence[tuple[int, int, int]] | None = None,
                     max_working_set_bytes: int | None = None, threads: int | None = None,
                     curve: pd.DataFrame | None = None) -> pd.DataFrame:
    """The measured ceilings of ``device``: one row per compute dtype and per memory level.

    Columns :data:`CEILING_COLUMNS` (+ the plateau span for memory rows, + the winning matmul's
    :data:`MATMUL_SHAPE_COLUMNS` for compute rows); ``value``/``iqr`` in FLOP/s or bytes/s.
    Compute ceilings are searched over shapes unless ``shapes`` are given. Memory ceilings come from the triad (stream.c's headline kernel) of
    ``curve`` when given (a :func:`measure_bandwidth_curve` result), else of a fresh sweep.
    """
    device = resolve_device(device)
    mm = measure_matmul_throughput(device, quick=quick, dtypes=dtypes, shapes=shapes)
    rows = []
    for dtype, group in mm.groupby("dtype", sort=False):
        best = group.loc[group["flop_per_s"].idxmax()]
        tried = [f"{r.m}x{r.n}x{r.k} {r.flop_per_s:.4g}" for r in group.itertuples()]
        rows.append({"kind": "compute", "dtype": dtype, "level": None, "value": float(best["flop_per_s"]),
                     "unit": "FLOP/s", "origin": "measured",
                     "source": f"best torch.matmul over {len(group)} "
                               f"{'searched' if group['searched'].all() else 'given'} shapes "
                               f"(best {best['m']}x{best['n']}x{best['k']})",
                     "method": "matmul", "iqr": float(best["flop_per_s_iqr"]), "noisy": bool(best["noisy"]),
                     "working_set_bytes": None, "m": int(best["m"]), "n": int(best["n"]), "k": int(best["k"]),
                     "shapes_tried": tried})
    if curve is None:
        curve = measure_bandwidth_curve(device, quick=quick, kernels=["triad"], threads=threads,
                                        max_working_set_bytes=max_working_set_bytes)
    triad = curve[curve["kernel"] == "triad"]
    if triad.empty:
        raise BadInputError("the bandwidth curve holds no triad rows")
    on_cpu = _kind(device) == "cpu"
    found = caches(device, int(triad["threads"].iloc[0]))
    levels = detect_levels(triad, cache_sizes=found.sizes_bytes, memory_name="DRAM" if on_cpu else "HBM")
    how = "C OpenMP STREAM triad" if triad["backend"].iloc[0] == "cpp" else "torch-op STREAM triad"
    # Why there is no DRAM/HBM row (or why levels are numbered) travels with the rows there are.
    note = levels.attrs.get("note")
    note = f"{found.source}; {note}" if note and not found.known else note
    for lvl in levels.itertuples():
        span = f"{how}, plateau {_size(lvl.working_set_min_bytes)}–{_size(lvl.working_set_max_bytes)}"
        rows.append({"kind": "memory", "dtype": None, "level": lvl.level, "value": lvl.bytes_per_s,
                     "unit": "bytes/s", "origin": "measured",
                     "source": f"{span}; {note}" if note else span,
                     "method": "stream_triad", "iqr": lvl.iqr, "noisy": lvl.noisy,
                     "working_set_bytes": lvl.working_set_bytes,
                     "working_set_min_bytes": lvl.working_set_min_bytes,
                     "working_set_max_bytes": lvl.working_set_max_bytes})
    table = pd.DataFrame(rows, columns=[*CEILING_COLUMNS, "working_set_min_bytes", "working_set_max_bytes",
                                        *MATMUL_SHAPE_COLUMNS, "shapes_tried"])
    table.attrs["memory_note"] = note
    return table
