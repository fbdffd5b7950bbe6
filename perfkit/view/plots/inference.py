"""Inference plots: TTFT and TPOT against batch and prompt length, throughput against latency, and
prefill and decode on the roofline.

Rows are :func:`perfkit.measuring.inference.generate.run_inference` rows (``workload == "inference"``).
Lines join rows that differ only in the x axis; their label names what else varies (batch or
prompt length, precision, ``kv cache`` / ``no cache``, compile, SDPA backend). A point is the
median (TTFT, TPOT: vLLM's definitions, :mod:`perfkit.analyse.inference`), its whisker reaches
the p90, and a noisy point (IQR/median > 0.1) is drawn hollow. On the roofline every row gives
two points, its prefill (time: TTFT) and its decode step (time: TPOT), linked across batch
sizes when the batch was swept: decode climbs the memory roof as the batch grows, prefill sits
near the compute roof.
"""

from __future__ import annotations

import math

import pandas as pd

from ._common import OVERLAY_LEGEND, Legend, display_scale, hv_bokeh, ok_rows
from .roofline import roofline_static

__all__ = ["latency_plot", "ttft_vs_prompt", "tpot_vs_batch", "throughput_vs_latency",
           "roofline_points", "inference_roofline", "inference_summary", "inference_section"]

_WORKLOAD = "inference"
#: Columns that tell configurations apart, in the order a line label names them.
_KEYS = ("model", "engine", "batch_size", "prompt_len", "new_tokens", "precision", "kv_cache", "compile", "compile_mode",
         "sdpa_backend", "model_n_layers", "model_d_model", "resolved_device",
         "request_rate_per_s", "max_concurrency")  # the last two: a serving benchmark's load (perfkit import vllm-bench)
_PHASE_COLORS = {"prefill": "#1f77b4", "decode": "#d62728"}
_PHASE_TIME = {"prefill": "ttft_s", "decode": "tpot_s"}


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    if "workload" in df:
        df = df[df["workload"] == _WORKLOAD]
    return ok_rows(df).copy()


def _text(col: str, value) -> str:
    if col == "kv_cache":
        return "kv cache" if bool(value) else "no cache"
    if col == "compile":
        return "compiled" if bool(value) else "eager"
    short = {"batch_size": "batch", "prompt_len": "prompt", "new_tokens": "N",
             "sdpa_backend": "sdpa", "model_n_layers": "layers", "model_d_model": "d",
             "request_rate_per_s": "rate", "max_concurrency": "concurrency"}
    return f"{short.get(col, col)} {value}" if col in short else str(value)


def _labels(df: pd.DataFrame, exclude: tuple[str, ...]) -> pd.Series:
    """Each row's line label from the key columns that vary among ``df`` (except ``exclude``);
    the kv_cache column is always named, so cached and uncached rows are never confused."""
    cols = [c for c in _KEYS if c in df and c not in exclude
            and (df[c].astype(str).nunique() > 1 or c == "kv_cache")]
    if not cols:
        return _named(df)
    return df[cols].apply(lambda r: ", ".join(_text(c, r[c]) for c in cols), axis=1)


def _named(df: pd.DataFrame) -> pd.Series:
    """A line's name when nothing varies: its model (an imported vLLM run says which; issue 55:
    its legend said "all"), else "all"."""
    for col in ("model", "model_id", "source_path"):
        if col in df and df[col].notna().any():
            return df[col].map(lambda v: str(v).rsplit("/", 1)[-1] if col == "source_path" else str(v))
    return pd.Series("all", index=df.index)


def _empty(what: str):
    return hv_bokeh().Div(f"<p>No inference rows with status ok and {what}.</p>")


def latency_plot(df: pd.DataFrame, metric: str = "ttft", x: str = "prompt_len"):
    """Median ``metric`` (``ttft``, ``tpot``, ``itl``, ``e2e_latency``) against ``x``, one line per
    other configuration, whiskers to the p90; log axes when ``x`` spans more than 4×."""
    hv = hv_bokeh()
    y, p90 = f"{metric}_s", f"{metric}_p90_s"
    rows = _rows(df)
    if rows.empty or y not in rows or x not in rows:
        return _empty(f"{y} against {x}")
    rows = rows[rows[y].notna()].sort_values(x)
    scale, prefix = display_scale(rows[y].tolist(), below_one=True)
    upper = (rows[p90] - rows[y]).clip(lower=0) if p90 in rows else 0.0
    noisy = rows["noisy"].fillna(False).astype(bool) if "noisy" in rows else False
    # The y dimension is named after the metric: panels of one layout share an axis only when
    # they plot the same quantity (TTFT and TPOT must not share one range).
    rows = rows.assign(series=_labels(rows, (x,)), upper=upper / scale, zero=0.0, noisy=noisy,
                       **{metric: rows[y] / scale})
    name = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e_latency": "end-to-end latency"}[metric]
    hover = [("series", "@{series}"), (x, f"@{{{x}}}"), (name, f"@{{{metric}}}{{0.000}} {prefix}s"),
             ("noisy", "@{noisy}")]
    parts, legend = [], Legend()
    for series, g in rows.groupby("series", sort=True):
        data = g[[x, metric, "series", "noisy", "zero", "upper"]]
        parts.append(hv.Curve(data, x, [metric, "series"], label=legend.label(series)))
        parts.append(hv.ErrorBars(data, x, [metric, "zero", "upper"]).opts(line_alpha=0.6))
        parts.append(hv.Scatter(data, x, [metric, "series", "noisy"], label=legend.label(series)).opts(
            size=8, tools=["hover"], hover_tooltips=hover,
            fill_alpha=hv.dim("noisy").categorize({True: 0.0, False: 1.0}, default=1.0)))
    logx = bool(rows[x].max() > 4 * rows[x].min() > 0)
    return hv.Overlay(parts).opts(
        title=f"{name} vs {x.replace('_', ' ')} (median, whisker to p90; hollow: noisy)",
        xlabel=x.replace("_", " "), ylabel=f"{name} ({prefix}s)", logx=logx, width=700, height=380,
        **legend.opts(width=False), show_grid=True, **OVERLAY_LEGEND)


def ttft_vs_prompt(df: pd.DataFrame):
    """TTFT against prompt length (prefill cost grows with the prompt)."""
    return latency_plot(df, "ttft", "prompt_len")


def tpot_vs_batch(df: pd.DataFrame):
    """TPOT against batch size (decode: nearly flat while it is memory-bound)."""
    return latency_plot(df, "tpot", "batch_size")


def throughput_vs_latency(df: pd.DataFrame):
    """Output tokens/s against TPOT, one path per configuration through its batch sizes: the
    trade a server makes between throughput and per-token latency."""
    hv = hv_bokeh()
    rows = _rows(df)
    need = {"tpot_s", "output_tokens_per_s", "batch_size"}
    if rows.empty or not need <= set(rows.columns):
        return _empty("TPOT and output throughput")
    rows = rows[rows["tpot_s"].notna()].sort_values("batch_size")
    scale, prefix = display_scale(rows["tpot_s"].tolist(), below_one=True)
    # Its own x name: an x axis named like the TPOT plot's y axis would share its range.
    rows = rows.assign(series=_labels(rows, ("batch_size",)), latency=rows["tpot_s"] / scale)
    hover = [("series", "@{series}"), ("batch", "@{batch_size}"), ("TPOT", f"@{{latency}}{{0.000}} {prefix}s"),
             ("output", "@{output_tokens_per_s}{0.0} tokens/s")]
    parts, legend = [], Legend()
    for series, g in rows.groupby("series", sort=True):
        data = g[["latency", "output_tokens_per_s", "batch_size", "series"]]
        parts.append(hv.Curve(data, "latency", ["output_tokens_per_s", "batch_size", "series"], label=legend.label(series)))
        parts.append(hv.Scatter(data, "latency", ["output_tokens_per_s", "batch_size", "series"],
                                label=legend.label(series)).opts(size=8, tools=["hover"], hover_tooltips=hover))
    return hv.Overlay(parts).opts(
        title="Throughput vs latency (one point per batch size)", xlabel=f"TPOT ({prefix}s)",
        ylabel="output tokens/s", width=700, height=380, **legend.opts(width=False), show_grid=True,
        **OVERLAY_LEGEND)


def roofline_points(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in :func:`perfkit.analyse.roofline.roofline_points`' columns: a ``prefill`` and a
    ``decode`` point per inference row that counted them (``op`` names the phase and, when
    several configurations are present, what else varies besides the batch)."""
    rows = _rows(df)
    if rows.empty:
        return pd.DataFrame()
    series = _labels(rows, ("batch_size",)) if len(rows) > 1 else pd.Series("", index=rows.index)
    points = []
    for (index, row), label in zip(rows.iterrows(), series):
        for phase, time_col in _PHASE_TIME.items():
            flop, nbytes = row.get(f"{phase}_flop"), row.get(f"{phase}_bytes")
            if flop is None or nbytes is None or not (flop > 0 and nbytes > 0):
                continue
            label_text = "" if label in ("", "all") else f" ({label})"
            points.append({
                **{c: row[c] for c in ("config_id", "batch_size", "precision", "resolved_device",
                                       "env_device_kind", "env_device_name", "env_cpu_model",
                                       "env_device_compute_units") if c in row},
                "op": f"{phase}{label_text}", "family": phase, "input_shapes": None,
                "dtype": row.get("precision"), "ceiling_dtype": row.get("precision"), "calls": 1,
                "flop": float(flop), "bytes": float(nbytes), "time_s": row.get(time_col),
                "intensity_flop_per_byte": float(flop) / float(nbytes),
                "flop_per_s": row.get(f"{phase}_flop_per_s"),
                "attainable_flop_per_s": row.get(f"{phase}_attainable_flop_per_s", math.nan),
                "percent_of_roof": row.get(f"{phase}_percent_of_roof", math.nan),
                "bound": row.get(f"{phase}_bound"), "time_share": math.nan})
    return pd.DataFrame(points)


def inference_roofline(df: pd.DataFrame, ceilings: pd.DataFrame | None, *, title: str = "Inference roofline"):
    """Prefill and decode points of ``df`` under ``ceilings`` (a ceilings table), one frame per
    precision one under the other, linked across batch sizes when they vary."""
    hv = hv_bokeh()
    points = roofline_points(df)
    if points.empty:
        return _empty("counted prefill and decode steps")
    swept = "batch_size" if points["batch_size"].nunique() > 1 else None
    layout = roofline_static(points, ceilings, trajectory_by=swept, title=title)
    styles = [hv.opts.Points(f"Ops.{phase}", color=color) for phase, color in _PHASE_COLORS.items()]
    paths = hv.dim("family").categorize(_PHASE_COLORS, default="black")
    return layout.opts(*styles, hv.opts.Path("Trajectory", color=paths))


def _latency_panels(rows: pd.DataFrame) -> list:
    """TTFT and TPOT against each swept axis (prompt length, batch size); the basic pair when
    nothing is swept; throughput vs latency when the batch is."""
    panels = [latency_plot(rows, metric, x) for metric in ("ttft", "tpot")
              for x in ("prompt_len", "batch_size") if x in rows and rows[x].nunique() > 1]
    if not panels:  # nothing swept: the basic pair still shows the numbers
        panels = [ttft_vs_prompt(rows), tpot_vs_batch(rows)]
    if "batch_size" in rows and rows["batch_size"].nunique() > 1:
        panels.append(throughput_vs_latency(rows))
    return panels


def _panels(plot) -> list:
    return list(plot) if isinstance(plot, hv_bokeh().Layout) else [plot]


def inference_summary(df: pd.DataFrame, ceilings: pd.DataFrame | None = None):
    """The plots for a notebook: latency against each swept axis, throughput vs latency, and the
    roofline of the prefill and decode points under ``ceilings``."""
    hv = hv_bokeh()
    rows = _rows(df)
    if rows.empty:
        return _empty("latencies")
    return hv.Layout(_latency_panels(rows) + _panels(inference_roofline(rows, ceilings))).cols(1)


def inference_section(rows: pd.DataFrame, all_rows: pd.DataFrame):
    """The report's inference section: ``rows`` are the ok ``workload == "inference"`` rows; their
    ceilings are the ``workload == "ceiling"`` rows of the same configurations. Latency plots for
    each swept axis (TTFT and TPOT against batch and prompt length), throughput vs latency, and
    one roofline per measured device (a CPU's points never under a GPU's roofs)."""
    from ...core.env import measured_devices

    hv = hv_bokeh()
    rows = _rows(rows)
    if rows.empty:
        return _empty("latencies")
    panels = _latency_panels(rows)
    ceilings = None
    if {"workload", "config_id"} <= set(all_rows.columns) and "config_id" in rows:
        ceilings = all_rows[(all_rows["workload"] == "ceiling")
                            & all_rows["config_id"].isin(rows["config_id"].unique())]

    def keys(frame: pd.DataFrame) -> list[str]:
        devices = measured_devices(frame)
        return [f"{k or 'unknown'} {n or 'unknown'}" for k, n in zip(devices["kind"], devices["name"])]

    row_keys = keys(rows)
    for key in dict.fromkeys(row_keys):
        group = rows[[k == key for k in row_keys]]
        own = None
        if ceilings is not None and not ceilings.empty:
            own = ceilings[ceilings["config_id"].isin(group["config_id"].unique())]
            own = own[[k == key for k in keys(own)]]
        title = "Inference roofline" + (f" on {key}" if len(set(row_keys)) > 1 else "")
        panels.extend(_panels(inference_roofline(group, own, title=title)))
    return hv.Layout(panels).cols(1)
