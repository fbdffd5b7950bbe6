"""``perfkit sweep`` and ``perfkit new``."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ...core.errors import BadInputError

__all__ = ["add_sweep_commands", "add_executor_arguments", "slurm_options", "ray_options", "TEMPLATES"]

TEMPLATES = Path(__file__).resolve().parents[3] / "templates"

_SWEEP_HELP = """\
Run NOTEBOOK once per configuration of SPEC's grid, headlessly with papermill, into DIR:
DIR/notebooks/<config_id>.ipynb (executed, error banner included), DIR/results/<config_id>.parquet
(rows, one file per configuration) and DIR/ledger/*.jsonl (what ran, how it ended, why; one file
per writing process, merged when read).

Running the same spec into the same DIR again resumes: configurations that ended ok, skipped or
oom are not run again; interrupted ones (never ended, or killed) are; failed and timeout ones
only with --retry-failed. Exit codes: 0 every configuration ok or skipped, 1 any other ending,
2 bad input (nothing runs).

A/B sweeps: a spec's `variants:` (each a name with a `python` interpreter, `env` variables and/or
fixed `parameters`) runs every configuration under every variant, interleaved (A B, then B A in
the next of `rounds:` rounds) so drift hits both sides alike; rows carry `variant` and `round`.
Each variant's interpreter is run once before anything else (it must import perfkit and
ipykernel). Compare the sides with `perfkit compare DIR --by variant --base NAME`.
"""


_SLURM_FLAGS = ("--partition", "--time-limit-min", "--cpus-per-task", "--gpus-per-task", "--array-parallelism",
                "--sbatch-option")


_RAY_FLAGS = ("--ray-address", "--ray-cpus-per-config")


def add_executor_arguments(p) -> None:
    """``--executor`` and the Slurm and Ray settings, as ``perfkit sweep`` and ``perfkit advise --verify`` take them."""
    p.add_argument("--executor", choices=("local", "slurm", "ray"), default="local",
                   help="local: this node's devices; slurm: a job array through submitit (perfkit[slurm]); "
                        "ray: one Ray task per configuration on a running Ray cluster (perfkit[ray])")
    g = p.add_argument_group("--executor slurm (override the spec's slurm: settings)")
    g.add_argument("--partition", help="Slurm partition of the job array")
    g.add_argument("--time-limit-min", type=int,
                   help="time limit of each task, whole minutes (default: the spec's timeout_s + 1 min, or 60)")
    g.add_argument("--cpus-per-task", type=int, help="CPUs of each task (sets OMP_NUM_THREADS in its kernel)")
    g.add_argument("--gpus-per-task", type=int, help="GPUs of each task")
    g.add_argument("--array-parallelism", type=int, help="tasks of the array running at once")
    g.add_argument("--sbatch-option", action="append", metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. account=myproj (repeatable)")
    g = p.add_argument_group("--executor ray (override the spec's ray: settings)")
    g.add_argument("--ray-address", help="the cluster's head, HOST:PORT (its GCS port, 6379 by default; default: "
                                         "RAY_ADDRESS), or 'local' for a Ray started in this process")
    g.add_argument("--ray-cpus-per-config", type=float,
                   help="CPUs each configuration's task asks for (its kernel's threads; default 1); GPUs: the "
                        "spec's devices_per_config on a cluster that has GPUs")


def executor_from_args(args):
    """The :class:`~perfkit.run.sweep.executors.Executor` that :func:`add_executor_arguments`' flags
    (and ``--workers``/``--prestart`` where the command has them) name; a flag of another executor
    is bad input."""
    from .executors import Executor

    slurm, ray = slurm_options(args), ray_options(args)
    if slurm is not None or ray is not None:
        return Executor(args.executor, slurm if slurm is not None else ray)
    choice = {"auto": None, "on": True, "off": False}
    return Executor("local", workers=getattr(args, "workers", 1), prestart=choice[getattr(args, "prestart", "auto")],
                    overlap=choice[getattr(args, "overlap", "auto")])


def ray_options(args) -> dict | None:
    """The Ray executor's keyword arguments from the ``--ray-*`` flags; None for another executor
    (where a Ray flag is bad input)."""
    if _refuse_flags_of("ray", _RAY_FLAGS, args):
        return None
    return {"address": args.ray_address, "cpus_per_config": args.ray_cpus_per_config}


def _refuse_flags_of(executor: str, flags: tuple[str, ...], args) -> bool:
    """True when ``executor`` is not the one chosen; its flags given anyway are bad input."""
    if args.executor == executor:
        return False
    given = [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_")) is not None]
    if given:
        raise BadInputError(f"{', '.join(given)} only apply with --executor {executor}")
    return True


def slurm_options(args) -> dict | None:
    """The Slurm executor's keyword arguments from :func:`add_executor_arguments`' flags; None for
    the local executor (where a Slurm flag is bad input)."""
    if _refuse_flags_of("slurm", _SLURM_FLAGS, args):
        return None
    from .slurm_settings import parse_sbatch_options

    return {"partition": args.partition, "time_limit_min": args.time_limit_min,
            "cpus_per_task": args.cpus_per_task, "gpus_per_task": args.gpus_per_task,
            "array_parallelism": args.array_parallelism,
            "sbatch_options": parse_sbatch_options(args.sbatch_option) or None}


def _short(text: object, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _params_text(params: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in params.items())


def _cmd_sweep(args) -> int:
    from ...core.status import FINISHED
    from . import expand, load_spec, plan
    from .engine import should_run

    if args.workers < 1:
        raise BadInputError("--workers must be at least 1")
    spec = load_spec(args.spec)
    configs = expand(spec)
    out = Path(args.out)
    if args.dry_run:
        rows = plan(configs, out, retry_failed=args.retry_failed)
        width = max(28, *(len(c.config_id) for c in configs))
        ab = bool(spec.variants) or spec.rounds > 1
        side = f"{'variant':<12} {'round':<5} " if ab else ""
        print(f"{'config_id':<{width}} {side}{'ledger':<9} {'action':<7} parameters")
        for c, prev in rows:
            action = "run" if should_run(prev, args.retry_failed) else "done"
            side = f"{c.variant.name if c.variant else '-':<12} {c.round:<5} " if ab else ""
            print(f"{c.config_id:<{width}} {side}{prev or '-':<9} {action:<7} {_params_text(c.params)}")
        todo = sum(should_run(p, args.retry_failed) for _, p in rows)
        print(f"{len(rows)} configurations, {todo} to run, {len(rows) - todo} finished "
              f"({', '.join(sorted(FINISHED))} are not re-run)")
        return 0
    result = executor_from_args(args).run(spec, out, configs=configs, retry_failed=args.retry_failed,
                                          progress=False if args.quiet else None)
    _summary(result)
    return result.exit_code


def _summary(result) -> None:
    counts = result.counts()
    ran = sum(counts.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing to run"
    print(f"sweep: {ran} run ({parts}), {result.already_done} already done, "
          f"{result.wall_time_s:.1f} s → {result.out_dir}")
    if result.busy is not None:
        print(result.busy.line())
    bad = [o for o in result.outcomes if o.status != "ok"]
    if bad:
        print(f"{'config_id':<28} {'status':<8} reason")
        for o in sorted(bad, key=lambda o: o.status):
            reason = f"{o.error_name}: {o.message}" if o.error_name else (o.message or "")
            where = f" (cell {o.cell})" if o.cell is not None else ""
            print(f"{o.config_id:<28} {o.status:<8} {_short(reason, 100)}{where}")
            if o.status not in ("skipped",):
                if why := _row_reason(o.results_path):
                    print(f"{'':<37} why: {_short(why, 160)}")
                print(f"{'':<37} notebook: {o.output_notebook}")


def _row_reason(results_path) -> str | None:
    """The last line of the reason a configuration's first row that is not ``ok`` gives (a
    script's own error: "ModuleNotFoundError: No module named 'torch'"), where the kernel's
    exception says only that the cell failed; None without one."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(results_path)
    except Exception:  # noqa: BLE001 - no file, or one cut by the kill that ended the configuration
        return None
    columns = [c for c in ("status", "reason", "error") if c in table.column_names]
    for row in table.select(columns).to_pylist():
        if row.get("status") == "ok":
            continue
        for text in (row.get("reason"), row.get("error")):
            lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
            if lines:
                return lines[-1]
    return None


def _cmd_new(args) -> int:
    name = args.name
    if not name.replace("_", "").replace("-", "").isalnum():
        raise BadInputError(f"name {name!r}: use letters, digits, '-' and '_' only")
    if args.model:
        return _new_model(name, Path(args.dir), args.force)
    src_nb, src_spec = TEMPLATES / "notebook.ipynb", TEMPLATES / "sweep.yaml"
    if not src_nb.exists() or not src_spec.exists():
        raise BadInputError(f"templates not found in {TEMPLATES}; run perfkit from its source checkout")
    directory = Path(args.dir)
    nb, spec = directory / f"{name}.ipynb", directory / f"{name}.yaml"
    for path in (nb, spec):
        if path.exists() and not args.force:
            raise BadInputError(f"{path} exists; choose another name or pass --force")
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src_nb, nb)
    spec.write_text(src_spec.read_text().replace("notebook.ipynb", nb.name))
    print(f"created {nb} and {spec}\nrun it:  perfkit sweep {spec} --out runs/{name}")
    return 0


def _new_model(name: str, directory: Path, force: bool) -> int:
    """NAME.py (an entry point to fill in: templates/user_model.py) and NAME.yaml (its training-step
    sweep: templates/user_model.yaml, pointed at NAME:build and this folder)."""
    if not name.isidentifier():
        raise BadInputError(f"name {name!r}: a model module's name must be a Python identifier (letters, digits, '_')")
    src_py, src_spec = TEMPLATES / "user_model.py", TEMPLATES / "user_model.yaml"
    notebook = TEMPLATES.parent / "notebooks" / "train_step.ipynb"
    if not (src_py.exists() and src_spec.exists() and notebook.exists()):
        raise BadInputError(f"templates not found in {TEMPLATES}; run perfkit from its source checkout")
    module, spec = directory / f"{name}.py", directory / f"{name}.yaml"
    for path in (module, spec):
        if path.exists() and not force:
            raise BadInputError(f"{path} exists; choose another name or pass --force")
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src_py, module)
    text = (src_spec.read_text().replace('"user_model:build"', f'"{name}:build"')
            .replace('"../templates"', json.dumps(str(directory.resolve())))
            .replace("../notebooks/train_step.ipynb", str(notebook.resolve()))
            .replace("name: user_model", f"name: {name}").replace("runs/user_model", f"runs/{name}")
            .replace("templates/user_model.yaml", str(spec)))
    spec.write_text(text)
    print(f"created {module} (your model: fill in build) and {spec}\n"
          f"check it:  perfkit sweep {spec} --out runs/{name} --dry-run\n"
          f"run it:    perfkit sweep {spec} --out runs/{name}")
    return 0


def add_sweep_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a notebook over a grid of configurations (resumable)",
                       description=_SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="the sweep spec (YAML): notebook, parameters, grid, configs, exclude, timeout_s")
    p.add_argument("--out", required=True, help="the sweep's directory (created; reused to resume)")
    p.add_argument("--dry-run", action="store_true", help="print the configuration table and exit")
    p.add_argument("--resume", action="store_true",
                   help="(the default) run only what the ledger in --out does not have as finished")
    p.add_argument("--retry-failed", action="store_true", help="also re-run configurations that ended failed or timeout")
    p.add_argument("--workers", type=int, default=1,
                   help="configurations at once; each owns a disjoint device slot (GPUs) or a share of the cores (CPU)")
    add_executor_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--prestart", choices=("auto", "on", "off"), default="auto",
                   help="start each slot's next kernel (at idle priority) while the current configuration "
                        "runs: hides kernel start-up. auto (default): on GPU slots only, since a starting "
                        "kernel perturbs CPU measurements on the same cores")
    p.add_argument("--overlap", choices=("auto", "on", "off"), default="auto",
                   help="hand a slot to its next configuration when the current one reaches its cells "
                        "tagged 'view' (plots, tables, advice), which then run beside the next measurement; "
                        "a configuration still ends only when its notebook did. auto (default): on GPU "
                        "slots only, since view cells would compete for the cores a CPU measurement uses")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("new", help="scaffold a notebook and a sweep spec from templates/ (--model: your model's entry point)")
    p.add_argument("name", help="the new notebook's name (NAME.ipynb and NAME.yaml; with --model NAME.py and NAME.yaml)")
    p.add_argument("--model", action="store_true",
                   help="scaffold your own model instead: NAME.py, an entry point NAME:build to fill in "
                        "(the workload contract), and NAME.yaml, its training-step sweep")
    p.add_argument("--dir", default=".", help="where to create them")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=_cmd_new)

