"""Where the nodes of a multi-node launch meet: :func:`slurm_rendezvous` reads a Slurm allocation
into :func:`perfkit.run.launch.launch`'s ``nnodes``, ``node_rank`` and ``rdzv_endpoint``."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from perfkit.core.errors import BadInputError

__all__ = ["slurm_rendezvous"]


def _expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact host list (``gpu[01-03,07],login1``) → host names, as scontrol would."""
    hosts, depth, token = [], 0, ""
    for ch in nodelist + ",":
        if ch == "," and depth == 0:
            match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", token)
            if match:
                prefix, ranges, suffix = match.groups()
                for part in ranges.split(","):
                    lo, _, hi = part.partition("-")
                    for i in range(int(lo), int(hi or lo) + 1):
                        hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
            elif token:
                hosts.append(token)
            token = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        token += ch
    return hosts


def slurm_rendezvous(port: int = 29500, environ: Mapping[str, str] | None = None) -> dict:
    """``nnodes``, ``node_rank`` and ``rdzv_endpoint`` for :func:`launch` inside a Slurm allocation.

    The sbatch shape is one task per node (``--nodes=N --ntasks-per-node=1``), each task running
    ``launch(..., **slurm_rendezvous())`` with ``world_size = N × GPUs per node``; torchrun's c10d
    rendezvous meets on the allocation's first node (``SLURM_JOB_NODELIST``)."""
    env = os.environ if environ is None else environ
    try:
        nnodes, node_rank, nodelist = int(env["SLURM_NNODES"]), int(env["SLURM_NODEID"]), env["SLURM_JOB_NODELIST"]
    except KeyError as missing:
        raise BadInputError(f"not inside a Slurm allocation ({missing.args[0]} is unset); "
                            "pass nnodes, node_rank and rdzv_endpoint yourself") from None
    hosts = _expand_nodelist(nodelist)
    if not hosts:
        raise BadInputError(f"cannot read SLURM_JOB_NODELIST={nodelist!r}")
    return {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": f"{hosts[0]}:{port}"}
