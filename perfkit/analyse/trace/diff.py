"""What changed between two traces: the kernels and operators whose time moved most, and those
that appeared or disappeared (e.g. one configuration under two variants).

Each side is summarised over its analysis window (:mod:`perfkit.analyse.trace.window`: HTA's
default, all ProfilerSteps but the last, or ``steps=(a, b)``) by event name: how many times it
ran and its summed duration, **per ProfilerStep** of the window, so that two traces with a
different number of profiled steps compare fairly (a trace without ProfilerSteps counts as one
step). Each event counts once, as it ran. With one step per side the figures are HTA's
``TraceDiff.compare_traces`` counts and ``total_duration`` (``hta/trace_diff.py``, one iteration
of each trace), except for a GPU event whose correlation id several host events carry (a runtime
call and the driver call inside it), which HTA's join on correlation counts once per host event.

``device`` selects the events as HTA's ``DeviceType``: ``"gpu"`` (stream other than -1:
kernels, memcpy, memset), ``"cpu"`` (stream -1: operators, runtime calls, annotations) or
``"all"``. The host-side ``ProfilerStep#N`` spans themselves are left out (HTA counts them:
they would show as added and removed whenever step numbers differ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfkit.analyse.trace.window import RankWindow, analysis_window
from perfkit.core import checks
from perfkit.core.errors import BadInputError

__all__ = ["TraceDiff", "ops_summary", "trace_diff"]

_DEVICES = ("gpu", "cpu", "all")
_COLUMNS = ["name", "control_count_per_step", "test_count_per_step", "control_time_per_step_s",
            "test_time_per_step_s", "diff_time_per_step_s", "relative_change", "change"]


@dataclass(frozen=True)
class TraceDiff:
    """The comparison of a control and a test trace; every frame has the columns of ``table``."""

    table: pd.DataFrame
    """Every name on either side: ``name``, ``control_count_per_step``, ``test_count_per_step``,
    ``control_time_per_step_s``, ``test_time_per_step_s``, ``diff_time_per_step_s`` (test −
    control), ``relative_change`` (test / control − 1; NaN when the control time is 0) and
    ``change`` (``added``, ``removed``, ``slower``, ``faster``, ``same``), by |difference|."""
    changed_most: pd.DataFrame
    """The ``n`` names with the largest absolute time difference (added and removed included)."""
    changed_most_relative: pd.DataFrame
    """The ``n`` names on both sides with the largest |relative_change|, among those taking at least
    ``min_share`` of their side's time (so that 1 µs becoming 3 µs does not lead the list)."""
    added: pd.DataFrame
    """Names only in the test trace, by test time."""
    removed: pd.DataFrame
    """Names only in the control trace, by control time."""
    control_steps: int
    test_steps: int


def _window(trace, steps) -> RankWindow:
    windows = analysis_window(trace, steps)
    if len(windows) != 1:
        raise BadInputError(f"trace_diff compares one trace per side, got {len(windows)} ranks")
    return windows[0]


def ops_summary(trace, *, steps: tuple[int, int] | None = None, device: str = "gpu") -> pd.DataFrame:
    """Per event name of one trace's window: ``name``, ``count_per_step``, ``time_per_step_s``,
    sorted by time; ``attrs["steps"]`` holds the number of ProfilerSteps it is divided by."""
    checks.one_of("device", device, _DEVICES)
    w = _window(trace, steps)
    ev = w.ev
    rows = {"gpu": w.ran, "cpu": w.rows[ev.stream[w.rows] == -1], "all": np.unique(w.rows)}[device]
    rows = rows[~np.isin(rows, w.step_rows())]  # the steps are the window, not an operation
    n_steps = max(len(w.step_rows()), 1)
    agg = (pd.DataFrame({"name_id": ev.name_id[rows], "dur": ev.dur_us[rows] * 1e-6})
           .groupby("name_id")["dur"].agg(["count", "sum"]))
    out = pd.DataFrame({"name": [ev.names[i] for i in agg.index],
                        "count_per_step": agg["count"].to_numpy() / n_steps,
                        "time_per_step_s": agg["sum"].to_numpy() / n_steps})
    out = out.sort_values("time_per_step_s", ascending=False, ignore_index=True)
    out.attrs["steps"] = n_steps
    return out


def _change(row) -> str:
    if row.control_count_per_step == 0:
        return "added"
    if row.test_count_per_step == 0:
        return "removed"
    return "slower" if row.diff_time_per_step_s > 0 else "faster" if row.diff_time_per_step_s < 0 else "same"


def trace_diff(control, test, *, control_steps: tuple[int, int] | None = None,
               test_steps: tuple[int, int] | None = None, device: str = "gpu", n: int = 10,
               min_share: float = 0.001) -> TraceDiff:
    """Compare ``control`` and ``test`` (paths or TraceEvents of one rank each); see :class:`TraceDiff`."""
    if n < 1:
        raise BadInputError(f"trace_diff needs n >= 1, got {n}")
    a = ops_summary(control, steps=control_steps, device=device)
    b = ops_summary(test, steps=test_steps, device=device)
    table = a.merge(b, on="name", how="outer", suffixes=("_c", "_t")).fillna(0.0)
    table = pd.DataFrame({
        "name": table["name"],
        "control_count_per_step": table["count_per_step_c"], "test_count_per_step": table["count_per_step_t"],
        "control_time_per_step_s": table["time_per_step_s_c"], "test_time_per_step_s": table["time_per_step_s_t"],
    })
    table["diff_time_per_step_s"] = table["test_time_per_step_s"] - table["control_time_per_step_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["relative_change"] = (table["test_time_per_step_s"] / table["control_time_per_step_s"]
                                    .where(table["control_time_per_step_s"] > 0)) - 1
    table["change"] = [_change(r) for r in table.itertuples()] if len(table) else []
    order = table["diff_time_per_step_s"].abs().sort_values(ascending=False, kind="stable").index
    table = table.loc[order].reset_index(drop=True)[_COLUMNS]

    both = table[(table["change"] != "added") & (table["change"] != "removed")]
    big = ((both["control_time_per_step_s"] >= min_share * a["time_per_step_s"].sum())
           | (both["test_time_per_step_s"] >= min_share * b["time_per_step_s"].sum()))
    relative = both[big].reindex(both[big]["relative_change"].abs().sort_values(ascending=False).index)
    added = table[table["change"] == "added"].sort_values("test_time_per_step_s", ascending=False)
    removed = table[table["change"] == "removed"].sort_values("control_time_per_step_s", ascending=False)
    return TraceDiff(table=table, changed_most=table.head(n),
                     changed_most_relative=relative.head(n).reset_index(drop=True),
                     added=added.reset_index(drop=True), removed=removed.reset_index(drop=True),
                     control_steps=a.attrs["steps"], test_steps=b.attrs["steps"])
