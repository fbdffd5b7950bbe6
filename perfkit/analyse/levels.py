"""Memory levels: the plateaus of a bandwidth curve, named after the cache or memory that feeds them.

Pure analysis (DataFrames in and out) beside the measuring in :mod:`perfkit.measuring.kernels.ceilings`, in the
spirit of the Empirical Roofline Toolkit's level detection. The cache sizes come from
:mod:`perfkit.core.caches` (sysfs), which also holds the rule for what is memory-fed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import pandas as pd

from ..core.caches import MEMORY_FACTOR, cache_capacities
from ..core.errors import BadInputError
from ..core.timing import NOISY_IQR_OVER_MEDIAN

__all__ = ["detect_levels"]


def _split_at(seg: list[int], ws: Sequence[float], bound: float, *, inclusive: bool = True) -> list[list[int]]:
    """``seg`` cut into the points at or under ``bound`` (under, if not ``inclusive``) and the rest."""
    below = [ws[i] <= bound if inclusive else ws[i] < bound for i in seg]
    lo, hi = [i for i, b in zip(seg, below) if b], [i for i, b in zip(seg, below) if not b]
    return [s for s in (lo, hi) if s]


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def detect_levels(curve: pd.DataFrame, *, cache_sizes: Mapping[str, int], memory_name: str = "DRAM",
                  step: float = 0.15, min_points: int = 2, memory_factor: float = MEMORY_FACTOR) -> pd.DataFrame:
    """Find the plateaus of a bandwidth curve and name them after the level that holds them.

    ``curve`` needs ``working_set_bytes`` and ``bytes_per_s`` (one kernel); ``cache_sizes``
    maps level names to the capacity available to the run (``{"L1": 96 << 10, ...}``, as
    :func:`perfkit.core.caches.cpu_cache_sizes` reads it).
    Method: smooth log-bandwidth with a running median of 3 (one outlier cannot make or break a
    plateau), start a new segment wherever a point leaves the current segment's median by more
    than ``step`` (relative), split at the total cache capacity C and at ``memory_factor`` × C,
    keep segments of at least ``min_points`` points. A segment within C is named by the first
    level (in level order) whose capacity, its own plus the lower levels' (non-inclusive caches),
    holds its median working set; the points at >= ``memory_factor`` × C are one plateau,
    ``memory_name``, however noisy; between the
    two a stream is fed by the caches in part (:mod:`perfkit.core.caches`), and belongs to no
    level. So DRAM/HBM appears only when the sweep went that far, and the last plateau of a
    shorter sweep keeps its cache's name; ``attrs["note"]`` then says why there is no memory level.
    With no cache sizes plateaus are named ``P1``, ``P2``... Same-named segments are merged. Per
    plateau: the median bandwidth, ``iqr`` (median of the points' ``bytes_per_s_iqr`` if given,
    else the spread of the plateau), ``noisy``, its span and ``working_set_bytes`` of its most
    typical point.
    """
    columns = ["level", "bytes_per_s", "iqr", "noisy", "working_set_bytes", "working_set_min_bytes",
               "working_set_max_bytes", "points"]
    if missing := {"working_set_bytes", "bytes_per_s"} - set(curve.columns):
        raise BadInputError(f"curve lacks column(s) {sorted(missing)}")
    if curve.get("kernel") is not None and curve["kernel"].nunique() > 1:
        raise BadInputError("curve holds several kernels; pass one kernel's rows")
    if step <= 0 or min_points < 1 or memory_factor < 1:
        raise BadInputError("need step > 0, min_points >= 1 and memory_factor >= 1")
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
    capacities = cache_capacities(cache_sizes)
    total = max(capacities.values(), default=None)
    memory_from = None if total is None else memory_factor * total
    if total is not None:
        segments = [part for seg in segments for part in _split_at(seg, ws, total)]
        segments = [part for seg in segments for part in _split_at(seg, ws, memory_from, inclusive=False)]
        # At or past memory_from every point is memory-fed by definition: one plateau, whose
        # spread (contention on a shared machine) is noise for its IQR, not a level change.
        memory = [i for seg in segments if ws[seg[0]] >= memory_from for i in seg]
        segments = [seg for seg in segments if ws[seg[0]] < memory_from] + ([memory] if memory else [])
    named: dict[str, list[int]] = {}
    for seg in (s for s in segments if len(s) >= min_points):
        mid = statistics.median(ws[i] for i in seg)
        if total is None:
            name = f"P{len(named) + 1}"
        elif ws[seg[0]] >= memory_from:
            name = memory_name
        elif ws[seg[-1]] > total:
            continue  # past the caches, short of memory_from: fed by both
        else:
            name = next(lvl for lvl, cap in capacities.items() if mid <= cap)
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
    out = pd.DataFrame(rows, columns=columns)
    out.attrs["note"] = _note(named, memory_name, ws, total, memory_from, memory_factor)
    return out


def _note(named, memory_name: str, ws: Sequence[float], total, memory_from, factor: float) -> str | None:
    """Why the levels hold no ``memory_name`` plateau, or None when they do."""
    if memory_name in named:
        return None
    if total is None:
        return f"cache sizes unknown: plateaus numbered P1..., none named {memory_name}"
    top = max(ws, default=0)
    why = (f"the sweep's largest working set {_size(top)} is under {factor:g} x the caches' "
           f"{_size(total)} = {_size(memory_from)}" if top < memory_from
           else f"fewer plateau points than needed at or past {_size(memory_from)}")
    between = sum(total < w < memory_from for w in ws)
    part = f"; {between} point(s) past the caches, still fed by them in part, belong to no level" if between else ""
    return f"no {memory_name} level: {why}{part}"
