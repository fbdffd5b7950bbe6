"""Rows of a real measurement recorded as one notebook's configuration in a results folder (real
Parquet, as a sweep writes them), then ``perfkit advise`` on that folder: the helper of the
advice tests (tests/test_advise.py and the fixtures of the measurement tests that make the
constraints: pipeline, scaling, collectives, data loading)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from perfkit.core.results import RunContext, record
from perfkit.cli import main


def record_as(rows, folder: Path, *, notebook: str, params: dict, config_id: str, status: str = "ok",
              reason: str | None = None) -> Path:
    ctx = RunContext(results_path=folder / "results" / f"{config_id}.parquet", config_id=config_id,
                     params=params, param_names=tuple(params), notebook=notebook)
    record(rows, context=ctx, status=status, reason=reason)
    return folder


def advise_json(folder: Path, *args: str) -> list[dict]:
    """``perfkit advise FOLDER --json FILE`` (exit 0 required): its findings. FILE is a temporary
    one, never beside the folder: that may be the shared reference data, read in place."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "advice.json"
        assert main(["advise", str(folder), "--json", str(out), *args]) == 0
        return json.loads(out.read_text())["findings"]


def top(findings: list[dict]) -> dict:
    """The binding constraint of the folder's one point (asserted to be one)."""
    points = {f["point"] for f in findings}
    assert len(points) == 1, points
    return next(f for f in findings if f["rank"] == 1)


def evidence_is_in_rows(finding: dict, folder: Path) -> None:
    """Every number of the finding's evidence that names a column equals that column in one of
    the rows it names (no advice whose evidence is not in the rows)."""
    import math

    import perfkit

    rows = perfkit.load(folder)
    rows = rows[rows["config_id"].isin(finding["config_ids"])]
    assert len(rows), finding
    for key, value in finding["evidence"].items():
        if key in rows and isinstance(value, (int, float)) and not isinstance(value, bool):
            # A per-rank column (a list a row) holds the value among its ranks' numbers.
            column = [float(x) for v in rows[key] for x in (v if hasattr(v, "__len__") else [v])]
            assert any(math.isclose(value, v, rel_tol=1e-9) for v in column), (key, value, column)
