"""Advice from a trace alone: what binds a profiled step when all a user has is its Kineto trace.

The rules read the GPU timeline of the trace's main window (its ProfilerSteps, else what it
launched: :func:`perfkit.analyse.trace.timeline.main_window`) and its ops on the device's roof
(:func:`perfkit.analyse.trace.ops.trace_ops`), and return :class:`~.findings.Finding` objects as
the row rules do, ranked on one scale: the share of the window's time each constraint costs.

=========================  ==================================================  =====================
rule                       evidence                                            threshold, source
=========================  ==================================================  =====================
trace_exposed_comm         exposed_comm_time_s / total_time_s                  10 % of the window
                                                                               (as exposed_communication)
trace_idle                 idle_time_s / total_time_s; the share of kernels    GPU idle >= 50 %:
                           under 10 µs                                         tb_plugin's low GPU
                                                                               utilization (< 0.5)
trace_ops_below_roof       GEMM, attention and convolution time whose share    under 50 % of the
                           of the attainable roof min(P, I·B) is low           roof, >= 10 % of the
                                                                               GPU time
trace_recompute            recompute computation / all computation             10 % (activation
                                                                               checkpointing's cost)
trace_exposed_memcpy       exposed_memcpy_time_s / total_time_s                5 % of the window
=========================  ==================================================  =====================
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfkit.analyse.trace.ops import TraceOps
from .findings import Finding

__all__ = ["TRACE_RULES", "trace_findings"]

SHORT_KERNEL_US = 10.0
"""A kernel shorter than this runs about as long as its launch costs the host (NVIDIA, "Getting
Started with CUDA Graphs", 2019), as :data:`perfkit.analyse.trace.breakdown.SHORT_KERNEL_US`."""
TRACE_RULES = {
    "trace_exposed_comm": (0.10, "exposed communication over 10 % of the step, as the row rule "
                                 "exposed_communication (TraceLens's gpu_timeline: exposed_comm_time)"),
    "trace_idle": (0.50, "GPU idle over half the step: tb_plugin's low GPU utilization (< 0.5)"),
    "trace_ops_below_roof": (0.50, "matrix ops under half of their attainable roof min(P, I·B) "
                                   "(Williams et al. 2009), >= 10 % of the GPU time"),
    "trace_recompute": (0.10, "activation checkpointing recomputing over 10 % of the computation"),
    "trace_exposed_memcpy": (0.05, "memcpy not hidden behind computation over 5 % of the step"),
}


def _finding(rule: str, constraint: str, point: str, share: float, evidence: dict, summary: str, advice: str,
             value: float, below: bool = False) -> Finding:
    """``value`` against the rule's threshold: low confidence within a factor 1.5 of it (above it,
    or below it for a ``below`` rule such as a roof share)."""
    threshold, source = TRACE_RULES[rule]
    near = value > threshold / 1.5 if below else value < threshold * 1.5
    return Finding(rule=rule, constraint=constraint, point=point, config_ids=(), cost_share=float(share),
                   evidence={k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v)
                             for k, v in evidence.items()},
                   summary=summary, advice=advice, confidence="low" if near else "high", source=source, robust=True)


def trace_findings(label: str, timeline: pd.DataFrame, ops: TraceOps, kernel_durations_us: np.ndarray) -> list[Finding]:
    """The findings of one rank's trace: ``timeline`` its :func:`gpu_timeline` rows, ``ops`` its
    main window's ops, ``kernel_durations_us`` that window's kernel durations; ranked, largest cost first."""
    window = ops.window
    rows = timeline[timeline["window"] == window].set_index("kernels")
    if "all" not in rows.index:
        return []
    t = rows.loc["all"]
    total = float(t["total_time_s"])
    if not total > 0:
        return []
    point = f"{label} (rank {ops.rank}, window {window})"
    out = []
    comm = t["exposed_comm_time_s"] / total
    if comm >= TRACE_RULES["trace_exposed_comm"][0]:
        evidence = {"exposed_comm_time_s": t["exposed_comm_time_s"], "total_comm_time_s": t["total_comm_time_s"],
                    "total_time_s": total}
        note = ""
        if "normal" in rows.index:  # TraceLens counts the comm under recompute as exposed: its figure too
            normal = rows.loc["normal"]
            evidence["exposed_comm_share_without_recompute"] = normal["exposed_comm_time_s"] / normal["total_time_s"]
            note = (f" ({100 * evidence['exposed_comm_share_without_recompute']:.1f} % when the recompute is not "
                    f"counted as computation, as TraceLens's report counts it)")
        hidden = 1 - t["exposed_comm_time_s"] / t["total_comm_time_s"] if t["total_comm_time_s"] else math.nan
        out.append(_finding(
            "trace_exposed_comm", "exposed communication", point, comm, evidence,
            f"collectives (NCCL/RCCL kernels) run {100 * comm:.1f} % of the step with no computation beside them"
            f"{note}; {100 * hidden:.0f} % of their {t['total_comm_time_s'] * 1e3:.3g} ms is hidden",
            "overlap them with compute: larger DDP buckets issued earlier, FSDP prefetch, or fewer bytes "
            "(gradient compression, a smaller world size per collective); check the network's busbw "
            "(perfkit collectives) against the link", comm))
    idle = t["idle_time_s"] / total
    short = float((kernel_durations_us < SHORT_KERNEL_US).mean()) if len(kernel_durations_us) else math.nan
    if idle >= TRACE_RULES["trace_idle"][0]:
        out.append(_finding(
            "trace_idle", "host- or launch-bound", point, idle,
            {"idle_time_s": t["idle_time_s"], "total_time_s": total, "short_kernel_share": short,
             "kernels": len(kernel_durations_us)},
            f"the GPU idles {100 * idle:.1f} % of the step; {100 * short:.0f} % of its kernels run under "
            f"{SHORT_KERNEL_US:g} µs, about as long as a launch",
            "launch fewer, larger kernels: CUDA graphs (torch.compile mode='reduce-overhead'), fused ops, a "
            "larger batch; or find the host work between launches (the trace's CPU ops)", idle))
    shapes = ops.shapes
    matrix = shapes[shapes["category"].isin(["GEMM", "attention", "convolution"]) & shapes["roof_share"].notna()]
    low = matrix[matrix["roof_share"] < TRACE_RULES["trace_ops_below_roof"][0]]
    low_time = float(low["kernel_time_s"].sum())
    if ops.gpu_time_s and low_time / ops.gpu_time_s >= 0.10:
        worst = low.sort_values("kernel_time_s", ascending=False).head(3)
        names = "; ".join(f"{r.op} {r.input_dims[:40]} at {100 * r.roof_share:.0f} % ({r.kernel_time_s * 1e3:.3g} ms)"
                          for r in worst.itertuples())
        share = low_time / total
        out.append(_finding(
            "trace_ops_below_roof", "matrix ops far below their roof", point, min(share, 1.0),
            {"time_s": low_time, "gpu_time_s": ops.gpu_time_s, "device": ops.device,
             "time_weighted_roof_share": float((low["roof_share"] * low["kernel_time_s"]).sum() / low_time)},
            f"{100 * low_time / ops.gpu_time_s:.0f} % of the GPU time is GEMM/attention/convolution under half of its "
            f"attainable roof on the {ops.device}: {names}",
            "check the dtype (bf16/fp8 where fp32 runs), shapes that tile badly (multiples of 64/128), a tuned "
            "kernel (cuBLASLt/hipBLASLt tuning, TunableOp), or fusing the small ops around them",
            float((low["roof_share"] * low["kernel_time_s"]).sum() / low_time), below=True))
    if "recompute" in rows.index and t["computation_time_s"] > 0:
        again = rows.loc["recompute"]["computation_time_s"] / t["computation_time_s"]
        if again >= TRACE_RULES["trace_recompute"][0]:
            out.append(_finding(
                "trace_recompute", "activation checkpointing's recompute", point,
                rows.loc["recompute"]["computation_time_s"] / total,
                {"recompute_computation_time_s": rows.loc["recompute"]["computation_time_s"],
                 "computation_time_s": t["computation_time_s"]},
                f"recompute is {100 * again:.1f} % of the step's computation",
                "checkpoint fewer blocks where memory allows (perfkit fit shows the headroom), or selective "
                "checkpointing of the cheap ops only", again))
    memcpy = t["exposed_memcpy_time_s"] / total
    if memcpy >= TRACE_RULES["trace_exposed_memcpy"][0]:
        out.append(_finding(
            "trace_exposed_memcpy", "exposed memory copies", point, memcpy,
            {"exposed_memcpy_time_s": t["exposed_memcpy_time_s"], "total_memcpy_time_s": t["total_memcpy_time_s"]},
            f"memory copies run {100 * memcpy:.1f} % of the step with nothing beside them",
            "pin host memory and copy with non_blocking=True on a side stream; keep tensors on the device", memcpy))
    return sorted(out, key=lambda f: -f.cost_share)
