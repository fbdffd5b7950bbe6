"""Issue 27's harness check: perfkit's training step on a user's model against a hand-written loop.

Same model (built by its own library or entry point, not by perfkit), same batch, precision,
optimizer (AdamW, lr 1e-2), device and threads, in this one process, alternating rounds (perfkit,
hand, hand, perfkit, ...) so drift hits both alike. perfkit's step time is the median of the
row's raw samples (its timed steps, after its warm-up, which carries the counted and metered
step); the hand loop times the same ``zero_grad``, forward, loss, ``backward``, ``step`` between
two ``perf_counter`` calls. Goal: hand median / perfkit median >= 0.97 (perfkit's bookkeeping
must not cost the user's model time).

    python benchmarks/harness_overhead.py [--rounds 5] [--steps 12]
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
    args = parser.parse_args()
    print(f"load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    hands = {"hf:llama": _hand_llama, "entry (templates/user_model.py)": _hand_entry}
    failed = False
    for name, params in MODELS.items():
        cfg = TrainConfig(**params, steps=args.steps, warmup_steps=1)
        perfkit_s, hand_s = [], []
        for r in range(args.rounds):
            order = ("perfkit", "hand") if r % 2 == 0 else ("hand", "perfkit")
            for side in order:
                if side == "perfkit":
                    perfkit_s += train_step_benchmark(cfg)["step_time_samples_s"]
                else:
                    hand_s += hands[name](params, args.steps)
        p, h = statistics.median(perfkit_s), statistics.median(hand_s)
        ratio = h / p
        ok = ratio >= GOAL
        failed |= not ok
        print(f"{name:34s} perfkit {p * 1e3:8.2f} ms  hand {h * 1e3:8.2f} ms  hand/perfkit {ratio:5.3f} "
              f"(goal >= {GOAL}) {'ok' if ok else 'MISSED'}  [{len(perfkit_s)} / {len(hand_s)} samples]")
    print(f"load after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
