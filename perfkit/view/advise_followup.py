"""The experiment that tests a piece of advice, and its verdict (``perfkit advise --spec/--verify``).

A finding with an :class:`~perfkit.analyse.advice.Experiment` becomes an A/B sweep spec: the
configuration exactly as it ran (its notebook and parameters, read from the executed notebook's
papermill metadata in ``DIR/notebooks/<config_id>.ipynb``), under two variants, ``current`` (the
setting it had) and ``advised`` (the proposed one), interleaved over ``rounds``. ``--verify`` runs
it into ``DIR/advice/<n>/`` (a ``.perfkit-ignore`` marker keeps those rows out of DIR's own
report and queries) and judges it with ``perfkit compare DIR/advice/<n> --by variant --base
current`` on the metric of the configuration's workload. Advice that did not help is reported
as such: the verdict is whatever the measurement says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..analyse.advice import Finding
from ..core.errors import BadInputError

if TYPE_CHECKING:
    from ..run.sweep.executors import Executor

__all__ = ["BASE", "ADVISED", "experiments", "spec_for", "write_specs", "speedup", "judged_point", "Verification",
           "verify"]

BASE, ADVISED = "current", "advised"


def _source(directory: Path, config_id: str) -> tuple[str, dict]:
    """The notebook and parameters a configuration ran with (papermill's metadata of its executed
    notebook)."""
    executed = directory / "notebooks" / f"{config_id}.ipynb"
    try:
        meta = json.loads(executed.read_text(encoding="utf-8"))["metadata"]["papermill"]
        notebook, params = meta["input_path"], dict(meta.get("parameters") or {})
    except (OSError, ValueError, KeyError) as e:
        raise BadInputError(f"{config_id}: its executed notebook {executed} is missing or has no papermill "
                            f"metadata ({type(e).__name__}), so the experiment cannot re-run it as it ran") from e
    # `perfkit run` keeps the path as it was typed: a relative one is read from here, as it ran.
    path = Path(notebook).expanduser().resolve()
    if not path.is_file():
        raise BadInputError(f"{config_id} ran {notebook}, which is not at {path} (run perfkit advise from where "
                            f"the configuration ran, or restore the notebook): the experiment runs it again")
    return str(path), params


def experiments(findings: list[Finding], top: int) -> list[Finding]:
    """The ``top`` findings that carry an experiment, by the share of time they cost (robust first)."""
    testable = [f for f in findings if f.experiment is not None and f.experiment.proposed is not None]
    testable.sort(key=lambda f: (not f.robust, -(f.cost_share if f.cost_share == f.cost_share else -1)))
    return testable[:top]


def _shaped(recorded, value):
    """A value in the shape the configuration recorded it: a list parameter stays a list."""
    return [value] if isinstance(recorded, list) else value


def spec_for(finding: Finding, directory: Path, *, rounds: int) -> dict:
    """The A/B sweep spec of one finding's experiment (a plain dict, YAML-ready)."""
    e = finding.experiment
    config_id = finding.config_ids[0]
    notebook, params = _source(directory, config_id)
    if e.notebook and Path(e.notebook).name != Path(notebook).name:
        # The experiment runs in another notebook (a roofline's fusion advice is timed by the
        # training step): that notebook's defaults, narrowed to the finding's model and shapes.
        notebook, params = str(Path(notebook).with_name(Path(e.notebook).name)), dict(e.narrow)
        if not Path(notebook).is_file():
            raise BadInputError(f"{config_id}: its experiment runs {e.notebook}, which is not beside the "
                                f"notebook it ran ({notebook})")
    else:
        params = {**params, **e.narrow}
    ranks = [params.get("world_size") or 1, *(params.get("world_sizes") or [])]
    devices = max(int(r) for r in ranks)  # a multi-rank configuration holds one device (core) per rank
    variants = [{"name": BASE}, {"name": ADVISED}]
    if e.parameter:
        recorded = params.get(e.parameter)
        variants[0]["parameters"] = {e.parameter: _shaped(recorded, e.current)}
        variants[1]["parameters"] = {e.parameter: _shaped(recorded, e.proposed),
                                     **{k: _shaped(params.get(k), v) for k, v in e.also.items()}}
    else:
        variants[0]["env"] = {e.env: str(e.current)} if e.current is not None else {}
        variants[1]["env"] = {e.env: str(e.proposed)}
    spec = {"name": f"advice-{finding.rule}-{config_id}", "notebook": notebook, "parameters": params,
            "variants": variants, "rounds": rounds}
    if devices > 1:
        spec["devices_per_config"] = devices
    return spec


def judged_point(points, metric: str | None):
    """The compared point a verdict stands on: of the experiment's metric (where it names one), the
    step's (a roofline configuration compares every op and its ``<step>``), else the one with the
    most samples. Not the first: compare lists the slowest first, which judged an advice by its
    worst op (issue 44)."""
    mine = points[points["metric"] == metric] if metric is not None and (points["metric"] == metric).any() else points
    step = mine[mine["point"].astype(str).str.contains("<step>", regex=False)]
    if len(step):
        return step.iloc[0]
    return mine.loc[(mine["n_base"].astype(float) + mine["n_new"].astype(float)).idxmax()]


def _header(finding: Finding) -> str:
    e = finding.experiment
    return (f"# perfkit advise: {finding.constraint} in {finding.point}\n# {finding.summary}\n"
            f"# advised: {e.parameter or e.env} {e.current!r} -> {e.proposed!r} ({finding.advice})\n"
            f"# rule {finding.rule}: {finding.source}\n")


def _write_spec(path: Path, finding: Finding, directory: Path, rounds: int) -> None:
    path.write_text(_header(finding) + yaml.safe_dump(spec_for(finding, directory, rounds=rounds), sort_keys=False),
                    encoding="utf-8")


def write_specs(findings: list[Finding], directory: Path, out: Path, *, top: int, rounds: int) -> list[Path]:
    """One spec file per experiment: ``out`` for the first, ``out``'s stem + ``-2``... after it."""
    chosen = experiments(findings, top)
    if not chosen:
        raise BadInputError("no finding here has an experiment to test (perfkit advise DIR lists what was found)")
    paths = []
    for n, f in enumerate(chosen, 1):
        path = out if n == 1 else out.with_name(f"{out.stem}-{n}{out.suffix}")
        _write_spec(path, f, directory, rounds)
        paths.append(path)
    return paths


@dataclass(frozen=True)
class Verification:
    """One experiment run and judged."""

    finding: Finding
    folder: Path
    verdict: str
    """``perfkit compare``'s: faster, slower, same or inconclusive (``failed``: it did not run)."""
    speedup: float
    """How many times as fast the advised side ran (its metric's median), with its 95 % interval."""
    speedup_ci_low: float
    speedup_ci_high: float
    metric: str | None
    text: str


def speedup(ratio: float, lo: float, hi: float, lower_is_better: bool) -> tuple[float, float, float]:
    """compare's ratio (advised/current of the metric) as a speed-up with its interval: above 1 is
    faster (a time's ratio inverts, a rate's does not)."""
    return (1 / ratio, 1 / hi, 1 / lo) if lower_is_better else (ratio, lo, hi)


def _line(f: Finding, verdict: str, speed: tuple[float, float, float], metric: str | None) -> str:
    e = f.experiment
    what = f"advised: {e.parameter or e.env} {e.current!r} -> {e.proposed!r}" + "".join(
        f", with {k} {v!r}" for k, v in e.also.items())
    if verdict == "failed":
        return f"{what}; the experiment did not run to the end (see its folder): no verdict"
    x, lo, hi = speed
    told = f"measured {x:.2f}x as fast ({metric}, 95 % CI {lo:.2f}-{hi:.2f}x)"
    helped = {"faster": "it helped", "slower": "it made it slower", "same": "no measurable change",
              "inconclusive": "the measurement cannot tell"}[verdict]
    return f"{what}; {told}: {verdict} — {helped}"


def verify(findings: list[Finding], directory: Path, *, top: int, rounds: int, progress: bool = False,
           executor: Executor | None = None) -> list[Verification]:
    """Run each chosen experiment into ``directory/advice/<n>/`` (resumable: a second call runs
    only what is missing) and judge it with ``perfkit compare --by variant --base current``.
    ``executor``: where it runs (default: this node, one configuration at a time)."""
    from ..analyse.compare import compare_by
    from ..core.results import IGNORE_MARKER
    from ..run.sweep import load_spec
    from ..run.sweep.executors import Executor
    from .compare import load_rows

    chosen = experiments(findings, top)
    root = directory / "advice"
    root.mkdir(exist_ok=True)
    (root / IGNORE_MARKER).touch()  # the experiments' rows are not the folder's own
    done = []
    for n, f in enumerate(chosen, 1):
        folder = root / str(n)
        folder.mkdir(exist_ok=True)
        spec_path = folder / "spec.yaml"
        _write_spec(spec_path, f, directory, rounds)
        spec = load_spec(spec_path)
        result = (executor or Executor()).run(spec, folder, progress=progress)
        rows = load_rows(folder)
        ok_sides = set(rows.loc[rows["status"] == "ok", "variant"].dropna())
        if result.exit_code != 0 or ok_sides != {BASE, ADVISED}:
            nan = float("nan")
            done.append(Verification(f, folder, "failed", nan, nan, nan, None, _line(f, "failed", (nan,) * 3, None)))
            continue
        points = compare_by(rows, by="variant", base=BASE, metric=f.experiment.metric).points
        point = judged_point(points, f.experiment.metric)
        speed = speedup(float(point["ratio"]), float(point["ci_low"]), float(point["ci_high"]),
                        bool(point["lower_is_better"]))
        text = _line(f, str(point["verdict"]), speed, str(point["metric"]))
        if len(points) > 1:
            text += f" (judged on {point['point']}, 1 of {len(points)} points compared)"
        v = Verification(f, folder, str(point["verdict"]), *speed, str(point["metric"]), text)
        # What the report's Advice section shows beside the advice (view/advice_report.py).
        (folder / "verdict.json").write_text(json.dumps(
            {"config_id": f.config_ids[0], "rule": f.rule, "verdict": v.verdict, "speedup": v.speedup,
             "speedup_ci_low": v.speedup_ci_low, "speedup_ci_high": v.speedup_ci_high, "metric": v.metric,
             "text": v.text}, indent=2) + "\n", encoding="utf-8")
        done.append(v)
    return done
