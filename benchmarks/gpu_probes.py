"""The probes of ``benchmarks/gpu_check.sh`` that answer the GPU trust issue (43), as JSON lines.

    python benchmarks/gpu_probes.py ceiling      # the measured ceiling beside a plain matmul sweep
    python benchmarks/gpu_probes.py probes       # OOM edge, fp8/bf16 eager and compiled, SDPA count
    python benchmarks/gpu_probes.py nccl         # one-rank nccl collectives, knobs checked (JSON)
    python benchmarks/gpu_probes.py sweep-spec   # the small sweep's spec (YAML) for the sweep step

Each probe prints one JSON object per line the moment it ends (``{"probe": name, ...}``), so a
step the script's ``timeout`` ends keeps every probe before it. Each probe is bounded on its own
(``RUN_LIMIT_S`` a run); a run the device cannot honour is its row, ``skipped`` with the reason. The
figures to compare with are the H200's, in ../shared/reference/gpu-h200/ (its README).
"""

from __future__ import annotations

import json
import sys
import time
import traceback

#: The H200 issue's transformer (4 layers, d_model 1024, 16 heads, vocab 8192, seq 256).
H200_TRANSFORMER = {"model": "transformer", "seq_len": 256,
                    "model_size": {"n_layers": 4, "d_model": 1024, "n_heads": 16, "vocab_size": 8192}}
#: Seconds a probe's one run may take (the H200: a search probe 8-15 s, a compiled fp8 run 33.5 s);
#: the step's own limit (gpu_check.sh, 180 s) bounds them all, and what ended before it is kept.
RUN_LIMIT_S = {"oom_edge": 30, "precision": 45}


def _emit(record: dict) -> None:
    print(json.dumps(record, default=str), flush=True)


def _plain_matmul_tflops(n: int) -> dict:
    """A plain bf16 ``a @ b`` of n-cubed, as the H200 reference measured it (benchmarks/ceilings.py's)."""
    import torch

    from ceilings import plain_matmul  # benchmarks/, this script's own folder

    best, median = plain_matmul("cuda", torch.bfloat16, n)
    return {"n": n, "best_tflops": best / 1e12, "median_tflops": median / 1e12}


def ceiling() -> None:
    """perfkit's quick bf16 ceiling (its shapes tried) and a plain matmul sweep, in one process."""
    import pandas as pd

    from perfkit.measuring.kernels.ceilings import measure_ceilings

    flat = pd.DataFrame({"kernel": ["triad"] * 4, "threads": 1, "backend": "torch",
                         "working_set_bytes": [2 ** 14, 2 ** 15, 2 ** 16, 2 ** 17], "bytes_per_s": [1e11] * 4})
    t0 = time.perf_counter()
    row = measure_ceilings("cuda", quick=True, dtypes=["bf16"], curve=flat).query("kind == 'compute'").iloc[0]
    ours = {"tflops": row["value"] / 1e12, "best_shape": [int(row["m"]), int(row["n"]), int(row["k"])],
            "shapes_tried": list(row["shapes_tried"]), "search_s": round(time.perf_counter() - t0, 1)}
    plain = [_plain_matmul_tflops(n) for n in (4096, 8192, 16384)]
    best = max(p["best_tflops"] for p in plain)
    _emit({"probe": "ceiling", "perfkit_bf16": ours, "plain": plain,
           "ratio_ceiling_over_plain_best": ours["tflops"] / best,
           "h200_before": {"perfkit_quick": 681.4, "plain_best": 780.8, "ratio": 0.87}})


def _bounded(name: str, fn) -> None:
    t0 = time.perf_counter()
    try:
        out = fn()
        _emit({"probe": name, "status": "ok", **out, "wall_s": round(time.perf_counter() - t0, 1)})
    except Exception as error:  # noqa: BLE001 - one probe's failure is its record, not the step's end
        _emit({"probe": name, "status": "failed", "error": f"{type(error).__name__}: {error}",
               "traceback": traceback.format_exc()[-2000:], "wall_s": round(time.perf_counter() - t0, 1)})


def _oom_edge() -> dict:
    from perfkit.measuring.training.batch_search import find_max_batch_size
    from perfkit.measuring.training.config import TrainConfig

    cfg = TrainConfig(**H200_TRANSFORMER, precision="bf16", device="cuda", steps=2, warmup_steps=1,
                      batch_size=1024, count_flops=False)
    found = find_max_batch_size(cfg, start=1024, limit=8192, multiple_of=128, predict_fake=True,
                                timeout_s=RUN_LIMIT_S["oom_edge"])
    stopped = found.pop("stopped_by", None)
    return {**found, "stopped_by_error": (stopped or {}).get("error"), "h200_before": {"in_process": 1024, "isolated": 1920, "fake": 1920, "analytic": 2816}}


def _precision() -> dict:
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training

    out = {}
    for precision in ("bf16", "fp8"):
        for compiled in (False, True):
            cfg = TrainConfig(**H200_TRANSFORMER, precision=precision, device="cuda", batch_size=128, steps=6,
                              warmup_steps=2, compile=compiled)
            row = run_training(cfg, timeout_s=RUN_LIMIT_S["precision"], isolate=True)
            out[precision + ("+compile" if compiled else "")] = {
                k: row.get(k) for k in ("status", "step_time_s", "mfu", "mfu_convention", "fp8_reason",
                                        "max_batch_size_predicted", "max_batch_size_predicted_source",
                                        "max_batch_size_predicted_analytic", "peak_mem_bytes", "error")}
    out["h200_before_step_s"] = {"bf16": 0.0333, "bf16+compile": 0.0284, "fp8": 0.1059, "fp8+compile": 0.0379}
    return out


def _sdpa_count() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import sdpa_flop_count

    from perfkit.measuring.ops.counting import count_ops, coverage

    q, k, v = (torch.randn(4, 16, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    df = count_ops(F.scaled_dot_product_attention, q, k, v)
    return {"counted_flop": float(df["flop"].sum()), "expected_attention_flop": sdpa_flop_count(q.shape, k.shape, v.shape),
            "uncounted": [u.op for u in coverage(df).uncounted]}


def nccl() -> None:
    """One-rank nccl collectives with Ring/Simple forced, the knobs checked on a live NCCL log."""
    from perfkit.measuring.collectives.benchmark import CollectivesConfig, run_collectives

    cfg = CollectivesConfig(ops=("all_reduce", "all_gather"), world_size=1, backend="nccl", min_bytes=1 << 16,
                            max_bytes=1 << 24, factor=16, iters=10, env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
                            timeout_s=25)
    rows = run_collectives(cfg)
    cols = ["op", "inplace", "size_bytes", "time_s", "busbw_bytes_per_s", "wrong_elements", "knob_check",
            "algo_observed", "proto_observed", "knob_check_detail", "timed_nccl_debug"]
    print(json.dumps(rows[[c for c in cols if c in rows]].to_dict(orient="records"), indent=2, default=str))


def probes() -> None:
    _bounded("oom_edge", _oom_edge)
    _bounded("precision", _precision)
    _bounded("sdpa_count", _sdpa_count)


SWEEP_SPEC = """\
# gpu_check's small sweep: one configuration per notebook family the H200 run measured.
name: gpu-check
timeout_s: 90
parts:
  - notebook: {repo}/notebooks/gemm.ipynb
    parameters: {{device: cuda, min_run_time_s: 0.05, sizes: [1024, 4096, 8192], dtypes: [bf16]}}
  - notebook: {repo}/notebooks/roofline.ipynb
    parameters: {{device: cuda, model: transformer, batch_size: 32, precision: bf16}}
  - notebook: {repo}/notebooks/train_step.ipynb
    parameters: {{device: cuda, model: transformer, seq_len: 256, batch_size: 32, precision: bf16, steps: 6,
                 warmup_steps: 2, profile: true,
                 model_size: {{n_layers: 4, d_model: 1024, n_heads: 16, vocab_size: 8192}}}}
  - notebook: {repo}/notebooks/inference.ipynb
    parameters: {{device: cuda, model: "hf:llama", precision: bf16, batch_sizes: [1, 8], prompt_len: 512,
                 new_tokens: 32, threads: 0, model_size: {{hidden_size: 1024, intermediate_size: 2816,
                 num_attention_heads: 16, num_hidden_layers: 6, num_key_value_heads: 8, vocab_size: 32000}}}}
  - notebook: {repo}/notebooks/kernels.ipynb
    parameters: {{device: cuda, model_path: {repo}/templates, dtypes: [bf16], min_run_time_s: 0.05,
                 impls: {{eager: "torch.nn.functional:rms_norm", triton: "my_kernels:rms_norm_triton",
                         wrong: "my_kernels:rms_norm_wrong"}},
                 shapes: [{{rows: 4096, hidden: 4096}}, {{rows: 16384, hidden: 8192}}]}}
"""


def main(argv: list[str]) -> int:
    if argv[:1] == ["ceiling"]:
        ceiling()
    elif argv[:1] == ["probes"]:
        probes()
    elif argv[:1] == ["nccl"]:
        nccl()
    elif argv[:1] == ["sweep-spec"] and len(argv) == 2:
        print(SWEEP_SPEC.format(repo=argv[1]), end="")
    else:
        print("usage: gpu_probes.py ceiling | probes | nccl | sweep-spec REPO", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
