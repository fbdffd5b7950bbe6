"""The report's Traces section: per profiled configuration and run, where the time went and its
trace files, linked.

Rows of a profiled run carry ``trace_path`` (rank 0), ``rank_trace_paths`` (every rank) and the
summary columns of :func:`perfkit.analyse.trace.breakdown.trace_summary` (``trace_idle_share``,
...). The summary table comes from those columns; the stacked temporal breakdown and the top
kernels need the traces themselves, read when the report is made, at most
:data:`MAX_REPORT_SETS` runs (the section says when it stopped there). Links to the files are
relative to the report file, so a results folder copied with its report keeps them working.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import pandas as pd

from ..analyse.trace.runs import TracedRun, traced_rows, traced_runs
from ..core.errors import BadInputError
from .trace import VIEWER_HINT, TraceSet, analyse_set, frames

__all__ = ["MAX_REPORT_SETS", "TracedRun", "traced_rows", "traced_runs", "traces_section", "ops_roofline_parts"]

MAX_REPORT_SETS = 6
"""Runs whose traces the report reads for its plots (each read takes time and memory)."""

_SUMMARY = {"trace_idle_share": "GPU idle", "trace_exposed_comm_share": "exposed comm.",
            "trace_data_wait_share": "data wait", "trace_top_kernel": "top kernel (CPU op)",
            "trace_top_kernel_share": "its share"}


def _href(path: Path, output: Path | None) -> str:
    """The link to ``path``: relative to the report's folder (or the working directory, in a
    notebook), absolute where no relative path exists (another drive)."""
    base = Path(output).resolve().parent if output is not None else Path.cwd()
    try:
        return Path(os.path.relpath(path.resolve(), base)).as_posix()
    except ValueError:
        return path.resolve().as_uri()


def _share(value) -> str:
    return f"{100 * value:.1f} %" if isinstance(value, (int, float)) and value == value else "n/a"


def _summary_table(runs: list[TracedRun]) -> str:
    present = [c for c in _SUMMARY if any(c in r.row for r in runs)]
    if not present:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ["configuration", "run", "ranks"] + [_SUMMARY[c] for c in present])
    body = ""
    for r in runs:
        cells = [r.config_id, r.run, str(len(r.paths))]
        for c in present:
            value = r.row.get(c)
            cells.append(_share(value) if c.endswith("_share") else "" if value is None else str(value))
        body += "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in cells) + "</tr>"
    return (f"<p>From each row's summary of its traces (shares of the GPU timeline, averaged over ranks; "
            f"data wait: of the profiled steps; top kernel: rank 0's, a CPU operator on a CPU-only trace).</p>"
            f'<table class="pk"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def _links_table(runs: list[TracedRun], output: Path | None) -> str:
    body = ""
    for r in runs:
        for rank, path in enumerate(r.paths):
            if path.exists():
                link = (f'<a href="{html.escape(_href(path, output))}">{html.escape(path.name)}</a>'
                        f" ({path.stat().st_size / 2**20:.2f} MiB)")
            else:
                link = f"{html.escape(path.name)}: not found at {html.escape(str(path))}"
            body += (f"<tr><td>{html.escape(r.config_id)}</td><td>{html.escape(r.run)}</td><td>{rank}</td>"
                     f"<td>{link}</td></tr>")
    return (f"<h3>Trace files</h3><p>Each trace file: {VIEWER_HINT}.</p>"
            '<table class="pk"><thead><tr><th>configuration</th><th>run</th><th>rank</th><th>trace file</th></tr>'
            f"</thead><tbody>{body}</tbody></table>")


def _untraced(all_rows: pd.DataFrame) -> str:
    """Configurations that asked for a trace and got none, with the reason (e.g. over the size cap)."""
    if "trace_reason" not in all_rows:
        return ""
    rows = all_rows[all_rows["trace_reason"].notna() & (all_rows["trace_reason"] != "profile off")]
    if "trace_path" in rows:
        rows = rows[rows["trace_path"].isna()]
    rows = rows.drop_duplicates(subset=[c for c in ("config_id", "trace_reason") if c in rows])
    if rows.empty:
        return ""
    items = "".join(f"<li>{html.escape(str(r.get('config_id', '')))}: {html.escape(str(r['trace_reason']))}</li>"
                    for r in rows.to_dict("records"))
    return f"<p>Profiled without a trace:</p><ul>{items}</ul>"


def ops_roofline_parts(results, max_plots: int = 2) -> list:
    """The roofline of each traced run's ops (its lowest rank; the first ``max_plots`` runs with
    recorded shapes), the per-category table beside it."""
    from ..core.specs import spec_peaks
    from .plots.trace import ops_roofline
    from .trace_text import format_time, percent

    parts = []
    for r in results:
        for ops in r.ops[:1]:
            if len(parts) >= 2 * max_plots or ops.shapes.empty:
                continue
            row = spec_peaks(ops.device) if ops.device else None
            cats = ops.categories()
            body = "".join(f"<tr><td>{html.escape(str(c.category))}</td><td>{c.ops}</td><td>{format_time(c.kernel_time_s)}"
                           f"</td><td>{percent(c.time_share)}</td><td>{percent(c.roof_share)}</td></tr>"
                           for c in cats.itertuples())
            parts.append(f"<h3>{html.escape(r.trace.label)}: ops on the roofline (rank {ops.rank}, {ops.window})</h3>"
                         '<table class="pk"><thead><tr><th>category</th><th>ops</th><th>kernel time</th>'
                         f"<th>share</th><th>of roof</th></tr></thead><tbody>{body}</tbody></table>")
            parts.append(ops_roofline(ops.shapes, ops.roof, row.flop_per_s if row else {},
                                      title=f"{r.trace.label}: ops on the {ops.roof.get('model') or 'unknown device'} roofline"))
    return parts


def traces_section(rows: pd.DataFrame, all_rows: pd.DataFrame, *, output: str | Path | None = None,
                   results_dir: str | Path | None = None, max_sets: int = MAX_REPORT_SETS):
    """The report's Traces section (a :class:`perfkit.view.report.Parts`): the summary of every
    traced run, the stacked temporal breakdown and top kernels of the first ``max_sets`` runs
    (read now), and every run's trace files as links (relative to ``output``, the report file)."""
    from .plots.trace import temporal_plot, top_kernels_plot
    from .report import Parts

    runs = traced_runs(rows, results_dir)
    intro = (f"<p>Where the time of each profiled run went, from its torch.profiler traces (one per rank), with "
             f"Holistic Trace Analysis' definitions: idle (no GPU activity), compute (computation kernels) and "
             f"non-compute (communication, memory kernels) time of the GPU timeline, and the kernels (CPU "
             f"operators on a CPU-only trace) that took the most time. <code>perfkit trace DIR</code> prints every "
             f"breakdown; each trace file {VIEWER_HINT}.</p>")
    read, notes = [], []
    for run in runs[:max_sets]:
        try:
            read.append(analyse_set(TraceSet(label=run.label, paths=run.paths), top=10))
        except (BadInputError, OSError) as exc:  # the rest of the report stands without this run's plots
            notes.append(f"{run.label}: not read ({exc})")
    if len(runs) > max_sets:
        notes.append(f"Breakdowns of the first {max_sets} of {len(runs)} traced runs are drawn (traces are read "
                     f"when the report is made); `perfkit trace DIR` shows them all.")
    parts: list = [intro + _summary_table(runs)]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if read:
        f = frames(read)
        parts.append(temporal_plot(f["temporal"], title="Temporal breakdown per run and rank"))
        lowest = f["top_kernels"].groupby("trace")["rank"].transform("min") == f["top_kernels"]["rank"]
        parts.append(top_kernels_plot(f["top_kernels"][lowest]))
        parts += ops_roofline_parts(read)
    parts.append(_links_table(runs, Path(output) if output is not None else None) + _untraced(all_rows))
    return Parts(tuple(parts))
