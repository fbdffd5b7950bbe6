"""The ``perfkit`` command line. Exit 0 on success, 1 when configurations failed, 2 on bad input."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__
from .core.errors import BadInputError, PerfkitError

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _cmd_env(args) -> int:
    from .core.env import fingerprint

    facts = fingerprint(args.device)
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True, default=str))
        return EXIT_OK
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        if key == "env_vars":
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "(none set)"
        print(f"{key:<{width}}  {value}")
    return EXIT_OK


def _parse_params(spec, pairs) -> dict:
    from .core.errors import UnknownParameterError
    from .run.notebooks import check_params, coerce_cli_value

    raw = {}
    for name, text in pairs or []:
        if name not in spec.parameters:
            raise UnknownParameterError(name, str(spec.path), spec.names)
        raw[name] = coerce_cli_value(spec.parameters[name], text)
    return check_params(spec, raw)


def _cmd_run(args) -> int:
    from .run.execute import execute_config
    from .run.notebooks import config_id, read_notebook
    from .core.status import OK, SKIPPED

    spec = read_notebook(args.notebook)
    params = _parse_params(spec, args.param)
    if args.timeout_s is not None and args.timeout_s <= 0:
        raise BadInputError("--timeout-s must be positive")
    cid = config_id(spec, params)
    out = Path(args.out)
    output_nb = out / "notebooks" / f"{cid}.ipynb"
    results = out / "results" / f"{cid}.parquet"
    shown = " ".join(f"{k}={v!r}" for k, v in params.items()) or "(defaults)"
    print(f"perfkit run: {spec.path} {shown} → {output_nb}", file=sys.stderr)
    outcome = execute_config(spec.path, params, config_id=cid, output_notebook=output_nb,
                             results_path=results, timeout_s=args.timeout_s, log_output=args.log_output)
    print(f"{outcome.status}: {cid} in {outcome.duration_s:.1f} s"
          + (f" — {outcome.error_name}: {outcome.message}" if outcome.error_name else ""))
    print(f"  notebook: {outcome.output_notebook}\n  results:  {outcome.results_path}")
    return EXIT_OK if outcome.status in (OK, SKIPPED) else EXIT_FAILED


def _cmd_report(args) -> int:
    from .view.report_page import write_report

    if args.workers is not None and args.workers < 1:
        raise BadInputError("--workers must be at least 1")
    path = write_report(args.dir, args.output, title=args.title, workers=args.workers)
    print(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return EXIT_OK


def _cmd_memory_snapshot(args) -> int:
    from .analyse.memory_snapshot import format_summary, load, summarize

    summary = summarize(load(args.file), top=args.top, device=args.device)
    print(json.dumps(summary.as_dict(), indent=2) if args.json else format_summary(summary))
    return EXIT_OK


def _cmd_peaks(args) -> int:
    from perfkit.measuring.kernels.peaks import peaks_table

    table = peaks_table(device=args.device, quick=not args.full, measure=not args.spec_only)
    if args.out:
        from perfkit.measuring.kernels.peaks import record_peaks

        record_peaks(table, args.out)
    if args.json:
        print(json.dumps(table.to_dict(orient="records"), indent=2, default=str))
        return EXIT_OK
    from .view.plots import format_si

    for row in table.itertuples():
        what = row.dtype if row.kind == "compute" else row.level
        iqr = getattr(row, "iqr", None)
        noise = f" (IQR {format_si(iqr, row.unit)})" if iqr is not None and iqr == iqr else ""
        print(f"{row.kind:<8} {str(what):<6} {row.origin:<12} {format_si(row.value, row.unit):>16}{noise}  [{row.source}]")
    return EXIT_OK


_EXPORT_HELP = """\
Put a results folder where teams already look.

  perfkit export DIR --to mlflow [--tracking-uri URI] [--experiment NAME]
      One MLflow run per configuration, nested under one parent run for DIR: parameters as
      params, numeric columns as metrics (units stay in the names: step_time_s, tokens_per_s),
      the environment fingerprint (env_*) and the status (perfkit.status, perfkit.reason) as
      tags; the executed notebook, the Parquet rows and any trace as artifacts. Failed, oom,
      timeout and skipped configurations are exported too. Exporting again adds no runs (they
      are found by config id); a configuration whose rows changed is updated. Default store:
      sqlite:///DIR/mlflow/mlflow.db (nothing needs to run; look with
      `mlflow ui --backend-store-uri sqlite:///DIR/mlflow/mlflow.db`); any tracking server
      URI (http://host:5000) works the same. Needs: pip install 'perfkit[mlflow]'.

  perfkit export DIR --to tensorboard LOGDIR
      One run directory per configuration, LOGDIR/<swept parameters>,<config id>, with its
      numeric columns as scalars and its parameters and status as hparams, so TensorBoard's
      HParams tab compares configurations (tensorboard --logdir LOGDIR). Exporting again
      replaces the runs it wrote. Needs: pip install 'perfkit[tensorboard]'.

Exit 2 on bad input (no results under DIR, unknown --to, a missing extra) before anything is written.
"""

_EXPORTERS = ("mlflow", "tensorboard")


def _cmd_export(args) -> int:
    target, logdir = args.to[0], args.to[1:]
    if target not in _EXPORTERS:
        raise BadInputError(f"--to {target!r}: export to one of {', '.join(_EXPORTERS)}")
    if target == "mlflow":
        from .view.export_mlflow import export_mlflow, require_mlflow

        if logdir:
            raise BadInputError(f"--to mlflow takes no LOGDIR (got {' '.join(logdir)}); a store: --tracking-uri URI")
        require_mlflow()
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not MLflow's INFO lines on creating a store
        done = export_mlflow(args.dir, tracking_uri=args.tracking_uri, experiment=args.experiment)
        print(f"mlflow: {len(done.runs)} configurations in experiment {args.experiment!r} "
              f"({done.created} created, {done.updated} updated, {done.unchanged} unchanged), "
              f"parent run {done.parent_run_id}\n  tracking URI: {done.tracking_uri}")
        return EXIT_OK
    from .view.export_tensorboard import export_tensorboard, require_tensorboard

    if len(logdir) != 1:
        raise BadInputError("--to tensorboard needs one LOGDIR: perfkit export DIR --to tensorboard LOGDIR")
    if args.tracking_uri or args.experiment != "perfkit":
        raise BadInputError("--tracking-uri and --experiment are for --to mlflow")
    require_tensorboard()
    done = export_tensorboard(args.dir, logdir[0])
    print(f"tensorboard: {len(done.runs)} configurations → {done.logdir} (tensorboard --logdir {done.logdir})")
    return EXIT_OK


def _cmd_index(args) -> int:
    from .core.results_index import INDEX_DIR, refresh

    directory = Path(args.dir)
    if not directory.is_dir():
        raise BadInputError(f"results directory {str(directory)!r} does not exist")
    manifest = refresh(directory, rebuild=args.rebuild, wait=True)
    if manifest is None:
        raise BadInputError(f"cannot write {str(directory / INDEX_DIR)!r} (read-only?): queries scan the files")
    s = manifest["summary"]
    print(f"index: {s['files']} results files, {s['rows']} rows in {s['parts']} parts → {directory / INDEX_DIR}\n"
          f"  read {s['read']} files ({s['changed']} changed), {s['removed']} removed, {s['new_parts']} parts added, "
          f"{s['rewritten_parts']} rewritten, {s['not_indexed']} not indexed, {s['seconds']:.1f} s")
    return EXIT_OK


_IMPORT_HELP = """\
Read other tools' outputs into DIR as perfkit rows, beside sweeps' rows: the report, compare,
query and export use them unchanged. One results file per imported file, named by its digest:
importing a file again adds nothing.

  nccl-tests   nccl-tests/rccl-tests stdout (every *_perf binary, every format since 2021; rccl-tests'
               --output_file JSON lines too): one
               row per size and form, perfkit's busbw recomputed beside the printed one (they must
               agree), #wrong > 0 rows failed. A run without its '# Avg bus bandwidth' line (a
               hang, a crash, a cut log) is refused; --partial keeps its rows marked failed.
  vllm-bench   vllm bench serve --save-result JSON (0.6 to 0.25; appended runs one per line; a
               `vllm bench sweep` folder): one inference row per run, TTFT/TPOT/ITL/E2E median,
               mean, std and percentiles in seconds, throughputs, the per-request samples; a run
               whose every request failed is `failed`, its zeros not read as latencies.
  mlperf       MLPerf Training result logs (:::MLLOG): time to train (run_stop - run_start), status
               from run_stop, hyperparameters, evaluations, tracked throughput.
  mad          ROCm/MAD perf.csv: one row per run, a column per metric in SI units
               (median_ttft in ms -> median_ttft_s).

Examples:
  perfkit import nccl-tests all_reduce.log all_gather.log --out runs/cluster-a
  perfkit import nccl-tests old.log --op all_gather --out runs/cluster-a
  perfkit import vllm-bench results/*.json sweep-dir/ --out runs/serving
"""


def _cmd_import(args) -> int:
    from .ingest.store import import_files

    options = {}
    if args.kind == "nccl-tests":
        options = {"op": args.op, "world_size": args.world_size, "partial": args.partial}
    elif args.op or args.world_size or args.partial:
        raise BadInputError("--op, --world-size and --partial are for nccl-tests")
    done = import_files(args.kind, args.paths, args.out, **options)
    for path, n in done.added:
        print(f"{path}: {n} rows")
    for path in done.unchanged:
        print(f"{path}: already imported, nothing added")
    for line in done.failed_runs:
        print(f"not imported, a run that failed: {line}")
    print(f"{len(done.added)} files imported, {len(done.unchanged)} unchanged → {args.out}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit",
        description="Performance-engineering notebook kit for PyTorch: measure, record, sweep, "
                    "analyse and plot. Exit codes: 0 success, 1 configurations failed, 2 bad input.",
    )
    parser.add_argument("--version", action="version", version=f"perfkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("env", help="print the environment fingerprint recorded with every row")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument("--device", default="auto", help="auto (first GPU, else CPU), cpu, cuda, cuda:N")
    p.set_defaults(func=_cmd_env)

    p = sub.add_parser("peaks", help="this machine's ceilings: measured, beside spec/theoretical")
    p.add_argument("--json", action="store_true", help="print a JSON list of ceiling objects")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--full", action="store_true", help="the full working-set sweep (slower)")
    p.add_argument("--spec-only", action="store_true", help="only the spec/theoretical ceilings, no measuring")
    p.add_argument("--out", help="also record the ceilings as rows under this results directory")
    p.set_defaults(func=_cmd_peaks)

    p = sub.add_parser(
        "memory-snapshot", help="what a CUDA/ROCm memory snapshot holds: the peak and its stacks, no browser",
        description="Summarize a torch.cuda.memory._dump_snapshot pickle (a training row's "
                    "memory_snapshot_path, a rank<r>-oom.pickle, or your own): replay its alloc/free "
                    "events to the peak of allocated memory, list the stacks holding the most at the "
                    "peak and at the end, and every out-of-memory event. Any size: nothing is drawn. "
                    "The file is read as data only (no code in it can run).")
    p.add_argument("file", help="the snapshot pickle")
    p.add_argument("--top", type=int, default=10, help="stacks listed per table (default 10)")
    p.add_argument("--device", type=int, default=None, help="device index (default: the one with the most events)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_memory_snapshot)

    p = sub.add_parser("run", help="execute one notebook with papermill into DIR",
                       description="Execute NOTEBOOK once with papermill. Every -p name is checked "
                                   "against the notebook's parameters cell before anything runs.")
    p.add_argument("notebook", help="the .ipynb to run (it needs a cell tagged 'parameters')")
    p.add_argument("--out", required=True, help="directory for the executed notebook and results")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="override a parameter; VALUE is a Python literal ([64, 128], 0.5, True) "
                        "or, for a string parameter, the text as is")
    p.add_argument("--timeout-s", type=float, default=None, help="kill the kernel after this wall time")
    p.add_argument("--log-output", action="store_true", help="stream the notebook's output")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("report", help="write the standalone interactive HTML report of DIR")
    p.add_argument("dir", help="a results directory (a sweep's --out, a run's --out)")
    p.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    p.add_argument("--title", default=None, help="the page's title (default: perfkit report: DIR's name)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes that build and render the sections (default: one per core; 1: this one)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("export", help="results into MLflow runs or TensorBoard runs (HParams), idempotent",
                       description=_EXPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR", help="a results directory (a sweep's --out, a run's --out)")
    p.add_argument("--to", required=True, nargs="+", metavar=("TARGET", "LOGDIR"),
                   help="mlflow, or tensorboard LOGDIR (the folder for the runs)")
    p.add_argument("--tracking-uri", metavar="URI",
                   help="MLflow tracking URI (default: sqlite:///DIR/mlflow/mlflow.db, a local store under DIR)")
    p.add_argument("--experiment", default="perfkit", metavar="NAME", help="MLflow experiment (default: perfkit)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("index", help="build or refresh DIR's query index (DIR/.perfkit-index; queries keep it fresh)",
                       description="Compact DIR's results files into a few Parquet parts that perfkit.load(DIR, "
                                   "columns=, filters=) and perfkit query read instead of every file; files "
                                   "added, changed or removed since are folded in. Derived: deleting it loses nothing.")
    p.add_argument("dir", metavar="DIR", help="a results directory (a sweep's --out, a run's --out)")
    p.add_argument("--rebuild", action="store_true", help="rebuild from the files instead of folding changes in")
    p.set_defaults(func=_cmd_index)

    from .ingest.store import KINDS

    p = sub.add_parser("import", help="read nccl-tests, vLLM bench, MLPerf or MAD outputs into DIR as perfkit rows",
                       description=_IMPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", metavar="KIND", help=f"what the files are: {', '.join(KINDS)}")
    p.add_argument("paths", nargs="+", metavar="PATH", help="the tool's output files")
    p.add_argument("--out", required=True, metavar="DIR", help="the results directory to add the rows to")
    p.add_argument("--op", help="nccl-tests: the collective, where the file does not name it (before 2.16.7)")
    p.add_argument("--world-size", type=int, help="nccl-tests: the ranks, where the file's rank list is cut")
    p.add_argument("--partial", action="store_true",
                   help="nccl-tests: keep the rows of a run that did not finish, marked failed")
    p.set_defaults(func=_cmd_import)

    # Imported unguarded: `sweep` and `new` are part of perfkit, and a broken install (a missing
    # dependency, a syntax error) must show its traceback, not a CLI without those commands.
    from .run.sweep.cli import add_sweep_commands

    add_sweep_commands(sub)
    from .view.compare import add_compare_command

    add_compare_command(sub)
    from .view.advise import add_advise_command

    add_advise_command(sub)
    from .measuring.training.fit_command import add_fit_command

    add_fit_command(sub)
    from .view.trace import add_trace_command

    add_trace_command(sub)
    from .ingest.network import read_network
    from .measuring.training.fit_command import memory_checker
    from .view.predict_cli import add_predict_command

    add_predict_command(sub, read_network, memory_checker)
    from .view.query import add_query_command

    add_query_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BadInputError as exc:
        print(f"perfkit {args.command}: error: {exc.reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PerfkitError as exc:
        print(f"perfkit {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("perfkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
