"""``perfkit predict --network``: the target network read from an nccl-tests/rccl-tests output
file (:mod:`perfkit.ingest.nccl_tests`) or a perfkit folder of measured collectives, as the ring
model of :mod:`perfkit.analyse.network_model`."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from perfkit.analyse.network_model import NetworkModel, network_from_rows
from perfkit.core.errors import BadInputError

__all__ = ["read_network"]


def read_network(path: str | os.PathLike) -> NetworkModel:
    """The network at ``path``; anything else is one line of :class:`BadInputError`."""
    path = Path(path)
    if path.is_dir():
        from perfkit.core.results import load

        try:
            rows = load(path)
        except Exception as exc:  # noqa: BLE001 - a folder without perfkit rows
            raise BadInputError(f"--network {path}: no perfkit rows to read ({exc})") from None
        need = {"op", "size_bytes", "time_s", "world_size"}
        if rows.empty or not need <= set(rows.columns) or rows["op"].isna().all():
            raise BadInputError(f"--network {path}: no measured collectives (rows with op, size_bytes, time_s, "
                                "world_size): run notebooks/collectives.ipynb there, or pass an nccl-tests output file")
        rows = rows[rows["op"].notna() & rows["size_bytes"].notna()]
    elif path.is_file():
        from perfkit.ingest import nccl_tests

        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise BadInputError(f"--network {path}: cannot read it ({exc.strerror})") from None
        try:
            rows = pd.DataFrame(nccl_tests.parse(text, source=str(path)).rows)
        except BadInputError as exc:
            raise BadInputError(f"--network {path}: not an nccl-tests/rccl-tests output ({exc})") from None
    else:
        raise BadInputError(f"--network {path}: no such file or folder")
    return network_from_rows(rows, str(path))
