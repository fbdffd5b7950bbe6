"""Issue 18's acceptance on this machine: TTFT and TPOT ratios with and without the KV cache.

The inference defaults (:mod:`perfkit.measuring.inference.generate`: 4 layers, d_model 256, 4 heads, vocab
512; batch 1, N = 16 new tokens, fp32) at prompt 128 and 512 with the cache, and at 512 without it,
run interleaved for ``--rounds`` rounds (order reversed every other round, so drift hits all
alike) and pooled; each figure is a median of the pooled samples. Goals:

- TPOT with cache, prompt 512 / prompt 128        <= 1.5  (decode reads the weights, 13.8 MB, and
  a KV cache of 4.2 MB at 512: the prompt barely matters)
- TTFT, prompt 512 / prompt 128                   in [2, 6] (prefill is linear matmul work plus
  attention's quadratic term)
- TPOT at prompt 512, no cache / cache            >= 4
- e2e = TTFT + (N - 1) * TPOT                     within 5 % (medians; and with the separately
  timed prefill, optimum-benchmark's, as TTFT)
- greedy tokens equal with and without the cache, and in fp32 and fp64
- counted bytes of one decode step within 5 % of weights + KV read + KV written

    python benchmarks/inference_latency.py [--rounds 3] [--threads 1] [--new-tokens 16] [--model hf:llama]

``--model hf:llama`` runs the same checks on a Hugging Face llama of the same shape (4 layers,
hidden 256, 4 heads, vocab 512; issue 27) generating through transformers' own static KV cache
(the decode-bytes check is perfkit's own decoder's and is left out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfkit.analyse.inference import e2e_consistency  # noqa: E402
from perfkit.measuring.inference import generate as inference
from perfkit.measuring.inference import kv_cache


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


#: A Hugging Face llama of perfkit's decoder's shape (its defaults: 4 layers, d_model 256, 4 heads, vocab 512).
HF_LLAMA = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 688, "vocab_size": 512}


def _check(ok: bool, text: str) -> bool:
    print(f"[{'ok  ' if ok else 'FAIL'}] {text}")
    return ok


def _hand_bytes(cfg: inference.InferenceConfig) -> tuple[float, float]:
    """(counted, hand-derived) bytes of the decode step at P + N // 2 positions (tests/test_inference.py)."""
    spec = cfg.spec
    L, d, V, B = spec.n_layers, spec.d_model, spec.vocab_size, cfg.batch_size
    t = cfg.prompt_len + cfg.new_tokens // 2
    model = inference.build_model(cfg, "cpu")
    ops = kv_cache.count_steps(model, inference.prompt_tokens(cfg, "cpu"), cfg.new_tokens)["decode"]
    weights = L * (12 * d * d + 2 * d) + d + V * d + B * d + d
    hand = 4 * (weights + 2 * L * B * t * d + 2 * L * B * d)
    return float((ops["bytes_read"] + ops["bytes_written"]).sum()), float(hand)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--model", default="transformer", choices=("transformer", "hf:llama"))
    args = parser.parse_args()
    print(_load())
    n = args.new_tokens
    base = dict(batch_size=args.batch_size, new_tokens=n, device="cpu", threads=args.threads, count_ops=False,
                model=args.model, model_size=HF_LLAMA if args.model == "hf:llama" else {})
    configs = {"cache128": inference.InferenceConfig(**base, prompt_len=128, timed_runs=6),
               "cache512": inference.InferenceConfig(**base, prompt_len=512, timed_runs=6),
               "full512": inference.InferenceConfig(**base, prompt_len=512, kv_cache=False, timed_runs=2)}
    print(f"{args.model} {base['model_size'] or inference.MODEL_DEFAULTS}; batch {args.batch_size}, N = {n}, "
          f"fp32, {args.threads or 'default'} thread(s), {args.rounds} interleaved rounds")
    keys = ("ttft_samples_s", "tpot_samples_s", "e2e_latency_samples_s", "prefill_time_samples_s")
    pooled = {name: {k: [] for k in keys} for name in configs}
    digests = {}
    for r in range(args.rounds):
        for name in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            row = inference.run_inference(configs[name])
            if row["status"] != "ok":
                raise SystemExit(f"{name}: {row['status']}: {row['error']}")
            for k in keys:
                pooled[name][k] += row[k]
            digests[name] = row["tokens_digest"]
    med = {name: {k.removesuffix("_samples_s"): float(np.median(v)) for k, v in s.items()}
           for name, s in pooled.items()}
    for name, m in med.items():
        print(f"{name:9s} TTFT {m['ttft'] * 1e3:8.2f} ms  TPOT {m['tpot'] * 1e3:7.2f} ms  "
              f"e2e {m['e2e_latency'] * 1e3:8.1f} ms  prefill alone {m['prefill_time'] * 1e3:8.2f} ms  "
              f"({len(pooled[name]['ttft_samples_s'])} generations)")
    c128, c512, f512 = med["cache128"], med["cache512"], med["full512"]
    results = [
        _check(c512["tpot"] / c128["tpot"] <= 1.5,
               f"TPOT with cache, prompt 512 / 128 = {c512['tpot'] / c128['tpot']:.2f} (goal <= 1.5)"),
        _check(2 <= c512["ttft"] / c128["ttft"] <= 6,
               f"TTFT, prompt 512 / 128 = {c512['ttft'] / c128['ttft']:.2f} (goal 2 to 6)"),
        _check(f512["tpot"] / c512["tpot"] >= 4,
               f"TPOT at prompt 512, no cache / cache = {f512['tpot'] / c512['tpot']:.1f} (goal >= 4)"),
    ]
    for name, m in med.items():
        gap = e2e_consistency(m["ttft"], m["tpot"], m["e2e_latency"], n)
        alone = e2e_consistency(m["prefill_time"], m["tpot"], m["e2e_latency"], n)
        results.append(_check(abs(gap) <= 0.05, f"{name}: (TTFT + (N-1) TPOT) / e2e - 1 = {gap:+.3f}; "
                                                f"with the prefill timed alone {alone:+.3f} (goal within 0.05)"))
    results.append(_check(digests["cache512"] == digests["full512"],
                          f"greedy tokens with and without the cache at 512: {digests['cache512']} / "
                          f"{digests['full512']}"))
    fp64 = inference.run_inference(inference.InferenceConfig(**{**base, "precision": "fp64"}, prompt_len=128,
                                                             timed_runs=1))
    results.append(_check(fp64["tokens_digest"] == digests["cache128"],
                          f"greedy tokens fp32 / fp64 at 128: {digests['cache128']} / {fp64['tokens_digest']}"))
    if args.model == "transformer":  # the hand derivation is of perfkit's own decoder
        counted, hand = _hand_bytes(configs["cache512"])
        results.append(_check(abs(counted / hand - 1) <= 0.05,
                              f"decode step bytes counted / hand-derived = {counted / 1e6:.3f} / {hand / 1e6:.3f} MB "
                              f"= {counted / hand:.3f} (goal within 5 %)"))
    print(_load())
    print(f"{sum(results)}/{len(results)} acceptance checks met")


if __name__ == "__main__":
    main()
