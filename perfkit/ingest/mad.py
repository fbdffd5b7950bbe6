"""ROCm/MAD ``perf.csv`` results as perfkit rows.

madengine writes one line per (model, metric): ``model,performance,metric`` and, in its
``multiple_results`` form, a ``unit`` and the run's own columns (``tp``, ``inp``, ``out``,
``max_concurrency``, ``cmd``, ...). Lines that share everything but the metric are one run: one row
with a column per metric, named and scaled to SI by :mod:`perfkit.core.units`
(``median_ttft`` in ``ms`` → ``median_ttft_s``; ``throughput_tot`` in ``tok/sec`` →
``throughput_tot_tokens_per_s``); the run's other columns are kept as ``mad_<name>``. A
``performance`` that is not a number (a failed model) makes its row ``failed`` with the value.

madengine's classic ``perf.csv`` (``model,n_gpus,...,performance,metric,relative_change,status,...``)
has no ``unit`` column: its ``metric`` is the unit (``samples_per_second``, ``tokens/sec``), so the
value is ``performance_<unit in SI>`` (``performance_samples_per_s``, which ``perfkit compare``
judges higher-is-better), and its ``status`` column is MAD's verdict: a row that is not
``SUCCESS`` is ``failed`` with it, whatever its number.
"""

from __future__ import annotations

import csv
import io
import math

from perfkit.core.errors import BadInputError
from perfkit.ingest.parsed import ParsedRun
from perfkit.core.units import is_unit, si_column

__all__ = ["parse"]

_REQUIRED = ("model", "performance", "metric")


def parse(text: str, *, source: str = "the file"):
    """Read one MAD perf CSV (module docstring) into a ParsedRun."""
    if not text.strip():
        raise BadInputError(f"{source} is empty")
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    if missing := [c for c in _REQUIRED if c not in header]:
        raise BadInputError(f"{source} is not a MAD perf CSV: its header has no {', '.join(missing)} "
                            f"(it has {', '.join(header[:8])})")
    runs: dict[tuple, dict] = {}
    for number, line in enumerate(reader, start=2):
        if None in line or any(v is None for v in line.values()):
            raise BadInputError(f"{source} line {number}: {len(header)} columns in the header, not in this line")
        key = tuple((k, v) for k, v in line.items() if k not in ("performance", "metric", "unit", "relative_change"))
        row = runs.setdefault(key, {"workload": "mad", "model": line["model"], "status": "ok", "reason": None,
                                    "source_line": number, "metrics": [],
                                    **{f"mad_{k}": v for k, v in key if k != "model" and v != ""}})
        classic = "unit" not in header and is_unit(line["metric"])  # the metric is the unit
        column, factor = si_column("performance", line["metric"]) if classic else si_column(line["metric"], line.get("unit"))
        try:
            value = float(line["performance"])
        except ValueError:
            row["status"] = "failed"
            row["reason"] = f"{line['metric']}: performance {line['performance']!r} is not a number"
            value = math.nan
        row[column] = value * factor
        row["metrics"].append(column)
        mad_status = (line.get("status") or "").strip()
        if mad_status and mad_status.upper() != "SUCCESS":
            row["status"], row["reason"] = "failed", f"MAD's status column says {mad_status}"
    if not runs:
        raise BadInputError(f"{source}: a header and no result lines")
    return ParsedRun(rows=list(runs.values()), facts={"engine": "mad"})
