"""The ceilings table of this machine: measured ceilings beside the spec or theoretical ones.

Spec (datasheet), theoretical (cores × clock × FLOP/cycle) and measured ceilings are kept as
separate rows with their ``origin``; nothing here mixes them.
"""

from __future__ import annotations

import pandas as pd

from perfkit.core.devices import detect, reference_ceilings

__all__ = ["CEILING_COLUMNS", "peaks_table", "record_peaks"]

CEILING_COLUMNS = ["kind", "dtype", "level", "value", "unit", "origin", "source", "method", "iqr", "noisy"]


def peaks_table(device: str = "auto", *, quick: bool = True, measure: bool = True) -> pd.DataFrame:
    """Reference ceilings of ``device``, plus the measured ones unless ``measure`` is False."""
    info = detect(device)
    rows = reference_ceilings(info)
    if measure:
        from perfkit.measuring.kernels.ceilings import measure_ceilings

        rows.extend(measure_ceilings(device=info.torch_device, quick=quick).to_dict("records"))
    table = pd.DataFrame(rows)
    for col in CEILING_COLUMNS:
        if col not in table:
            table[col] = None
    # Recorded, each row's fingerprint is then of this device, not of the machine's first GPU.
    table["device"] = info.torch_device
    table.attrs["device_name"] = info.name
    return table[CEILING_COLUMNS + [c for c in table.columns if c not in CEILING_COLUMNS]]


def record_peaks(table: pd.DataFrame, out_dir) -> pd.DataFrame:
    """Record the ceilings as rows (``workload="ceiling"``) under ``out_dir``/results."""
    from pathlib import Path

    from perfkit.core.results import RunContext, record

    ctx = RunContext(results_path=Path(out_dir).resolve() / "results" / "peaks.parquet", config_id="peaks")
    return record(table.assign(workload="ceiling"), context=ctx)
