"""Parallelism plots: what each rank holds under each parallelism, measured beside predicted.

Rows are training-step rows (``workload == "train_step"``) with a parallelism other than
``none``. The model state a rank holds (parameters, gradients, optimizer state: the
``param_bytes``, ``grad_bytes``, ``optim_state_bytes`` columns, the maximum over ranks, from the
tensors held after the last step) does not depend on the batch size, so each series
(parallelism × world size, precision, model) is one stacked bar, the memory model's prediction
(``model_state_bytes_predicted``, :mod:`perfkit.measuring.training.memory_model`) a marker on it. Peak
memory and throughput against the batch are the training section's plots; the pipeline's bubble
is :func:`perfkit.view.plots.pipeline.bubble_vs_microbatches`.
"""

from __future__ import annotations

import pandas as pd

from ._common import LEGEND_BESIDE, display_scale, hv_bokeh, ok_rows, width_with_legend
from .pipeline import bubble_vs_microbatches
from .training import activations_vs_batch, memory_vs_batch, throughput_vs_batch

__all__ = ["parallel_rows", "model_state_per_rank", "parallelism_section"]

_PARTS = {"param_bytes": "parameters", "grad_bytes": "gradients", "optim_state_bytes": "optimizer state"}
_SERIES = ("parallelism", "world_size", "precision", "model")


def parallel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok training-step rows of a parallelism other than ``none``."""
    if not {"workload", "parallelism"} <= set(df):
        return df.iloc[0:0]
    return ok_rows(df[(df["workload"] == "train_step") & (df["parallelism"] != "none")])


def _label(rows: pd.DataFrame) -> pd.Series:
    label = rows["parallelism"].astype(str) + "×" + rows["world_size"].astype(int).astype(str)
    for column in ("precision", "model"):
        if column in rows and rows[column].nunique() > 1:
            label = label + " " + rows[column].astype(str)
    return label


def model_state_per_rank(df: pd.DataFrame):
    """Stacked bars of the parameter, gradient and optimizer-state bytes one rank holds, per
    parallelism; a marker at the memory model's predicted total."""
    hv = hv_bokeh()
    rows = parallel_rows(df)
    need = [*_PARTS, "model_state_bytes_predicted"]
    if rows.empty or not set(need) <= set(rows):
        return hv.Div("<p>No parallel training rows with measured model state.</p>")
    keys = [k for k in _SERIES if k in rows]
    one = rows.groupby(keys, as_index=False, dropna=False)[need].median()
    one["series"] = _label(one)
    scale, prefix = display_scale(one[[*_PARTS]].sum(axis=1).tolist())
    long = one.melt(id_vars=["series"], value_vars=list(_PARTS), var_name="part", value_name="bytes")
    long["part"] = long["part"].map(_PARTS)
    long["size"] = long["bytes"] / scale
    bars = hv.Bars(long, ["series", "part"], "size").opts(
        stacked=True, tools=["hover"], width=width_with_legend([*_PARTS.values(), "predicted"]), height=380,
        xrotation=30,
        ylabel=f"model state per rank ({prefix}B)", xlabel="", **LEGEND_BESIDE,
        hover_tooltips=[("series", "@{series}"), ("part", "@{part}"), ("held", f"@{{size}}{{0.00}} {prefix}B")])
    one["predicted"] = one["model_state_bytes_predicted"] / scale
    marks = hv.Scatter(one[["series", "predicted"]], "series", "predicted", label="predicted").opts(
        marker="dash", size=30, color="black", line_width=3, tools=["hover"],
        hover_tooltips=[("series", "@{series}"), ("predicted", f"@{{predicted}}{{0.00}} {prefix}B")])
    return (bars * marks).opts(title="Model state per rank (bars: held after the last step; "
                                     "dash: memory model)", show_grid=True, **LEGEND_BESIDE)


def _pipeline_setting(rows: pd.DataFrame) -> pd.Series:
    """``parallelism``, spelled ``pp 1F1B m=4`` (``v=2`` when interleaved) for pipeline rows."""
    label = rows["parallelism"].astype(str)
    if not {"pp_schedule", "n_microbatches"} <= set(rows):
        return label
    pp = label == "pp"
    setting = ("pp " + rows["pp_schedule"].astype(str) + " m="
               + rows["n_microbatches"].fillna(0).astype(int).astype(str))
    if "stages_per_rank" in rows:
        v = rows["stages_per_rank"].fillna(1).astype(int)
        setting = setting.where(v == 1, setting + " v=" + v.astype(str))
    return label.where(~pp, setting)


def parallelism_section(rows: pd.DataFrame, all_rows: pd.DataFrame):
    """The report section: model state per rank, throughput, peak memory and saved activations per
    rank against the batch for each parallelism (a pipeline's per schedule and microbatch count),
    and the pipeline bubble when pipeline rows are present."""
    hv = hv_bokeh()
    parallel = parallel_rows(all_rows)
    # A pipeline's line per schedule and microbatch count: each is its own way of running the step.
    by_setting = parallel.assign(parallelism=_pipeline_setting(parallel))
    plots = [model_state_per_rank(parallel), throughput_vs_batch(by_setting), memory_vs_batch(by_setting),
             activations_vs_batch(by_setting)]
    if (parallel["parallelism"] == "pp").any():
        plots.append(bubble_vs_microbatches(parallel))
    return hv.Layout(plots).cols(1)
