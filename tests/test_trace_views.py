"""What a person sees of traces (issue 15, parts 3 and 4): `perfkit trace` on the reference traces
and on a real profiled 2-rank run, the report's Traces section with its links, and the plots."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfkit.analyse.trace.breakdown import breakdowns, data_wait_share, top_kernels
from perfkit.analyse.trace.diff import trace_diff
from perfkit.cli import main
from perfkit.core.errors import BadInputError
from perfkit.view import trace as tv

KEYS = ("temporal", "idle", "kernel_types", "overlap")


@pytest.fixture
def traces(reference_dir) -> Path:
    return reference_dir / "traces"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["trace", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _frame(records: list[dict], like: pd.DataFrame) -> pd.DataFrame:
    """JSON records back into a frame with ``like``'s columns and dtypes (null is NaN again)."""
    got = pd.DataFrame(records, columns=list(like.columns))
    return got.astype(like.dtypes.to_dict()) if len(got) else got


def _assert_records(records: list[dict], expected: pd.DataFrame, trace: str) -> None:
    mine = [{k: v for k, v in r.items() if k != "trace"} for r in records if r["trace"] == trace]
    assert mine and set(mine[0]) == set(expected.columns), (sorted(mine[0]) if mine else mine, list(expected.columns))
    pd.testing.assert_frame_equal(_frame(mine, expected), expected.reset_index(drop=True), check_dtype=False)


def test_json_is_one_object_of_hta_records_equal_to_the_analysis(traces, capsys):
    pair = traces / "trace_filter"
    amd = traces / "amd_mi250" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    code, out, err = _run(capsys, pair, amd, "--json")
    assert code == 0, err
    doc = json.loads(out)  # one object, strict JSON (NaN written as null)
    assert set(KEYS) | {"top_kernels", "data_wait"} <= set(doc)
    ranks = sorted(pair.glob("*.json.gz"))
    for trace, files in ((str(pair), ranks), (str(amd), [amd])):
        expected = breakdowns(files)
        for key in KEYS:
            _assert_records(doc[key], expected[key], trace)
        _assert_records(doc["top_kernels"], top_kernels(files, 10), trace)
        _assert_records(doc["data_wait"], data_wait_share(files), trace)
    overlap = [r for r in doc["overlap"] if r["trace"] == str(amd)]
    assert overlap == [{"trace": str(amd), "rank": 0, "comp_comm_overlap_pctg": None}]  # no communication


def test_text_shows_every_breakdown_with_hta_names_and_values(traces, capsys):
    pair = traces / "trace_filter"
    code, out, err = _run(capsys, pair)
    assert code == 0, err
    expected = breakdowns(sorted(pair.glob("*.json.gz")))
    for key in KEYS:
        for column in expected[key].columns:
            assert column in out, f"{key}: no column {column!r} in the text"
    for value in [*expected["temporal"]["idle_time_pctg"], *expected["overlap"]["comp_comm_overlap_pctg"]]:
        assert f" {value}" in out, value
    for title in ("Temporal breakdown", "Idle time per stream", "Kernel types", "overlap", "Top kernels", "Data wait"):
        assert title in out
    assert "ui.perfetto.dev" in out and "chrome://tracing" in out


@pytest.mark.slow  # > 5 s here: make test runs it, test-fast does not
def test_steps_and_top_reach_the_analysis(traces, capsys):
    control = traces / "trace_diff" / "control.json.gz"
    code, out, err = _run(capsys, control, "--json", "--steps", 1010, 1011, "--top", 3)
    assert code == 0, err
    doc = json.loads(out)
    expected = breakdowns(control, steps=(1010, 1011))
    for key in KEYS:
        _assert_records(doc[key], expected[key], str(control))
    assert sorted({r["step"] for r in doc["data_wait"]}) == [1010, 1011]
    _assert_records(doc["top_kernels"], top_kernels(control, 3, steps=(1010, 1011)), str(control))


@pytest.mark.slow  # > 10 s here: make test runs it, test-fast does not
def test_diff_lists_what_changed_most_added_and_removed(traces, capsys):
    control, test = traces / "trace_diff" / "control.json.gz", traces / "trace_diff" / "test.json.gz"
    expected = trace_diff(control, test, n=5)
    code, out, err = _run(capsys, "--diff", control, test, "--top", 5, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["control_steps"], doc["test_steps"], doc["device"]) == (expected.control_steps, expected.test_steps, "gpu")
    assert [r["name"] for r in doc["changed_most"]] == list(expected.changed_most["name"])
    assert [r["name"] for r in doc["added"]] == list(expected.added["name"].head(5))
    assert [r["name"] for r in doc["removed"]] == list(expected.removed["name"].head(5))
    assert (doc["added_count"], doc["removed_count"]) == (len(expected.added), len(expected.removed))
    code, out, err = _run(capsys, "--diff", control, test, "--top", 5)
    assert code == 0, err
    assert "Changed most" in out and f"Added (only in test; {len(expected.added)} in all)" in out
    assert f"Removed (only in control; {len(expected.removed)} in all)" in out
    assert expected.changed_most["name"].iloc[0][:40] in out


@pytest.fixture(scope="module")
def profiled_ddp(tmp_path_factory) -> Path:
    """A results folder of one real profiled CPU training run: 2 DDP ranks under gloo, one trace each."""
    from perfkit.core.results import CONTEXT_ENV, RunContext, record
    from perfkit.measuring.training.config import TrainConfig
    from perfkit.measuring.training.step import run_training

    out = tmp_path_factory.mktemp("profiled-ddp") / "runs"
    ctx = RunContext(results_path=out / "results" / "ddp-cfg.parquet", config_id="ddp-cfg", params={"profile": True})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CONTEXT_ENV, ctx.to_env())
        row = run_training(TrainConfig(model="mlp", batch_size=16, steps=5, warmup_steps=1, profile=True,
                                       profile_active_steps=2, parallelism="ddp", world_size=2, device="cpu"))
    assert row["status"] == "ok", row.get("error")
    record(row, context=ctx)
    return out


@pytest.mark.slow
def test_a_results_directory_is_one_trace_set_per_run_with_its_ranks(profiled_ddp, capsys):
    code, out, err = _run(capsys, profiled_ddp, "--json")
    assert code == 0, err
    doc = json.loads(out)
    [trace] = doc["traces"]
    assert [Path(f).name for f in trace["files"]] == ["rank0.json.gz", "rank1.json.gz"]
    assert Path(trace["trace"]).parent.parent == profiled_ddp / "traces"
    assert [r["rank"] for r in doc["temporal"]] == [0, 1]
    assert {r["kind"] for r in doc["top_kernels"]} == {"cpu_op"} and {r["rank"] for r in doc["top_kernels"]} == {0, 1}
    assert {r["rank"] for r in doc["data_wait"]} == {0, 1}
    code, out, err = _run(capsys, profiled_ddp)
    assert code == 0 and "no GPU activity" in out and "Top CPU operators" in out


def _one_rank_dir(tmp_path: Path, source: Path) -> Path:
    folder = tmp_path / "runs" / "traces" / "cfg" / "run-a"
    folder.mkdir(parents=True)
    shutil.copy(source, folder / "rank0.json.gz")
    return tmp_path / "runs"


@pytest.mark.parametrize("case", ["missing", "not-a-trace-name", "json-not-a-trace", "not-gzip", "empty-dir",
                                  "diff-one-path", "diff-three-paths", "diff-dir-of-two-sets", "top-0", "steps-reversed",
                                  "steps-not-in-trace"])
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, traces, capsys):
    amd = traces / "amd_mi250" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "data.json").write_text(json.dumps({"rows": [1, 2]}))
    (tmp_path / "broken.json.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    (tmp_path / "empty").mkdir()
    two_sets = _one_rank_dir(tmp_path, amd)
    (two_sets / "traces" / "cfg" / "run-b").mkdir()
    shutil.copy(amd, two_sets / "traces" / "cfg" / "run-b" / "rank0.json.gz")
    argv = {
        "missing": [tmp_path / "nope.json.gz"],
        "not-a-trace-name": [tmp_path / "notes.txt"],
        "json-not-a-trace": [tmp_path / "data.json"],
        "not-gzip": [tmp_path / "broken.json.gz"],
        "empty-dir": [tmp_path / "empty"],
        "diff-one-path": ["--diff", amd],
        "diff-three-paths": ["--diff", amd, amd, amd],
        "diff-dir-of-two-sets": ["--diff", two_sets, amd],
        "top-0": [amd, "--top", 0],
        "steps-reversed": [amd, "--steps", 5, 2],
        "steps-not-in-trace": [amd, "--steps", 90, 95],
    }[case]
    code, out, err = _run(capsys, *argv)
    assert code == 2, (code, out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("perfkit trace: error: "), err


def test_help_explains_each_breakdown_and_where_traces_open():
    perfkit = Path(sys.executable).with_name("perfkit")
    cp = subprocess.run([str(perfkit), "trace", "--help"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    text = " ".join(cp.stdout.split())
    for key, line in tv.BREAKDOWN_HELP.items():
        assert f"{key} {' '.join(line.split())}" in text, key
    assert "ui.perfetto.dev" in text and "chrome://tracing" in text


def test_the_notebook_path_says_how_to_make_a_trace(monkeypatch, tmp_path):
    monkeypatch.delenv(tv.TRACE_PATH_ENV, raising=False)
    with pytest.raises(BadInputError, match="perfkit run notebooks/train_step.ipynb --out runs/t -p profile True"):
        tv.notebook_trace_path("")
    with pytest.raises(BadInputError, match="does not exist"):
        tv.notebook_trace_path(tmp_path / "nope")
    monkeypatch.setenv(tv.TRACE_PATH_ENV, str(tmp_path))
    assert tv.notebook_trace_path("") == tmp_path


# ---- the report ------------------------------------------------------------------------------


def _link(html_text: str, href: str) -> bool:
    return f'href="{href}"' in html_text  # the page's HTML text


@pytest.mark.slow
def test_report_has_a_traces_section_linking_each_rank_file(profiled_ddp, tmp_path):
    from perfkit.core.results import load
    from perfkit.view.report_page import build_report, write_report

    page = write_report(profiled_ddp, profiled_ddp / "report.html").read_text()
    run = next((profiled_ddp / "traces" / "ddp-cfg").iterdir()).name
    for rank in (0, 1):
        assert _link(page, f"traces/ddp-cfg/{run}/rank{rank}.json.gz"), f"no relative link to rank {rank}"
    assert "open in Perfetto (ui.perfetto.dev) or chrome://tracing" in page
    # A report written elsewhere links the same files relative to itself.
    elsewhere = write_report(profiled_ddp, tmp_path / "reports" / "r.html").read_text()
    expected = Path(os.path.relpath(profiled_ddp / "traces" / "ddp-cfg" / run / "rank0.json.gz", tmp_path / "reports"))
    assert _link(elsewhere, expected.as_posix())
    assert "Traces" in build_report(load(profiled_ddp)).tags


@pytest.mark.slow
def test_a_moved_results_folder_still_finds_and_links_its_traces(profiled_ddp, tmp_path):
    from perfkit.core.results import load
    from perfkit.view.trace_report import traced_runs, traces_section

    moved = tmp_path / "copied-off-the-node"
    shutil.copytree(profiled_ddp, moved)
    rows = load(moved)
    [run] = traced_runs(rows, moved)
    assert all(p.is_relative_to(moved) and p.exists() for p in run.paths)
    parts = traces_section(rows, rows, output=moved / "report.html", results_dir=moved)
    text = "".join(p for p in parts.items if isinstance(p, str))
    assert f'href="traces/ddp-cfg/{run.run}/rank1.json.gz"' in text and "not read" not in text


@pytest.mark.slow
def test_the_section_reads_at_most_max_sets_runs_and_says_so(profiled_ddp):
    import holoviews as hv

    from perfkit.core.results import load
    from perfkit.view.trace_report import traces_section

    rows = load(profiled_ddp)
    one_rank = rows.assign(rank_trace_paths=[[rows["trace_path"].iloc[0]]], config_id="ddp-rank0-only")
    both = pd.concat([rows, one_rank], ignore_index=True)
    parts = traces_section(both, both, max_sets=1).items
    text = "".join(p for p in parts if isinstance(p, str))
    assert "first 1 of 2 traced runs" in text and "ddp-rank0-only" in text  # listed and linked, not drawn
    plots = [p for p in parts if not isinstance(p, str)]
    assert isinstance(plots[0], hv.Div) and "CPU only" in plots[0].data  # no GPU timeline to stack
    bars = hv.render(plots[1])
    assert [type(r.glyph).__name__ for r in bars.renderers] == ["HBar"]
    assert "rank 0" in bars.title.text and "CPU operators" in bars.title.text


@pytest.mark.slow
def test_no_traces_section_without_traced_rows(profiled_ddp):
    from perfkit.core.results import load
    from perfkit.view.report import sections

    rows = load(profiled_ddp).assign(trace_path=None)
    assert "Traces" not in [title for title, _ in sections(rows)]


# ---- the plots -------------------------------------------------------------------------------


def test_temporal_plot_stacks_idle_compute_non_compute_per_rank(traces):
    import holoviews as hv

    from perfkit.view.plots.trace import TEMPORAL_PARTS, temporal_plot

    temporal = breakdowns(sorted((traces / "trace_filter").glob("*.json.gz")))["temporal"].assign(trace="tf")
    fig = hv.render(temporal_plot(temporal))
    [renderer] = fig.renderers
    assert type(renderer.glyph).__name__ == "HBar"
    data = pd.DataFrame({k: list(v) for k, v in renderer.data_source.data.items()})
    for rank, row in temporal.set_index("rank").iterrows():
        bars = data[data["run"] == f"tf · rank {rank}"].set_index("part")
        assert list(bars.index) == list(TEMPORAL_PARTS)  # stacked in this order, from 0
        assert bars["bottom"].iloc[0] == 0
        np.testing.assert_allclose(bars["top"] - bars["bottom"],
                                   [row["idle_time_pctg"], row["compute_time_pctg"], row["non_compute_time_pctg"]])
    mapper = renderer.glyph.fill_color.transform
    assert dict(zip(mapper.factors, mapper.palette)) == TEMPORAL_PARTS


def test_top_kernels_plot_is_one_bar_per_kernel_longest_on_top(traces):
    import holoviews as hv

    from perfkit.view.plots.trace import top_kernels_plot

    top = top_kernels(sorted((traces / "trace_filter").glob("*.json.gz")), 5)
    fig = hv.render(top_kernels_plot(top, ranks=[1]))
    [renderer] = fig.renderers
    assert type(renderer.glyph).__name__ == "HBar"
    data = renderer.data_source.data
    expected = top[top["rank"] == 1].sort_values("total_time_s")
    np.testing.assert_allclose(list(data["share_pct"]), 100 * expected["share"].to_numpy())
    assert list(data["name"]) == list(expected["name"])
    assert list(fig.y_range.factors)[-1] == data["kernel"][-1]  # the last factor is drawn on top
    layout = hv.render(top_kernels_plot(top))
    assert len([r for child in layout.children for r in child[0].renderers]) == 2  # one chart per rank


@pytest.mark.slow
def test_traces_report_renders_in_a_real_browser_and_its_links_reach_the_files(profiled_ddp, tmp_path):
    from jupyterlab_driver import report_page

    from perfkit.view.report_page import write_report

    report = write_report(profiled_ddp, tmp_path / "out" / "report.html")  # links climb out of out/
    with report_page(report) as opened:
        page = opened.page
        walk = """(root) => Array.from(root.querySelectorAll('*')).flatMap(
            el => [...(el.tagName === 'A' ? [el.href] : []), ...(el.shadowRoot ? walk(el.shadowRoot) : [])])"""
        links = f"() => {{ const walk = {walk}; return walk(document).filter(h => h.endsWith('.json.gz')); }}"
        page.wait_for_function(f"() => ({links})().length >= 2", timeout=30_000)
        hrefs = page.evaluate(links)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(Path(os.environ.get("PERFKIT_SCREENSHOT_DIR", tmp_path)) / "traces-report.png"),
                        full_page=True)
    assert not opened.errors, opened.errors
    assert not opened.failed, opened.failed
    files = sorted(Path(h.removeprefix("file://")) for h in hrefs)
    assert [f.name for f in files] == ["rank0.json.gz", "rank1.json.gz"] and all(f.is_file() for f in files), hrefs
