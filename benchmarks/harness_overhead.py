"""Issue 27's harness check: perfkit's training step on a user's model against a hand-written loop.

Same model (built by its own library or entry point, not by perfkit), same batch, precision,
optimizer (AdamW, lr 1e-2), device and threads, in this one process, alternating rounds (perfkit,
hand, hand, perfkit, ...) so drift hits both alike. perfkit's step time is the median of the
row's raw samples (its timed steps, after its warm-up, which carries the counted and metered
step); the hand loop times the same ``zero_grad``, forward, loss, ``backward``, ``step`` between
two ``perf_counter`` calls. Goal: the median over rounds of (hand median / perfkit median) >= 0.97
(perfkit's bookkeeping must not cost the user's model time); a round's two sides run next to each
other, so the machine's drift between rounds cancels in its ratio.

Decode, the same way: perfkit's TPOT of ``hf:llama`` (inference.ipynb's row: its own loop over
transformers' static KV cache) against ``model.generate()`` as a user times it (greedy, the same
static cache, prompt and token count), a logits processor stamping ``perf_counter`` after every
forward: the hand TPOT of a generation is (last stamp − first) / (N − 1), the decode steps and
everything generate() does between them. Goal: hand TPOT / perfkit TPOT >= 0.97.

    python benchmarks/harness_overhead.py [--rounds 5] [--steps 12] [--generations 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "templates"))

from perfkit.measuring.training.config import TrainConfig  # noqa: E402
from perfkit.measuring.training.step import batch_seed, train_step_benchmark  # noqa: E402

GOAL = 0.97
LLAMA_SIZE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 512}
MODELS = {
    "hf:llama": {"model": "hf:llama", "model_size": LLAMA_SIZE, "batch_size": 8, "seq_len": 64},
    "entry (templates/user_model.py)": {"model": "user_model:build", "batch_size": 64,
                                        "model_size": {"width": 256, "depth": 4}},
}


def _hand_llama(params: dict, steps: int) -> list[float]:
    """What a user writes: the model from transformers, a batch, AdamW, a timed loop."""
    import transformers

    config = transformers.AutoConfig.for_model("llama", **LLAMA_SIZE)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, LLAMA_SIZE["vocab_size"], (params["batch_size"], params["seq_len"] + 1), generator=gen)
    inputs, targets = seq[:, :-1], seq[:, 1:]
    return _loop(steps, model, optimizer, lambda: F.cross_entropy(
        model(inputs).logits.float().reshape(-1, LLAMA_SIZE["vocab_size"]), targets.reshape(-1)))


def _hand_entry(params: dict, steps: int) -> list[float]:
    import user_model

    built = user_model.build(**params["model_size"], seed=0)
    model = built["model"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = built["make_batch"](params["batch_size"], batch_seed(TrainConfig(**params), 0))
    return _loop(steps, model, optimizer, lambda: built["loss_fn"](model(x), y))


def _hand_generate_tpot(generations: int, prompt_len: int, new_tokens: int) -> list[float]:
    """TPOT of ``generations`` hand-timed greedy ``generate()`` calls (after one untimed)."""
    import transformers

    config = transformers.AutoConfig.for_model("llama", **LLAMA_SIZE)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.randint(0, LLAMA_SIZE["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(0))
    stamps: list[float] = []

    class Stamp(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    samples = []
    for g in range(generations + 1):
        stamps.clear()
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 cache_implementation="static", logits_processor=[Stamp()], pad_token_id=0)
        assert out.shape[1] == prompt_len + new_tokens and len(stamps) == new_tokens
        if g:
            samples.append((stamps[-1] - stamps[0]) / (new_tokens - 1))
    return samples


def _decode(rounds: int, generations: int) -> bool:
    from perfkit.measuring.inference import generate as inference

    prompt_len, new_tokens = 128, 16
    cfg = inference.InferenceConfig(model="hf:llama", model_size=LLAMA_SIZE, prompt_len=prompt_len,
                                    new_tokens=new_tokens, device="cpu", count_ops=False, timed_runs=generations)

    def perfkit_tpot() -> list[float]:
        row = inference.run_inference(cfg)
        assert row["status"] == "ok", row["error"]
        return row["tpot_samples_s"]

    sides = {"perfkit": perfkit_tpot, "hand": lambda: _hand_generate_tpot(generations, prompt_len, new_tokens)}
    return _report("hf:llama decode (TPOT)", _alternate(sides, rounds), "generate()",
                   f"generations, prompt {prompt_len}, N = {new_tokens}")


def _alternate(sides: dict, rounds: int) -> list[dict[str, list[float]]]:
    """Each round runs both sides once, in alternating order (perfkit, hand / hand, perfkit)."""
    order = list(sides)
    return [{side: sides[side]() for side in (order if r % 2 == 0 else order[::-1])} for r in range(rounds)]


def _report(name: str, rounds: list[dict[str, list[float]]], hand: str, unit: str) -> bool:
    """Print the pooled medians and the goal's ratio: the median over rounds of each round's
    hand median / perfkit median (a round's two sides ran next to each other, so the machine's
    drift between rounds, seen here as 25 -> 34 ms within one run, cancels in each ratio)."""
    p = statistics.median(x for r in rounds for x in r["perfkit"])
    h = statistics.median(x for r in rounds for x in r["hand"])
    ratios = [statistics.median(r["hand"]) / statistics.median(r["perfkit"]) for r in rounds]
    ratio = statistics.median(ratios)
    print(f"{name:32s} perfkit {p * 1e3:7.2f} ms  {hand} {h * 1e3:7.2f} ms  hand/perfkit {ratio:5.3f} "
          f"(rounds {min(ratios):.3f}..{max(ratios):.3f}; goal >= {GOAL}) {'ok' if ratio >= GOAL else 'MISSED'}"
          f"  [{sum(len(r['perfkit']) for r in rounds)} / {sum(len(r['hand']) for r in rounds)} {unit}]")
    return ratio >= GOAL


def _loop(steps: int, model, optimizer, loss) -> list[float]:
    samples = []
    for step in range(steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()
        if step >= 1:  # perfkit's warm-up_steps=1
            samples.append(time.perf_counter() - t0)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--generations", type=int, default=4, help="timed generations per round (decode)")
    args = parser.parse_args()
    print(f"load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    hands = {"hf:llama": _hand_llama, "entry (templates/user_model.py)": _hand_entry}
    failed = False
    for name, params in MODELS.items():
        cfg = TrainConfig(**params, steps=args.steps, warmup_steps=1)
        sides = {"perfkit": lambda: train_step_benchmark(cfg)["step_time_samples_s"],
                 "hand": lambda: hands[name](params, args.steps)}
        failed |= not _report(name, _alternate(sides, args.rounds), "hand", "samples")
    failed |= not _decode(args.rounds, args.generations)
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
