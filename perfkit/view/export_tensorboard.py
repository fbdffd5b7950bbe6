"""``perfkit export DIR --to tensorboard LOGDIR``: configurations side by side in TensorBoard.

One run directory per configuration, ``LOGDIR/<swept parameters>,<config_id>`` (for example
``sizes=64_96,gemm-1ddea0d38ff3``), holding:

- scalars: each numeric column of its rows under its own name (units stay in the name), one step
  per row in the order they were recorded (one row: step 0);
- the HParams plugin's session summaries: its parameters (numbers stay numbers, so the HParams
  view sorts and plots them) and its ``status`` as hyperparameters, ``trial_id`` = the config id,
  and the session's end (success for ``ok``/``skipped``, failure otherwise).

No experiment summary is written at the top of LOGDIR: TensorBoard's HParams plugin then builds
the experiment from the runs it finds (``backend_context._compute_experiment_from_runs``), every
hyperparameter seen and every scalar as a metric — so several results folders exported into one
LOGDIR compare in one table. Writing runs under its own directory per configuration, rather than
``torch.utils.tensorboard.SummaryWriter.add_hparams`` (which writes the hparams into a new
``<time.time()>`` subdirectory beside the scalars, pytorch/pytorch#32651), keeps scalars and
hparams in one run. Events are written with TensorBoard's own ``EventFileWriter`` and the HParams
plugin's ``summary_v2.hparams_pb``: neither TensorFlow nor torch is needed.

Idempotent: this exporter's event files end in ``.perfkit``; exporting again replaces them.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import status as st
from ..core.errors import BadInputError
from .export_rows import Configuration, configurations

__all__ = ["export_tensorboard", "require_tensorboard", "TensorBoardExport", "SUFFIX"]

SUFFIX = ".perfkit"


def require_tensorboard() -> None:
    """Raise :class:`BadInputError` naming the extra when TensorBoard is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise BadInputError("exporting to TensorBoard needs the tensorboard extra: pip install 'perfkit[tensorboard]'")


@dataclass(frozen=True)
class TensorBoardExport:
    """What an export wrote."""

    logdir: Path
    runs: dict[str, Path]
    """config_id → its run directory."""


def _hparam_value(c: Configuration, name: str):
    """The parameter as the HParams plugin takes it: bool, int, float or text."""
    present = c.rows[name].dropna() if name in c.rows else ()
    value = present.iloc[0] if len(present) else c.params[name]
    if hasattr(value, "item"):
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else c.params[name]


def _stale(logdir: Path) -> dict[str, list[Path]]:
    # A run directory is named ``[<swept>,]<config_id>``; which parameters are swept can change
    # when the folder grows, so earlier exports are found by the id at the end of the name.
    found: dict[str, list[Path]] = {}
    if logdir.is_dir():
        for child in logdir.iterdir():
            if child.is_dir() and any(child.glob(f"events.out.tfevents.*{SUFFIX}")):
                found.setdefault(child.name.rsplit(",", 1)[-1], []).append(child)
    return found


def export_tensorboard(directory: str | Path, logdir: str | Path) -> TensorBoardExport:
    """Write every configuration under ``directory`` as a TensorBoard run under ``logdir``."""
    directory, logdir = Path(directory), Path(logdir)
    if logdir.exists() and not logdir.is_dir():
        raise BadInputError(f"LOGDIR {str(logdir)!r} is a file: pass a folder for the TensorBoard runs")
    configs = configurations(directory)
    require_tensorboard()
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    stale = _stale(logdir)
    runs: dict[str, Path] = {}
    for c in configs:
        for old in stale.get(c.config_id, []):
            for f in old.glob(f"events.out.tfevents.*{SUFFIX}"):
                f.unlink()
            if old.name != c.slug and not any(old.iterdir()):
                old.rmdir()
        run_dir = logdir / c.slug
        run_dir.mkdir(parents=True, exist_ok=True)
        start_s = (c.start_ms or time.time() * 1000) / 1000
        end_s = (c.end_ms or start_s * 1000) / 1000
        hparams = {name: _hparam_value(c, name) for name in c.params}
        hparams["status"] = c.status
        writer = EventFileWriter(str(run_dir), filename_suffix=SUFFIX)
        try:
            writer.add_event(Event(wall_time=start_s, step=0,
                                   summary=hp.hparams_pb(hparams, trial_id=c.config_id, start_time_secs=start_s)))
            for tag, series in c.metrics.items():
                for step, value in series:
                    writer.add_event(Event(wall_time=end_s, step=step,
                                           summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
            ended = plugin_data_pb2.SessionEndInfo(
                status=api_pb2.STATUS_SUCCESS if c.status in (st.OK, st.SKIPPED) else api_pb2.STATUS_FAILURE,
                end_time_secs=end_s)
            content = plugin_data_pb2.HParamsPluginData(session_end_info=ended)
            writer.add_event(Event(wall_time=end_s, step=0, summary=Summary(value=[Summary.Value(
                tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(content),
                tensor=metadata.NULL_TENSOR)])))
        finally:
            writer.close()
        runs[c.config_id] = run_dir
    return TensorBoardExport(logdir=logdir, runs=runs)
