"""One question over a big results folder: pushdown and SQL against reading everything.

100,000 configurations in 10,000 Parquet files (rows shaped like real training rows: a dozen
parameter columns, the step-time and data-time samples, throughput, memory, MFU, the
environment fingerprint). The question: one column (``tokens_per_s``) for one parameter value
(``d_model == 1024``, an eighth of the rows), answered several ways, each in its own subprocess
so its peak memory (``VmHWM``) is its own:

- ``full``:     ``perfkit.load(DIR)`` then a pandas filter (what one did before), files only;
- ``pushdown``: ``perfkit.load(DIR, columns=[...], filters=[...])`` (pyarrow.dataset) over the files;
- ``query``:    ``perfkit query DIR "SELECT ..."`` (DuckDB over the files in place);

the files-only rows with ``PERFKIT_NO_INDEX=1``; then, the folder's index
(``DIR/.perfkit-index``, :mod:`perfkit.core.results_index`) removed first:

- ``build``:       the first pushdown question, which builds the index (its cost, reported apart);
- ``pushdown+ix``, ``query+ix``: the same questions later, answered from the index;
- ``full+ix``:     ``perfkit.load(DIR)`` + pandas filter with the index there (load uses one, never builds one).

Times are of the call alone (imports done before the clock starts); peak memory is the
process's ``VmHWM`` (/proc/self/status: the peak RSS of this program image; ``ru_maxrss`` would
carry the parent's RSS over fork + exec), shown whole and less the RSS after imports.
Ratios are against ``full`` (files) measured in the same run. Goal: pushdown and query >= 10x
faster than full, <= 0.1x its peak memory.

    python benchmarks/query_scale.py [--configs 100000] [--files 10000] [--dir KEEP_DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SQL = "SELECT tokens_per_s FROM results WHERE d_model = 1024"
PARAMS = ["model", "d_model", "n_layers", "n_heads", "seq_len", "batch_size", "precision", "parallelism",
          "world_size", "steps", "warmup_steps", "compile"]


def _rows(first: int, n: int, rng: random.Random, env: dict):
    import pandas as pd

    rows = []
    for c in range(first, first + n):
        d_model = rng.choice([128, 256, 384, 512, 768, 1024, 1536, 2048])
        batch, seq = rng.choice([1, 2, 4, 8, 16, 32, 64, 128]), rng.choice([128, 256, 512, 1024])
        step = 1e-9 * d_model * d_model * batch * seq / rng.uniform(0.5, 2.0)
        samples = [step * rng.uniform(0.97, 1.05) for _ in range(20)]
        data = [step * rng.uniform(0.01, 0.05) for _ in range(20)]
        status = "ok" if rng.random() > 0.03 else rng.choice(["failed", "oom", "timeout"])
        params = {"model": "transformer", "d_model": d_model, "n_layers": rng.choice([2, 4, 8, 12]),
                  "n_heads": rng.choice([4, 8, 16]), "seq_len": seq, "batch_size": batch,
                  "precision": rng.choice(["fp32", "bf16"]), "parallelism": rng.choice(["ddp", "zero2", "zero3", "tp"]),
                  "world_size": rng.choice([1, 2, 4, 8]), "steps": 20, "warmup_steps": 3, "compile": rng.random() < 0.5}
        rows.append({
            "config_id": f"train_step-{c:012x}", "status": status,
            "reason": None if status == "ok" else f"{status} at batch_size={batch}", **params,
            "param_names": json.dumps(PARAMS), "step_time_s": sorted(samples)[10], "step_time_iqr_s": step * 0.03,
            "step_time_samples_s": samples, "noisy": False, "data_time_s": sorted(data)[10], "data_time_samples_s": data,
            "samples_per_s": batch / step, "tokens_per_s": batch * seq / step, "peak_mem_bytes": d_model * 2 ** 20,
            "peak_mem_bytes_per_rank": [d_model * 2 ** 20] * params["world_size"],
            "model_flop_per_s": 6 * d_model ** 2 * batch * seq / step, "mfu": rng.uniform(0.2, 0.6),
            "losses": [rng.uniform(2, 4) for _ in range(20)], "notebook": "train_step.ipynb",
            "recorded_at": pd.Timestamp.now(tz="UTC"), **env,
        })
    return pd.DataFrame(rows)


def generate(work: Path, configs: int, files: int) -> None:
    from perfkit.core.env import fingerprint, flat_columns
    from perfkit.core.results import write_rows

    rng = random.Random(0)
    env = flat_columns(fingerprint("cpu"))
    per_file = configs // files
    for f in range(files):
        write_rows(_rows(f * per_file, per_file, rng, env), work / "results" / f"train_step-{f:06d}.parquet")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_variant(variant: str, directory: str) -> None:
    """In a fresh process: answer the question one way; print seconds, rows, peaks as JSON."""
    import pandas as pd  # noqa: F401  (every variant pays the same imports before the clock)

    import perfkit
    from perfkit.view import query as q

    if variant == "query":
        import duckdb  # noqa: F401
    import pyarrow.dataset  # noqa: F401
    before = _rss_bytes()
    t0 = time.perf_counter()
    if variant == "full":
        df = perfkit.load(directory)
        values = df.loc[df["d_model"] == 1024, "tokens_per_s"]
    elif variant == "pushdown":
        values = perfkit.load(directory, columns=["tokens_per_s"], filters=[("d_model", "==", 1024)])["tokens_per_s"]
    else:
        values = q.query(directory, SQL)["tokens_per_s"]
    seconds = time.perf_counter() - t0
    with open("/proc/self/status") as fh:
        peak = 1024 * int(next(line for line in fh if line.startswith("VmHWM:")).split()[1])  # kB
    print(json.dumps({"variant": variant, "seconds": seconds, "rows": len(values),
                      "sum": float(values.sum()), "peak_bytes": peak, "after_imports_bytes": before}))


VARIANTS = [  # (row name, variant, files only)
    ("full", "full", True), ("pushdown", "pushdown", True), ("query", "query", True),
    ("build", "pushdown", False), ("pushdown+ix", "pushdown", False), ("query+ix", "query", False),
    ("full+ix", "full", False),
]


def _load_line() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip() + f" ({os.cpu_count()} CPUs)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--dir", help="keep the generated folder here (reused when it has results)")
    parser.add_argument("--variant", choices=["full", "pushdown", "query"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        run_variant(args.variant, args.dir)
        return
    from perfkit.core.results_index import INDEX_DIR, NO_INDEX_ENV

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="perfkit-query-scale-"))
    try:
        if not (work / "results").is_dir():
            t0 = time.perf_counter()
            generate(work, args.configs, args.files)
            print(f"generated {args.configs} configurations in {args.files} files in {time.perf_counter() - t0:.0f} s")
        shutil.rmtree(work / INDEX_DIR, ignore_errors=True)  # `build` measures the first question
        print(f"uptime before: {_load_line()}")
        out = {}
        for name, variant, files_only in VARIANTS:
            env = {k: v for k, v in os.environ.items() if k != NO_INDEX_ENV}
            env |= {NO_INDEX_ENV: "1"} if files_only else {}
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--variant", variant, "--dir", str(work)],
                                  capture_output=True, text=True, check=True, env=env)
            out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            out[name]["process_s"] = time.perf_counter() - t0
            if name == "build":
                summary = json.loads((work / INDEX_DIR / "manifest.json").read_text())["summary"]
                index_bytes = sum(p.stat().st_size for p in (work / INDEX_DIR).iterdir())
        full = out["full"]
        print(f"question: {SQL}  ({full['rows']} rows)")
        print(f"index built by `build`: {summary['rows']} rows of {summary['files']} files in "
              f"{summary['parts']} parts, {index_bytes / 2**20:.0f} MiB, {summary['seconds']:.1f} s of the call")
        print(f"{'variant':<12} {'call s':>8} {'process s':>9} {'peak MiB':>9} {'added MiB':>9} "
              f"{'time ratio':>10} {'peak ratio':>10} {'added ratio':>11}")
        for name, r in out.items():
            added = r["peak_bytes"] - r["after_imports_bytes"]
            full_added = full["peak_bytes"] - full["after_imports_bytes"]
            print(f"{name:<12} {r['seconds']:8.2f} {r['process_s']:9.2f} {r['peak_bytes'] / 2**20:9.0f} "
                  f"{added / 2**20:9.0f} {full['seconds'] / r['seconds']:9.1f}x "
                  f"{r['peak_bytes'] / full['peak_bytes']:10.3f} "
                  f"{added / full_added:11.3f}")
            assert r["rows"] == full["rows"] and abs(r["sum"] - full["sum"]) <= 1e-9 * abs(full["sum"]), (name, r, full)
        ix, pix, qix = out["full+ix"], out["pushdown+ix"], out["query+ix"]
        print(f"against full+ix (load(DIR) with the index): pushdown+ix {ix['seconds'] / pix['seconds']:.1f}x, "
              f"query+ix {ix['seconds'] / qix['seconds']:.1f}x faster; peak ratios "
              f"{pix['peak_bytes'] / ix['peak_bytes']:.3f}, {qix['peak_bytes'] / ix['peak_bytes']:.3f}")
        print("goal: time ratio >= 10x, peak ratio <= 0.1 (pushdown and query against full)")
        print(f"uptime after: {_load_line()}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
