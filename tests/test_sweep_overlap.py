"""The device handed on when measuring ends: view cells beside the next configuration's
measurement, measurement windows on every row and in the ledger, the sweep's busy share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import perfkit
from perfkit.core.errors import BadInputError
from perfkit.run.execute import WINDOW_COLUMNS
from perfkit.run.notebooks import read_notebook
from perfkit.run.sweep import Ledger, SweepPart, SweepSpec, run_sweep
from perfkit.run.sweep.busy import busy_share, read_summaries

VIEW = Path(__file__).parent / "notebooks" / "view_cells.ipynb"
TRIVIAL = Path(__file__).parent / "notebooks" / "trivial.ipynb"


def _spec(**grid) -> SweepSpec:
    return SweepSpec(parts=(SweepPart(notebook=VIEW, grid=grid),))


def _by_action(result, out) -> dict:
    state = Ledger(out).state()
    rows = perfkit.load(out)
    return {rows.loc[rows["config_id"] == o.config_id, "view_action"].iloc[0]: (o, state[o.config_id])
            for o in result.outcomes}


@pytest.mark.slow
def test_view_cells_run_beside_the_next_measurement_and_end_with_their_own_status(tmp_path):
    # kill, fail, none in this order on one slot: each next configuration measures while the one
    # before is still in its view cells, and how each view ended is its own status only.
    # One configuration views beside a measurement on a 2-core host: each view ends within the next one.
    spec = _spec(view_action=["kill", "fail", "none"], view_s=[0.8], measure_s=[1.2])
    result = run_sweep(spec, tmp_path, workers=1, progress=False, overlap=True, prestart=True)
    ended = _by_action(result, tmp_path)
    assert {a: o.status for a, (o, _) in ended.items()} == {"kill": "killed", "fail": "failed", "none": "ok"}
    assert ended["fail"][0].error_name == "RuntimeError" and "the plot broke" in ended["fail"][0].message
    assert all(o.released for o, _ in ended.values())
    # Overlap happened: the next configuration began measuring before the one before it ended.
    assert ended["fail"][1].window_start < ended["kill"][1].end
    assert ended["none"][1].window_start < ended["fail"][1].end
    rows = perfkit.load(tmp_path)
    measured = rows[rows["measured_s"].notna()]
    # Every configuration measured, in its own kernel, for at least its measurement's time,
    # and its window ended before its view cells did (not at its notebook's end).
    assert len(measured) == 3 and measured["pid"].nunique() == 3
    # (how soon after its view cells a window ends is asserted per configuration below, against its
    # own end: an upper bound on the window itself would time the host, 2.0-2.2 s on a loaded CI)
    assert (rows["measure_window_s"] >= 1.2).all()
    for action, (o, entry) in ended.items():
        mine = rows[rows["config_id"] == o.config_id]
        assert set(WINDOW_COLUMNS) <= set(mine.columns)
        assert mine["measure_window_start_unix_s"].iloc[0] == pytest.approx(entry.window_start)
        assert entry.window_end <= entry.end - 0.8  # 0.8 s of view cells after it
    killed = rows[rows["config_id"] == ended["kill"][0].config_id]
    assert set(killed["status"]) == {"ok", "killed"}  # its measured row kept, its ending added
    assert result.busy is not None and result.busy.overlap and 0 < result.busy.share <= 1


@pytest.mark.slow
def test_without_overlap_each_configuration_ends_before_the_next_measures(tmp_path):
    spec = _spec(view_action=["none", "fail"], view_s=[0.5], measure_s=[0.3])
    result = run_sweep(spec, tmp_path, workers=1, progress=False, overlap=False)
    ended = sorted((e for e in Ledger(tmp_path).state().values()), key=lambda e: e.window_start)
    assert ended[1].window_start > ended[0].end
    assert not result.busy.overlap and result.busy.configs == 2
    assert "not overlapped" in result.busy.line()


def test_a_notebook_without_view_cells_measures_to_its_end_and_the_sweep_says_how_busy(tmp_path):
    from perfkit.view.report_page import write_report

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(TRIVIAL), "grid": {"x": [1]}}))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(out), "--quiet",
                          "--overlap", "on"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (entry,) = Ledger(out).state().values()
    assert entry.window_start >= entry.start and entry.window_end <= entry.end
    (summary,) = read_summaries(out)
    assert summary.configs == 1 and summary.overlap is True
    assert summary.share == pytest.approx((entry.window_end - entry.window_start) / summary.wall_s)
    closing = run.stdout.strip().splitlines()[-1]
    assert closing.startswith(f"device busy {summary.share:.2f} of ") and "overlapped" in closing
    rows = perfkit.load(out)
    assert rows["measure_window_s"].iloc[0] == pytest.approx(entry.window_end - entry.window_start)
    page = write_report(out, tmp_path / "report.html").read_text()
    assert "Device busy (sweep runs)" in page and f"device busy {summary.share:.2f}" in page


def test_a_measuring_cell_after_a_view_cell_is_bad_input(tmp_path):
    nb = json.loads(VIEW.read_text())
    nb["cells"][-1]["metadata"]["tags"] = []
    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps(nb))
    with pytest.raises(BadInputError, match="follows a cell tagged 'view'"):
        read_notebook(bad)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(bad), "grid": {"view_s": [0.1]}}))
    run = subprocess.run([sys.executable, "-m", "perfkit.cli", "sweep", str(spec), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "results").exists()


def test_busy_share_is_measuring_over_wall_per_slot():
    busy = busy_share([("gpu:0", 0.0, 2.0), ("gpu:0", 2.5, 4.5), ("gpu:1", 0.0, 1.0), ("gpu:1", None, None)],
                      wall_s=5.0, overlap=True)
    assert busy.per_slot == {"gpu:0": pytest.approx(0.8), "gpu:1": pytest.approx(0.2)}
    assert busy.share == pytest.approx(0.5) and busy.configs == 3
    assert "gpu:0 0.80" in busy.line() and "overlapped" in busy.line()
    cpu = busy_share([("cpu:0/1x2", 0.0, 1.0)], wall_s=4.0, overlap=False)
    assert cpu.share == pytest.approx(0.25) and "compete for the measured cores" in cpu.line()
    assert busy_share([], wall_s=1.0, overlap=False).share is None


def test_allocations_busy_share_is_measuring_over_held_not_over_the_queue(tmp_path):
    """Slurm/Ray: Σ windows ÷ Σ allocations, the sweep's wall (queue wait) printed but not divided by;
    an allocation that never measured still counts as held."""
    from perfkit.run.sweep.busy import allocation_share, append_summary

    busy = allocation_share([("7_0", 4.0, 10.0, 13.0), ("7_1", 6.0, 20.0, 21.5), ("7_2", 2.0, None, None),
                             ("7_3", None, None, None)], wall_s=100.0, executor="Slurm", held_from="sacct")
    assert busy.share == pytest.approx((3.0 + 1.5) / 12.0) and busy.configs == 2
    assert busy.per_slot == {"7_0": pytest.approx(0.75), "7_1": pytest.approx(0.25), "7_2": 0.0}
    line = busy.line()
    assert line.startswith("device busy 0.38 of 3 Slurm allocations' 12.0 s held (sacct): 4.5 s measuring")
    assert "lowest 0.00, highest 0.75" in line and "100.0 s wall includes queue wait, not counted" in line
    append_summary(tmp_path, busy)
    (back,) = read_summaries(tmp_path)
    assert (back.held_s, back.executor, back.share) == (busy.held_s, "Slurm", pytest.approx(busy.share))


@pytest.mark.slow
def test_a_prestarted_kernel_runs_its_configurations_warm_up_before_it_measures(tmp_path):
    # The notebook's metadata perfkit.warm: called in the prestarted kernel with the configuration's
    # parameters, so what it imports (torch._dynamo here, which torch.optim would import at the first
    # optimizer) is done before the measurement window opens.
    nb = json.loads(VIEW.read_text())
    nb["metadata"]["perfkit"] = {"warm": "perfkit.measuring.workloads.catalog:warm_imports"}
    nb["cells"][3]["source"] = ("import sys\nwarmed = 'torch._dynamo' in sys.modules\n"
                                "perfkit.record([{'warmed': warmed}])")
    warm = tmp_path / "warm.ipynb"
    warm.write_text(json.dumps(nb))
    spec = SweepSpec(parts=(SweepPart(notebook=warm, grid={"view_s": [0.0, 0.1]}),))
    for prestart in (True, False):
        out = tmp_path / f"prestart-{prestart}"
        result = run_sweep(spec, out, workers=1, progress=False, prestart=prestart)
        assert {o.status for o in result.outcomes} == {"ok"}
        assert perfkit.load(out)["warmed"].tolist() == [prestart, prestart]
