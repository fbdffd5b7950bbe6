"""Metrics a script prints, read as perfkit columns in SI units (:mod:`perfkit.core.units`).

Where a script says its numbers (``sources``, tried in this order):

- ``performance``: ROCm/MAD's line ``performance: VALUE UNIT`` (``performance: 1234.5
  samples_per_second``) → ``performance_samples_per_s``;
- ``json``: lines starting with ``json_prefix`` followed by a JSON object: ``{"metric": NAME,
  "value": V, "unit": U}``, or ``{NAME: V, ...}`` where a name ending in a unit says it
  (``step_time_ms`` → ``step_time_s`` × 1e-3; ``throughput_samples_per_second`` →
  ``throughput_samples_per_s``);
- ``csv``: a MAD-style CSV file the script writes (``model,performance,metric[,unit]``);
- ``regex``: a pattern with named groups, each group a metric named like a JSON key.

A metric seen more than once keeps every value: the column is their median, with its samples,
IQR and noisy flag (IQR/median > 0.1, as perfkit's timer) named as perfkit names its own:
``step_time_s`` → ``step_time_samples_s``, ``step_time_iqr_s``, ``step_time_noisy``; other units
after the column (``tput_tokens_per_s_samples``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence

from perfkit.core.errors import BadInputError
from perfkit.core.units import UNITS, si_column

__all__ = ["SOURCES", "check_regex", "named_column", "read_metrics", "summarise"]

SOURCES = ("performance", "json", "csv", "regex")
_PERFORMANCE = re.compile(r"^\s*performance:\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>\S*)")
_RATE_SUFFIX = re.compile(r"^(?P<name>.+?)_(?P<unit>[a-z]+_per_(?:s|sec|second))$")
NOISY = 0.1


def check_regex(pattern: str) -> re.Pattern:
    """The compiled ``pattern``; BadInputError when it does not compile or names no group."""
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise BadInputError(f"regex {pattern!r} does not compile: {err}") from None
    if not compiled.groupindex:
        raise BadInputError(f"regex {pattern!r} has no named group: name each metric, e.g. "
                            "'step (?P<step_time_ms>[0-9.]+) ms'")
    return compiled


def named_column(name: str) -> tuple[str, float]:
    """A metric named with its unit (``step_time_ms``, ``tokens_per_second``...) as (column, factor)."""
    if m := _RATE_SUFFIX.match(name):
        column, factor = si_column(m.group("name"), m.group("unit"))
        if column.endswith("_per_s"):
            return column, factor
    head, _, unit = name.rpartition("_")
    if head and unit in UNITS and unit:
        return si_column(head, unit)
    return si_column(name, "")


def read_metrics(lines: Sequence[str], sources: Iterable[str], *, json_prefix: str = "PERFKIT_METRIC",
                 regex: str | None = None, csv_text: str | None = None) -> dict[str, list[float]]:
    """Every metric value in ``lines`` (and ``csv_text``) from ``sources``: column -> values in SI."""
    found: dict[str, list[float]] = {}
    pattern = check_regex(regex) if "regex" in sources and regex else None

    def add(column: str, value, factor: float = 1.0) -> None:
        try:
            found.setdefault(column, []).append(float(value) * factor)
        except (TypeError, ValueError):
            pass  # a non-number under a metric's name (a label) is not a measurement

    for line in lines:
        if "performance" in sources and (m := _PERFORMANCE.match(line)):
            column, factor = si_column("performance", m.group("unit"))
            add(column, m.group("value"), factor)
        if "json" in sources and line.lstrip().startswith(json_prefix):
            try:
                obj = json.loads(line.lstrip()[len(json_prefix):])
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and {"metric", "value"} <= set(obj):
                column, factor = si_column(str(obj["metric"]), obj.get("unit"))
                add(column, obj["value"], factor)
            elif isinstance(obj, dict):
                for name, value in obj.items():
                    add(*_column_value(name, value))
        if pattern is not None:
            for m in pattern.finditer(line):
                for name, value in m.groupdict().items():
                    if value is not None:
                        add(*_column_value(name, value))
    if "csv" in sources and csv_text:
        for row in csv.DictReader(csv_text.splitlines()):
            if row.get("metric") and row.get("performance") is not None:
                column, factor = si_column(row["metric"], row.get("unit"))
                add(column, row["performance"], factor)
    return found


def _column_value(name: str, value) -> tuple[str, object, float]:
    column, factor = named_column(name)
    return column, value, factor


_UNIT_SUFFIX = re.compile(r"(?<!_per)(_s)$")


def _parts(column: str) -> tuple[str, str]:
    """(stem, unit suffix) of a column in seconds: ``step_time_s`` → (``step_time``, ``_s``); any
    other column is its own stem (``tput_tokens_per_s`` → ``tput_tokens_per_s_samples``)."""
    m = _UNIT_SUFFIX.search(column)
    return (column[:m.start()], m.group(1)) if m and m.start() > 0 else (column, "")


def summarise(found: dict[str, list[float]]) -> dict:
    """Row columns from :func:`read_metrics`: the value, or the median with its samples, IQR and
    noisy flag where a metric repeats."""
    cols: dict = {}
    for column, values in found.items():
        if len(values) == 1:
            cols[column] = values[0]
            continue
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        median = statistics.median(values)
        stem, unit = _parts(column)
        cols.update({column: median, f"{stem}_samples{unit}": list(values), f"{stem}_iqr{unit}": q3 - q1,
                     f"{stem}_noisy": bool(median and math.isfinite(median) and (q3 - q1) / abs(median) > NOISY)})
    return cols
