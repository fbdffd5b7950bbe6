"""A user's kernels against the reference op: correct first, then how fast.

The loop of this field (TritonBench's operators × backends, KernelBench's ``fast_p``): the same
inputs through every implementation, each output (and, with ``backward``, each input gradient)
checked against the reference's as ``torch.testing.assert_close`` checks it, then each timed with
perfkit's timer (raw samples kept). One row per (impl, shape, dtype):

- ``correct``, ``max_abs_error``, ``max_rel_error`` and ``worst_index`` (the element furthest
  outside the tolerance, or the largest absolute error where all are inside), with the ``rtol`` and
  ``atol`` used: by default ``torch.testing.assert_close``'s for the dtype (fp32 1.3e-6/1e-5,
  bf16 1.6e-2/1e-5, fp16 1e-3/1e-5, fp64 1e-7/1e-7);
- ``time_s`` and its samples; on a CUDA/ROCm device each call is timed with the L2 flushed before
  it, as ``triton.testing.do_bench`` does (a 256 MiB buffer zeroed between calls, outside the
  timed region); on a CPU there is no such flush, and the row says so;
- ``flop`` and ``bytes``: the user's ``flops``/``bytes`` entry points where given, else the
  reference's as perfkit's dispatch counter sees it (a Triton kernel's work is not seen by the
  dispatcher, so its own count would be 0); ``flop_per_s`` and ``bytes_per_s`` from them;
- ``status`` ``failed`` with the reason for an impl that raises or returns the wrong shape or
  dtype; the other impls go on.

Entry points are ``package.module:function``; ``compile:NAME`` is ``torch.compile`` of the impl
``NAME``. Every entry point is imported before any work, and a bad one is one line of
:class:`~perfkit.core.errors.BadInputError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from perfkit.core.devices import resolve_device
from perfkit.core.errors import BadInputError
from perfkit.core.progress import progress
from perfkit.core.timing import measure
from perfkit.core.tolerances import ASSERT_CLOSE

__all__ = ["DEFAULT_TOLERANCES", "measure_kernels", "resolve_impls"]

#: ``torch.testing.assert_close``'s defaults, (rtol, atol) by dtype (its documentation's table).
DEFAULT_TOLERANCES = ASSERT_CLOSE
_TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_L2_FLUSH_BYTES = 256 * 2**20  # triton.testing.do_bench's cache buffer
_MIN_SAMPLES = 10  # per impl and point, however long a call (the interpreter's: 0.3-2 s each)


def resolve_impls(impls: Mapping[str, str], reference: str, model_path: str | None = None) -> dict[str, Callable]:
    """Each impl's callable, imported now: a bad entry point, an unknown ``compile:NAME`` or a
    ``reference`` not among them is one line of :class:`BadInputError` before any work."""
    from perfkit.core.entry_points import load_entry_point

    if not impls:
        raise BadInputError("impls is empty: name at least the reference, e.g. {'eager': 'torch.nn.functional:rms_norm'}")
    if reference not in impls:
        raise BadInputError(f"reference {reference!r} is not one of impls ({', '.join(impls)})")
    out: dict[str, Callable] = {}
    for name, target in impls.items():
        if not isinstance(target, str) or not target:
            raise BadInputError(f"impls[{name!r}]: an entry point 'package.module:function' or 'compile:NAME'")
        if target.startswith("compile:"):
            continue
        out[name] = load_entry_point(target, model_path)
    for name, target in impls.items():
        if target.startswith("compile:"):
            of = target.partition(":")[2]
            if of not in out:
                raise BadInputError(f"impls[{name!r}] = {target!r}: {of!r} is not an impl to compile "
                                    f"({', '.join(n for n in impls if n in out)})")
            out[name] = _compiled(out[of])
    if impls[reference].startswith("compile:"):
        raise BadInputError(f"reference {reference!r} is a compiled impl: make the truth an eager one")
    return {name: out[name] for name in impls}


def _compiled(fn: Callable) -> Callable:
    import torch

    return torch.compile(fn, dynamic=False)


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _check(ref, got, rtol: float, atol: float) -> dict:
    """torch.testing.assert_close's comparison, as numbers: where it fails, by how much."""
    import torch

    refs, gots = _tensors(ref), _tensors(got)
    if len(refs) != len(gots):
        return {"failed": f"returned {len(gots)} tensors where the reference returns {len(refs)}"}
    worst = {"max_abs_error": 0.0, "max_rel_error": 0.0, "worst_index": None, "correct": True, "mismatched": 0}
    worst_excess = -math.inf
    for k, (r, g) in enumerate(zip(refs, gots)):
        if tuple(r.shape) != tuple(g.shape):
            return {"failed": f"output {k} has shape {tuple(g.shape)}, the reference's {tuple(r.shape)}"}
        if r.dtype != g.dtype:
            return {"failed": f"output {k} is {g.dtype}, the reference's {r.dtype}"}
        r64, g64 = r.detach().double().cpu(), g.detach().double().cpu()
        diff = (g64 - r64).abs()
        diff = torch.where(torch.isnan(r64) & torch.isnan(g64), torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)
        bound = atol + rtol * r64.abs()
        excess = diff - bound
        bad = int((excess > 0).sum())
        worst["mismatched"] += bad
        rel = diff / r64.abs().clamp_min(torch.finfo(torch.float64).tiny)
        if diff.numel():
            worst["max_abs_error"] = max(worst["max_abs_error"], float(diff.max()))
            worst["max_rel_error"] = max(worst["max_rel_error"], float(rel.max()))
            i = int(excess.argmax())
            if float(excess.reshape(-1)[i]) > worst_excess:
                worst_excess = float(excess.reshape(-1)[i])
                where = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), r.shape))
                worst["worst_index"] = str((k, *where)) if len(refs) > 1 else str(where)
        worst["correct"] = worst["correct"] and bad == 0
    return worst


def _timer(fn: Callable, device: str, min_run_time_s: float):
    """Samples of ``fn()``: perfkit's block timer on a CPU; on a GPU one call per sample between
    CUDA events with the L2 flushed before each (triton.testing.do_bench)."""
    import torch

    if not device.startswith("cuda"):
        # Blocks of a twentieth of the run at most, and 10 samples at least: a speedup's CI and
        # perfkit compare (5 a side) need them, and a long call would otherwise give the minimum 3.
        return (measure(fn, min_run_time_s=min_run_time_s, min_block_time_s=min(0.01, min_run_time_s / 20),
                        min_samples=_MIN_SAMPLES, device=device), "none (a CPU: no L2 flush)")
    cache = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    samples, spent = [], 0.0
    while spent < min_run_time_s or len(samples) < _MIN_SAMPLES:
        cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
        spent += samples[-1]
    from perfkit.core.timing import Measurement

    return Measurement(samples_s=tuple(samples), calls_per_sample=1, warmup_calls=3, label="do_bench-style"), \
        f"{_L2_FLUSH_BYTES >> 20} MiB zeroed before each call (triton.testing.do_bench)"


def _work(fn: Callable, args) -> tuple[float, float]:
    """FLOP and bytes of one call as the dispatch counter counts them."""
    from perfkit.measuring.ops.counting import count_ops

    ops = count_ops(fn, *args)
    if ops.empty:
        return 0.0, 0.0
    return float(ops["flop"].sum()), float((ops["bytes_read"] + ops["bytes_written"]).sum())


def measure_kernels(impls: Mapping[str, str], *, reference: str, make_inputs: str, shapes: Sequence[Mapping],
                    dtypes: Sequence[str], backward: bool = False, rtol: float | None = None,
                    atol: float | None = None, flops: str | None = None, bytes_fn: str | None = None,
                    device: str = "auto", min_run_time_s: float = 0.1, model_path: str | None = None,
                    seed: int = 0) -> list[dict]:
    """One row per (impl, shape, dtype), the reference first at each point (module docstring)."""
    import torch

    from perfkit.core.entry_points import load_entry_point

    fns = resolve_impls(impls, reference, model_path)
    inputs_fn = load_entry_point(make_inputs, model_path)
    flop_fn = load_entry_point(flops, model_path) if flops else None
    byte_fn = load_entry_point(bytes_fn, model_path) if bytes_fn else None
    if not shapes or not all(isinstance(s, Mapping) and s for s in shapes):
        raise BadInputError("shapes: a list of named dimensions, e.g. [{'rows': 1024, 'hidden': 4096}]")
    if unknown := [d for d in dtypes if d not in _TORCH_DTYPES]:
        raise BadInputError(f"dtypes {unknown}: choose from {', '.join(_TORCH_DTYPES)}")
    if (rtol is None) != (atol is None):
        raise BadInputError("give rtol and atol together, or neither (torch.testing.assert_close's defaults per dtype)")
    device = resolve_device(device)
    order = [reference] + [n for n in impls if n != reference]
    rows = []
    for shape, dtype in progress([(s, d) for d in dtypes for s in shapes], desc="kernels", unit="point"):
        base = {"workload": "kernels", "shape": dict(shape), **{f"dim_{k}": v for k, v in shape.items()},
                "dtype": dtype, "device": device, "reference": reference, "backward": bool(backward)}
        tol = (rtol, atol) if rtol is not None else DEFAULT_TOLERANCES[dtype]
        torch.manual_seed(seed)
        try:
            args = tuple(inputs_fn(dict(shape), getattr(torch, _TORCH_DTYPES[dtype]), device))
        except Exception as err:  # noqa: BLE001 - the user's input maker: that point fails, said
            rows += [{**base, "impl": n, "status": "failed", "reason": f"make_inputs: {type(err).__name__}: {err}"[:300]}
                     for n in order]
            continue
        grad_of = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        work = {}
        truth = None
        for name in order:
            row = {**base, "impl": name, "entry_point": impls[name], "rtol": tol[0], "atol": tol[1]}
            call = _call(fns[name], args, grad_of, backward, seed)
            try:
                got = call()
            except Exception as err:  # noqa: BLE001 - an impl that raises is that point's failure
                rows.append({**row, "status": "failed", "reason": f"{type(err).__name__}: {err}"[:300]})
                continue
            if name == reference:
                truth = got
                work = _reference_work(fns[name], args, shape, dtype, flop_fn, byte_fn, backward)
            if truth is None:
                rows.append({**row, "status": "failed", "reason": "the reference failed at this point: nothing to check against"})
                continue
            check = _check(truth, got, *tol)
            if "failed" in check:
                rows.append({**row, "status": "failed", "reason": check["failed"]})
                continue
            m, flush = _timer(call, device, min_run_time_s)
            rows.append({**row, "status": "ok", "reason": None, **check, **work, **m.as_row("time"),
                         "l2_flush": flush, "timing_note": _timing_note(),
                         "flop_per_s": work["flop"] / m.median_s if work.get("flop") else math.nan,
                         "bytes_per_s": work["bytes"] / m.median_s if work.get("bytes") else math.nan})
    return rows


def _timing_note() -> str | None:
    """Why a row's time is not the device's, where it is not."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("TRITON_INTERPRET=1: Triton kernels ran in Triton's interpreter on the CPU: their results are "
                "real, their times the interpreter's")
    return None


def _call(fn: Callable, args, grad_of, backward: bool, seed: int) -> Callable:
    """One call of ``fn``: its output, or with ``backward`` (output, input gradients) for a
    gradient drawn once from ``seed``."""
    import torch

    if not backward:
        def forward():
            with torch.no_grad():
                return fn(*args)
        return forward
    leaves = [a.detach().requires_grad_(True) for a in grad_of]
    swapped = list(args)
    for k, a in enumerate(args):
        for leaf, original in zip(leaves, grad_of):
            if a is original:
                swapped[k] = leaf
    state: dict = {}

    def both():
        out = fn(*swapped)
        if "grad" not in state:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            state["grad"] = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
        grads = torch.autograd.grad(out, leaves, state["grad"], allow_unused=True)
        return (out.detach(), *[g if g is not None else torch.zeros_like(x) for g, x in zip(grads, leaves)])
    return both


def _reference_work(fn: Callable, args, shape, dtype: str, flop_fn, byte_fn, backward: bool) -> dict:
    """FLOP and bytes of a call: the user's entry points where given, else the reference's count."""
    counted_flop, counted_bytes = (math.nan, math.nan)
    if flop_fn is None or byte_fn is None:
        counted_flop, counted_bytes = _work(fn, args)
    flop = float(flop_fn(dict(shape), dtype)) if flop_fn else counted_flop
    nbytes = float(byte_fn(dict(shape), dtype)) if byte_fn else counted_bytes
    how = "the user's flops/bytes" if flop_fn and byte_fn else "the reference's, counted at dispatch (forward)"
    if backward and not (flop_fn and byte_fn):
        how += "; backward's work not counted"
    return {"flop": flop, "bytes": nbytes, "work_source": how}
