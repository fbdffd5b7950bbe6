"""One training row from every rank's result (:func:`row_from_ranks`): the step's timing, work,
MFU and counted-FLOP utilisation, memory, losses, traces and the optimizer's share, as the
docstring of :mod:`perfkit.measuring.training.step` describes them. A step lasts as long as its
slowest rank, and so does each timed part of it (the data fetch, the optimizer step)."""

from __future__ import annotations

import math
import statistics

from perfkit.analyse import mfu, pipeline_bubble
from perfkit.core.status import OK
from perfkit.core.timing import Measurement
from perfkit.measuring.ops import trace_capture
from perfkit.measuring.training import fp8_notes, memory_edge, memory_fit, memory_model
from perfkit.measuring.training.config import WORKLOAD, TrainConfig
from perfkit.measuring.workloads import catalog

__all__ = ["row_from_ranks", "optimizer_columns", "count_reason", "COLLECTIVES"]


def count_reason(cfg: TrainConfig) -> str | None:
    """Why the first step's FLOP are not counted, or None when they are."""
    if not cfg.count_flops:
        return "count_flops is off"
    if cfg.warmup_steps < 1:
        return "no warm-up step to count on (warmup_steps is 0)"
    if cfg.compile:
        # Compiled kernels run below the dispatcher: the counter would see a fraction of the ops.
        return "not counted under torch.compile (fused kernels bypass the dispatch-level counter)"
    if cfg.parallelism == "pp":
        return "not counted under pp (the schedule runs the stages' forward and backward)"
    if cfg.parallelism in ("tp", "fsdp_tp"):
        # Above DTensor's dispatch the counter sees sharded-weight matmuls at their global shape
        # and the ops between them at shard shape: neither one rank's count nor the sum is exact.
        return "not counted under tensor parallel (DTensor ops mix global and shard shapes)"
    return None


COLLECTIVES = {"all_gather": ("allgather",), "reduce_scatter": ("reduce_scatter",),
                "all_reduce": ("allreduce",)}


def _counted_step_flop(cfg: TrainConfig, rank_results: list[dict]) -> tuple[float, str | None]:
    """FLOP counted in one step over all ranks, or (NaN, why not)."""
    reason = count_reason(cfg)
    if reason is None:
        # Each rank counted the forward and backward of its slice of the batch (FSDP2 gathers
        # whole parameters for them, so these are plain, unsharded ops).
        return float(sum(r["counted_flop"] for r in rank_results)), None
    return math.nan, reason


def _counted_matmul_flop(cfg: TrainConfig, rank_results: list[dict]) -> float:
    """The counted step's matmul, attention and convolution FLOP over all ranks (what the
    analytic convention models), or NaN where the step was not counted."""
    if count_reason(cfg) is not None or any(r.get("counted_matmul_flop") is None for r in rank_results):
        return math.nan
    return float(sum(r["counted_matmul_flop"] for r in rank_results))


def row_from_ranks(cfg: TrainConfig, rank_results: list[dict]) -> dict:
    """One results row from every rank's result: a step lasts as long as its slowest rank."""
    per_step = [max(times) for times in zip(*(r["step_time_samples_s"] for r in rank_results))]
    data_samples = [max(times) for times in zip(*(r["data_time_samples_s"] for r in rank_results))]
    timing = Measurement(samples_s=tuple(per_step), warmup_calls=cfg.warmup_steps,
                         label=f"{cfg.model} {cfg.parallelism} step").as_row("step_time")
    first, losses = rank_results[0], rank_results[0]["losses"]
    step_s = timing["step_time_s"]
    tokens = (cfg.batch_size * first["tokens_per_sample"] if first["tokens_per_sample"]
              else math.nan)
    # One GPU per rank (peak × world_size); on a CPU the peak of the physical cores the ranks'
    # affinity and threads gave them (perfkit.analyse.mfu); of the dtype the matmuls ran in.
    peak = mfu.peak_flop_per_s(device_kind=first["device_kind"], device_name=first["device_name"],
                               precision=cfg.compute_dtype, devices=cfg.world_size,
                               compute_units=first.get("device_compute_units"),
                               cpu_shares=[r["cpu_share"] for r in rank_results if r.get("cpu_share")])
    model_flop = float(first["flop_per_sample"] * cfg.batch_size)
    counted_flop, counted_reason = _counted_step_flop(cfg, rank_results)
    return {
        **cfg.as_row(), "workload": WORKLOAD, "status": OK, "error": None, **timing,
        "samples_per_s": cfg.batch_size / step_s,
        "tokens_per_s": tokens / step_s,
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rank_results),
        "peak_mem_bytes_per_rank": [r["peak_mem_bytes"] for r in rank_results],
        "peak_mem_kind": first["peak_mem_kind"], "n_params": first["n_params"],
        "n_params_non_embedding": first["n_params_non_embedding"],
        "step_model_flop": model_flop,
        "model_flop_per_s": model_flop / step_s,
        "peak_flop_per_s": peak.flop_per_s,
        "peak_source": peak.source,
        "cpu_threads": peak.cpu_threads, "cpu_cores_counted": peak.cpu_cores,
        "mfu": mfu.utilisation(model_flop, step_s, peak),
        "mfu_convention": mfu.mfu_convention(cfg.model, peak, first.get("flop_convention")) + (
            "; fp8: the dense fp8 peak, an upper bound (only the converted Linears run in fp8)"
            if cfg.precision == "fp8" else ""),
        **fp8_notes.fp8_columns(cfg),
        "mfu_reason": first.get("flop_reason") or peak.reason,
        "model_family": first.get("model_family", "builtin"), "model_config_note": first.get("config_note"),
        **catalog.package_versions(first.get("model_family", "builtin")),
        "step_counted_flop": counted_flop,
        "step_counted_matmul_flop": _counted_matmul_flop(cfg, rank_results),
        "counted_flop_per_s": counted_flop / step_s,
        "counted_flop_utilisation": mfu.utilisation(counted_flop, step_s, peak),
        "counted_flop_reason": counted_reason or peak.reason,
        "matmul_dtype_counted": first.get("matmul_dtype_counted"),
        "uncounted_ops": ", ".join(sorted(set().union(*(r["uncounted_ops"] for r in rank_results)))),
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "loss_fell": bool(losses[-1] < losses[0]),
        "resolved_device": first["device"], "device_name": first["device_name"],
        "grad_scale": first["grad_scale"],
        # The batch fetch, outside the timed step (slowest rank per step, as the step).
        "data_time_s": _median(data_samples),
        **optimizer_columns(rank_results),
        # What data_time_s measured (perfkit.analyse.advice.training.data_source reads it).
        "data_source": "data_delay_s" if cfg.data_delay_s else "the entry point's make_batch"
        if catalog.family_of(cfg.model) == "entry" else "perfkit's synthetic batch",
        "data_time_samples_s": data_samples,
        "trace_path": first["trace_path"], "rank_trace_paths": [r["trace_path"] for r in rank_results],
        "trace_reason": first["trace_reason"],
        **trace_capture.summary_columns(r["trace_path"] for r in rank_results),
        **(state := memory_model.row_columns(cfg, rank_results, str(first["device"]).split(":")[0])),
        **(fit := memory_fit.row_columns(cfg, rank_results))[0],
        **memory_edge.edge_columns(cfg, state["memory_budget_bytes"], state["max_batch_size_predicted_analytic"], fit[1]),
        **_snapshot_columns(rank_results),
        "dp_size": cfg.dp_size, "tp_size": cfg.tp_size,
        **{f"{k}_calls_per_step": (first["collective_calls"] or {}).get(k, math.nan) for k in COLLECTIVES},
        **(_pipeline_columns(cfg, rank_results) if cfg.parallelism == "pp" else {}),
    }


def optimizer_columns(rank_results: list[dict]) -> dict:
    """``optimizer_time_s`` (median over the timed steps of the slowest rank's optimizer step, its
    communication included where it has some: ZeRO-1's broadcast) and its raw samples; NaN where
    the ranks did not time it (a pipeline's schedule steps its own optimizer)."""
    ranks = [r.get("optimizer_time_samples_s") for r in rank_results]
    if not all(ranks):
        return {"optimizer_time_s": math.nan, "optimizer_time_samples_s": None}
    per_step = [max(times) for times in zip(*ranks)]
    return {"optimizer_time_s": _median(per_step), "optimizer_time_samples_s": per_step}


def _pipeline_columns(cfg: TrainConfig, rank_results: list[dict]) -> dict:
    """A pipeline row's bubble (:func:`perfkit.analyse.pipeline_bubble.row_columns`) and stages."""
    return {**pipeline_bubble.row_columns(cfg.pp_schedule, cfg.n_microbatches, cfg.stages_per_rank,
                                          [r["intervals"] for r in rank_results],
                                          [r["window_samples_s"] for r in rank_results]),
            "pp_stages": cfg.world_size * cfg.stages_per_rank,
            "stages_per_rank_held": [r["stages"] for r in rank_results],
            "stage_params_per_rank": [r["stage_params"] for r in rank_results]}


def _snapshot_columns(rank_results: list[dict]) -> dict:
    """Rank 0's snapshot and its stacks at the peak; the peak is the largest over the ranks."""
    if "memory_snapshot_path" not in rank_results[0]:
        return {}
    return {"memory_snapshot_path": rank_results[0]["memory_snapshot_path"],
            "memory_snapshot_top_at_peak": rank_results[0]["memory_snapshot_top_at_peak"],
            "memory_snapshot_peak_bytes": max(r["memory_snapshot_peak_bytes"] for r in rank_results)}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan
