"""A results folder as configurations, ready for an experiment tracker (MLflow, TensorBoard).

One :class:`Configuration` per ``config_id``: its parameters (the columns its rows'
``param_names`` lists, plus an A/B sweep's ``variant`` and ``round``), the parameters that vary
across the folder (``swept``: they name the run), its ending (:func:`ending`), the numeric
columns as metric series (one step per row, in the order the rows were recorded), the
environment fingerprint (``env_*`` columns) and its files: the executed notebook
(``DIR/notebooks/<config_id>.ipynb``), its Parquet file(s) and any profiler traces
(``trace_path``, ``rank_trace_paths``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core import status as st
from ..core.errors import BadInputError
from ..core.results import load
from ..core.results_files import result_files

__all__ = ["Configuration", "configurations", "counts", "ending", "metric_columns", "param_text"]

#: Columns that are neither parameters nor metrics: bookkeeping every row carries.
_BOOKKEEPING = {"config_id", "status", "reason", "param_names", "variant_params", "notebook", "recorded_at",
                "trace_path", "rank_trace_paths", "trace_reason"}
#: The run's ending when rows disagree: the executor's failure row is the configuration's ending.
_ENDINGS = (st.KILLED, st.TIMEOUT, st.OOM, st.FAILED)


@dataclass(frozen=True)
class Configuration:
    """One configuration of a results folder, as a tracker sees it."""

    config_id: str
    rows: pd.DataFrame = field(repr=False)
    """Its rows, as :func:`perfkit.load` returns them."""
    params: dict[str, str]
    """Parameter name → value as text (JSON for containers, as the Parquet column holds it)."""
    swept: tuple[str, ...]
    """The parameters whose value differs between configurations of the folder."""
    status: str
    """How it ended (:func:`ending`)."""
    reason: str | None
    """Why, for anything but ``ok`` (and the reasons of its skipped rows)."""
    fingerprint: dict[str, str]
    """``env_*`` columns of its first row, as text."""
    metrics: dict[str, list[tuple[int, float]]]
    """Numeric column → ``(step, value)`` pairs: step = the row's position in the configuration."""
    notebook: Path | None
    """The executed notebook, when the folder has it."""
    files: tuple[Path, ...]
    """Its Parquet file(s)."""
    traces: tuple[Path, ...]
    """Profiler traces its rows point to that exist."""
    digest: str
    """Hash of its Parquet files' bytes: changes when its rows change (a retried configuration)."""
    start_ms: int | None
    end_ms: int | None

    @property
    def name(self) -> str:
        """A readable run name: the notebook, then the swept parameters (``gemm sizes=[64]``)."""
        notebook = Path(str(self.rows["notebook"].iloc[0])).stem if _has(self.rows, "notebook") else ""
        shown = " ".join(f"{k}={self.params[k]}" for k in self.swept if k in self.params)
        return " ".join(p for p in (notebook or self.config_id.rsplit("-", 1)[0], shown) if p) or self.config_id

    @property
    def slug(self) -> str:
        """A folder name: the swept parameters, then the id (unique, file-system safe)."""
        shown = ",".join(f"{k}={_safe(self.params[k])}" for k in self.swept if k in self.params)
        return f"{shown},{self.config_id}" if shown else self.config_id


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:40] or "_"


def _has(frame: pd.DataFrame, column: str) -> bool:
    return column in frame and frame[column].notna().any()


def param_text(value) -> str:
    """A parameter value as text: JSON for containers, ``repr``-free plain text otherwise."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return param_text(value.tolist())
    return str(value)


def ending(statuses) -> str:
    """A configuration's status from its rows' statuses: the failure a row records (the executor's
    row for a failed, oom, timeout or killed configuration); ``skipped`` when every row is; else ``ok``."""
    seen = [s for s in statuses if isinstance(s, str)]
    for status in reversed(seen):
        if status in _ENDINGS:
            return status
    if seen and all(s == st.SKIPPED for s in seen):
        return st.SKIPPED
    return st.OK


def _param_names(rows: pd.DataFrame) -> list[str]:
    names: dict[str, None] = {}
    for text in rows["param_names"].dropna().unique() if "param_names" in rows else ():
        try:
            names.update(dict.fromkeys(json.loads(text)))
        except (TypeError, ValueError):
            continue
    for tag in ("variant", "round"):  # an A/B sweep's: they tell its configurations apart
        if _has(rows, tag):
            names[tag] = None
    return [n for n in names if n in rows]


def metric_columns(rows: pd.DataFrame, params) -> list[str]:
    """The numeric columns of ``rows`` (bools and the fingerprint aside) that are not parameters."""
    out = []
    for col in rows.columns:
        if col in params or col in _BOOKKEEPING or str(col).startswith("env_"):
            continue
        dtype = rows[col].dtype
        if pd.api.types.is_bool_dtype(dtype) or not pd.api.types.is_numeric_dtype(dtype):
            continue
        if rows[col].notna().any():
            out.append(col)
    return out


def _first(series: pd.Series):
    present = series.dropna()
    return present.iloc[0] if len(present) else None


def _trace_files(rows: pd.DataFrame, directory: Path) -> list[Path]:
    paths: list[str] = []
    for col in ("trace_path", "rank_trace_paths"):
        if col not in rows:
            continue
        for value in rows[col].dropna():
            if isinstance(value, str):
                paths.append(value)
            elif hasattr(value, "__iter__"):
                paths.extend(str(v) for v in value if v)
    found = []
    for text in dict.fromkeys(paths):
        path = Path(text)
        if not path.is_absolute():
            path = directory / path
        if path.is_file():
            found.append(path)
    return found


def _millis(value) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(pd.Timestamp(value).value // 1_000_000)


def configurations(directory: str | Path) -> list[Configuration]:
    """Every configuration under ``directory``, in the order of their first rows."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInputError(f"{str(directory)!r} is not a results directory (a sweep's or a run's --out)")
    files = result_files(directory)
    if not files:
        raise BadInputError(f"no results under {str(directory)!r}: run a sweep (perfkit sweep SPEC --out "
                            f"{directory}) or pass the folder it wrote")
    frame = load(directory)
    by_stem: dict[str, list[Path]] = {}
    for path in files:
        by_stem.setdefault(path.stem, []).append(path)
    groups = [(cid, rows.reset_index(drop=True)) for cid, rows in frame.groupby("config_id", sort=False)]
    params = {cid: {n: param_text(v) for n in _param_names(rows) if (v := _first(rows[n])) is not None}
              for cid, rows in groups}
    values: dict[str, set] = {}
    for p in params.values():
        for name, text in p.items():
            values.setdefault(name, set()).add(text)
    swept = tuple(n for n, vs in values.items() if len(vs) > 1)
    out = []
    for cid, rows in groups:
        mine = params[cid]
        own_files = tuple(by_stem.get(cid, ()))
        digest = hashlib.sha256()
        for path in own_files:
            digest.update(path.read_bytes())
        if not own_files:  # rows under another name (an interactive session's file): hash the rows
            digest.update(pd.util.hash_pandas_object(rows.astype(str), index=False).values.tobytes())
        reasons = [str(r) for r in dict.fromkeys(rows["reason"].dropna())] if "reason" in rows else []
        stamps = rows["recorded_at"].dropna() if "recorded_at" in rows else pd.Series(dtype=object)
        notebook = directory / "notebooks" / f"{cid}.ipynb"
        out.append(Configuration(
            config_id=str(cid), rows=rows, params=mine, swept=tuple(n for n in swept if n in mine),
            status=ending(rows["status"]), reason="; ".join(reasons) or None,
            fingerprint={c: param_text(v) for c in rows.columns if c.startswith("env_")
                         if (v := _first(rows[c])) is not None},
            metrics={c: [(i, float(v)) for i, v in enumerate(rows[c]) if _finite(v)]
                     for c in metric_columns(rows, mine)},
            notebook=notebook if notebook.is_file() else None, files=own_files,
            traces=tuple(_trace_files(rows, directory)), digest=digest.hexdigest()[:16],
            start_ms=_millis(stamps.min()) if len(stamps) else None,
            end_ms=_millis(stamps.max()) if len(stamps) else None,
        ))
    return out


def _finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def counts(configs: list[Configuration]) -> Mapping[str, int]:
    """How many configurations ended each way."""
    out: dict[str, int] = {}
    for c in configs:
        out[c.status] = out.get(c.status, 0) + 1
    return out
