"""``perfkit trace`` as text: a trace set's GPU timeline per window, its ops on the roofline,
HTA's breakdowns, and ``--diff``'s tables; times shown with SI prefixes (data stays in seconds)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["VIEWER_HINT", "BREAKDOWN_HELP", "format_time", "data_wait_by_rank", "render_text", "render_diff",
           "timeline_text", "op_tables_text", "op_diff_text", "percent"]

VIEWER_HINT = "open in Perfetto (ui.perfetto.dev) or chrome://tracing"

#: One line per breakdown: what it measures, in HTA's words (hta/analyzers/breakdown_analysis.py).
BREAKDOWN_HELP = {
    "timeline": "where the GPU's time goes in each window (each ProfilerStep's launched GPU work, all steps, the "
                "whole trace), from the trace's exact times: computation, communication and memcpy not hidden "
                "behind computation, idle (AMD TraceLens's gpu_timeline)",
    "ops": "every op the trace recorded with shapes, on the device's roof: FLOP and bytes from its shapes, "
           "its kernels' time, achieved rates and share of the attainable roof min(peak, intensity x bandwidth)",
    "temporal": "GPU timeline from its first kernel start to its last end (kernel_time), split into idle "
                "(no GPU activity), compute (computation kernels) and non-compute (communication, memory) time "
                "(HTA's temporal breakdown, over HTA's window)",
    "idle": "per GPU stream, the gaps between its kernels: host wait (launched after the previous one ended), "
            "kernel wait (gap under 30 µs) or other",
    "kernel_types": "GPU busy time in each mix of computation, communication and memory kernels running at once",
    "overlap": "the share of communication time during which computation runs too (comp_comm_overlap_pctg)",
    "top_kernels": "the kernels (CPU operators on a CPU-only trace) with the most total time, with counts and shares",
    "data_wait": "the share of each ProfilerStep spent waiting for its batch (data_wait or DataLoader spans)",
}
_NAME_CHARS = 70


def percent(value: float) -> str:
    return f"{100 * value:.1f} %" if value == value else "n/a"


def _rate(value: float, unit: str) -> str:
    if value != value:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def timeline_text(timeline: pd.DataFrame) -> pd.DataFrame:
    """The timeline as a table of times and shares of each window's total."""
    t = format_time
    out = pd.DataFrame({"rank": timeline["rank"], "window": timeline["window"], "kernels": timeline["kernels"]})
    total = timeline["total_time_s"].where(timeline["total_time_s"] > 0)
    for col, label in (("computation_time_s", "computation"), ("exposed_comm_time_s", "exposed comm"),
                       ("exposed_memcpy_time_s", "exposed memcpy"), ("idle_time_s", "idle")):
        out[label] = [f"{t(v)} ({100 * v / s:.1f} %)" if s == s else t(v) for v, s in zip(timeline[col], total)]
    out["total"] = timeline["total_time_s"].map(t)
    return out


def op_tables_text(ops, top: int) -> list[str]:
    """Lines for one rank's ops: the roof, the per-category table, the top ops, the unexplained."""
    roof = ops.roof
    where = (f"{roof['device']}: {roof['model']} ({roof['source']})" if roof["model"]
             else roof["reason"])
    lines = [f"    device: {where}"]
    cats = ops.categories()
    if len(cats):
        shown = pd.DataFrame({"category": cats["category"], "ops": cats["ops"],
                              "time": cats["kernel_time_s"].map(format_time), "share": cats["time_share"].map(percent),
                              "achieved": [f"{_rate(f, 'FLOP/s')}, {_rate(b, 'B/s')}" if f == f else "" for f, b in
                                           zip(cats["flop_per_s"], cats["bytes_per_s"])],
                              "of roof": cats["roof_share"].map(percent)})
        lines.append(_table(shown))
    shapes = ops.shapes.head(top)
    if len(shapes):
        lines += ["", f"    Top {len(shapes)} ops by time (each unique shape; the JSON has every op):"]
        shown = pd.DataFrame({"op": _names(shapes["op"]), "shapes": shapes["input_dims"].map(lambda s: s[:48]),
                              "dtype": shapes["dtype"].fillna("?"), "calls": shapes["count"],
                              "time": shapes["kernel_time_s"].map(format_time),
                              "achieved": [_rate(f, "FLOP/s") if f > 0 else _rate(b, "B/s")
                                           for f, b in zip(shapes["flop_per_s"].fillna(0), shapes["bytes_per_s"])],
                              "of roof": shapes["roof_share"].map(percent), "bound": shapes["roof_bound"].fillna("")})
        lines.append(_table(shown))
    if len(ops.unexplained):
        u = ops.unexplained
        lines += ["", f"    Kernels no op model explains: {len(u)} ({format_time(u['kernel_time_s'].sum())}); the largest:"]
        shown = pd.DataFrame({"kernel": _names(u["kernel"].head(3)), "launched by": u["launched_by"].head(3),
                              "count": u["kernels"].head(3), "time": u["kernel_time_s"].head(3).map(format_time)})
        lines.append(_table(shown))
    return lines


def _table(frame: pd.DataFrame) -> str:
    return "    " + frame.to_string(index=False, na_rep="n/a").replace("\n", "\n    ")


def data_wait_by_rank(data_wait: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, Σ step time, Σ data wait and their ratio (as ``trace_summary``'s share)."""
    g = data_wait.groupby("rank")
    out = pd.DataFrame({"steps": g["step"].count(), "step_time_s": g["step_time_s"].sum(),
                        "data_wait_time_s": g["data_wait_time_s"].sum()}).reset_index()
    out["data_wait_share"] = out["data_wait_time_s"] / out["step_time_s"].where(out["step_time_s"] > 0)
    return out


def format_time(seconds: float) -> str:
    """0.0123 → '12.3 ms' (display only; data stays in seconds)."""
    if seconds != seconds:
        return "n/a"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} µs"


def _names(names: pd.Series) -> pd.Series:
    """Shortened and left-aligned (pandas right-aligns text columns)."""
    from .plots.trace import short_name

    short = names.map(lambda n: short_name(n, _NAME_CHARS))
    return short.str.ljust(int(short.str.len().max())) if len(short) else short


def _top_text(top: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"rank": top["rank"], "name": _names(top["name"]), "type": top["kernel_type"].where(
        top["kind"] == "kernel", "cpu_op"), "count": top["count"], "total": top["total_time_s"].map(format_time),
        "share": top["share"].map(lambda v: f"{100 * v:.1f} %" if v == v else "n/a")})


def render_text(results, *, top: int = 10) -> str:
    """Every set's timeline, ops and breakdowns as terminal tables, each introduced by what it measures."""
    lines = []
    for r in results:
        files = ", ".join(p.name for p in r.trace.paths)
        lines += [f"== {r.trace.label} ({len(r.trace.paths)} rank file(s): {files}; {r.events:,} events)", ""]
        if len(r.timeline):
            lines += [f"  GPU timeline: {BREAKDOWN_HELP['timeline']}.", _table(timeline_text(r.timeline)), ""]
        for ops in r.ops:
            lines += [f"  Ops on the roofline (rank {ops.rank}, window {ops.window}): {BREAKDOWN_HELP['ops']}.",
                      *op_tables_text(ops, top), ""]
        b = r.breakdowns
        if not r.has_gpu:
            lines += ["  Temporal, idle-time, kernel-type and overlap breakdowns: no GPU activity in this trace "
                      "(CPU only; HTA's breakdowns need GPU kernels): see the top CPU operators.", ""]
        for key, title in (("temporal", "Temporal breakdown"), ("idle", "Idle time per stream"),
                           ("kernel_types", "Kernel types"), ("overlap", "Communication/computation overlap")):
            if r.has_gpu:
                lines += [f"  {title}: {BREAKDOWN_HELP[key]}.", _table(b[key]) if len(b[key]) else "    none", ""]
        kind = "kernels" if r.has_gpu else "CPU operators"
        lines.append(f"  Top {kind}: {BREAKDOWN_HELP['top_kernels']}.")
        lines += [_table(_top_text(r.top_kernels)) if len(r.top_kernels) else "    none", ""]
        lines.append(f"  Data wait: {BREAKDOWN_HELP['data_wait']}.")
        lines += [_table(data_wait_by_rank(r.data_wait)) if len(r.data_wait) else "    no ProfilerStep in the window", ""]
    lines.append(f"The trace files {VIEWER_HINT}.")
    return "\n".join(lines)


def _diff_text(frame: pd.DataFrame) -> str:
    t = format_time
    shown = pd.DataFrame({
        "name": _names(frame["name"]), "control/step": frame["control_time_per_step_s"].map(t),
        "test/step": frame["test_time_per_step_s"].map(t), "diff/step": frame["diff_time_per_step_s"].map(t),
        "change": [f"{c} ({100 * r:+.1f} %)" if r == r and c not in ("added", "removed") else c
                   for c, r in zip(frame["change"], frame["relative_change"])],
    })
    return _table(shown) if len(shown) else "    none"


def _change(diff_s: float, relative: float) -> str:
    sign = "+" if diff_s >= 0 else "−"
    return f"{sign}{format_time(abs(diff_s))}" + (f" ({100 * relative:+.1f} %)" if relative == relative else "")


def op_diff_text(ops, *, control: Path, test: Path, top: int) -> list[str]:
    """Lines of the op-by-op comparison: the timelines, the categories, the shapes that moved most."""
    t = format_time
    lines = [f"== ops compared by name, shapes and dtypes: control {control} ({ops.control_device or 'device unknown'})"
             f" → test {test} ({ops.test_device or 'device unknown'})", ""]
    if len(ops.timeline):
        shown = pd.DataFrame({"figure": ops.timeline["figure"], "control": ops.timeline["control_s"].map(t),
                              "test": ops.timeline["test_s"].map(t),
                              "test − control": [_change(d, r) for d, r in zip(ops.timeline["diff_s"],
                                                                               ops.timeline["relative_change"])]})
        lines += ["  GPU timeline of each side's window:", _table(shown), ""]
    c = ops.categories
    shown = pd.DataFrame({"category": c["category"], "control": c["control_time_s"].map(t), "test": c["test_time_s"].map(t),
                          "test − control": [_change(d, r) for d, r in zip(c["diff_time_s"], c["relative_change"])]})
    lines += ["  Time per category:", _table(shown), ""]
    s = ops.shapes.head(top)
    shown = pd.DataFrame({"op": _names(s["op"]), "shapes": s["input_dims"].map(lambda x: x[:44]),
                          "calls": [f"{int(a)}/{int(b)}" for a, b in zip(s["control_count"], s["test_count"])],
                          "control": s["control_time_s"].map(t), "test": s["test_time_s"].map(t),
                          "test − control": [_change(d, r) for d, r in zip(s["diff_time_s"], s["relative_change"])],
                          "TFLOP/s": [f"{a / 1e12:.3g} → {b / 1e12:.3g}" if a == a and a > 0 else ""
                                      for a, b in zip(s["control_flop_per_s"], s["test_flop_per_s"])]})
    lines += [f"  The ops that explain most of the difference ({len(ops.shapes)} matched shapes):", _table(shown), ""]
    for label, frame in (("control only", ops.only_control), ("test only", ops.only_test)):
        if len(frame):
            lines.append(f"  Ops on the {label} side ({len(frame)}): " + ", ".join(
                f"{r.op} {r.input_dims[:30]} ×{r.count} ({t(r.time_s)})" for r in frame.head(3).itertuples()))
    return lines + [""]


def render_diff(diff, *, control: Path, test: Path, device: str, top: int, ops=None) -> str:
    what = "GPU kernels" if device == "gpu" else "CPU operators"
    lines = op_diff_text(ops, control=control, test=test, top=top) if ops is not None else []
    lines += [f"== trace diff of {what} by name, time per ProfilerStep: control {control} ({diff.control_steps} "
              f"steps) → test {test} ({diff.test_steps} steps)", "",
             "  Changed most (largest |test − control| per step):", _diff_text(diff.changed_most), "",
             f"  Added (only in test; {len(diff.added)} in all):", _diff_text(diff.added.head(top)), "",
             f"  Removed (only in control; {len(diff.removed)} in all):", _diff_text(diff.removed.head(top)), "",
             f"The trace files {VIEWER_HINT}."]
    return "\n".join(lines)


