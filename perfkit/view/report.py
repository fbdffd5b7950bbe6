"""What the standalone HTML report shows: an A/B sweep's comparison, every plot whose rows are
present, the profiled runs' traces (breakdowns and links), the failures, the environment.

The sections and the page's text are here; :mod:`perfkit.view.report_page` writes them as one
page, bokeh resources inlined (it opens offline, e.g. copied off a cluster node). Text taken from
data — labels, reasons, hostnames — is HTML-escaped before it reaches the page.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import plots
from .plots._common import whole
from .report_summary import anchor, configurations_html, summary_html

__all__ = ["Section", "SECTIONS", "sections", "failures_table", "present_sections",
           "section_items", "page_top_html", "page_bottom_html",
           "REPORT_DIR_ENV", "notebook_results_dir", "comparison_base", "COMPARE_DIR_ENV",
           "notebook_compare_dir", "Parts"]

#: Fingerprint facts whose mix within one plot makes comparisons suspect.
_COMPARABILITY_KEYS = ("env_torch", "env_device_name", "env_driver", "env_torch_cuda", "env_torch_hip",
                       "env_transformers", "env_torchvision")


@dataclass(kw_only=True, frozen=True)
class Section:
    """One part of the report: shown when ``select`` finds rows for it."""

    title: str
    select: Callable[[pd.DataFrame], pd.DataFrame]
    """Rows this section draws (an empty frame hides the section)."""
    build: Callable[[pd.DataFrame, pd.DataFrame], object]
    """(its rows, all rows) → a holoviews object, or :class:`Parts` (HTML text and plots)."""
    links: bool = False
    """``build`` also takes ``output=`` (the report file; None in a notebook) and ``results_dir=``,
    to link files beside the rows (traces)."""
    findings: bool = False
    """``build`` also takes ``findings=``: the advice, computed once for the page."""


def _workload(name: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def select(df: pd.DataFrame) -> pd.DataFrame:
        if "workload" not in df:
            return df.iloc[0:0]
        return df[(df["workload"] == name) & (df["status"] == "ok")]

    return select


def _device_label(kind, name, cores) -> str:
    if kind == "cpu":
        return f"CPU {name or 'unknown'}" + (f", {cores} physical cores" if cores else "")
    return f"{kind} {name or 'unknown GPU'}"


def _reference_ceilings(kind, name, compute_units, cores) -> pd.DataFrame | None:
    """The spec (GPU) or theoretical (CPU) ceilings of the device rows measured, or None.

    A CPU's theoretical peak is computed here from this machine's ISA and clock, so only for
    rows of this CPU model, and of the physical cores the rows' process had (recorded in the
    fingerprint); an older row without them gets no roof rather than the whole machine's."""
    from ..core.devices import DeviceInfo, cpu_model_name, cpu_theoretical_peak, reference_ceilings

    if name is None or kind is None:
        return None
    if kind == "cpu":
        if name != cpu_model_name() or not cores:
            return None
        ceilings = reference_ceilings(
            DeviceInfo(kind="cpu", torch_device="cpu", name=name, count=1, memory_bytes=None),
            cpu_peak=cpu_theoretical_peak(cores=int(cores)))
    else:
        ceilings = reference_ceilings(DeviceInfo(kind=kind, torch_device="", name=name, count=1,
                                                 memory_bytes=None, compute_units=compute_units))
    return pd.DataFrame(ceilings) if ceilings else None


def _gemm(rows: pd.DataFrame, all_rows: pd.DataFrame):
    """One GEMM plot per device the rows measured, each under that device's peaks only (a CPU
    row is never drawn under a GPU's spec roof)."""
    import holoviews as hv

    from ..core.env import measured_devices

    measured = measured_devices(rows)
    cores = rows["env_cpu_cores_counted"] if "env_cpu_cores_counted" in rows else [None] * len(rows)
    keys = [(_plain(kind), _plain(name), _plain(units), _plain(n) if kind == "cpu" else None)
            for kind, name, units, n in zip(measured["kind"], measured["name"],
                                            measured["compute_units"], cores)]
    panels = []
    for key in dict.fromkeys(keys):
        plot = plots.gemm_throughput(rows[[k == key for k in keys]], _reference_ceilings(*key))
        if isinstance(plot, hv.Overlay):
            plot = plot.opts(title=f"GEMM throughput: {_device_label(key[0], key[1], key[3])} "
                                   "(hollow: noisy)")
        panels.append(plot)
    return panels[0] if len(panels) == 1 else hv.Layout(panels).cols(1)


def _plain(value):
    """A hashable, comparable key part: None for missing (NaN), int for whole floats."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return whole(value)


def _variant_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every row of an A/B sweep (a ``variant`` column with ≥ 2 values), whatever its status: a
    point that is not ok on one side is listed by the comparison, not dropped."""
    if "variant" not in df or df["variant"].dropna().nunique() < 2:
        return df.iloc[0:0]
    return df[df["variant"].notna()]


def comparison_base(df: pd.DataFrame, by: str = "variant") -> str:
    """The base side of an A/B sweep: the ``by`` value of the earliest-recorded row of round 1.

    A sweep runs round 1 in the order its spec lists the variants (round 2 reversed, ...), so
    this is the variant the spec lists first: list the base first. Rows without ``round`` or
    ``recorded_at`` fall back to the earliest row of any round, or the first row."""
    rows = df[df[by].notna()] if by in df else df.iloc[0:0]
    if rows.empty:
        from ..core.errors import BadInputError

        raise BadInputError(f"no rows with a {by!r} value: is this an A/B sweep (a spec with variants:)?")
    if "round" in rows and (rows["round"] == 1).any():
        rows = rows[rows["round"] == 1]
    if "recorded_at" in rows:
        rows = rows.sort_values("recorded_at", kind="stable")
    return str(rows[by].iloc[0])


@dataclass(frozen=True)
class Parts:
    """A section made of HTML text (``str``, data already escaped) and holoviews objects, in
    order. The report renders text as bokeh Divs (``hv.Div`` needs panel's JavaScript, which a
    standalone page does not carry); a notebook displays each part."""

    items: tuple

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        for item in self.items:
            display(HTML(item) if isinstance(item, str) else item)


def _lazy(module: str, function: str) -> Callable:
    """``perfkit.view.<module>.<function>``, imported when its section is drawn (the holoviews
    work of a section is paid only by reports that have its rows)."""
    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(*args, **kwargs)

    return call


SECTIONS: list[Section] = [
    Section(title="Advice: what binds each configuration", select=_lazy("advice_report", "advised_rows"),
            build=_lazy("advice_report", "advice_section"), links=True, findings=True),
    Section(title="Comparison", select=_variant_rows, build=_lazy("compare_report", "comparison_of_variants")),
    Section(title="Roofline", select=_workload("roofline"), build=_lazy("plots.roofline", "roofline_section")),
    Section(title="GEMM throughput", select=_workload("gemm"), build=_gemm),
    Section(title="Training step: throughput, MFU, memory", select=_workload("train_step"),
            build=_lazy("plots.training", "training_section")),
    Section(title="Parallelism: memory per rank, throughput, pipeline bubble",
            select=_lazy("plots.parallelism", "parallel_rows"),
            build=_lazy("plots.parallelism", "parallelism_section")),
    Section(title="Inference: TTFT, TPOT, throughput vs latency, prefill and decode on the roofline",
            select=_workload("inference"), build=_lazy("plots.inference", "inference_section")),
    Section(title="Data loading: throughput vs workers, data wait, stalls", select=_workload("dataloader"),
            build=_lazy("plots.dataloading", "dataloading_section")),
    Section(title="Scaling efficiency", select=_workload("scaling"), build=_lazy("plots.scaling", "scaling_section")),
    Section(title="Predicted scaling (perfkit predict)", select=_workload("prediction"),
            build=_lazy("plots.scaling", "prediction_section")),
    Section(title="Kernels: yours against the reference, correct first", select=_lazy("kernels_report", "kernel_rows"),
            build=_lazy("kernels_report", "kernels_section")),
    Section(title="Collective bus bandwidth", select=_workload("collectives"),
            build=lambda rows, all_rows: plots.busbw_vs_size(rows)),
    Section(title="Collective knob settings", select=_workload("collectives"),
            build=lambda rows, all_rows: plots.knob_comparison(rows)),
    Section(title="Traces", select=_lazy("trace_report", "traced_rows"), links=True,
            build=_lazy("trace_report", "traces_section")),
]

def _cell(value) -> str:
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    return html.escape(str(whole(value)))  # an int column that met a missing value in another file's rows


def sections(df: pd.DataFrame, *, output: str | Path | None = None,
             results_dir: str | Path | None = None, findings: list | None = None) -> list[tuple[str, object]]:
    """(title, holoviews object or :class:`Parts`) for every section whose rows ``df`` holds, in
    report order; links to files are relative to ``output`` (the report file) when given.

    ``notebooks/report.ipynb`` displays these live; :mod:`perfkit.view.report_page` writes them as a page."""
    return [(section.title, _built(section, rows, df, output=output, results_dir=results_dir, findings=findings))
            for section, rows in present_sections(df)]


def _built(section: Section, rows: pd.DataFrame, df: pd.DataFrame, *, output, results_dir, findings):
    """``section.build`` with what it takes: the report's place and the rows' (links), the advice."""
    where = {"output": output, "results_dir": results_dir} if section.links else {}
    if section.findings and findings is not None:
        where["findings"] = findings
    return section.build(rows, df, **where)


def failures_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration that did not end ok: its status, reason and parameters."""
    bad = df[df["status"] != "ok"] if "status" in df else df.iloc[0:0]
    cols = [c for c in ("config_id", "notebook", "status", "reason") if c in bad]
    # The configurations' own parameters (param_names), not whatever columns the rows carry: a
    # measurement window's Unix seconds are no parameter (issue 55).
    named: list[str] = []
    for text in bad.get("param_names", pd.Series(dtype=object)).dropna().unique():
        try:
            named += [n for n in (json.loads(text) if isinstance(text, str) else list(text)) if n not in named]
        except (ValueError, TypeError):
            continue
    params = [c for c in named if c in bad and c not in cols and bad[c].notna().any()] or [
        c for c in bad.columns if c not in cols and not str(c).startswith("env_") and c not in {"recorded_at", "noisy"}
        and not str(c).endswith(("_samples_s", "_unix_s")) and bad[c].notna().any()]
    keys = ["config_id", "status"] if "config_id" in bad else None
    out = bad[cols + params[:8]].drop_duplicates(subset=keys).reset_index(drop=True)
    if "recorded_at" in bad:  # when it ended, as a person reads a time
        out["ended"] = pd.to_datetime(bad.drop_duplicates(subset=keys)["recorded_at"].to_numpy(), utc=True,
                                      errors="coerce").strftime("%Y-%m-%d %H:%M:%S UTC")
    return out


def _table_html(frame: pd.DataFrame, max_rows: int = 500) -> str:
    shown = frame.head(max_rows)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>"
        for row in shown.itertuples(index=False)
    )
    more = f"<p>… {len(frame) - max_rows} more rows</p>" if len(frame) > max_rows else ""
    return f'<table class="pk"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'


def _failures(df: pd.DataFrame) -> str:
    table = failures_table(df)
    if table.empty:
        return '<h2 id="failures">Failures</h2><p>Every configuration ended ok.</p>'
    counts = ", ".join(f"{html.escape(str(k))}: {v}" for k, v in table["status"].value_counts().items())
    return (f'<h2 id="failures">Failed, oom, timeout, killed and skipped configurations</h2><p>{counts}</p>'
            f"{_table_html(table)}")


def _environment(df: pd.DataFrame) -> str:
    if "env_json" not in df:
        return ""
    df = df[df["env_json"].notna()]  # derived rows (perfkit predict's) ran no environment
    fps = df.drop_duplicates("env_fingerprint_id")
    warn = ""
    mixed = [k for k in _COMPARABILITY_KEYS if k in df and df[k].nunique(dropna=False) > 1]
    if mixed:
        values = "; ".join(f"{k[4:]}: {', '.join(map(str, df[k].dropna().unique()))}" for k in mixed)
        warn = (f'<p class="warn">⚠ Rows from different environments are plotted together '
                f'({html.escape(values)}): compare them with care.</p>')
    items = []
    for row in fps.itertuples():
        facts = json.loads(row.env_json)
        facts.pop("env_vars", None)
        pretty = ", ".join(f"{k}={v}" for k, v in facts.items() if v not in (None, ""))
        items.append(f"<li><code>{html.escape(str(row.env_fingerprint_id))}</code>: {html.escape(pretty)}</li>")
    return f'<h2 id="environment-fingerprints">Environment fingerprints</h2>{warn}<ul>{"".join(items)}</ul>'


def _device_busy(results_dir) -> str:
    """Each sweep run into the folder: how much of its wall time its devices spent measuring."""
    from ..run.sweep.busy import read_summaries

    runs = read_summaries(results_dir) if results_dir is not None else []
    items = [f"<li>{html.escape(time.strftime('%Y-%m-%d %H:%M', time.gmtime(r.ended_unix_s)))} UTC, "
             f"{r.configs} configurations: {html.escape(r.line())}</li>" for r in runs[-10:]]
    return f"<h3>Device busy (sweep runs)</h3><ul>{''.join(items)}</ul>" if items else ""


_CSS = """<style>
body{font-family:system-ui,sans-serif;margin:1.5em} table.pk{border-collapse:collapse;font-size:12px}
table.pk td,table.pk th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.warn{background:#fff3cd;border:1px solid #e0b000;padding:6px}
</style>"""


def present_sections(df: pd.DataFrame) -> list[tuple[Section, pd.DataFrame]]:
    """The sections ``df`` has rows for, in report order, with their rows."""
    out = []
    for section in SECTIONS:
        rows = section.select(df)
        if not rows.empty:
            out.append((section, rows))
    return out


def section_items(section: Section, rows: pd.DataFrame, df: pd.DataFrame, *, output=None, results_dir=None,
                  findings: list | None = None) -> list:
    """What the page shows for one section, in order: HTML text (``str``) and holoviews objects."""
    import holoviews as hv

    items = [f'<h2 id="{anchor(section.title)}">{html.escape(section.title)}</h2>']
    built = _built(section, rows, df, output=output, results_dir=results_dir, findings=findings)
    for item in _items(built, hv):
        # An hv.Div is a panel model in bokeh: a standalone page lacks panel's JavaScript.
        items.append(item.data if isinstance(item, hv.Div) else item)
    return items


def page_top_html(df: pd.DataFrame, title: str, findings: list, titles: list[str]) -> str:
    """The page's first screen: the title, the rows' count and the summary (report_summary)."""
    counts = df["status"].value_counts().to_dict() if "status" in df else {}
    summary = ", ".join(f"{html.escape(str(k))}: {v}" for k, v in counts.items()) or "no rows"
    n_configs = df["config_id"].nunique() if "config_id" in df else 0
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{_CSS}<h1>{html.escape(title)}</h1><p>{n_configs} configurations, {len(df)} rows ({summary}); "
            f"generated {stamp}.</p>{summary_html(df, findings, titles)}")


def page_bottom_html(df: pd.DataFrame, *, output=None, results_dir=None) -> list[str]:
    """After the sections: every configuration, the failures, the environments."""
    return [f'<h2 id="{anchor("Configurations")}">Configurations</h2>'
            + configurations_html(df, results_dir=results_dir, output=output),
            _failures(df), _environment(df) + _device_busy(results_dir)]


def _items(obj, hv) -> tuple:
    """What the report renders one after another for a section: a :class:`Parts`' items; a
    layout's panels when one of them is a Div (a Div inside a layout renders as a panel model,
    which a standalone page cannot draw); else the object whole."""
    if isinstance(obj, Parts):
        return obj.items
    if isinstance(obj, hv.Layout) and any(isinstance(e, hv.Div) for e in obj.values()):
        return tuple(obj.values())
    return (obj,)


#: The results folder of the report notebook when its ``results_dir`` parameter is "" (how the
#: test suite points nbval, which cannot inject parameters, at rows it prepared).
REPORT_DIR_ENV = "PERFKIT_REPORT_DIR"


#: Where ``make demo`` writes (the Makefile's DEMO_DIR, from the checkout's root): the report
#: notebook's folder when neither its parameter nor ``$PERFKIT_REPORT_DIR`` names one.
DEMO_DIR = Path(__file__).resolve().parents[2] / "runs" / "quickstart"


def notebook_results_dir(results_dir: str | Path) -> Path:
    """The report notebook's folder: ``results_dir``; when it is "", ``$PERFKIT_REPORT_DIR``;
    then the demo's folder (:data:`DEMO_DIR`) where ``make demo`` has written it.

    A folder that does not exist is an error, never replaced by other rows: a mistyped path must
    not show an ``ok`` run of something else; with nothing to show, the error says what to run.
    """
    return _notebook_dir(results_dir, name="results_dir", env=REPORT_DIR_ENV, default=DEMO_DIR,
                         hint="run `make demo` (it writes runs/quickstart, read here by default) or set "
                              "results_dir to a sweep's --out")


#: The A/B sweep of the compare notebook when its ``base_dir`` parameter is "" (nbval, as above).
COMPARE_DIR_ENV = "PERFKIT_COMPARE_DIR"


def notebook_compare_dir(base_dir: str | Path) -> Path:
    """The compare notebook's base folder: ``base_dir``, or ``$PERFKIT_COMPARE_DIR`` when it is "".

    Missing, it says what to run: the compare notebook never shows made-up or other rows."""
    return _notebook_dir(base_dir, name="base_dir", env=COMPARE_DIR_ENV,
                         hint="run `perfkit sweep templates/ab_threads.yaml --out runs/ab` and set "
                              "base_dir to its --out (../runs/ab from notebooks/)")


def _notebook_dir(given: str | Path, *, name: str, env: str, hint: str, default: Path | None = None) -> Path:
    import os

    from ..core.errors import BadInputError

    given = str(given) or os.environ.get(env, "")
    if not given and default is not None and default.is_dir():
        return default
    if not given:
        raise BadInputError(f"{name} is empty and ${env} is not set: {hint}")
    path = Path(given)
    if not path.exists():
        raise BadInputError(f"results directory {given!r} does not exist (looked in {path.resolve()}): {hint}")
    return path
