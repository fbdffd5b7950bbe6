"""A metric's unit as perfkit's column suffix and SI factor: ``ms`` → ``_s`` × 1e-3, ``tok/sec`` →
``_tokens_per_s``, ``samples_per_second`` → ``_samples_per_s``, ``GB/s`` → ``_bytes_per_s`` × 1e9.

Units are read as tools print them (ROCm/MAD's ``unit`` column and ``performance: VALUE UNIT``
lines, vLLM's, MLPerf's); one not in :data:`UNITS` keeps its value and gets its own spelling as the
suffix, so nothing is converted by a guess.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "si_column", "is_unit"]

_TIME = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6,
         "µs": 1e-6, "ns": 1e-9, "min": 60.0, "minutes": 60.0}
_COUNT = {"tok": "tokens", "tokens": "tokens", "token": "tokens", "samples": "samples", "sample": "samples",
          "sequences": "sequences", "seq": "sequences", "images": "images", "img": "images", "req": "requests",
          "requests": "requests", "queries": "queries", "steps": "steps", "it": "iterations"}
_BYTES = {"B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30}
_FLOPS = {"FLOPS": 1.0, "GFLOPS": 1e9, "TFLOPS": 1e12, "PFLOPS": 1e15}

#: Exact spellings beside the patterns below: unit -> (column suffix, factor to SI).
UNITS: dict[str, tuple[str, float]] = {
    **{u: ("_s", f) for u, f in _TIME.items()},
    **{f"{b}/s": ("_bytes_per_s", f) for b, f in _BYTES.items()},
    **{u: ("_flop_per_s", f) for u, f in _FLOPS.items()},
    "%": ("_percent", 1.0), "": ("", 1.0),
}
_RATE = re.compile(r"^(?P<what>[A-Za-z]+)\s*(?:/|_per_|\s+per\s+)\s*(?P<time>s|sec|second|ms|min)$")


def si_column(metric: str, unit: str | None) -> tuple[str, float]:
    """``(column, factor)``: the column of ``metric`` measured in ``unit`` (perfkit's suffix), and
    the factor that turns the value into SI. ``median_ttft`` in ``ms`` → (``median_ttft_s``, 1e-3)."""
    unit = (unit or "").strip()
    name = re.sub(r"[^0-9A-Za-z_]+", "_", metric.strip()).strip("_").lower()
    if unit in UNITS:
        suffix, factor = UNITS[unit]
    elif (m := _RATE.match(unit)) and m.group("what").lower() in _COUNT:
        suffix, factor = f"_{_COUNT[m.group('what').lower()]}_per_s", 1.0 / _TIME[m.group("time")]
    else:
        suffix, factor = "_" + re.sub(r"[^0-9A-Za-z]+", "_", unit).strip("_").lower(), 1.0
    return (name if name.endswith(suffix) else name + suffix), factor


def is_unit(text: str) -> bool:
    """Whether ``text`` is a unit perfkit reads (``tokens/sec``, ``samples_per_second``, ``ms``, ...),
    not a metric's name: ROCm/MAD's classic ``perf.csv`` puts the unit in its ``metric`` column."""
    text = (text or "").strip()
    return bool(text) and (text in UNITS or (bool(m := _RATE.match(text)) and m.group("what").lower() in _COUNT))
