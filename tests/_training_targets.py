"""Launch targets of the training tests: several configurations of one world size in one launch.

A launch costs its torchrun start-up (5-10 s of `import torch` and rendezvous on 2 shared
cores); a test fixture that needs a dozen small runs shares one launch per world size among
them. Each configuration still runs whole (``train_rank``: its own model, optimizer, meters and
counters) and is made a row by the library's own ``row_from_ranks``; a sweep never does this
(each configuration is its own launch there, so no process state reaches another's timing)."""

from __future__ import annotations

from perfkit.core.status import OK
from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.pipeline import pipeline_rank
from perfkit.measuring.training.step import row_from_ranks, train_rank, with_trace_dir
from perfkit.run.launch import launch


def train_each(config: dict) -> dict:
    # Each configuration as run_training's launch runs it: pp through the pipeline's rank target.
    return {"runs": [(pipeline_rank if c["parallelism"] == "pp" else train_rank)(c) for c in config["configs"]]}


def run_training_shared(cfgs: list[TrainConfig], timeout_s: float) -> list[dict]:
    """One row per configuration (all of one world size, on CPU), from one launch."""
    (world_size,) = {c.world_size for c in cfgs}
    cfgs = [with_trace_dir(c) for c in cfgs]
    result = launch("_training_targets:train_each", {"configs": [c.as_dict() for c in cfgs]},
                    world_size=world_size, backend="gloo", timeout_s=timeout_s, device="cpu")
    assert result.status == OK, result.error
    return [row_from_ranks(c, [r["runs"][i] for r in result.rank_results]) for i, c in enumerate(cfgs)]
