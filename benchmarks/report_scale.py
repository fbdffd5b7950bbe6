"""The results store and the report at scale: 10,000 configurations in 1,000 Parquet files.

Prints the time to load every row, the time to build the report, and the HTML size.
Goals: load < 2 s, report < 10 s, HTML < 5 MB. Rows are synthetic but shaped like real ones
(GEMM rows with raw samples, the fingerprint columns, a sprinkling of failures).

    python benchmarks/report_scale.py [--configs 10000] [--files 1000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from perfkit.core.env import fingerprint, flat_columns
from perfkit.core.results import load, write_rows


def _rows(first_config: int, n_configs: int, rng: random.Random, env: dict) -> pd.DataFrame:
    rows = []
    for c in range(first_config, first_config + n_configs):
        size = 2 ** rng.randint(5, 12)
        dtype = rng.choice(["fp32", "bf16", "fp16"])
        status = "ok" if rng.random() > 0.02 else rng.choice(["failed", "oom", "timeout"])
        median = 2 * size ** 3 / (rng.uniform(5e10, 3e11))
        samples = [median * rng.uniform(0.97, 1.05) for _ in range(10)]
        rows.append({
            "config_id": f"gemm-{c:012x}", "workload": "gemm", "size": size, "m": size, "n": size, "k": size,
            "dtype": dtype, "device": "cpu", "status": status,
            "reason": None if status == "ok" else f"{status} at size {size}",
            "flop": 2 * size ** 3, "bytes": 3 * size * size * 4, "time_s": median,
            "time_iqr_s": median * 0.03, "time_samples_s": samples, "noisy": False,
            "flop_per_s": 2 * size ** 3 / median, "bytes_per_s": 3 * size * size * 4 / median,
            "sizes": json.dumps([size]), "dtypes": json.dumps([dtype]), "notebook": "gemm.ipynb",
            "recorded_at": pd.Timestamp.now(tz="UTC"), **env,
        })
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=1_000)
    args = parser.parse_args()
    rng = random.Random(0)
    env = flat_columns(fingerprint("cpu"))
    work = Path(tempfile.mkdtemp(prefix="perfkit-report-scale-"))
    try:
        per_file = args.configs // args.files
        for f in range(args.files):
            write_rows(_rows(f * per_file, per_file, rng, env), work / "results" / f"part-{f:05d}.parquet")
        t0 = time.perf_counter()
        df = load(work)
        load_s = time.perf_counter() - t0
        from perfkit.view.report_page import write_report

        t0 = time.perf_counter()
        out = write_report(work, work / "report.html")
        report_s = time.perf_counter() - t0
        size_mb = out.stat().st_size / 1e6
        print(f"rows: {len(df)} from {df['config_id'].nunique()} configurations in {args.files} files")
        print(f"load:   {load_s:6.2f} s   (goal < 2 s)")
        print(f"report: {report_s:6.2f} s   (goal < 10 s; includes its own load)")
        print(f"HTML:   {size_mb:6.2f} MB  (goal < 5 MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
