"""What held a training step's peak memory, per configuration: the categories at the peak of the
tracked step (``memory_tracked_<category>_bytes``, :mod:`perfkit.measuring.training.memory_fit`)
as stacked bars, the fake-tensor prediction of the same step (``memory_predicted_peak_bytes``) a
dash on each. Rows come from ``memory_breakdown=True`` runs; a folder without them gets a note.
"""

from __future__ import annotations

import pandas as pd

from ._common import LEGEND_BESIDE, display_scale, hv_bokeh, ok_rows, width_with_legend

__all__ = ["CATEGORIES", "memory_rows", "memory_at_peak"]

#: The categories of ``perfkit.measuring.training.memory_fit.CATEGORIES``, as the bars name them
#: (the plots do not import torch, so the names are repeated here; a test keeps them equal).
CATEGORIES = {"parameters": "parameters", "gathered_parameters": "gathered parameters", "gradients": "gradients",
              "optimizer_state": "optimizer state", "activations": "activations", "temporaries": "temporaries",
              "inputs": "inputs", "communication_buffers": "communication buffers", "other": "other"}
_SERIES = ("model", "parallelism", "world_size", "precision", "batch_size", "seq_len", "activation_checkpointing")


def memory_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows that carry a tracked memory breakdown."""
    if "memory_tracked_peak_bytes" not in df:
        return df.iloc[0:0]
    rows = ok_rows(df)
    return rows[rows["memory_tracked_peak_bytes"].notna()]


def _label(rows: pd.DataFrame) -> pd.Series:
    label = rows["parallelism"].astype(str) + "×" + rows["world_size"].astype(int).astype(str)
    label = label + " b" + rows["batch_size"].astype(int).astype(str)
    for column in ("model", "precision", "seq_len"):
        if column in rows and rows[column].nunique() > 1:
            label = label + " " + rows[column].astype(str)
    if "activation_checkpointing" in rows:
        label = label + rows["activation_checkpointing"].map({True: " AC"}).fillna("")
    return label


def memory_at_peak(df: pd.DataFrame):
    """Stacked bars: per configuration, the bytes one rank held at the step's peak, by category
    (the rank with the highest tracked peak); a dash at the fake-tensor prediction of that peak."""
    hv = hv_bokeh()
    rows = memory_rows(df)
    parts = [f"memory_tracked_{c}_bytes" for c in CATEGORIES]
    if rows.empty or not set(parts) <= set(rows):
        return hv.Div("<p>No rows with a memory breakdown: run the training step with memory_breakdown=True "
                      "(and warmup_steps ≥ 3).</p>")
    keys = [k for k in _SERIES if k in rows]
    predicted = "memory_predicted_peak_bytes"
    values = parts + ([predicted] if predicted in rows else [])
    one = rows.groupby(keys, as_index=False, dropna=False)[values].median()
    one["series"] = _label(one)
    scale, prefix = display_scale(one[parts].sum(axis=1).tolist())
    long = one.melt(id_vars=["series"], value_vars=parts, var_name="part", value_name="bytes")
    long["part"] = long["part"].str.removeprefix("memory_tracked_").str.removesuffix("_bytes").map(CATEGORIES)
    long = long[long["bytes"] > 0]
    long["size"] = long["bytes"] / scale
    plot = hv.Bars(long, ["series", "part"], "size").opts(
        stacked=True, tools=["hover"], width=width_with_legend([*CATEGORIES.values(), "predicted"]), height=380,
        xrotation=30, ylabel=f"held at the step's peak, per rank ({prefix}B)", xlabel="", **LEGEND_BESIDE,
        hover_tooltips=[("series", "@{series}"), ("part", "@{part}"), ("held", f"@{{size}}{{0.00}} {prefix}B")])
    if predicted in one:
        one["predicted"] = one[predicted] / scale
        plot = plot * hv.Scatter(one[["series", "predicted"]].dropna(), "series", "predicted", label="predicted").opts(
            marker="dash", size=30, color="black", line_width=3, tools=["hover"],
            hover_tooltips=[("series", "@{series}"), ("predicted (fake tensors)", f"@{{predicted}}{{0.00}} {prefix}B")])
    return plot.opts(title="Memory at the step's peak (bars: tracked on the real step; dash: predicted on fake "
                           "tensors)", show_grid=True, **LEGEND_BESIDE)
