"""``perfkit export DIR --to mlflow``: a results folder as MLflow runs, next to training runs.

One parent run per results folder (a sweep's ``--out``) and, nested under it, one run per
configuration (:mod:`.export_rows`):

- **params**: the configuration's parameters (the columns its rows' ``param_names`` lists; an A/B
  sweep's ``variant`` and ``round``), as text;
- **metrics**: its numeric columns under their own names, so the unit stays in the name
  (``step_time_s``, ``tokens_per_s``, ``peak_mem_bytes``); a configuration with several rows (a
  GEMM notebook's sizes) logs each column as a series, step = the row's position;
- **tags**: the environment fingerprint (``env_*``), ``perfkit.status`` and ``perfkit.reason``
  (failed, oom, timeout and killed configurations are exported too; the run's MLflow status is
  ``FAILED``, or ``KILLED`` for timeout/killed), ``perfkit.config_id``;
- **artifacts**: the executed notebook (``notebook/``), the configuration's Parquet file
  (``results/``) and any profiler trace its rows point to (``traces/``).

Idempotent: runs are found again by their tags (``perfkit.results_key``, a hash of the folder's
absolute path, and ``perfkit.config_id``), so exporting twice adds no run; a configuration whose
Parquet bytes changed since (a retried sweep) gets a fresh run in place of its old one (deleted:
MLflow cannot take back a metric value already logged at a step), the others are left as they are.

The default tracking URI is a SQLite store under the folder (``DIR/mlflow/mlflow.db``, artifacts
in ``DIR/mlflow/artifacts``): it works with nothing running, and ``mlflow ui --backend-store-uri
sqlite:///DIR/mlflow/mlflow.db`` shows it. Any tracking URI MLflow accepts (``http://host:5000``,
``databricks``, a database) works the same. MLflow's own file store (``./mlruns``, ``file://``)
is in maintenance mode since MLflow 3.7 (mlflow/mlflow#18534), hence SQLite: MLflow refuses it
unless ``MLFLOW_ALLOW_FILE_STORE=true`` opts in (``mlflow/store/tracking/file_store.py``), so such
a URI is refused here first, in one line naming the ways out (:func:`_file_store_refused`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import status as st
from ..core.errors import BadInputError, PerfkitError
from ..core.results_files import IGNORE_MARKER
from .export_rows import Configuration, configurations, counts

__all__ = ["export_mlflow", "default_tracking_uri", "require_mlflow", "MlflowExport",
           "TAG_CONFIG", "TAG_KEY", "TAG_ROLE", "TAG_STATUS", "TAG_REASON"]

TAG_CONFIG, TAG_KEY, TAG_ROLE = "perfkit.config_id", "perfkit.results_key", "perfkit.role"
TAG_STATUS, TAG_REASON, TAG_DIGEST = "perfkit.status", "perfkit.reason", "perfkit.digest"
_RUN_STATUS = {st.OK: "FINISHED", st.SKIPPED: "FINISHED", st.FAILED: "FAILED", st.OOM: "FAILED",
               st.TIMEOUT: "KILLED", st.KILLED: "KILLED"}
# MLflow's limits (mlflow/utils/validation.py): values past them are refused, so they are cut.
_MAX_PARAM, _MAX_TAG, _PER_BATCH = 6000, 8000, 100


def require_mlflow() -> None:
    """Raise :class:`BadInputError` naming the extra when MLflow is not installed."""
    if importlib.util.find_spec("mlflow") is None:
        raise BadInputError("exporting to MLflow needs the mlflow extra: pip install 'perfkit[mlflow]'")


def default_tracking_uri(directory: str | Path) -> str:
    """The local store under a results folder: ``sqlite:///DIR/mlflow/mlflow.db``."""
    return f"sqlite:///{(Path(directory) / 'mlflow' / 'mlflow.db').resolve()}"


@dataclass(frozen=True)
class MlflowExport:
    """What an export did."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    runs: dict[str, str]
    """config_id → MLflow run id."""
    created: int
    updated: int
    unchanged: int


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " …(truncated)"


def _results_key(directory: Path) -> str:
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]


def _artifact_root(uri: str, experiment: str) -> str | None:
    # A SQLite store keeps its artifacts beside the database (MLflow's default would be ./mlruns
    # under whatever folder the command ran in); a server decides for itself.
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        return (db.parent / "artifacts" / experiment.replace("/", "_")).as_uri()
    return None


def export_mlflow(directory: str | Path, *, tracking_uri: str | None = None,
                  experiment: str = "perfkit") -> MlflowExport:
    """Export every configuration under ``directory`` to MLflow (see the module docstring)."""
    directory = Path(directory)
    configs = configurations(directory)  # bad input is refused before MLflow is touched
    require_mlflow()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not experiment:
        raise BadInputError("--experiment needs a name")
    uri = tracking_uri or default_tracking_uri(directory)
    _file_store_refused(uri)
    _reachable(uri)
    if uri.startswith("sqlite:///"):  # its artifacts (copies of the Parquet files) are not results
        artifacts = Path(uri[len("sqlite:///"):]).resolve().parent / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / IGNORE_MARKER).touch()
    try:
        client = MlflowClient(tracking_uri=uri)
    except MlflowException as exc:  # a URI MLflow opens no store for (an unknown scheme)
        raise BadInputError(f"--tracking-uri {uri}: {str(exc).strip().splitlines()[0]}") from None
    try:
        return _export(client, uri, directory, configs, experiment)
    except MlflowException as exc:
        raise PerfkitError(f"MLflow at {uri}: {str(exc).splitlines()[0]}") from exc


def _file_store_refused(uri: str) -> None:
    """BadInputError where ``uri`` is a file store this MLflow refuses, as MLflow decides both: a
    URI without a scheme or ``file:`` (``mlflow.utils.uri.get_uri_scheme``), and its opt-in."""
    from mlflow.utils.uri import get_uri_scheme

    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow before the file store's maintenance mode (3.7) takes it
        return
    if get_uri_scheme(uri) not in ("", "file") or MLFLOW_ALLOW_FILE_STORE.get():
        return
    import mlflow

    raise BadInputError(
        f"--tracking-uri {uri} is an MLflow file store, which MLflow {mlflow.__version__} refuses (maintenance "
        "mode since 3.7): use a database, e.g. the default (no --tracking-uri: sqlite:///DIR/mlflow/mlflow.db) "
        "or --tracking-uri sqlite:///PATH/mlflow.db (`mlflow migrate-filestore --source ./mlruns --target "
        "sqlite:///PATH/mlflow.db` moves existing runs there), a tracking server (mlflow server; --tracking-uri "
        "http://host:5000), or MLflow's own opt-in for file stores: MLFLOW_ALLOW_FILE_STORE=true")


def _reachable(uri: str) -> None:
    # MLflow's client retries a refused connection with backoff for minutes; say it at once.
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10).close()
    except urllib.error.HTTPError:
        return  # something answers (a proxy asking for credentials, an older server): MLflow will tell
    except (OSError, ValueError) as exc:
        raise BadInputError(f"no MLflow tracking server answers at {uri} ({getattr(exc, 'reason', exc)}): "
                            "start one (mlflow server) or check --tracking-uri") from None


def _experiment_id(client, uri: str, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, artifact_location=_artifact_root(uri, name))
    if found.lifecycle_stage != "active":
        raise BadInputError(f"MLflow experiment {name!r} is deleted at {uri}: restore it "
                            "(mlflow experiments restore) or pass another --experiment")
    return found.experiment_id


def _existing(client, experiment_id: str, key: str) -> list:
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_KEY}` = '{key}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _export(client, uri: str, directory: Path, configs: list[Configuration], experiment: str) -> MlflowExport:
    experiment_id = _experiment_id(client, uri, experiment)
    key = _results_key(directory)
    found = _existing(client, experiment_id, key)
    parents = [r for r in found if r.data.tags.get(TAG_ROLE) == "sweep"]
    by_config = {r.data.tags.get(TAG_CONFIG): r for r in found if r.data.tags.get(TAG_ROLE) == "configuration"}
    starts = [c.start_ms for c in configs if c.start_ms is not None]
    ends = [c.end_ms for c in configs if c.end_ms is not None]
    where = {TAG_KEY: key, "perfkit.results_dir": str(directory.resolve())}
    if parents:
        parent_id = parents[0].info.run_id
    else:
        parent_id = client.create_run(experiment_id, start_time=min(starts, default=None), run_name=directory.name,
                                      tags={**where, TAG_ROLE: "sweep"}).info.run_id
    tally = counts(configs)
    _log(client, parent_id, tags={"perfkit.configurations": str(len(configs)),
                                  "perfkit.status_counts": json.dumps(tally, sort_keys=True)})
    runs: dict[str, str] = {}
    created = updated = unchanged = 0
    for c in configs:
        old = by_config.get(c.config_id)
        if old is not None and old.data.tags.get(TAG_DIGEST) == c.digest:
            runs[c.config_id] = old.info.run_id
            unchanged += 1
            continue
        tags = {**where, TAG_ROLE: "configuration", TAG_CONFIG: c.config_id, TAG_STATUS: c.status,
                TAG_DIGEST: c.digest, "mlflow.parentRunId": parent_id, **c.fingerprint}
        if c.reason:
            tags[TAG_REASON] = c.reason
        if "notebook" in c.rows and c.rows["notebook"].notna().any():
            tags["mlflow.source.name"] = str(c.rows["notebook"].dropna().iloc[0])
        if old is not None:  # its rows changed: a fresh run, so no metric keeps the old values' steps
            client.delete_run(old.info.run_id)
        run_id = client.create_run(experiment_id, start_time=c.start_ms, run_name=c.name,
                                   tags={k: _cut(v, _MAX_TAG) for k, v in tags.items()}).info.run_id
        created, updated = created + (old is None), updated + (old is not None)
        _log(client, run_id, params=c.params, metrics=c.metrics, timestamp=c.end_ms)  # tags: set at creation
        _artifacts(client, run_id, c, directory)
        client.set_terminated(run_id, status=_RUN_STATUS.get(c.status, "FAILED"), end_time=c.end_ms)
        runs[c.config_id] = run_id
    ending = "FINISHED" if all(c.status in (st.OK, st.SKIPPED) for c in configs) else "FAILED"
    client.set_terminated(parent_id, status=ending, end_time=max(ends, default=None))
    return MlflowExport(tracking_uri=uri, experiment_id=experiment_id, parent_run_id=parent_id, runs=runs,
                        created=created, updated=updated, unchanged=unchanged)


def _log(client, run_id: str, *, params=None, tags=None, metrics=None, timestamp=None) -> None:
    from mlflow.entities import Metric, Param, RunTag

    stamp = timestamp or int(time.time() * 1000)
    p = [Param(k, _cut(v, _MAX_PARAM)) for k, v in (params or {}).items()]
    t = [RunTag(k, _cut(v, _MAX_TAG)) for k, v in (tags or {}).items()]
    m = [Metric(k, v, stamp, step) for k, series in (metrics or {}).items() for step, v in series]
    while p or t or m:  # MLflow takes at most 100 params + tags and 1000 entities per batch
        bp, p = p[:_PER_BATCH], p[_PER_BATCH:]
        bt, t = t[:_PER_BATCH - len(bp)], t[_PER_BATCH - len(bp):]
        room = 1000 - len(bp) - len(bt)
        bm, m = m[:room], m[room:]
        client.log_batch(run_id, metrics=bm, params=bp, tags=bt)


def _artifacts(client, run_id: str, c: Configuration, directory: Path) -> None:
    if c.notebook is not None:
        client.log_artifact(run_id, str(c.notebook), artifact_path="notebook")
    for path in c.files:
        client.log_artifact(run_id, str(path), artifact_path="results")
    if not c.files:  # rows kept under another file name: write this configuration's own
        import tempfile

        from ..core.results import write_rows

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{c.config_id}.parquet"
            write_rows(c.rows, path)
            client.log_artifact(run_id, str(path), artifact_path="results")
    for path in c.traces:  # DIR/traces/<config_id>/<run>/rank<r>.json.gz → traces/<run>/
        try:
            inner = path.resolve().relative_to((directory / "traces" / c.config_id).resolve()).parent.parts
        except ValueError:
            inner = ()
        client.log_artifact(run_id, str(path), artifact_path="/".join(("traces", *inner)))
