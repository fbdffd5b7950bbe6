"""``perfkit predict --network``: the target network read from an nccl-tests/rccl-tests output
file (:mod:`perfkit.ingest.nccl_tests`) or a perfkit folder of measured collectives, as the ring
model of :mod:`perfkit.analyse.network_model`."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pandas as pd

from perfkit.analyse.network_model import NetworkModel, network_from_rows
from perfkit.core.errors import BadInputError

__all__ = ["read_network"]


def read_network(path: str | os.PathLike, intra: str | os.PathLike | None = None,
                 gpus_per_node: int | None = None) -> NetworkModel:
    """The network at ``path`` (with ``intra``, the intra-node network beside it for groups of up
    to ``gpus_per_node`` ranks: by default the inter-node table's ranks ÷ hosts); anything else is
    one line of :class:`BadInputError`."""
    model = _read_one(path)
    if intra is None:
        if gpus_per_node:
            return replace(model, gpus_per_node=gpus_per_node)
        return model
    inside = _read_one(intra)
    if model.hosts == 1:
        raise BadInputError(f"--network {path} ran on one host: pass the inter-node (several hosts) table as --network "
                            f"and the one-node table as --network-intra")
    if inside.hosts > 1:
        raise BadInputError(f"--network-intra {intra} ran on {inside.hosts} hosts: an intra-node table runs on one")
    gpn = gpus_per_node or (model.measured_world_size // model.hosts if model.hosts > 1 else None)
    if not gpn:
        raise BadInputError(f"--network {path}: its hosts are not known (a perfkit folder): pass --gpus-per-node N")
    return replace(model, intra=inside, gpus_per_node=gpn)


def _read_one(path: str | os.PathLike) -> NetworkModel:
    path = Path(path)
    notes: list[str] = []
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
            parsed = nccl_tests.parse(text, source=str(path))
        except BadInputError as exc:
            raise BadInputError(f"--network {path}: not an nccl-tests/rccl-tests output ({exc})") from None
        notes += [f"a run that failed in {path}, left out: {p.reason}" for p in parsed.parts if not p.finished]
        frames = []
        for part in parsed.parts or [parsed]:  # each run with the hosts it ran on
            if part.rows:
                frames.append(pd.DataFrame(part.rows).assign(hosts=int(part.facts.get("hosts") or 0),
                                                             backend=part.facts.get("backend")))
        rows = pd.concat(frames, ignore_index=True)
        empty = rows["size_bytes"] <= 0
        if empty.any():  # nccl-tests' minBytes 0: a row that moved nothing measures the launch alone
            notes.append(f"{int(empty.sum())} rows of 0 bytes in {path} left out (they move nothing)")
            rows = rows[~empty]
    else:
        raise BadInputError(f"--network {path}: no such file or folder")
    return network_from_rows(rows, str(path), notes)
