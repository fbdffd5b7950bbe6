"""Training-step plots: throughput, peak memory and MFU against batch size.

Rows are :func:`perfkit.measuring.training.step.run_training` rows (``workload == "train_step"``). One line per
series: the precision, plus the parallelism (× world size), the model and its size when the rows
hold more than one of them. Rows whose status is not ``ok`` are not drawn, except ``oom`` rows, which
the throughput plot marks with an × at the batch size that ran out of memory.
"""

from __future__ import annotations

import pandas as pd

from ._common import OVERLAY_LEGEND, Legend, display_scale, hv_bokeh, ok_rows, whole

__all__ = ["throughput_vs_batch", "memory_vs_batch", "activations_vs_batch", "mfu_vs_batch", "training_summary",
           "training_section"]

_WORKLOAD = "train_step"


def _train_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "workload" in df:
        df = df[df["workload"] == _WORKLOAD]
    return df[df["batch_size"].notna()] if "batch_size" in df else df.iloc[0:0]


def _series(df: pd.DataFrame) -> pd.Series:
    """Each row's line label: precision, then whatever else varies among the rows."""
    parts = [df["precision"].astype(str)] if "precision" in df else []
    if "parallelism" in df and df["parallelism"].nunique() > 1 or (
            "world_size" in df and df["world_size"].nunique() > 1):
        ws = df["world_size"].fillna(1).astype(int).astype(str) if "world_size" in df else "1"
        parts.append(df["parallelism"].astype(str) + "×" + ws)
    if "model" in df and df["model"].nunique() > 1:
        parts.append(df["model"].astype(str))
    if "model_size" in df:  # the demo's bigger pipeline model drew on one line with the small one
        sizes = _varying_sizes(df)
        if sizes.str.len().gt(0).any():
            parts.append(pd.Series([_size_label(m, s, n) for m, s, n in zip(
                df["model"] if "model" in df else [""] * len(df), sizes,
                df["n_params"] if "n_params" in df else [None] * len(df))], index=df.index))
    if not parts:
        return pd.Series("all", index=df.index)
    label = parts[0]
    for part in parts[1:]:
        label = label + " " + part
    return label.str.strip()


def _varying_sizes(df: pd.DataFrame) -> pd.Series:
    """Per row, the ``model_size`` fields that differ among the rows of its model, ``k=v`` (issue
    55: every field of every line, "n_layers=4 d_model=1024 n_heads=16 vocab_size=8192", twelve
    times over); "" where the model was run at one size."""
    import json

    def parse(v) -> dict:
        if isinstance(v, dict):
            return v
        try:
            return json.loads(v) if isinstance(v, str) and v.strip() else {}
        except ValueError:
            return {"size": v}

    parsed = [parse(v) for v in df["model_size"]]  # by position: a concatenated frame repeats its index
    models = [str(m) for m in df["model"]] if "model" in df else [""] * len(df)
    labels = [""] * len(df)
    for model in dict.fromkeys(models):
        positions = [i for i, m in enumerate(models) if m == model]
        group = [parsed[i] for i in positions]
        keys = sorted({k for d in group for k in d})
        vary = [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in group}) > 1]
        for i, d in zip(positions, group):
            labels[i] = " ".join(f"{k}={whole(d[k]) if k in d else 'default'}" for k in vary)
    return pd.Series(labels, index=df.index, dtype=object)


def _size_label(model, sizes: str, n_params) -> str:
    """A line's size: perfkit's models by their few size fields; a user's model (``hf:llama``,
    ``pkg.mod:fn``), whose config has dozens, by its parameter count."""
    if not sizes:
        return ""
    if ":" in str(model) and n_params is not None and n_params == n_params:
        return f"{n_params / 1e6:.3g}M params"
    return sizes


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    """The ok and oom training rows, each with its line label (from both, so an oom row's
    label matches its line's)."""
    rows = _train_rows(df)
    if "status" in rows:
        rows = rows[rows["status"].isin(["ok", "oom"])]
    rows = rows.copy()
    rows["series"] = _series(rows) if not rows.empty else pd.Series(dtype=str)
    return rows


def _ok(df: pd.DataFrame, column: str) -> pd.DataFrame:
    rows = ok_rows(_labelled(df))
    if column not in rows:
        return rows.iloc[0:0]
    rows = rows[rows[column].notna()].copy()
    rows["noisy"] = rows["noisy"].fillna(False).astype(bool) if "noisy" in rows else False
    return rows.sort_values("batch_size")


def _empty(what: str):
    return hv_bokeh().Div(f"<p>No training-step rows with status ok and {what}.</p>")


def _lines(rows: pd.DataFrame, y: str, vdims: list[str], hover: list, legend: Legend, *, dash: str = "solid",
           suffix: str = "") -> list:
    hv = hv_bokeh()
    elements = []
    for series, group in rows.groupby("series", sort=True):
        data = group[["batch_size", y] + [v for v in vdims if v != y]]
        label = legend.label(f"{series}{suffix}")
        elements.append(hv.Curve(data, "batch_size", [y] + vdims, label=label).opts(line_dash=dash))
        elements.append(hv.Scatter(data, "batch_size", [y] + vdims, label=label).opts(
            tools=["hover"], hover_tooltips=hover, size=8,
            fill_alpha=hv.dim("noisy").categorize({True: 0.0, False: 1.0}, default=1.0)))
    return elements


def throughput_vs_batch(df: pd.DataFrame, metric: str = "samples_per_s"):
    """Throughput (``samples_per_s`` or ``tokens_per_s``) vs global batch size, one line per
    series; hollow points are noisy (step-time IQR/median > 0.1); × marks a batch size that
    ran out of memory, drawn at the height of its series' best throughput."""
    hv = hv_bokeh()
    rows = _ok(df, metric)
    if rows.empty:
        return _empty(metric)
    unit_name = "samples/s" if metric == "samples_per_s" else "tokens/s"
    scale, prefix = display_scale(rows[metric].tolist())
    rows["throughput"] = rows[metric] / scale
    hover = [("series", "@{series}"), ("batch size", "@{batch_size}"),
             ("throughput", f"@{{throughput}}{{0.000}} {prefix}{unit_name}"),
             ("median step", "@{step_time_s}{0.000000} s"), ("IQR", "@{step_time_iqr_s}{0.000000} s"),
             ("noisy", "@{noisy}")]
    vdims = ["series", "step_time_s", "step_time_iqr_s", "noisy"]
    legend = Legend()
    elements = _lines(rows, "throughput", vdims, hover, legend)
    oom = _labelled(df)
    oom = oom[oom["status"] == "oom"].copy() if "status" in oom else oom.iloc[0:0]
    if not oom.empty:
        best = rows.groupby("series")["throughput"].max()
        oom["throughput"] = oom["series"].map(best).fillna(rows["throughput"].min())
        oom["reason"] = (oom["error"] if "error" in oom else oom.get("reason", "")).astype(str).str[:200]
        data = oom[["batch_size", "throughput", "series", "reason"]]
        elements.append(hv.Scatter(data, "batch_size", ["throughput", "series", "reason"],
                                   label="out of memory").opts(
            marker="x", size=14, color="red", line_width=3, tools=["hover"],
            hover_tooltips=[("oom at batch size", "@{batch_size}"), ("series", "@{series}"),
                            ("reason", "@{reason}")]))
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title="Training throughput (hollow: noisy; ×: out of memory)",
                        xlabel="global batch size", ylabel=f"{prefix}{unit_name}", logx=True,
                        **legend.opts(["out of memory"]), height=400, **OVERLAY_LEGEND,
                        show_grid=True, padding=0.08))  # every point inside the frame


def memory_vs_batch(df: pd.DataFrame):
    """Peak memory vs global batch size (the maximum over ranks; ``peak_mem_kind`` says what was
    measured: the CUDA allocator's peak or the process's max RSS on CPU)."""
    hv = hv_bokeh()
    rows = _ok(df, "peak_mem_bytes")
    if rows.empty:
        return _empty("peak_mem_bytes")
    scale, prefix = display_scale(rows["peak_mem_bytes"].tolist())
    rows["memory"] = rows["peak_mem_bytes"] / scale
    rows["peak_mem_kind"] = rows["peak_mem_kind"].astype(str) if "peak_mem_kind" in rows else "?"
    hover = [("series", "@{series}"), ("batch size", "@{batch_size}"),
             ("peak memory", f"@{{memory}}{{0.00}} {prefix}B"), ("measured as", "@{peak_mem_kind}")]
    legend = Legend()
    elements = _lines(rows, "memory", ["series", "peak_mem_kind", "noisy"], hover, legend)
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title="Peak memory per rank", xlabel="global batch size",
                        ylabel=f"peak memory ({prefix}B)", logx=True,
                        **legend.opts(), height=360,
                        **OVERLAY_LEGEND, show_grid=True, padding=0.08))


def activations_vs_batch(df: pd.DataFrame):
    """Saved activations per rank vs global batch size: what autograd held at once on the last
    warm-up step (solid, ``activation_bytes_measured``) beside the memory model (dashed,
    ``activation_bytes_predicted``). The part of the memory that grows with the batch."""
    hv = hv_bokeh()
    rows = _ok(df, "activation_bytes_predicted")
    if rows.empty:
        return _empty("activation_bytes_predicted")
    measured = rows["activation_bytes_measured"] if "activation_bytes_measured" in rows \
        else pd.Series(float("nan"), index=rows.index)
    scale, prefix = display_scale(rows["activation_bytes_predicted"].tolist() + measured.dropna().tolist())
    rows["predicted"], rows["measured"] = rows["activation_bytes_predicted"] / scale, measured / scale
    hover = [("series", "@{series}"), ("batch size", "@{batch_size}")]
    legend = Legend()
    elements = _lines(rows, "predicted", ["series", "noisy"],
                      hover + [("predicted", f"@{{predicted}}{{0.00}} {prefix}B")], legend, dash="dashed",
                      suffix=" predicted")
    held = rows[rows["measured"].notna()]
    if not held.empty:
        elements += _lines(held, "measured", ["series", "noisy"],
                           hover + [("measured", f"@{{measured}}{{0.00}} {prefix}B")], legend, suffix=" measured")
    ylabel = f"saved activations ({prefix}B)"
    return hv.Overlay(elements).opts(
        hv.opts.Curve(ylabel=ylabel), hv.opts.Scatter(ylabel=ylabel),
        hv.opts.Overlay(title="Saved activations per rank (solid: measured on the warm-up step; "
                              "dashed: memory model)", xlabel="global batch size", ylabel=ylabel,
                        logx=True, **legend.opts(), height=360, **OVERLAY_LEGEND,
                        show_grid=True, padding=0.08))  # every point inside the frame


def mfu_vs_batch(df: pd.DataFrame):
    """MFU (solid) and counted-FLOP utilisation (dashed) in percent vs global batch size; the
    convention is in the hover. Says why instead when no row has a known peak."""
    hv = hv_bokeh()
    rows = _ok(df, "mfu")
    known = rows[rows["mfu"].notna()] if not rows.empty else rows
    if known.empty:
        reasons = sorted(set(_ok(df, "mfu_reason")["mfu_reason"].dropna().astype(str))) \
            if "mfu_reason" in df else []
        why = "; ".join(reasons) or "no rows with status ok"
        return hv.Div(f"<p>MFU unknown: {why}</p>")
    known = known.copy()
    known["mfu_pct"] = 100 * known["mfu"]
    counted = known.get("counted_flop_utilisation", pd.Series(float("nan"), index=known.index))
    known["counted_pct"] = 100 * counted.astype(float)
    known["mfu_convention"] = known["mfu_convention"].astype(str)
    vdims = ["series", "mfu_convention", "noisy"]
    hover = [("series", "@{series}"), ("batch size", "@{batch_size}"), ("MFU", "@{mfu_pct}{0.000} %"),
             ("convention", "@{mfu_convention}")]
    legend = Legend()
    elements = _lines(known, "mfu_pct", vdims, hover, legend, suffix=" MFU")
    with_count = known[known["counted_pct"].notna()]
    if not with_count.empty:
        chover = [("series", "@{series}"), ("batch size", "@{batch_size}"),
                  ("counted-FLOP utilisation", "@{counted_pct}{0.000} %")]
        elements += _lines(with_count, "counted_pct", vdims, chover, legend, dash="dashed",
                           suffix=" counted")
    ylabel = "% of peak" if with_count.empty else "% of peak (solid MFU, dashed counted FLOP)"
    return hv.Overlay(elements).opts(
        hv.opts.Curve(ylabel=ylabel), hv.opts.Scatter(ylabel=ylabel),
        hv.opts.Overlay(title="MFU (analytic model FLOP) and counted-FLOP utilisation",
                        xlabel="global batch size", ylabel=ylabel, logx=True,
                        **legend.opts(),
                        height=360, **OVERLAY_LEGEND, show_grid=True, padding=0.08))


def training_summary(df: pd.DataFrame):
    """Throughput, MFU, memory and saved activations vs batch size, one above the other; what held
    the peak (:func:`perfkit.view.plots.memory.memory_at_peak`) where rows carry a breakdown."""
    from .memory import memory_at_peak, memory_rows

    hv = hv_bokeh()
    plots = [throughput_vs_batch(df), mfu_vs_batch(df), memory_vs_batch(df), activations_vs_batch(df)]
    if not memory_rows(df).empty:
        plots.append(memory_at_peak(df))
    return hv.Layout(plots).cols(1)


def training_section(rows: pd.DataFrame, all_rows: pd.DataFrame):
    """The report section's build function: its ok rows plus, from all rows, the oom ones."""
    return training_summary(_train_rows(all_rows))
