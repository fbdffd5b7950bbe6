"""``compile=True`` of the training step on CPU: torch.compile (inductor, C++ codegen) really
compiles the model, and the step computes what the eager step computes.

Slow: inductor compiles the forward and backward (~30 s on 2 idle cores, more under load).
The same on a GPU is in tests/test_gpu.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.step import train_step_benchmark


@pytest.mark.slow
def test_compiled_training_step_on_cpu_compiles_and_matches_eager():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = dict(model="mlp", device="cpu", steps=3, batch_size=8, precision="fp32")
    compiled = train_step_benchmark(TrainConfig(compile=True, **cfg))
    graphs = counters["stats"]["unique_graphs"]
    eager = train_step_benchmark(TrainConfig(compile=False, **cfg))

    assert graphs >= 1  # dynamo captured and compiled the model: compile=True is not a no-op
    assert compiled["status"] == "ok" and compiled["compile"] is True
    assert len(compiled["step_time_samples_s"]) == 2 and compiled["step_time_s"] > 0
    # Same seeds, same math: the compiled losses follow the eager ones (fused kernels may
    # reassociate sums, hence a tolerance).
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4, abs=1e-5)
    assert compiled["loss_last"] < compiled["loss_first"]
    # The dispatch-level counter cannot see inside compiled kernels: NaN, with the reason.
    assert math.isnan(compiled["step_counted_flop"]) and "torch.compile" in compiled["counted_flop_reason"]
