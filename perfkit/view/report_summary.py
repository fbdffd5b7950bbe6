"""The report's first screen: how did it go, and what to fix.

TensorBoard's profiler overview puts the step breakdown and its recommendation on one screen;
this does the same for a results folder, above every section:

- **devices** (name, count, driver, from the rows' environment fingerprints);
- **configurations by how they ended** (a configuration's ending is its rows' status);
- **headline figures per workload**: the best throughput and MFU of the training steps, the
  best GEMM rate and its share of the device's roof, the scaling efficiency at the largest world
  size, the best bus bandwidth, the inference latencies;
- **at most five findings**, the largest time costs first, similar ones on one line ("9
  points: noisy measurement");
- **a table of contents** of the sections below, and per configuration a line with its status, its
  parameters, its rows (opened on demand: their headline figures and the traces they recorded) and a
  link to its executed notebook, which holds its plots (relative to the report, so a copied folder
  keeps it).
"""

from __future__ import annotations

import html
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from .plots._common import whole

__all__ = ["summary_html", "anchor", "configurations_html", "devices_text", "MAX_FINDINGS"]

MAX_FINDINGS = 5


def anchor(title: str) -> str:
    """The HTML id of a section title: lowercase words joined by dashes."""
    return "-".join("".join(ch if ch.isalnum() else " " for ch in title.lower()).split())[:60]


def _first(series: pd.Series):
    values = series.dropna()
    return values.iloc[0] if len(values) else None


def devices_text(df: pd.DataFrame) -> str:
    """The devices the rows measured, one phrase: "2 × NVIDIA H200 (driver 570.86)", a CPU by its model."""
    if "env_device_name" not in df:
        return "unknown (rows without an environment fingerprint)"
    cols = [c for c in ("env_device_name", "env_device_count", "env_driver", "env_cpu_model") if c in df]
    seen = df[cols].drop_duplicates().dropna(subset=["env_device_name"])
    parts = []
    for r in seen.itertuples(index=False):
        row = dict(zip(cols, r))
        name = row["env_device_name"]
        if str(name).lower() in ("cpu", "") and row.get("env_cpu_model"):
            name = f"CPU: {row['env_cpu_model']}"
        count = row.get("env_device_count")
        driver = row.get("env_driver")
        text = f"{int(count)} × {name}" if isinstance(count, (int, float)) and count == count and count > 1 else str(name)
        parts.append(text + (f" (driver {driver})" if isinstance(driver, str) and driver else ""))
    return "; ".join(dict.fromkeys(parts)) or "unknown"


def _endings(df: pd.DataFrame) -> str:
    if "status" not in df or "config_id" not in df:
        return f"{len(df)} rows"
    order = {"failed": 0, "oom": 1, "timeout": 2, "killed": 3, "skipped": 4, "ok": 5}
    per_config = df.groupby("config_id")["status"].agg(lambda s: min(s, key=lambda v: order.get(v, 9)))
    counts = per_config.value_counts()
    words = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: order.get(kv[0], 9)))
    return f"{len(per_config)} configurations: {words} ({len(df)} rows)"


def _si(value: float, unit: str) -> str:
    if value is None or value != value:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _time(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= factor:
            return f"{seconds / factor:.3g} {unit}"
    return f"{seconds * 1e6:.3g} µs"


def _best(rows: pd.DataFrame, column: str):
    if column not in rows:
        return None
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
    if not (values == values).any():
        return None
    return rows.iloc[int(np.nanargmax(values))]  # by position: a concatenated frame repeats its index


def _headlines(ok: pd.DataFrame) -> list[str]:
    out = []
    work = ok["workload"] if "workload" in ok else pd.Series(None, index=ok.index, dtype=object)
    train = ok[work == "train_step"]
    if (row := _best(train, "samples_per_s")) is not None:
        mfu = row.get("mfu")
        out.append(f"training step: best {row['samples_per_s']:.4g} samples/s ({row.get('model')}, batch "
                   f"{int(row['batch_size'])}, {row.get('precision')}); MFU "
                   + (f"{100 * mfu:.1f} %" if isinstance(mfu, float) and mfu == mfu else "n/a"))
    gemm = ok[work == "gemm"]
    if (row := _best(gemm, "flop_per_s")) is not None:
        from ..core.specs import spec_peaks

        spec = spec_peaks(str(row.get("env_device_name") or ""))
        peak = spec.flop_per_s.get(spec.mfu_peak_key(str(row.get("dtype")))) if spec else None
        share = f", {100 * row['flop_per_s'] / peak:.0f} % of the {spec.model}'s {row.get('dtype')} spec" if peak else ""
        size = int(row["size"]) if isinstance(row.get("size"), (int, float)) and row.get("size") == row.get("size") else "?"
        out.append(f"GEMM: best {_si(row['flop_per_s'], 'FLOP/s')} ({row.get('dtype')}, size {size}{share})")
    scaling = ok[work == "scaling"]
    if len(scaling) and "world_size" in scaling and "samples_per_s" in scaling:
        from ..analyse.scaling import scaling_efficiency

        try:
            eff = scaling_efficiency(scaling)
            top = eff[eff["world_size"] == eff["world_size"].max()]
            e = pd.to_numeric(top["efficiency_vs_none"], errors="coerce").dropna()
            if len(e):
                out.append(f"scaling: {100 * e.max():.0f} % efficiency at {int(top['world_size'].max())} ranks "
                           f"(against the plain module on one)")
        except Exception:  # noqa: BLE001 - a headline is never worth failing the report for
            pass
    coll = ok[work == "collectives"]
    if (row := _best(coll, "busbw_bytes_per_s")) is not None:
        out.append(f"collectives: best bus bandwidth {_si(row['busbw_bytes_per_s'], 'B/s')} ({row.get('op')}, "
                   f"{int(row['world_size']) if row.get('world_size') == row.get('world_size') else '?'} ranks)")
    inf = ok[work == "inference"]
    if len(inf) and "tpot_s" in inf:
        t = pd.to_numeric(inf["tpot_s"], errors="coerce").dropna()
        f = pd.to_numeric(inf.get("ttft_s", pd.Series(dtype=float)), errors="coerce").dropna()
        if len(t):
            out.append(f"inference: TPOT {_time(t.min())}–{_time(t.max())}" + (f", TTFT from {_time(f.min())}" if len(f) else ""))
    loaders = ok[work == "dataloader"]
    if (row := _best(loaders, "step_samples_per_s")) is not None:
        out.append(f"data loading: best {row['step_samples_per_s']:.4g} samples/s at {int(row.get('num_workers', 0))} workers")
    return out


def _findings(findings: list) -> list[str]:
    """At most :data:`MAX_FINDINGS` lines: each configuration's binding constraint, grouped by
    rule, the largest time cost first."""
    from ..analyse.advice import is_note

    binding: dict[str, object] = {}
    for f in findings:
        if not is_note(f):
            binding.setdefault(f.point, f)
    groups: dict[tuple, list] = defaultdict(list)
    for f in binding.values():
        groups[(f.rule, f.constraint)].append(f)
    ranked = sorted(groups.values(), key=lambda fs: -max((f.cost_share if f.cost_share == f.cost_share else 0.0)
                                                          for f in fs))
    lines = []
    for fs in ranked[:MAX_FINDINGS]:
        f = max(fs, key=lambda x: x.cost_share if x.cost_share == x.cost_share else -1)
        cost = f" ({100 * f.cost_share:.0f} % of its time)" if f.cost_share == f.cost_share else ""
        if len(fs) == 1:
            lines.append(f"<b>{html.escape(f.constraint)}</b>{cost}: {html.escape(f.point)} — {html.escape(f.summary)}"
                         f"<br><i>try:</i> {html.escape(f.advice)}")
        else:
            lines.append(f"<b>{len(fs)} points: {html.escape(f.constraint)}</b> (the largest{cost}: "
                         f"{html.escape(f.point)}) — <i>try:</i> {html.escape(f.advice)}")
    if len(ranked) > MAX_FINDINGS:
        lines.append(f"{len(ranked) - MAX_FINDINGS} more kinds of finding in the Advice section")
    return lines


def summary_html(df: pd.DataFrame, findings: list, titles: list[str]) -> str:
    """The first screen (module docstring), as HTML."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    items = [f"<li><b>devices:</b> {html.escape(devices_text(df))}</li>",
             f"<li><b>ran:</b> {html.escape(_endings(df))}</li>"]
    items += [f"<li>{html.escape(h)}</li>" for h in _headlines(ok)]
    found = _findings(findings)
    out = [f'<div class="summary"><ul>{"".join(items)}</ul>']
    if found:
        out.append("<h3>What binds it, and what to try</h3><ol>" + "".join(f"<li>{x}</li>" for x in found) + "</ol>")
    toc = " · ".join(f'<a href="#{anchor(t)}">{html.escape(t)}</a>' for t in [*titles, "Configurations",
                                                                          "Failures", "Environment fingerprints"])
    out.append(f'<p class="toc"><b>Sections:</b> {toc}</p></div>')
    return "".join(out)


def configurations_html(df: pd.DataFrame, *, results_dir=None, output=None) -> str:
    """One line per configuration: status, notebook, the parameters that vary, its rows, and a link
    to its executed notebook (relative to the report)."""
    if "config_id" not in df:
        return ""
    base = Path(output).resolve().parent if output is not None else Path.cwd()
    varying = [c for c in _params(df) if df[c].astype(str).nunique() > 1]
    body = []
    for cid, rows in df.groupby("config_id", sort=False):
        nb = _first(rows["notebook"]) if "notebook" in rows else None
        params = ", ".join(f"{c}={_first(rows[c])}" for c in varying if _first(rows[c]) is not None)
        link = ""
        if results_dir is not None:
            path = Path(results_dir) / "notebooks" / f"{cid}.ipynb"
            if path.exists():
                try:
                    href = Path(os.path.relpath(path.resolve(), base)).as_posix()
                except ValueError:
                    href = path.resolve().as_uri()
                link = f'<a href="{html.escape(href)}">notebook</a>'
        status = ", ".join(sorted(rows["status"].dropna().unique())) if "status" in rows else ""
        body.append(f"<tr><td>{html.escape(str(cid))}</td><td>{html.escape(str(nb or ''))}</td><td>{html.escape(status)}"
                    f"</td><td>{html.escape(params)}</td><td>{_drill_down(rows)}</td><td>{link}</td></tr>")
    return (f'<details><summary>{len(body)} configurations: status, parameters, rows (open one for its figures and '
            'traces), executed notebook (its plots)</summary>'
            '<table class="pk"><thead><tr><th>configuration</th><th>notebook</th><th>status</th><th>parameters '
            f'that vary</th><th>rows</th><th>notebook</th></tr></thead><tbody>{"".join(body)}</tbody></table></details>')


#: What a configuration's drill-down shows of its rows, in this order, where the rows have a value:
#: what each row is, then how it ended and its headline figures.
DRILL_DOWN_COLUMNS = (
    "workload", "op", "impl", "dtype", "size", "shape", "model", "batch_size", "precision", "parallelism",
    "world_size", "status", "reason", "time_s", "step_time_s", "samples_per_s", "tokens_per_s", "mfu",
    "ttft_s", "tpot_s", "flop_per_s", "bytes_per_s", "busbw_bytes_per_s", "peak_memory_bytes", "correct",
)
_DRILL_MAX_ROWS, _DRILL_MAX_COLUMNS = 20, 12


def _shown(value) -> str:
    if value is None or (isinstance(value, (float, np.floating)) and not np.isfinite(value)):
        return ""
    value = whole(float(value)) if isinstance(value, (float, np.floating)) else value
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _drill_down(rows: pd.DataFrame) -> str:
    """A configuration's rows, opened on demand: the :data:`DRILL_DOWN_COLUMNS` they have (12 at
    most, 20 rows at most, said), and the trace files they recorded, linked to the Traces section."""
    cols = [c for c in DRILL_DOWN_COLUMNS if c in rows and rows[c].notna().any()][:_DRILL_MAX_COLUMNS]
    if not cols:
        return str(len(rows))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(_shown(v))}</td>" for v in r) + "</tr>"
                    for r in rows[cols].head(_DRILL_MAX_ROWS).itertuples(index=False))
    more = f"<p>… {len(rows) - _DRILL_MAX_ROWS} more rows (perfkit query)</p>" if len(rows) > _DRILL_MAX_ROWS else ""
    traces = ""
    if "trace_path" in rows and rows["trace_path"].notna().any():
        names = ", ".join(html.escape(Path(str(p)).name) for p in dict.fromkeys(rows["trace_path"].dropna()))
        traces = f'<p>traces: {names} (<a href="#{anchor("Traces")}">their summary</a>)</p>'
    return (f'<details><summary>{len(rows)}</summary><table class="pk"><thead><tr>{head}</tr></thead>'
            f'<tbody>{cells}</tbody></table>{more}{traces}</details>')


def _params(df: pd.DataFrame) -> list[str]:
    import json

    names: set[str] = set()
    for text in df.get("param_names", pd.Series(dtype=object)).dropna().unique():
        try:
            names.update(json.loads(text) if isinstance(text, str) else list(text))
        except (ValueError, TypeError):
            continue
    return sorted(n for n in names if n in df)
