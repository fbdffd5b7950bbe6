"""The results store: one typed Parquet file per configuration, written atomically.

``record(rows)`` appends rows to the current configuration's file; ``load(DIR)`` returns every
row under DIR as one DataFrame. Each row carries:

- ``config_id`` and ``status`` (``ok``, ``failed``, ``oom``, ``timeout``, ``killed``, ``skipped``)
  with ``reason`` for anything but ``ok``;
- the configuration's parameters as columns of the same names (so rows group by what was swept),
  and their names as ``param_names`` (JSON text), so an analysis can tell a parameter from a
  measured column; in an A/B sweep also ``variant``, ``round`` and ``variant_params`` (the names
  the variant sets);
- the environment fingerprint of the device the row measured (``env_*`` columns and the whole
  as ``env_json``; :func:`perfkit.core.env.fingerprint_columns`);
- the raw samples the statistics came from (``*_samples_s`` list columns).

Columns carry their unit in their name (``time_s``, ``flop_per_s``, ``peak_mem_bytes``); the
unit of each column is also written into the Parquet schema metadata and comes back in
``DataFrame.attrs["units"]``.

Where rows go is set by the executor through the ``PERFKIT_CONTEXT`` environment variable (a
JSON object: ``results_path``, ``config_id``, ``params``, ``notebook``). Without it — a notebook
run by hand in JupyterLab — rows go to ``$PERFKIT_OUT`` or ``./perfkit-runs/interactive``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from . import status as _status
from .durable import write_atomic
from .errors import BadInputError, ConfigurationSkipped
from .results_files import IGNORE_MARKER, TMP_MARK, concat_to_pandas, merge_units, read_tables, result_files

if TYPE_CHECKING:
    from .env import Described

__all__ = ["RunContext", "current_context", "record", "record_ending", "skip", "load", "write_rows", "stamp", "CONTEXT_ENV", "unit_of",
           "IGNORE_MARKER"]

CONTEXT_ENV = "PERFKIT_CONTEXT"


@dataclass(kw_only=True, frozen=True)
class RunContext:
    """Where the current configuration's rows go, and what identifies them."""

    results_path: Path
    """The configuration's Parquet file."""
    config_id: str
    """Stable id of the configuration (hash of the notebook and its parameters)."""
    params: Mapping[str, object] = field(default_factory=dict)
    """Columns added to every row: the configuration's parameters (and an A/B sweep's
    ``variant``/``round`` tags)."""
    param_names: tuple[str, ...] | None = None
    """Which of ``params`` are the notebook's parameters (recorded as ``param_names``); None: all."""
    notebook: str | None = None
    """The notebook (path as given to the executor)."""
    interactive: bool = False
    """True when no executor set the context (a notebook run by hand)."""

    def to_env(self) -> str:
        return json.dumps({
            "results_path": str(self.results_path), "config_id": self.config_id,
            "params": dict(self.params), "notebook": self.notebook,
            "param_names": None if self.param_names is None else list(self.param_names),
        }, default=str)


def current_context() -> RunContext:
    """The context set by the executor, or a fresh interactive one."""
    raw = os.environ.get(CONTEXT_ENV)
    if raw:
        data = json.loads(raw)
        return RunContext(
            results_path=Path(data["results_path"]), config_id=data["config_id"],
            params=data.get("params") or {}, notebook=data.get("notebook"),
            param_names=None if data.get("param_names") is None else tuple(data["param_names"]),
        )
    return _interactive_context()


_INTERACTIVE: RunContext | None = None


def _interactive_context() -> RunContext:
    # One file per interactive session (kernel), so re-running a cell appends instead of
    # scattering files, and two kernels never write the same file.
    global _INTERACTIVE
    if _INTERACTIVE is None:
        out = Path(os.environ.get("PERFKIT_OUT", "perfkit-runs/interactive"))
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        config_id = f"interactive-{stamp}-{os.getpid()}"
        _INTERACTIVE = RunContext(
            results_path=out / "results" / f"{config_id}.parquet", config_id=config_id,
            interactive=True,
        )
        # Said once per session, where a person sees it (the notebook's output): where the rows went.
        print(f"perfkit: rows of this interactive session go to {_INTERACTIVE.results_path.resolve()} "
              f"(set PERFKIT_OUT to choose the folder; perfkit.load({str(out.resolve())!r}) reads them)")
    return _INTERACTIVE


_UNIT_SUFFIXES = (
    ("_busbw_bytes_per_s", "bytes/s"), ("_bytes_per_s", "bytes/s"), ("_flop_per_s", "FLOP/s"),
    ("_samples_per_s", "samples/s"), ("_tokens_per_s", "tokens/s"), ("_per_s", "1/s"),
    ("_samples_s", "s"), ("_s", "s"), ("_bytes", "bytes"), ("_flop", "FLOP"), ("_hz", "Hz"),
)


def unit_of(column: str) -> str | None:
    """The SI unit a column name declares (``time_s`` → ``s``), or None for unitless columns."""
    name = "_" + column
    for suffix, unit in _UNIT_SUFFIXES:
        if name.endswith(suffix):
            return unit
    return None


def _as_frame(rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows.reset_index(drop=True).copy()
    if isinstance(rows, Mapping):
        return pd.DataFrame([dict(rows)])
    rows = list(rows)
    if rows and not all(isinstance(r, Mapping) for r in rows):
        raise BadInputError("record() takes a DataFrame, a dict, or a list of dicts (one per row)")
    return pd.DataFrame(rows)


def _params_cell(value):
    # Parquet columns need one type; parameters that are containers are stored as JSON text so a
    # sweep over lists still groups and filters cleanly.
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value


def _complete(frame: pd.DataFrame, ctx: RunContext, status: str, reason: str | None,
              process: Described | None = None) -> pd.DataFrame:
    from .env import fingerprint_columns

    if status not in _status.STATUSES:
        raise BadInputError(f"status {status!r} is not one of {', '.join(_status.STATUSES)}")
    if frame.empty:
        frame = pd.DataFrame([{}])
    frame.insert(0, "config_id", ctx.config_id)
    if "status" not in frame:
        frame["status"] = status
    if "reason" not in frame:
        frame["reason"] = reason
    frame["reason"] = frame["reason"].astype("object")
    for name, value in ctx.params.items():
        if name not in frame:  # a row's own, more specific value wins
            frame[name] = _params_cell(value)
    if "param_names" not in frame:
        names = list(ctx.params) if ctx.param_names is None else list(ctx.param_names)
        frame["param_names"] = json.dumps(names)
    frame["notebook"] = ctx.notebook
    frame["recorded_at"] = pd.Timestamp.now(tz="UTC")
    env = fingerprint_columns(frame, process)  # each row's fingerprint is of the device it measured
    for col in env.columns:
        frame[col] = env[col].to_numpy()
    return frame


def write_rows(frame: pd.DataFrame, path: Path) -> None:
    """Append ``frame`` to the Parquet file at ``path`` atomically (temp file, fsync, rename).

    A crash at any moment leaves either the old file or the new one, never a partial file; a
    stray temp file is ignored by :func:`load`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        frame = pd.concat([_read_one(path), frame], ignore_index=True)
    _write_frame(frame, path)


def stamp(path: str | Path, values: Mapping[str, object]) -> None:
    """Set ``values`` (column → one value) on every row of the results file at ``path``, atomically
    as :func:`write_rows`: what the engine learns of a configuration only once its notebook ran
    (its measurement window). A missing file is left missing."""
    path = Path(path)
    if not path.exists():
        return
    frame = _read_one(path)
    for name, value in values.items():
        frame[name] = value
    _write_frame(frame, path)


def _write_frame(frame: pd.DataFrame, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    units = {c: u for c in frame.columns if (u := unit_of(str(c)))}
    meta = dict(table.schema.metadata or {})
    meta[b"perfkit.units"] = json.dumps(units).encode()
    table = table.replace_schema_metadata(meta)
    # The temp name carries TMP_MARK: load() skips a temp file a kill left behind.
    write_atomic(path, lambda fh: pq.write_table(table, fh),
                 tmp=path.with_name(f"{path.name}{TMP_MARK}{uuid.uuid4().hex[:8]}"))


def record(rows, *, status: str = _status.OK, reason: str | None = None,
           context: RunContext | None = None) -> pd.DataFrame:
    """Append ``rows`` (DataFrame, dict or list of dicts) to this configuration's results.

    ``context`` defaults to the one the executor set (or the interactive one). Returns the rows
    as written (with ``config_id``, ``status``, parameters and fingerprint).
    """
    from .results_paths import relative_to_folder, results_folder_of

    ctx = context or current_context()
    frame = _complete(_as_frame(rows), ctx, status, reason)
    write_rows(relative_to_folder(frame, results_folder_of(ctx.results_path)), ctx.results_path)
    return frame


def record_ending(ctx: RunContext, status: str, reason: str | None, *, environ: Mapping[str, str],
                  cwd: str | Path) -> pd.DataFrame:
    """The one row saying how a configuration ended, written by the process that ran it (the sweep
    engine) rather than by its kernel: fingerprinted as that kernel ran, with ``environ`` (its
    thread share and performance variables) and ``cwd`` (its git checkout), not the engine's."""
    from .env import Described

    frame = _complete(pd.DataFrame([{}]), ctx, status, reason, Described(environ=dict(environ), cwd=cwd))
    write_rows(frame, ctx.results_path)
    return frame


def skip(reason: str, *, record_row: bool = True) -> None:
    """Declare this configuration unsupported here: record a ``skipped`` row, stop the notebook.

    Use when the device cannot honour a setting (tf32 on CPU, fp8 before Hopper/MI300); the
    sweep reports it as ``skipped`` with ``reason`` rather than as a failure. ``record_row=False``
    when the notebook already recorded its ``skipped`` rows.
    """
    if not reason:
        raise BadInputError("skip() needs a reason that says what this device cannot do")
    if record_row:
        record([{}], status=_status.SKIPPED, reason=reason)
    raise ConfigurationSkipped(reason)


def _read_with_units(path: Path) -> tuple[pd.DataFrame, dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(b"perfkit.units")
    return table.to_pandas(), (json.loads(raw) if raw else {})


def _read_many(files: list[Path]) -> tuple[pd.DataFrame, dict]:
    """Read many files fast: parallel reads, one Arrow concatenation with schema promotion (files
    of different notebooks have different columns), and a single conversion to pandas — per-file
    ``to_pandas`` + ``pd.concat`` is ~10x slower at 1,000 files."""
    tables = read_tables(files)
    units = merge_units((t.schema.metadata or {}).get(b"perfkit.units") for t in tables)
    if len(tables) == 1:
        return tables[0].to_pandas(), units
    tables = [t.replace_schema_metadata(None) for t in tables if t.num_rows] or tables[:1]
    return concat_to_pandas(tables), units


def _read_one(path: Path) -> pd.DataFrame:
    return _read_with_units(path)[0]


def load(directory: str | Path, *, statuses: Iterable[str] | None = None,
         columns: Iterable[str] | None = None, filters=None) -> pd.DataFrame:
    """One DataFrame of every row under ``directory`` (recursively), optionally filtered by status.

    ``columns`` and ``filters`` are pushed down to the Parquet reader (``pyarrow.dataset``): only
    the named columns are read, and a file or row group whose statistics rule the filter out is
    not read at all, so one question over thousands of files costs a fraction of reading them whole.

    - ``columns``: the columns to return, in this order (a column that some files lack is null in
      their rows; one that no file has is an error).
    - ``filters``: the rows to keep, as pyarrow's DNF list (``[("batch_size", "==", 64),
      ("dtype", "in", ["fp32", "bf16"])]`` ANDs its tuples; a list of such lists ORs them — the
      ``filters`` of ``pyarrow.parquet.read_table``) or a ``pyarrow.compute`` expression
      (``pyarrow.dataset.field("batch_size") == 64``). Files of different notebooks have different
      columns: a row without the filtered column has null there and is not kept.
    """
    directory = Path(directory)
    if not directory.exists():
        raise BadInputError(f"results directory {str(directory)!r} does not exist")
    files = result_files(directory) if directory.is_dir() else [directory]
    if statuses is not None:
        wanted = set(statuses)
        unknown = wanted - set(_status.STATUSES)
        if unknown:
            raise BadInputError(f"unknown status {sorted(unknown)}; valid: {', '.join(_status.STATUSES)}")
    if columns is not None or filters is not None:
        from .results_scan import scan

        frame, units = scan(files, columns, filters, statuses, directory)
        from .results_paths import resolved_in_folder

        frame = resolved_in_folder(frame, directory if directory.is_dir() else directory.resolve().parent.parent)
        frame.attrs["units"] = Units(units)
        return frame
    if not files:
        frame, units = pd.DataFrame({"config_id": pd.Series(dtype="str"), "status": pd.Series(dtype="str")}), {}
    else:
        from .results_scan import read_all

        indexed = read_all(directory, files) if directory.is_dir() and len(files) > 1 else None
        frame, units = indexed or _read_many(files)
    if statuses is not None:
        frame = frame[frame["status"].isin(wanted)].reset_index(drop=True)
    from .results_paths import resolved_in_folder

    frame = resolved_in_folder(frame, directory if directory.is_dir() else directory.resolve().parent.parent)
    frame.attrs["units"] = Units(units)
    return frame


class Units(dict):
    """A results frame's column units, ``DataFrame.attrs["units"]``. pandas deep-copies ``attrs``
    into every frame an operation makes (``NDFrame.__finalize__``): with a dict of ~150 units that
    was 4.9 million ``deepcopy`` calls and a third of the time of the quickstart's report. The
    units of a loaded folder are not edited, so each derived frame shares this one."""

    def __deepcopy__(self, memo) -> "Units":
        return self
