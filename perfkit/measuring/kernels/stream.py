"""Memory bandwidth: STREAM kernels over working sets from KiB to well past the caches (8× and more).

STREAM is McCalpin's (https://www.cs.virginia.edu/stream/). On CPU the kernels are C with
OpenMP (``csrc/stream_kernels.c``, compiled at first use on a CPU model, called through ctypes): a
torch-op triad reaches ~60% of what a C STREAM triad reaches on a 2-core Xeon, and the roof must be
the machine's, not torch's. On GPUs they are torch ops.

Bytes follow stream.c's convention: reads + writes, no write-allocate traffic; per element copy
and scale move 2 words, add and triad 3. ``working_set_bytes`` is the size of all arrays the
kernel touches. The sweep's top comes from the cache sizes the OS reports
(:mod:`perfkit.core.caches`): a working set is DRAM-fed only at >= 8× the caches, so the default
sweep goes one octave (full: two) past that. The plateaus of the curve become memory ceilings in
:func:`perfkit.measuring.kernels.ceilings.measure_ceilings`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from perfkit.core.caches import Caches, cpu_caches, memory_threshold_bytes, sweep_top_bytes
from perfkit.core.cpu_share import affinity_cpus
from perfkit.core.devices import resolve_device
from perfkit.core.errors import BadInputError, PerfkitError
from perfkit.core.progress import progress
from perfkit.core.timing import measure

__all__ = ["STREAM_KERNELS", "ExtensionBuildError", "load_stream_extension", "measure_bandwidth_curve",
           "StreamKernels", "caches", "free_memory_bytes"]

#: Words moved per element (stream.c's ``bytes[]``: 2, 2, 3, 3 × sizeof(STREAM_TYPE)); also the
#: number of arrays each kernel touches.
STREAM_KERNELS = {"copy": 2, "scale": 2, "add": 3, "triad": 3}
_SCALAR = 3.0  # stream.c's scalar


class ExtensionBuildError(PerfkitError):
    """The C STREAM kernels could not be built (no compiler, no OpenMP); nothing was measured."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"building perfkit's STREAM kernels failed: {message}")


def _kind(device: str) -> str:
    return device.split(":")[0]


@functools.lru_cache(maxsize=1)
def _first_cpu() -> str:
    """The first processor's block of ``/proc/cpuinfo`` ('' where there is none), read once."""
    try:
        return Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return ""


def _host_tag() -> str:
    """Short hash of the CPU model and ISA flags: ``-march=native`` code must not be loaded
    from a shared extensions cache by a different CPU (it could die on an illegal instruction)."""
    keep = [line for line in _first_cpu().splitlines()
            if line.split(":")[0].strip() in {"model name", "flags", "Features"}]
    return hashlib.sha1("\n".join(keep or [platform.processor(), platform.machine()]).encode()).hexdigest()[:10]


def _wide_vectors() -> list[str]:
    """GCC prefers 256-bit vectors even where AVX-512 exists; an L1 plateau needs the full
    width (2 loads + 1 store of 64 B per cycle on Intel server cores), so ask for it there."""
    avx512 = " avx512f " in _first_cpu().replace("\n", " ") + " "
    return ["-mprefer-vector-width=512"] if avx512 and platform.machine() in {"x86_64", "AMD64"} else []


#: The C compiler (``$CC``, else ``cc``) and its flags for the STREAM kernels. gnu11, not c11: ISO
#: mode turns off the contraction of ``b + s * c`` into one FMA. Loops aligned to 64 bytes: the same
#: machine code unaligned ran an L1-sized triad 15 % slower on 2 threads (AMD EPYC, gcc 12; the
#: torch extension these kernels replaced happened to be aligned), and the L1 roof must be the core's.
_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-std=gnu11", "-falign-loops=64", "-shared", "-fPIC")


def _kernels_cache_dir() -> Path:
    """Where built kernels are kept: ``$PERFKIT_CACHE_DIR`` or ``$XDG_CACHE_HOME/perfkit`` (``~/.cache``)."""
    root = os.environ.get("PERFKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "perfkit")
    return Path(root) / "kernels"


def _build(source: Path, compiler: str, flags: list[str]) -> Path:
    """The shared library of ``source`` for this CPU, compiled once (about a second) and kept under
    a name that carries the CPU's tag and a hash of the source and flags; written to a private
    name, then renamed, so that processes building at once never load a half-written file."""
    digest = hashlib.sha1(source.read_bytes() + "\0".join([compiler, *flags]).encode()).hexdigest()[:10]
    target = _kernels_cache_dir() / f"{source.stem}-{_host_tag()}-{digest}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run([compiler, *flags, str(source), "-o", str(partial)], capture_output=True, text=True,
                              timeout=300)
    except FileNotFoundError:
        raise ExtensionBuildError(f"no C compiler {compiler!r} on PATH (install gcc, or set CC)") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        said = (done.stderr or done.stdout).strip()[-2000:]
        raise ExtensionBuildError(f"{compiler} {' '.join(flags)} {source.name} exited {done.returncode}: {said}")
    os.replace(partial, target)
    return target


class StreamKernels:
    """The OpenMP STREAM kernels of ``csrc/stream_kernels.c`` on CPU tensors: ``copy``, ``scale``,
    ``add``, ``triad`` (each ``(a, b, c, scalar, reps, threads)``, ``threads`` 0 for OpenMP's
    default), ``first_touch(x, value, threads)`` and ``max_threads()``. Tensors are checked here
    (CPU, contiguous, one dtype, float64 or float32, equal sizes); ctypes releases the GIL while a
    kernel runs. A timed loop calls :meth:`bind`'s callable: checked once, then only the C call
    (1.6 us a call here, the pybind11 extension before it 1.5 us; checking every call cost 6.6 us)."""

    _OPS = {"copy": 0, "scale": 1, "add": 2, "triad": 3}

    def __init__(self, library: Path):
        import torch

        lib = ctypes.CDLL(str(library))
        p, i64, c_int, dbl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
        lib.perfkit_stream.argtypes = [c_int, c_int, p, p, p, dbl, i64, i64, c_int]
        lib.perfkit_first_touch.argtypes = [c_int, p, dbl, i64, c_int]
        lib.perfkit_stream.restype = lib.perfkit_first_touch.restype = lib.perfkit_max_threads.restype = c_int
        self._lib = lib
        self._dtypes = {torch.float64: 0, torch.float32: 1}
        self.path = library
        for name in self._OPS:
            setattr(self, name, functools.partial(self._call, name))

    def _code(self, x, name: str, like=None) -> int:
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor, got one on {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if like is not None and x.dtype != like.dtype:
            raise ValueError(f"{name} has dtype {x.dtype}, expected {like.dtype}")
        if like is not None and x.numel() != like.numel():
            raise ValueError(f"{name} has {x.numel()} elements, expected {like.numel()}")
        if x.dtype not in self._dtypes:
            raise ValueError(f"STREAM kernels support float64 and float32, got {x.dtype}")
        return self._dtypes[x.dtype]

    def bind(self, kernel: str, a, b, c, scalar: float, reps: int, threads: int):
        """``kernel`` on these tensors as a no-argument callable, checked once here; it holds the
        tensors, so their memory outlives every call."""
        code = self._code(a, "a")
        self._code(b, "b", a)
        self._code(c, "c", a)
        if reps < 1:
            raise ValueError(f"reps must be >= 1, got {reps}")
        call = functools.partial(self._lib.perfkit_stream, self._OPS[kernel], code, a.data_ptr(), b.data_ptr(),
                                 c.data_ptr(), scalar, a.numel(), reps, threads)
        call.tensors = (a, b, c)
        return call

    def _call(self, kernel: str, a, b, c, scalar: float, reps: int, threads: int) -> None:
        self.bind(kernel, a, b, c, scalar, reps, threads)()

    def first_touch(self, x, value: float, threads: int) -> None:
        self._lib.perfkit_first_touch(self._code(x, "x"), x.data_ptr(), value, x.numel(), threads)

    def max_threads(self) -> int:
        return self._lib.perfkit_max_threads()


@functools.lru_cache(maxsize=1)
def load_stream_extension(verbose: bool = False) -> StreamKernels:
    """Build (first use on a CPU model: about a second) or load the C STREAM kernels, cached under
    :func:`_kernels_cache_dir` for this CPU's tag. ``verbose``: print the compile command."""
    source = Path(__file__).with_name("csrc") / "stream_kernels.c"
    compiler = os.environ.get("CC") or "cc"
    flags = [*_CFLAGS, *_wide_vectors()]
    if verbose:
        print(f"perfkit: {compiler} {' '.join(flags)} {source}")
    library = _build(source, compiler, flags)
    try:
        return StreamKernels(library)
    except OSError as exc:  # a library that does not load (a broken cache file: remove it, build again)
        raise ExtensionBuildError(f"{library} does not load: {exc} (delete it to build again)") from exc


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

    ``backend``: ``cpp`` (the compiled OpenMP kernels, C since they stopped being C++; the rows keep
    the name; CPU), ``torch`` (torch ops) or ``auto`` (``cpp`` on CPU, ``torch`` on GPUs). There
    is no fallback: a failed build raises
    :class:`ExtensionBuildError` rather than report torch's bandwidth as the machine's.
    Defaults: quick sweeps triad only, 2 points per octave from 16 KiB to one octave past 8× the
    caches the OS reports (:func:`perfkit.core.caches.sweep_top_bytes`: where a working set is
    DRAM-fed, so a DRAM plateau has points); full sweeps all four kernels, 4 per octave to two
    octaves past it; capped at a quarter of free memory. Cache sizes unreadable: 2× (4×) an
    assumed 256 MiB, and the levels say so. On GPUs the torch ops are launch-bound at L2 sizes,
    so the default sweep starts at 8× the caches (HBM only); a smaller ``min_working_set_bytes``
    draws the launch-bound part too.
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
    threads = threads or len(affinity_cpus())
    sizes = caches(device, threads).sizes_bytes
    llc = max(sizes.values(), default=256 << 20)
    memory_from = memory_threshold_bytes(sizes)  # None when the sizes are unknown
    if max_working_set_bytes is None:
        free = free_memory_bytes(device)
        if on_cpu:
            max_working_set_bytes = sweep_top_bytes(sizes, octaves_past=1 if quick else 2,
                                                    fallback_llc_bytes=256 << 20, free_bytes=free)
        else:
            # A GPU's L2 keeps part of a stream that is several times its size: go to >= 16x
            # L2 and at least 1 GiB.
            want = max(2 ** math.ceil(math.log2(16 * llc)), 1 << 30)
            max_working_set_bytes = max(1 << 20, min(want, free // 4))
    if min_working_set_bytes is None:
        min_working_set_bytes = 16 << 10 if on_cpu else min(memory_from or 8 * llc, max_working_set_bytes)
    if not 0 < min_working_set_bytes <= max_working_set_bytes:
        raise BadInputError("need 0 < min_working_set_bytes <= max_working_set_bytes")
    per_octave = points_per_octave or (2 if quick else 4)
    run_s = min_run_time_s if min_run_time_s is not None else (0.03 if quick else 0.2)
    impl = load_stream_extension() if backend == "cpp" else None
    funcs = None if impl else _torch_kernels()
    item = torch.empty((), dtype=torch_dtype).element_size()
    # One allocation at the largest size; smaller working sets use prefixes of it, so pages are
    # faulted in once. Values stay finite: each kernel repeated alone is idempotent.
    n_max = max_working_set_bytes // (2 * item)
    arrays = [torch.empty(n_max, dtype=torch_dtype, device=device) for _ in range(3)]
    for x, v in zip(arrays, (1.0, 2.0, 0.0)):
        impl.first_touch(x, v, threads) if impl else x.fill_(v)
    target = (64 << 20) if quick else (256 << 20)  # bytes per call: amortizes the OpenMP fork
    rows = []
    sweep = [(k, ws) for k in kernels for ws in _working_sets(min_working_set_bytes, max_working_set_bytes, per_octave)]
    for kernel, ws in progress(sweep, desc="STREAM working sets", unit="point"):
        words = STREAM_KERNELS[kernel]
        n = ws // (words * item)
        if n < 64:
            continue
        a, b, c = (x[:n] for x in arrays)
        moved = words * n * item
        reps = max(1, target // moved)
        fn = (impl.bind(kernel, a, b, c, _SCALAR, reps, threads) if impl
              else functools.partial(funcs[kernel], a, b, c, _SCALAR, reps, threads))
        # Past the LLC each call is one slow sweep: give the DRAM/HBM points (the ceiling
        # a roofline is usually read against) more samples even in a quick sweep; those short
        # of memory_from, fed by caches and memory both, make no level and keep run_s.
        short = ws <= llc or (memory_from is not None and ws < memory_from)
        point_s = run_s if min_run_time_s is not None or short else max(run_s, 0.2)
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


def free_memory_bytes(device: str) -> int:
    """Bytes ``device`` has free now: available host RAM on a CPU, free device memory on a GPU."""
    if _kind(device) == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    import torch

    return torch.cuda.mem_get_info(torch.device(device))[0]


def caches(device: str, threads: int) -> Caches:
    """Caches of ``device`` as the first ``threads`` CPUs of this process see them (sysfs), or
    the GPU's L2 (and MALL), with where they were read or why they could not be."""
    if _kind(device) == "cpu":
        return cpu_caches(list(affinity_cpus())[:threads])
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    sizes = {"L2": int(getattr(props, "L2_cache_size", 0))} if getattr(props, "L2_cache_size", 0) else {}
    source = "torch.cuda.get_device_properties L2_cache_size"
    if any(g in (getattr(props, "gcnArchName", "") or "") for g in ("gfx94", "gfx95")):
        sizes["MALL"] = 256 << 20  # MI300/MI350: 256 MB AMD Infinity Cache (AMD CDNA 3/4 white papers)
        source += "; MALL 256 MB (AMD CDNA 3/4 white papers)"
    return Caches(sizes_bytes=sizes, source=source if sizes else "the device reports no L2 size")
