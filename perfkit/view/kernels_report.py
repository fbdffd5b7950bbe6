"""The report's Kernels section: a user's impls against the reference (``notebooks/kernels.ipynb``
rows, :mod:`perfkit.analyse.kernels`), the views the notebook draws — what ran and how it ended,
``fast_p``, the speedup table, the ``perf_report`` chart and the roofline under the roofs the
notebook recorded beside its rows."""

from __future__ import annotations

import html

import pandas as pd

from .plots._common import whole
from .report import _CSS, Parts, _table_html

__all__ = ["kernel_rows", "kernels_section"]

_SPEEDUP_COLUMNS = ["impl", "dtype", "shape", "correct", "max_rel_error", "speedup", "speedup_ci_low",
                    "speedup_ci_high", "verdict"]


def kernel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every ``kernels`` row, failed ones included: a failing impl is a point of its own (its reason)."""
    if "workload" not in df:
        return df.iloc[0:0]
    return df[df["workload"] == "kernels"]


def _shape_text(frame: pd.DataFrame) -> pd.DataFrame:
    """Shapes as "rows=256, hidden=1024" (Parquet hands a shape's dimensions back as floats, and
    the keys of every shape recorded in the folder, NaN where a shape has not that dimension)."""
    return frame.assign(shape=frame["shape"].map(lambda s: ", ".join(f"{k}={whole(v)}" for k, v in s.items() if v == v)
                                                 if isinstance(s, dict) else str(s)))


def _summary(rows: pd.DataFrame, table: pd.DataFrame, fast: pd.DataFrame) -> str:
    impls = ", ".join(map(str, dict.fromkeys(rows["impl"])))
    reference = ", ".join(map(str, dict.fromkeys(rows["reference"].dropna())))
    devices = ", ".join(map(str, dict.fromkeys(rows.get("device", pd.Series(dtype=object)).dropna()))) or "unknown"
    out = [_CSS, f"<p>{len(table)} points ({html.escape(impls)}) against the reference "
                 f"<b>{html.escape(reference)}</b> on {html.escape(devices)}: correct first (within rtol/atol of "
                 f"the reference, <code>torch.testing.assert_close</code>'s per dtype unless given), then timed; "
                 f"an incorrect impl is never called faster. <code>fast_p</code> (KernelBench): the share of an "
                 f"impl's points both correct and more than p× faster.</p>"]
    notes = rows.get("timing_note", pd.Series(dtype=object)).dropna().unique()
    out += [f'<p class="warn">⚠ {html.escape(str(n))}</p>' for n in notes]
    wrong = table[table["verdict"] == "incorrect"]
    if len(wrong):
        worst = wrong.sort_values("max_rel_error", ascending=False).iloc[0]
        out.append(f'<p class="warn">Incorrect: {len(wrong)} point(s) outside tolerance, e.g. {html.escape(str(worst["impl"]))} '
                   f'{html.escape(str(worst["dtype"]))} {html.escape(str(worst["shape"]))}: max rel error '
                   f'{worst["max_rel_error"]:.3g}.</p>')
    failed = rows[rows["status"] != "ok"]
    if len(failed):
        out.append("<h3>Failed points</h3>" + _table_html(
            _shape_text(failed)[["impl", "dtype", "shape", "status", "reason"]]))
    out.append("<h3>fast_p</h3>" + _table_html(fast))
    shown = table[[c for c in _SPEEDUP_COLUMNS if c in table]]
    out.append("<h3>Speedup over the reference (95 % CI)</h3>" + _table_html(shown.round(4)))
    return "".join(out)


def kernels_section(rows: pd.DataFrame, all_rows: pd.DataFrame) -> Parts:
    """Summary and tables, the ``perf_report`` chart (GB/s where the rows have bytes, else
    TFLOP/s) and the roofline of every impl's points under the recorded roofs."""
    from ..analyse import kernels
    from .plots.kernels import perf_report
    from .plots.roofline import roofline_static

    table = _shape_text(kernels.speedups(rows))
    fast = kernels.fast_p(table)
    ok = rows[rows["status"] == "ok"]
    metric = "bytes_per_s" if "bytes_per_s" in ok and ok["bytes_per_s"].notna().any() else "flop_per_s"
    parts: list = [_summary(rows, table, fast), perf_report(rows, metric=metric)]
    ceilings = None
    if {"workload", "config_id"} <= set(all_rows.columns):
        ceilings = all_rows[(all_rows["workload"] == "ceiling") & all_rows["config_id"].isin(rows["config_id"].unique())]
        ceilings = ceilings if len(ceilings) else None
    points = kernels.roofline_points(rows, ceilings)
    if len(points):
        parts.append(roofline_static(points, ceilings, title="Kernels on the roofline"))
    else:
        parts.append("<p>No roofline: no ok point has both FLOP and bytes (give the notebook flops and bytes_fn).</p>")
    return Parts(tuple(parts))
