"""perfkit's trace breakdowns against Holistic Trace Analysis': wall time and peak memory.

Both sides compute the same four breakdowns (temporal, idle time per stream, kernel types,
comm/comp overlap) from the same file: perfkit with ``breakdowns(read_trace(path))``, HTA 0.5.0
with ``TraceAnalysis`` and its four getters. Each side runs in its own subprocess; its peak
memory is that process's maximum RSS (``os.wait4``), and the bare interpreter with the same
imports is measured too, so "net" is what the analysis itself held. Inputs: the largest
reference trace (``../shared/reference/traces``, when present) and a synthetic trace of
``--size-mb`` (default 200) written here: many ProfilerSteps of a training-like mix (cpu_op,
cuda_runtime launches with correlation ids and flow events, compute kernels on stream 7, NCCL
on stream 20, memcpy on stream 22, memset; fractional timestamps as torch >= 2.3 writes them).
Goal (issue 54): >= 10x faster and <= 0.2x peak memory on each of the corpus's largest traces
(HTA's trace_diff pair, the ResNet and Qwen MI300X field traces). Each side runs ``--repeats``
times in fresh processes (each pays its cold start) and the median wall times are compared (the
fastest of each too: on a shared machine the same run varies by a third).
Peak memory is printed whole and net of the imports: the interpreter with pandas and numpy is
~70 MiB of either side's peak, 0.28x of HTA's whole peak on the largest trace by itself, so the
whole-peak goal cannot hold while the breakdowns are DataFrames; net of imports it is what the
analysis holds. The two sides also have to agree (printed); perfkit reads with HTA's rounding
here for that, and HTA keeps a sub-microsecond GPU event that rounding ends before it starts at
-1 us where perfkit keeps 0, so each such event is 1 us of allowed difference (counted, printed).

    python benchmarks/trace_analysis_speed.py [--size-mb 200] [--repeats 3] [--skip-hta] [--keep PATH]

Timings are of this machine at this moment; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference"
REF = _SHARED / "traces" / "trace_diff" / "control.json.gz"
#: The corpus's largest traces (HTA's NVIDIA pair; AMD's MI300X training and inference traces).
CORPUS = (REF, _SHARED / "traces" / "trace_diff" / "test.json.gz",
          _SHARED / "field-traces" / "tracelens" / "mi300" / "resnet_act_checkpoint.json.gz",
          _SHARED / "field-traces" / "tracelens" / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
_IMPORTS = {"perfkit": "import perfkit.analyse.trace.breakdown", "hta": "import hta.trace_analysis"}


# --- the two sides, each in a child process ---------------------------------------------------------

def _child(side: str, path: str, out: str) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    # Imports happen before the clock starts (a session pays them once, not per trace); the
    # peak memory includes them, and "net" below takes them out.
    if side == "perfkit":
        from perfkit.analyse.trace.breakdown import breakdowns, read_trace
    else:
        from hta.trace_analysis import TraceAnalysis
    t0 = time.perf_counter()
    if side == "perfkit":
        b = breakdowns(read_trace(path, round_to_us=True))  # HTA's rounding: the figures must agree
        temporal, overlap, idle, kinds = b["temporal"], b["overlap"], b["idle"], b["kernel_types"]
    else:
        logging.getLogger("hta").setLevel(logging.ERROR)
        ta = TraceAnalysis(trace_files={0: path}, trace_dir="/")
        temporal = ta.get_temporal_breakdown(visualize=False)
        overlap = ta.get_comm_comp_overlap(visualize=False)
        idle = ta.get_idle_time_breakdown(ranks=ta.t.get_ranks(), visualize=False)[0]
        kinds = ta.get_gpu_kernel_breakdown(visualize=False)[0]
    wall_s = time.perf_counter() - t0
    Path(out).write_text(json.dumps({
        "wall_s": wall_s,
        "temporal": temporal.drop(columns="rank").iloc[0].astype(float).tolist(),
        "overlap_pctg": float(overlap["comp_comm_overlap_pctg"].iloc[0]),
        "idle_us": float(idle["idle_time"].sum()),
        "kernel_type_us": {k: int(v) for k, v in kinds.groupby("kernel_type")["sum"].sum().items()},
    }))


def _sub_us_gpu_events(path: str) -> int:
    """GPU events that HTA's inward rounding (ts up, end down) ends before they start: HTA keeps
    them at -1 µs, and its interval sums count that; perfkit's reader keeps them at 0. Each is
    one microsecond the two sides may differ by."""
    import numpy as np

    from perfkit.analyse.trace.breakdown import read_trace

    exact = read_trace(path)
    gpu = exact.stream != -1
    ts = exact.ts_us[gpu] + exact.origin_us
    return int(np.count_nonzero(np.floor(ts + exact.dur_us[gpu]) < np.ceil(ts)))


def _count_sub_us(path: str) -> int:
    """:func:`_sub_us_gpu_events` in a process of its own: this one stays small, since a child's
    maximum RSS on Linux starts from its parent's RSS at fork."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, __file__, "--sub-us", path, out.name], check=True)
        return json.loads(Path(out.name).read_text())


def _run(args: list[str]) -> tuple[int, float]:
    """(exit status, peak RSS in bytes) of a child Python process."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode:
        print(err[-2000:], file=sys.stderr)
    return proc.returncode, usage.ru_maxrss * 1024  # kilobytes on Linux


def _measure(side: str, path: str) -> dict:
    _, base = _run(["-c", _IMPORTS[side] + "; import pandas, numpy"])
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        status, peak = _run([__file__, "--child", side, path, out.name])
        if status:
            return {"failed": status}
        res = json.loads(Path(out.name).read_text())
    return {**res, "peak_bytes": peak, "net_bytes": peak - base}


def _median_of(side: str, path: str, repeats: int) -> dict:
    """The run with the median wall time of ``repeats`` fresh processes (each pays its own cold
    start: page faults, first calls), and the largest peak memory of them."""
    runs = [_measure(side, path) for _ in range(repeats)]
    if any("failed" in r for r in runs):
        return next(r for r in runs if "failed" in r)
    runs.sort(key=lambda r: r["wall_s"])
    mid = dict(runs[len(runs) // 2])
    mid["walls_s"] = [r["wall_s"] for r in runs]
    mid["peak_bytes"] = max(r["peak_bytes"] for r in runs)
    mid["net_bytes"] = max(r["net_bytes"] for r in runs)
    return mid


# --- a synthetic trace ------------------------------------------------------------------------------

_KERNELS = ["ampere_sgemm_128x64_nn", "ampere_sgemm_64x32_sliced1x4_tn",
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)"
            "::{lambda()#1}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, "
            "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::"
            "{lambda(float)#1}, at::detail::Array<char*, 2>)",
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, "
            "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4>)",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_"
            "128x128_32x3_nn_align4::Params)"]
_OPS = ["aten::linear", "aten::addmm", "aten::gelu", "aten::mean", "aten::mm", "aten::add_"]
_NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"


class _Writer:
    """Kineto-shaped events of consecutive ProfilerSteps, written as they are made."""

    def __init__(self, f, rng: random.Random):
        self.f, self.rng = f, rng
        self.corr = 278_000_000  # Kineto-sized ids (HTA 0.5.0 under pandas 3 fails on ids < 2**15)
        self.ext = 1
        self.first = True
        self.gpu = {7: 0.0, 20: 0.0, 22: 0.0}

    def ev(self, text: str) -> None:
        self.f.write(text if self.first else ",\n" + text)
        self.first = False

    def cpu(self, cat: str, name: str, ts: float, dur: float, tid: int = 100) -> None:
        self.ext += 1
        self.ev(f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 100, "tid": {tid}, "ts": {ts:.3f}, '
                f'"dur": {dur:.3f}, "args": {{"External id": {self.ext}, "Record function id": 0, '
                f'"Sequence number": {self.ext // 3}, "Fwd thread id": 0, "Ev Idx": {self.ext}}}}}')

    def launch(self, ts: float, kernel: str, dur: float, stream: int, cat: str = "kernel",
               runtime: str = "cudaLaunchKernel", tid: int = 100) -> None:
        self.corr += 1
        c = self.corr
        self.ev(f'{{"ph": "X", "cat": "cuda_runtime", "name": "{runtime}", "pid": 100, "tid": {tid}, '
                f'"ts": {ts:.3f}, "dur": 4.125, "args": {{"External id": {self.ext}, "cbid": 211, "correlation": {c}}}}}')
        start = max(self.gpu[stream], ts + 6.5)
        self.gpu[stream] = start + dur
        self.ev(f'{{"ph": "X", "cat": "{cat}", "name": "{kernel}", "pid": 0, "tid": {stream}, "ts": {start:.3f}, '
                f'"dur": {dur:.3f}, "args": {{"External id": {self.ext}, "queued": 0, "device": 0, "context": 1, '
                f'"stream": {stream}, "correlation": {c}, "registers per thread": 128, "shared memory": 16384, '
                f'"blocks per SM": 2.5, "warps per SM": 10.0, "grid": [216, 1, 1], "block": [256, 1, 1], '
                f'"est. achieved occupancy %": 25}}}}')
        self.ev(f'{{"ph": "s", "id": {c}, "pid": 100, "tid": {tid}, "ts": {ts:.3f}, "cat": "ac2g", "name": "ac2g"}}')
        self.ev(f'{{"ph": "f", "id": {c}, "pid": 0, "tid": {stream}, "ts": {start:.3f}, "cat": "ac2g", '
                f'"name": "ac2g", "bp": "e"}}')

    def step(self, n: int, ts: float, layers: int = 150) -> float:
        """One training step from ``ts``; returns its end."""
        r = self.rng
        begin = ts
        ts += 2.0
        self.cpu("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts, 180.0)
        ts += 190.0
        self.launch(ts, "Memcpy HtoD (Pageable -> Device)", 40.0, 22, "gpu_memcpy", "cudaMemcpyAsync")
        ts += 10.0
        for layer in range(layers):
            for op in _OPS:
                dur = r.uniform(8, 30)
                self.cpu("cpu_op", op, ts, dur)
                self.launch(ts + 2, r.choice(_KERNELS), r.uniform(3, 60), 7)
                ts += dur + r.uniform(0.5, 3)
            if layer % 25 == 0:
                self.launch(ts, "Memset (Device)", 2.0, 7, "gpu_memset", "cudaMemsetAsync")
            if layer % 10 == 9:
                self.cpu("user_annotation", "nccl:all_reduce", ts, 12.0)
                self.launch(ts + 1, _NCCL, r.uniform(200, 900), 20)
                ts += 14
        for _ in range(layers * 2):  # backward on the autograd thread
            dur = r.uniform(10, 40)
            self.cpu("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", ts, dur, tid=101)
            self.launch(ts + 2, r.choice(_KERNELS[:2]), r.uniform(5, 80), 7, tid=101)
            ts += dur + 1
        end = max(ts, *self.gpu.values()) + 50
        self.cpu("user_annotation", f"ProfilerStep#{n}", begin, end - begin)
        return end


def synthetic_trace(path: Path, size_mb: float, seed: int = 0) -> int:
    """Write a trace of at least ``size_mb`` MB to ``path``; returns its number of steps."""
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},\n'
                '"deviceProperties": [{"id": 0, "name": "synthetic"}],\n"traceEvents": [\n')
        w = _Writer(f, random.Random(seed))
        w.ev('{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "ts": 0, "args": {"name": "python3"}}')
        w.ev('{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "ts": 0, "args": {"name": "stream 7"}}')
        ts, n = 1_700_000_000_000_000.0, 0
        while f.tell() < size_mb * 1e6:
            n += 1
            ts = w.step(n, ts)
        f.write('\n],\n"traceName": "synthetic.json"}\n')
    return n


# --- the report -------------------------------------------------------------------------------------

def _compare(label: str, path: str, skip_hta: bool, repeats: int) -> None:
    size = os.path.getsize(path)
    print(f"\n{label}: {path} ({size / 1e6:.1f} MB on disk)")
    ours = _median_of("perfkit", path, repeats)
    print(f"  perfkit: {ours['wall_s']:7.3f} s (median of {_walls(ours)}), peak RSS {ours['peak_bytes'] / 2**20:5.0f} MiB "
          f"(net of imports {ours['net_bytes'] / 2**20:4.0f} MiB)")
    if skip_hta:
        return
    theirs = _median_of("hta", path, repeats)
    if "failed" in theirs:
        print(f"  HTA failed (exit {theirs['failed']})")
        return
    print(f"  HTA:     {theirs['wall_s']:7.3f} s (median of {_walls(theirs)}), peak RSS {theirs['peak_bytes'] / 2**20:5.0f} MiB "
          f"(net of imports {theirs['net_bytes'] / 2**20:4.0f} MiB)")
    print(f"  perfkit is {theirs['wall_s'] / ours['wall_s']:.1f}x faster (goal >= 10x; fastest of each: "
          f"{min(theirs['walls_s']) / min(ours['walls_s']):.1f}x); peak memory "
          f"{ours['peak_bytes'] / theirs['peak_bytes']:.2f}x of HTA's (goal <= 0.2x), net of imports "
          f"{ours['net_bytes'] / max(theirs['net_bytes'], 1):.2f}x")
    def close(a, b, tol):
        return abs(a - b) <= tol or (a != a and b != b)  # NaN on both sides agrees

    # 1 µs, and 1 µs more for each GPU event HTA's rounding gives -1 µs (perfkit: 0).
    sub_us = _count_sub_us(path)
    tol = 1 + sub_us
    same = all(close(a, b, tol) for a, b in zip(ours["temporal"][:4], theirs["temporal"][:4]))
    same &= close(ours["overlap_pctg"], theirs["overlap_pctg"], 0.1) and close(ours["idle_us"], theirs["idle_us"], tol)
    ours_types = {k: v for k, v in ours["kernel_type_us"].items() if v}  # a type with 0 µs: HTA leaves it out
    theirs_types = {k: v for k, v in theirs["kernel_type_us"].items() if v}
    same &= ours_types.keys() == theirs_types.keys() and all(close(ours_types[k], v, tol) for k, v in theirs_types.items())
    print(f"  results agree with HTA: {'yes' if same else 'NO'} (within {tol} us: {sub_us} sub-us GPU events HTA's "
          f"rounding keeps at -1 us, perfkit at 0; temporal us perfkit {ours['temporal'][:4]}, "
          f"HTA {theirs['temporal'][:4]}; idle {ours['idle_us']} vs {theirs['idle_us']} us; overlap {ours['overlap_pctg']} vs {theirs['overlap_pctg']})")


def _walls(res: dict) -> str:
    return " ".join(f"{w:.3f}" for w in res["walls_s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--sub-us":
        Path(sys.argv[3]).write_text(json.dumps(_sub_us_gpu_events(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of the synthetic trace (default 200)")
    parser.add_argument("--skip-hta", action="store_true", help="time perfkit alone")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh processes per side and trace; the median wall time is compared (default 3)")
    parser.add_argument("--keep", type=Path, help="write the synthetic trace here and keep it")
    parser.add_argument("--traces", nargs="*", type=Path, default=None,
                        help="real traces to compare on (default: the corpus's largest: HTA's trace_diff pair, "
                             "the ResNet and Qwen MI300X field traces); --size-mb 0 skips the synthetic one")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs "
          "(other processes share them; ratios are of this one run)")
    for path in (args.traces if args.traces is not None else CORPUS):
        if path.is_file():
            _compare("reference trace", str(path), args.skip_hta, args.repeats)
        else:
            print(f"\n(no trace at {path}; skipped)")
    if args.size_mb <= 0:
        return
    with tempfile.TemporaryDirectory(prefix="perfkit-trace-bench-") as tmp:
        path = args.keep or Path(tmp) / "synthetic.json"
        t0 = time.perf_counter()
        steps = synthetic_trace(path, args.size_mb)
        print(f"\nwrote a synthetic trace of {steps} ProfilerSteps in {time.perf_counter() - t0:.1f} s")
        _compare("synthetic trace", str(path), args.skip_hta, args.repeats)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
