"""How an entry point's batch splits over data-parallel ranks: the contract's ``split_batch`` for a
batch whose tensors do not all hold the samples on dim 0 (an ``nn.EmbeddingBag``'s flat indices
and offsets), checked before any rank starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO
from perfkit.core.errors import BadInputError
from perfkit.measuring.training.config import TrainConfig
from perfkit.measuring.training.step import train_step_benchmark
from perfkit.measuring.workloads import catalog

BAGS = {"model": "_user_models:bag_recommender", "batch_size": 16, "steps": 5, "warmup_steps": 1, "device": "cpu"}


def test_a_split_gives_each_rank_its_samples_bags_and_all():
    work = catalog.build(catalog.make("_user_models:bag_recommender", {}), device="cpu")
    inputs, target = work.make_batch(8, seed=3)
    halves = [work.rank_slice(inputs, target, lo, lo + 4) for lo in (0, 4)]
    dense, indices, offsets = inputs
    assert sum(len(h[0][1]) for h in halves) == len(indices)  # every id of every bag, once
    for (d, i, o), t in halves:
        assert len(d) == len(o) == len(t) == 4 and o[0] == 0 and o[-1] < len(i)
    model = work.model
    whole = model(dense, indices, offsets)
    assert (model(*halves[0][0]).detach() == whole[:4].detach()).all()
    assert (model(*halves[1][0]).detach() == whole[4:].detach()).all()


@pytest.mark.slow  # > 5 s here: make test runs it, test-fast does not
def test_a_batch_that_does_not_split_by_rows_is_refused_in_one_line_before_any_rank():
    size = {"split": False}
    TrainConfig(**BAGS, model_size=size)  # one process: nothing to split
    with pytest.raises(BadInputError, match=r"inputs\[1\] has \d+ rows on dim 0, not batch_size 16.*split_batch"):
        TrainConfig(**BAGS, model_size=size, parallelism="ddp", world_size=2)
    run = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", "notebooks/train_step.ipynb", "--out", "/dev/null/x",
                          "-p", "model", "_user_models:bag_recommender", "-p", "model_size", '{"split": false}',
                          "-p", "parallelism", "ddp", "-p", "world_size", "2", "-p", "batch_size", "16"],
                         cwd=REPO, capture_output=True, text=True, env={**__import__("os").environ,
                                                                        "PYTHONPATH": str(REPO / "tests")})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "split_batch" in run.stderr


@pytest.mark.slow
def test_embedding_bags_train_under_ddp_and_zero2_as_in_one_process():
    from _training_targets import run_training_shared

    ref = train_step_benchmark(TrainConfig(**BAGS))
    rows = run_training_shared([TrainConfig(**BAGS, parallelism=p, world_size=2) for p in ("ddp", "zero2")], 600)
    assert ref["status"] == "ok", ref["error"]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["losses"] == pytest.approx(ref["losses"], rel=1e-4)


def test_a_command_line_value_may_be_json_as_tools_write_it():
    from perfkit.core.errors import ParameterTypeError
    from perfkit.run.notebooks import Parameter, coerce_cli_value

    sizes = Parameter(name="model_size", default={}, literal=True, source="{}")
    assert coerce_cli_value(sizes, '{"split": false, "n": null, "w": 2}') == {"split": False, "n": None, "w": 2}
    assert coerce_cli_value(sizes, "{'split': False}") == {"split": False}  # a Python literal, as before
    steps = Parameter(name="steps", default=6, literal=True, source="6")
    with pytest.raises(ParameterTypeError):
        coerce_cli_value(steps, "six")
    anything = Parameter(name="x", default=None, literal=True, source="None")
    assert coerce_cli_value(anything, "true") == "true" and coerce_cli_value(anything, "[1, null]") == [1, None]
