"""Measured ceilings: the best matmul throughput per dtype, and bandwidth per memory level.

- Compute: the best ``torch.matmul`` FLOP/s per dtype over shapes searched until the best stops
  improving (``perfkit.shape_search``); FLOP = 2·M·N·K, and the winning (M, N, K) is in the row.
- Memory: STREAM kernels (McCalpin, https://www.cs.virginia.edu/stream/) over working sets from
  KiB to past the last-level cache; the curve's plateaus are found and named (L1, L2, L3, DRAM or
  HBM) as the Empirical Roofline Toolkit does (Lo et al., PMBS 2014). On CPU the kernels are C++
  with OpenMP (``csrc/stream_kernels.cpp``, built at first use): a torch-op triad reaches ~60% of
  what a C STREAM triad reaches on a 2-core Xeon, and the roof must be the machine's, not torch's.

Bytes follow stream.c's convention: reads + writes, no write-allocate traffic; per element copy
and scale move 2 words, add and triad 3. ``working_set_bytes`` is the size of all arrays the
kernel touches. :func:`measure_ceilings` returns the ceilings table shared with the roofline
analysis (``origin="measured"``); spec ceilings are appended elsewhere (``perfkit.devices``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .devices import resolve_device
from .errors import BadInputError, PerfkitError
from .gemm import gemm_flop
from .levels import cpu_cache_sizes, detect_levels  # noqa: F401 - re-exported
from .shape_search import SearchResult, search_best_shape
from .timing import measure

__all__ = [
    "CEILING_COLUMNS",
    "MATMUL_SHAPE_COLUMNS",
    "STREAM_KERNELS",
    "ExtensionBuildError",
    "compute_dtypes",
    "cpu_cache_sizes",
    "detect_levels",
    "load_stream_extension",
    "measure_bandwidth_curve",
    "measure_ceilings",
    "measure_matmul_throughput",
]

#: Columns of the ceilings table, shared with the roofline analysis and the spec rows.
CEILING_COLUMNS = ("kind", "dtype", "level", "value", "unit", "origin", "source", "method", "iqr",
                   "noisy", "working_set_bytes")
#: Extra columns of compute ceilings: the (M, N, K) of the matmul that reached the ceiling.
MATMUL_SHAPE_COLUMNS = ("m", "n", "k")

#: Words moved per element (stream.c's ``bytes[]``: 2, 2, 3, 3 × sizeof(STREAM_TYPE)); also the
#: number of arrays each kernel touches.
STREAM_KERNELS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}
_SCALAR = 3.0  # stream.c's scalar

# Where the shape search (perfkit.shape_search) starts and how far it may go. The best size
# differs between machines (cores, vector width, matrix units, cache sizes), hence a search.
# CPU starts stay small: half precision without matrix units runs at a few GFLOP/s. A candidate
# whose one call would outlast the max seconds per call (estimated from the best rate so far)
# is not tried: it keeps `perfkit peaks` quick on a 2-core machine.
_CPU_START_N = {"fp64": 512, "fp32": 1024, "bf16": 512}
_SEARCH = {  # (device kind, quick) → (min_n, max_n, max seconds per call)
    ("cpu", True): (128, 4096, 0.5), ("cpu", False): (128, 8192, 4.0),
    ("gpu", True): (1024, 16384, 0.5), ("gpu", False): (1024, 32768, 4.0),
}


class ExtensionBuildError(PerfkitError):
    """The C++ STREAM extension could not be built (no compiler, no OpenMP); nothing was measured."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"building perfkit's STREAM kernels failed: {message}")


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
        from .precision import fp8_reason, rocm_tf32_reason

        out["tf32"], out["fp8"] = rocm_tf32_reason(arch), fp8_reason(arch)
        return out
    cap = (props.major, props.minor)
    if cap < (8, 0):
        out["tf32"] = out["bf16"] = f"needs compute capability >= 8.0; this is {cap[0]}.{cap[1]}"
    if cap < (8, 9):
        out["fp8"] = f"fp8 needs compute capability >= 8.9; this is {cap[0]}.{cap[1]}"
    return out


def _free_memory_bytes(device: str) -> int:
    import torch

    if _kind(device) == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return torch.cuda.mem_get_info(torch.device(device))[0]


def _search(device: str, dtype: str, quick: bool, rate) -> SearchResult:
    """Search the shape of ``dtype``'s best matmul throughput on ``device`` (rate measures one)."""
    on_cpu = _kind(device) == "cpu"
    min_n, max_n, max_call_s = _SEARCH[("cpu" if on_cpu else "gpu", quick)]
    free = _free_memory_bytes(device)

    def fits(shape, best_flop_per_s: float) -> bool:
        m, n, k = shape
        # fp32 sources + converted operands + output: at most 12 bytes per element of A, B, C.
        return (gemm_flop(m, n, k) / best_flop_per_s <= max_call_s
                and 12 * (m * k + k * n + m * n) <= free // 2)

    start = _CPU_START_N.get(dtype, 512) if on_cpu else 4096
    return search_best_shape(rate, start, min_n=min_n, max_n=max_n, fits=fits)


def _matmul_fn(device: str, dtype: str, m: int, n: int, k: int):
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=gen, device=device)
    b = torch.randn(k, n, generator=gen, device=device)
    if dtype == "fp8":
        # torch._scaled_mm wants e4m3 operands, B column-major, and float32 scales; the e4m3
        # variant is the device's (MI300: fnuz, MI350 and NVIDIA: OCP).
        from .precision import fp8_e4m3_dtype

        hip = getattr(torch.version, "hip", None)
        f8 = fp8_e4m3_dtype(torch.cuda.get_device_properties(torch.device(device)).gcnArchName
                            if hip else None)
        a8, b8 = a.to(f8), b.t().contiguous().to(f8).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch_dtype = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
                   "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a, b = a.to(torch_dtype), b.to(torch_dtype)
    out = torch.empty(m, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b, out=out)


def measure_matmul_throughput(device: str = "cpu", *, quick: bool = True,
                              dtypes: Sequence[str] | None = None,
                              shapes: Sequence[tuple[int, int, int]] | None = None,
                              min_run_time_s: float | None = None) -> pd.DataFrame:
    """One row per (dtype, shape): ``torch.matmul`` timed with :func:`perfkit.timing.measure`.

    ``dtypes`` defaults to every precision the device supports; asking for one it cannot honour
    raises :class:`BadInputError` with the reason. ``shapes`` (M, N, K) are measured as given;
    without them each dtype's shapes are searched (:mod:`perfkit.shape_search`) until the best
    stops improving, and the rows are the shapes the search measured (``searched`` True).
    """
    from .precision import math_mode

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
            with math_mode(dtype):  # fp32 is IEEE fp32, tf32 only when asked (perfkit.precision)
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
# Memory bandwidth

def _host_tag() -> str:
    """Short hash of the CPU model and ISA flags: ``-march=native`` code must not be loaded
    from a shared extensions cache by a different CPU (it could die on an illegal instruction)."""
    try:
        text = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        text = ""
    keep = [line for line in text.splitlines() if line.split(":")[0].strip() in {"model name", "flags", "Features"}]
    return hashlib.sha1("\n".join(keep or [platform.processor(), platform.machine()]).encode()).hexdigest()[:10]


def _wide_vectors() -> list[str]:
    """GCC prefers 256-bit vectors even where AVX-512 exists; an L1 plateau needs the full
    width (2 loads + 1 store of 64 B per cycle on Intel server cores), so ask for it there."""
    try:
        avx512 = " avx512f " in Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].replace("\n", " ") + " "
    except OSError:
        avx512 = False
    return ["-mprefer-vector-width=512"] if avx512 and platform.machine() in {"x86_64", "AMD64"} else []


@functools.lru_cache(maxsize=1)
def load_stream_extension(verbose: bool = False):
    """Build (first use; ~25 s on 2 cores) or load the C++ STREAM kernels, cached in torch's
    extensions directory under a name that carries this CPU's tag."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("csrc") / "stream_kernels.cpp"
    try:
        return load(name=f"perfkit_stream_kernels_{_host_tag()}", sources=[str(source)], verbose=verbose,
                    extra_cflags=["-O3", "-march=native", "-fopenmp", *_wide_vectors()],
                    extra_ldflags=["-fopenmp"])
    except (RuntimeError, OSError, ImportError) as exc:
        raise ExtensionBuildError(str(exc).strip() or repr(exc)) from exc


def _torch_kernels():
    """STREAM kernels as torch ops: the CUDA/ROCm path (and a CPU cross-check)."""
    import torch

    def rep(op):
        def run(a, b, c, s, reps, threads):
            for _ in range(reps):
                op(a, b, c, s)
        return run

    return {"copy": rep(lambda a, b, c, s: c.copy_(a)),
            "scale": rep(lambda a, b, c, s: torch.mul(c, s, out=b)),
            "add": rep(lambda a, b, c, s: torch.add(a, b, out=c)),
            "triad": rep(lambda a, b, c, s: torch.add(b, c, alpha=s, out=a))}


def _working_sets(lo: int, hi: int, per_octave: int) -> list[int]:
    steps = max(0, math.floor(math.log2(hi / lo) * per_octave + 1e-9))
    return sorted({int(lo * 2 ** (i / per_octave)) for i in range(steps + 1)} | {hi})


def measure_bandwidth_curve(device: str = "cpu", *, quick: bool = True,
                            kernels: Sequence[str] | None = None,
                            min_working_set_bytes: int | None = None,
                            max_working_set_bytes: int | None = None,
                            points_per_octave: int | None = None, threads: int | None = None,
                            backend: str = "auto", dtype: str = "fp64",
                            min_run_time_s: float | None = None) -> pd.DataFrame:
    """Bandwidth of STREAM kernels per working set: one row per (kernel, working set).

    ``backend``: ``cpp`` (the OpenMP kernels; CPU), ``torch`` (torch ops) or ``auto`` (``cpp``
    on CPU, ``torch`` on GPUs). There is no fallback: a failed build raises
    :class:`ExtensionBuildError` rather than report torch's bandwidth as the machine's.
    Defaults: quick sweeps triad only, 2 points per octave from 16 KiB to ≥ 2× the LLC; full
    sweeps all four kernels, 4 per octave to ≥ 4× the LLC (capped at a quarter of free memory).
    On GPUs the torch ops are launch-bound at L2 sizes, so the default sweep starts at 8x L2
    (HBM only); a smaller ``min_working_set_bytes`` draws the launch-bound part too.
    """
    import torch

    device = resolve_device(device)
    on_cpu = _kind(device) == "cpu"
    backend = ("cpp" if on_cpu else "torch") if backend == "auto" else backend
    if backend not in {"cpp", "torch"} or (backend == "cpp" and not on_cpu):
        raise BadInputError(f"backend {backend!r} on {device}: use 'auto', 'torch', or 'cpp' on CPU")
    kernels = list(kernels or (("triad",) if quick else STREAM_KERNELS))
    if unknown := [k for k in kernels if k not in STREAM_KERNELS]:
        raise BadInputError(f"unknown STREAM kernel(s) {unknown}; choose from {', '.join(STREAM_KERNELS)}")
    torch_dtype = {"fp64": torch.float64, "fp32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise BadInputError(f"STREAM dtype must be fp64 or fp32, got {dtype!r}")
    if backend == "torch":
        threads = torch.get_num_threads() if on_cpu else 1  # torch ops use torch's own pool
    threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    caches = _cache_sizes(device, threads)
    llc = max(caches.values(), default=256 << 20)
    if max_working_set_bytes is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if on_cpu else \
            torch.cuda.mem_get_info(torch.device(device))[0]
        # CPU: past 2x (quick) or 4x the LLC. GPU: a GPU's L2 keeps part of a stream that is
        # several times its size, so go to >= 16x L2 and at least 1 GiB.
        want = 2 ** math.ceil(math.log2(llc * ((2 if quick else 4) if on_cpu else 16)))
        want = want if on_cpu else max(want, 1 << 30)
        max_working_set_bytes = max(1 << 20, min(want, free // 4))
    if min_working_set_bytes is None:
        min_working_set_bytes = 16 << 10 if on_cpu else min(8 * llc, max_working_set_bytes)
    if not 0 < min_working_set_bytes <= max_working_set_bytes:
        raise BadInputError("need 0 < min_working_set_bytes <= max_working_set_bytes")
    per_octave = points_per_octave or (2 if quick else 4)
    run_s = min_run_time_s if min_run_time_s is not None else (0.03 if quick else 0.2)
    impl = load_stream_extension() if backend == "cpp" else None
    funcs = {k: getattr(impl, k) for k in kernels} if impl else _torch_kernels()
    item = torch.empty((), dtype=torch_dtype).element_size()
    # One allocation at the largest size; smaller working sets use prefixes of it, so pages are
    # faulted in once. Values stay finite: each kernel repeated alone is idempotent.
    n_max = max_working_set_bytes // (2 * item)
    arrays = [torch.empty(n_max, dtype=torch_dtype, device=device) for _ in range(3)]
    for x, v in zip(arrays, (1.0, 2.0, 0.0)):
        impl.first_touch(x, v, threads) if impl else x.fill_(v)
    target = (64 << 20) if quick else (256 << 20)  # bytes per call: amortizes the OpenMP fork
    rows = []
    for kernel in kernels:
        words = STREAM_KERNELS[kernel]
        for ws in _working_sets(min_working_set_bytes, max_working_set_bytes, per_octave):
            n = ws // (words * item)
            if n < 64:
                continue
            a, b, c = (x[:n] for x in arrays)
            moved = words * n * item
            reps = max(1, target // moved)
            fn = functools.partial(funcs[kernel], a, b, c, _SCALAR, reps, threads)
            # Past the LLC each call is one slow sweep: give the DRAM/HBM points (the ceiling
            # a roofline is usually read against) more samples even in a quick sweep.
            point_s = run_s if min_run_time_s is not None or ws <= llc else max(run_s, 0.2)
            meas = measure(fn, min_run_time_s=point_s, device=device, label=f"{kernel} {ws} B")
            total = moved * reps
            rows.append({"device": device, "kernel": kernel, "dtype": dtype, "backend": backend, "threads": threads,
                         "working_set_bytes": words * n * item, "elements": n, "reps": reps,
                         "bytes": total, **meas.as_row("time"),
                         "bytes_per_s": total / meas.median_s,
                         "bytes_per_s_best": total / meas.min_s,  # stream.c's "Best Rate"
                         "bytes_per_s_iqr": total / meas.percentile(25) - total / meas.percentile(75)})
    del arrays
    return pd.DataFrame(rows)


def _cache_sizes(device: str, threads: int) -> dict[str, int]:
    if _kind(device) == "cpu":
        cpus = sorted(os.sched_getaffinity(0))[:threads] if hasattr(os, "sched_getaffinity") else None
        return cpu_cache_sizes(cpus)
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    sizes = {"L2": int(getattr(props, "L2_cache_size", 0))} if getattr(props, "L2_cache_size", 0) else {}
    if any(g in (getattr(props, "gcnArchName", "") or "") for g in ("gfx94", "gfx95")):
        sizes["MALL"] = 256 << 20  # MI300/MI350: 256 MB AMD Infinity Cache (AMD CDNA 3/4 white papers)
    return sizes


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
        rows.append({"kind": "compute", "dtype": dtype, "level": None, "value": float(best["flop_per_s"]),
                     "unit": "FLOP/s", "origin": "measured",
                     "source": f"best torch.matmul over {len(group)} "
                               f"{'searched' if group['searched'].all() else 'given'} shapes "
                               f"(best {best['m']}x{best['n']}x{best['k']})",
                     "method": "matmul", "iqr": float(best["flop_per_s_iqr"]), "noisy": bool(best["noisy"]),
                     "working_set_bytes": None, "m": int(best["m"]), "n": int(best["n"]), "k": int(best["k"])})
    if curve is None:
        curve = measure_bandwidth_curve(device, quick=quick, kernels=["triad"], threads=threads,
                                        max_working_set_bytes=max_working_set_bytes)
    triad = curve[curve["kernel"] == "triad"]
    if triad.empty:
        raise BadInputError("the bandwidth curve holds no triad rows")
    on_cpu = _kind(device) == "cpu"
    levels = detect_levels(triad, cache_sizes=_cache_sizes(device, int(triad["threads"].iloc[0])),
                           memory_name="DRAM" if on_cpu else "HBM")
    how = "C++ OpenMP STREAM triad" if triad["backend"].iloc[0] == "cpp" else "torch-op STREAM triad"
    for lvl in levels.itertuples():
        rows.append({"kind": "memory", "dtype": None, "level": lvl.level, "value": lvl.bytes_per_s,
                     "unit": "bytes/s", "origin": "measured",
                     "source": f"{how}, plateau {_size(lvl.working_set_min_bytes)}–{_size(lvl.working_set_max_bytes)}",
                     "method": "stream_triad", "iqr": lvl.iqr, "noisy": lvl.noisy,
                     "working_set_bytes": lvl.working_set_bytes,
                     "working_set_min_bytes": lvl.working_set_min_bytes,
                     "working_set_max_bytes": lvl.working_set_max_bytes})
    return pd.DataFrame(rows, columns=[*CEILING_COLUMNS, "working_set_min_bytes", "working_set_max_bytes",
                                       *MATMUL_SHAPE_COLUMNS])
