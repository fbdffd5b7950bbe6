"""Memory levels: cache sizes from the OS, and the plateaus of a bandwidth curve, named.

Pure analysis (DataFrames in and out) beside the measuring in :mod:`perfkit.measuring.ceilings`, in the
spirit of the Empirical Roofline Toolkit's level detection.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from ..core.cpu_share import SYS_CPU, affinity_cpus
from ..core.errors import BadInputError
from ..core.timing import NOISY_IQR_OVER_MEDIAN

__all__ = ["cpu_cache_sizes", "detect_levels"]


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cpu_cache_sizes(cpus: Sequence[int] | None = None, root: str = str(SYS_CPU)) -> dict[str, int]:
    """Data-cache capacity per level summed over the distinct cache instances of ``cpus``
    (default: the CPUs this process may run on), from Linux sysfs; ``{}`` when unreadable.

    With one thread per core, each thread has a private L1 and L2, so the working set a level
    holds is the aggregate over cores; a shared L3 counts once per instance.
    """
    if cpus is None:
        cpus = affinity_cpus()
    seen, sizes = set(), {}
    for cpu in cpus:
        for index in sorted(Path(root, f"cpu{cpu}", "cache").glob("index*")):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                key = (level, (index / "shared_cpu_list").read_text().strip())
                size = _parse_size((index / "size").read_text())
            except (OSError, ValueError):
                continue
            if key not in seen:
                seen.add(key)
                sizes[f"L{level}"] = sizes.get(f"L{level}", 0) + size
    return dict(sorted(sizes.items(), key=lambda kv: kv[1]))



def _split_at(seg: list[int], ws: Sequence[float], bound: float) -> list[list[int]]:
    lo, hi = [i for i in seg if ws[i] <= bound], [i for i in seg if ws[i] > bound]
    return [s for s in (lo, hi) if s]


def detect_levels(curve: pd.DataFrame, *, cache_sizes: Mapping[str, int], memory_name: str = "DRAM",
                  step: float = 0.15, min_points: int = 2) -> pd.DataFrame:
    """Find the plateaus of a bandwidth curve and name them after the level that holds them.

    ``curve`` needs ``working_set_bytes`` and ``bytes_per_s`` (one kernel); ``cache_sizes``
    maps level names to the capacity available to the run (``{"L1": 96 << 10, ...}``).
    Method: smooth log-bandwidth with a running median of 3 (one outlier cannot make or break a
    plateau), start a new segment wherever a point leaves the current segment's median by more
    than ``step`` (relative), split at the last-level cache, keep segments of at least
    ``min_points`` points. Each is named by the smallest cache holding its median working set;
    past the LLC it is ``memory_name`` -- so DRAM/HBM appears only when the sweep went past the
    LLC, and the last plateau of a shorter sweep keeps its cache's name. With no cache sizes
    plateaus are named ``P1``, ``P2``... Same-named segments are merged. Per plateau: the median
    bandwidth, ``iqr`` (median of the points' ``bytes_per_s_iqr`` if given, else the spread of
    the plateau), ``noisy``, its span and ``working_set_bytes`` of its most typical point.
    """
    columns = ["level", "bytes_per_s", "iqr", "noisy", "working_set_bytes", "working_set_min_bytes",
               "working_set_max_bytes", "points"]
    if missing := {"working_set_bytes", "bytes_per_s"} - set(curve.columns):
        raise BadInputError(f"curve lacks column(s) {sorted(missing)}")
    if curve.get("kernel") is not None and curve["kernel"].nunique() > 1:
        raise BadInputError("curve holds several kernels; pass one kernel's rows")
    if step <= 0 or min_points < 1:
        raise BadInputError("need step > 0 and min_points >= 1")
    df = curve.sort_values("working_set_bytes").reset_index(drop=True)
    bw, ws = df["bytes_per_s"].astype(float), df["working_set_bytes"].astype(float).tolist()
    if not (bw.gt(0) & bw.map(math.isfinite)).all() or min(ws, default=1) <= 0:
        raise BadInputError("bandwidths and working sets must be positive and finite")
    y = [math.log(v) for v in bw]
    smooth = [statistics.median(y[max(0, i - 1):i + 2]) for i in range(len(y))]
    tol = math.log1p(step)
    segments: list[list[int]] = []
    for i, v in enumerate(smooth):
        if segments and abs(v - statistics.median(smooth[j] for j in segments[-1])) <= tol:
            segments[-1].append(i)
        else:
            segments.append([i])
    llc = max(cache_sizes.values(), default=None)
    if llc is not None:
        segments = [part for seg in segments for part in _split_at(seg, ws, llc)]
    named: dict[str, list[int]] = {}
    for seg in (s for s in segments if len(s) >= min_points):
        mid = statistics.median(ws[i] for i in seg)
        if llc is None:
            name = f"P{len(named) + 1}"
        else:
            name = next((lvl for lvl, size in sorted(cache_sizes.items(), key=lambda kv: kv[1])
                         if mid <= size), memory_name)
        named.setdefault(name, []).extend(seg)
    rows = []
    for name, idx in named.items():
        pts = df.loc[idx]
        value = float(pts["bytes_per_s"].median())
        if "bytes_per_s_iqr" in pts:
            iqr = float(pts["bytes_per_s_iqr"].median())
        else:
            iqr = float(pts["bytes_per_s"].quantile(0.75) - pts["bytes_per_s"].quantile(0.25))
        typical = pts.loc[(pts["bytes_per_s"] - value).abs().idxmin(), "working_set_bytes"]
        rows.append({"level": name, "bytes_per_s": value, "iqr": iqr,
                     "noisy": bool(iqr / value > NOISY_IQR_OVER_MEDIAN),
                     "working_set_bytes": int(typical), "working_set_min_bytes": int(pts["working_set_bytes"].min()),
                     "working_set_max_bytes": int(pts["working_set_bytes"].max()), "points": len(idx)})
    return pd.DataFrame(rows, columns=columns)
