"""Rank targets for tests/test_teardown.py: ranks that hang, and say who they are.

A module of tests/ (on PYTHONPATH for kernels and ranks, see conftest.py), so that a notebook's
kernel and the ranks it launches can import it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def sleep_forever_target(config: dict) -> dict:
    """Write this rank's pid into ``pid_dir``, then sleep for ever while ``hang_file`` exists."""
    import torch.distributed as dist

    pid_dir = Path(config["pid_dir"])
    pid_dir.mkdir(parents=True, exist_ok=True)
    (pid_dir / f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    while os.path.exists(config["hang_file"]):
        time.sleep(0.2)
    return {"rank": dist.get_rank()}
