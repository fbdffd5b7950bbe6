"""A collective's time at any message size and group size, from a fitted or imported network.

The ring algorithms' costs (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005, §3-4), with p ranks, n bytes (the
collective's size as nccl-tests counts it: an all-gather's whole output, a reduce-scatter's whole
input), α a hop's latency and B the bus bandwidth:

- all-gather, reduce-scatter: ``t = (p-1)·α + (p-1)/p · n/B``
- all-reduce (a reduce-scatter then an all-gather): ``t = 2(p-1)·α + 2(p-1)/p · n/B``

``(p-1)/p`` and ``2(p-1)/p`` are nccl-tests' busbw factors (``shared/reference/formulas.md``,
nccl-tests' PERFORMANCE.md): in this model the bus bandwidth B is the same at every p, which is
why nccl-tests reports it. A measured α-β fit at p0 ranks (``t = a + c·n``,
:func:`perfkit.analyse.commfit.fit_alpha_beta`) gives ``α = a / hops(p0)`` and
``B = factor(p0) / c``; any other p follows from the formulas.

**Two levels.** A table measured on one host is an intra-node network (NVLink, xGMI); one measured
across hosts (nccl-tests' ``#  Rank`` lines name them) an inter-node one, whose GPUs per node are its
ranks ÷ hosts. With both (``intra``, ``gpus_per_node``) a group that fits in one node is costed on
the intra-node links, a larger one on the inter-node links (a flat ring: every step crosses the
slowest link). With one, a group the other level would carry is costed on the one given and said:
an upper bound inside a node from an inter-node table, a lower bound across nodes from an
intra-node one.

**Each collective at its mean.** The α-β curve goes through each size's median (robust to the
outliers a fit must not follow), but a step pays every collective it waits for in full, outliers
included: a step's expected time sums its collectives' *means*. Where the rows keep their raw
samples (perfkit's own), each link carries its table's mean excess over the median
(:attr:`Link.tail_s`: every sample minus its size's median, averaged over all sizes, since the
outliers — a rank's thread woken late, a scheduler's tick — do not grow with the message), and
:meth:`NetworkModel.time_s` adds it once per collective. nccl-tests' tables print mean times
already (its ``time`` column averages the timed iterations): no excess is added to them. On a
2-core VM's gloo it is 0.2–0.7 ms a collective, as large as a small message's whole median time;
on NCCL between GPUs it is small.

**Backends that run one collective as another.** gloo has no reduce-scatter of its own:
``reduce_scatter_tensor`` runs as an all-reduce of the whole input (torch 2.13: a gloo
``_reduce_scatter_base`` is traced as ``gloo:all_reduce``; perfkit's gloo ZeRO-3 traces show only
``gloo:all_reduce`` and ``gloo:all_gather``). A gloo reduce-scatter table measures exactly that,
and is used as it is; where it has no fit, a gloo reduce-scatter is costed as an all-reduce of its
size, not on the all-gather's links.

What the model does not know, and :attr:`Link.note` / :meth:`NetworkModel.extrapolation` /
:meth:`NetworkModel.size_flag` say: a group larger than the one measured crosses links the
measurement did not (more nodes, another switch tier); NCCL switches to tree algorithms at scale
(log p latency: the ring's α term is an upper bound there); a message size outside those measured
(a latency the fit did not resolve is bounded by the smallest message's measured time); an op never
measured borrows the all-reduce's links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfkit.core.errors import BadInputError
from perfkit.core.formulas import busbw_factor

__all__ = ["Link", "NetworkModel", "ring_hops", "network_from_rows"]

_MODELLED = ("all_reduce", "all_gather", "reduce_scatter")


def ring_hops(op: str, world_size: int) -> int:
    """The latency terms of the ring algorithm (Thakur et al. 2005): 2(p-1) or p-1."""
    if op not in _MODELLED:
        raise BadInputError(f"no ring model for {op!r}; modelled: {', '.join(_MODELLED)}")
    return (2 if op == "all_reduce" else 1) * (world_size - 1)


@dataclass(frozen=True)
class Link:
    """One collective's per-hop latency and bus bandwidth, derived from a fit at ``world_size``."""

    op: str
    alpha_hop_s: float
    bus_bytes_per_s: float
    world_size: int
    note: str
    min_size_bytes: float = math.nan
    max_size_bytes: float = math.nan
    """The message sizes the fit measured: a prediction outside them is flagged (:meth:`NetworkModel.size_flag`)."""
    hosts: int = 0
    """The hosts the table ran on (0: not known, a perfkit folder's rows)."""
    tail_s: float = 0.0
    """The mean excess of a call's time over its size's median (0 where the table keeps no raw samples)."""


@dataclass(frozen=True)
class NetworkModel:
    links: dict[str, Link]
    source: str
    notes: tuple[str, ...] = ()
    """What reading the tables found (a run that failed, several runs of one op)."""
    intra: NetworkModel | None = None
    """The intra-node network, where one was given beside this inter-node one."""
    gpus_per_node: int | None = None
    backend: str | None = None
    """The library that measured it (gloo, nccl, rccl) where the rows say."""

    @property
    def hosts(self) -> int:
        return max((link.hosts for link in self.links.values()), default=0)

    def level(self, world_size: int) -> NetworkModel:
        """The network a group of ``world_size`` ranks runs on: the intra-node one where it fits in a node."""
        if self.intra is not None and self.gpus_per_node and world_size <= self.gpus_per_node:
            return self.intra
        return self

    def time_s(self, op: str, size_bytes: float, world_size: int) -> float:
        """The mean time of ``op`` over ``size_bytes`` among ``world_size`` ranks (0 for one rank): its
        ring cost plus its link's mean excess over the median (:attr:`Link.tail_s`), once.

        An op not measured is costed from those that were (a gloo reduce-scatter first as the
        all-reduce gloo runs, :meth:`runs_as`): an all-reduce as a reduce-scatter then an all-gather
        (the ring all-reduce is exactly that, Thakur et al. §4.4), an all-gather or a reduce-scatter
        on the other's links, else on the all-reduce's."""
        if self.level(world_size) is not self:
            return self.level(world_size).time_s(op, size_bytes, world_size)
        ring_hops(op, world_size)  # refuses an op without a ring model
        if world_size <= 1 or size_bytes <= 0:
            return 0.0
        op = self.runs_as(op)
        if op not in self.links and op == "all_reduce":
            (rs, rs_link), (ag, ag_link) = (self._ring(o, size_bytes, world_size) for o in ("reduce_scatter", "all_gather"))
            return rs + ag + max(rs_link.tail_s, ag_link.tail_s)  # one call: one tail
        t, link = self._ring(op, size_bytes, world_size)
        return t + link.tail_s

    def runs_as(self, op: str) -> str:
        """The collective the backend runs for ``op``: gloo's reduce-scatter is an all-reduce where no
        reduce-scatter of its own was fitted (a fitted one measured exactly that)."""
        if op == "reduce_scatter" and self.backend == "gloo" and op not in self.links:
            return "all_reduce"
        return op

    def _link(self, op: str) -> Link | None:
        """The link ``op`` is costed on: its own, else the all-gather's and reduce-scatter's for each
        other, else the all-reduce's."""
        return (self.links.get(op) or self.links.get("all_gather" if op == "reduce_scatter" else "reduce_scatter")
                or self.links.get("all_reduce"))

    def _ring(self, op: str, size_bytes: float, world_size: int) -> tuple[float, Link]:
        """The ring time of ``op`` on its link (no tail), and that link."""
        link = self._link(op)
        return (ring_hops(op, world_size) * link.alpha_hop_s
                + busbw_factor(op, world_size) * size_bytes / link.bus_bytes_per_s), link

    @property
    def measured_world_size(self) -> int:
        return max(link.world_size for link in self.links.values())

    def extrapolation(self, world_size: int) -> str | None:
        """What a prediction at ``world_size`` assumes beyond the measurement, or None."""
        level = self.level(world_size)
        if level is not self:
            return level.extrapolation(world_size)
        out = []
        gpn = self.gpus_per_node or (self.measured_world_size // self.hosts if self.hosts > 1 else None)
        if self.hosts > 1 and gpn and world_size <= gpn:
            out.append(f"{world_size} ranks fit in one node ({gpn} GPUs a node): costed on the inter-node links of "
                       f"{self.source}, no intra-node table given (--network-intra): an upper bound")
        measured = self.measured_world_size
        if world_size > measured:
            what = ("one node: no inter-node table given, links between nodes are assumed as fast as inside one "
                    "(a lower bound)" if self.hosts == 1 else
                    "links past them (more nodes, another switch tier) are assumed as fast")
            out.append(f"extrapolates {world_size / measured:g}x beyond the {measured} ranks the network was measured at: "
                       + what)
        return "; ".join(out) or None

    def size_flag(self, op: str, size_bytes: float, world_size: int | None = None) -> str | None:
        """Why ``size_bytes`` of ``op`` is outside what the network measured, or None."""
        if world_size is not None and self.level(world_size) is not self:
            return self.level(world_size).size_flag(op, size_bytes)
        link = self._link(self.runs_as(op))
        if link is None or not (link.min_size_bytes == link.min_size_bytes):
            return None
        if size_bytes < link.min_size_bytes:
            return (f"{size_bytes / 2**20:.3g} MiB is {link.min_size_bytes / size_bytes:.3g}x below the smallest {link.op} "
                    f"measured ({link.min_size_bytes / 2**20:.3g} MiB): latency-bound there, its α extrapolated")
        if size_bytes > link.max_size_bytes:
            return (f"{size_bytes / 2**20:.3g} MiB is {size_bytes / link.max_size_bytes:.3g}x above the largest {link.op} "
                    f"measured ({link.max_size_bytes / 2**20:.3g} MiB)")
        return None

    def assumptions(self) -> list[str]:
        where = {0: "", 1: " (one host: intra-node)"}.get(self.hosts, f" ({self.hosts} hosts: inter-node)")
        out = [f"collectives: ring costs (Thakur, Rabenseifner & Gropp 2005) from {self.source}{where}"]
        out += list(self.notes)
        if self.intra is not None:
            out += [f"groups of up to {self.gpus_per_node} ranks (one node): {a}" for a in self.intra.assumptions()]
        out += [f"{op}: {link.note}" for op, link in self.links.items()]
        tails = {op: link.tail_s for op, link in self.links.items() if link.tail_s > 0}
        if tails:
            out.append("each collective at its mean time: the median curve plus the measured mean excess over the median ("
                       + ", ".join(f"{op} {t * 1e6:.3g} us" for op, t in tails.items()) + "), once per call")
        for op in _MODELLED:
            if op in self.links:
                continue
            if op == "reduce_scatter" and self.runs_as(op) == "all_reduce":
                out.append("reduce_scatter: not fitted; gloo runs it as an all-reduce of the whole input: costed as one")
            elif op == "all_reduce":
                out.append("all_reduce: not fitted; costed as a reduce-scatter then an all-gather (the ring all-reduce)")
            else:
                other = "all_gather" if op == "reduce_scatter" else "reduce_scatter"
                out.append(f"{op}: not fitted; costed on {other if other in self.links else 'all_reduce'}'s links")
        return out


def _tail_s(rows: pd.DataFrame, fit: pd.Series, by: list[str]) -> float:
    """The mean over every raw sample of the fit's group, in-place and out-of-place alike (the
    outliers are the machine's, not the buffer's), of its excess over its size's median (0 where
    the rows keep no samples: nccl-tests' times are means already)."""
    if "time_samples_s" not in rows or "size_bytes" not in rows:
        return 0.0
    same = rows
    for key in by:
        if key != "inplace" and key in rows and key in fit.index:
            value = fit[key]
            same = same[same[key].isna()] if value is None or value != value else same[same[key] == value]
    excess = []
    for samples in same["time_samples_s"]:
        if not hasattr(samples, "__len__") or len(samples) < 3:  # None or NaN: a row without samples
            continue
        s = np.asarray(samples, dtype=float)
        s = s[np.isfinite(s)]
        excess.append(s - np.median(s))
    return float(np.concatenate(excess).mean()) if excess else 0.0


def _links_from_fits(fits: pd.DataFrame, source: str, notes: list[str], *, rejected: bool = False,
                     rows: pd.DataFrame | None = None, by: list[str] = ()) -> dict[str, Link]:
    """One link per op from its good fits; with ``rejected``, from the best of its rejected ones;
    each with its group's mean excess over the median where ``rows`` keep raw samples."""
    links: dict[str, Link] = {}
    for op, group in fits.groupby("op", sort=False):
        if op not in _MODELLED:
            continue
        ok = group[group["fit_ok"].astype(bool)] if not rejected else group.iloc[:0]
        poor = ""
        if ok.empty and rejected:  # every fit of this op rejected: still the best curve there is, said how poor
            usable = group[(group["world_size"] >= 2) & (group["model_time_per_byte_s"] > 0)]
            if usable.empty:
                continue
            ok = usable.sort_values("rel_rms_residual").iloc[:1]
            worst = float(ok["rel_rms_residual"].iloc[0])
            poor = (f"; its α-β fit was REJECTED ({ok['fit_note'].iloc[0]}; relative RMS residual {worst:.2f}): "
                    "predictions costed on it are as poor")
        if ok.empty:
            continue
        if "inplace" in ok:  # out-of-place where measured: the form nccl-tests leads with
            outplace = ok[~ok["inplace"].astype(bool)]
            ok = outplace if not outplace.empty else ok
        ok = ok.sort_values(["world_size", "run_index"] if "run_index" in ok else ["world_size"])
        row = ok.iloc[-1]
        p0 = int(row["world_size"])
        same = ok[ok["world_size"] == p0]
        if len(same) > 1 and "run_index" in same:
            notes.append(f"{op}: {len(same)} runs at {p0} ranks (runs {', '.join(str(int(r)) for r in same['run_index'])}), "
                         f"each fitted on its own; the network uses run {int(row['run_index'])}'s: pass one run's table "
                         "to choose another")
        if p0 < 2:
            continue
        a, c = float(row["model_alpha_s"]), float(row["model_time_per_byte_s"])
        if not (c > 0 and math.isfinite(c)):
            continue
        lo, hi = float(row["min_size_bytes"]), float(row["max_size_bytes"])
        how = ""
        if not bool(row["alpha_resolved"]):
            # The sizes measured do not resolve the latency: the fit's intercept is an artefact. The
            # smallest message's measured time bounds it (what alpha_upper_s is, commfit); used as such.
            bound = row.get("alpha_upper_s")
            bound = float(bound) if bound is not None and bound == bound else float(row.get("smallest_size_time_s", a))
            a = min(max(a, 0.0), bound) if a == a else bound
            how = (f"; α not resolved by the {lo / 2**20:.3g}-{hi / 2**20:.3g} MiB measured: bounded by the smallest "
                   f"message's time, {bound * 1e6:.3g} us (an upper bound on small messages' latency)")
        if not bool(row["beta_resolved"]):
            how += "; B not resolved by the sizes measured: the fit's curve is used"
        how += poor
        tail = max(_tail_s(rows, row, by), 0.0) if rows is not None else 0.0
        note = (f"α {a / ring_hops(op, p0) * 1e6:.3g} us a hop, bus {busbw_factor(op, p0) / c / 1e9:.3g} GB/s, "
                f"fitted at {p0} ranks over {lo:.3g}-{hi:.3g} B" + how)
        links[str(op)] = Link(op=str(op), alpha_hop_s=a / ring_hops(op, p0), bus_bytes_per_s=busbw_factor(op, p0) / c,
                              world_size=p0, note=note, min_size_bytes=lo, max_size_bytes=hi,
                              hosts=int(row["hosts"]) if "hosts" in row and row["hosts"] == row["hosts"] else 0,
                              tail_s=tail)
    return links


def network_from_rows(rows: pd.DataFrame, source: str, notes: list[str] | None = None) -> NetworkModel:
    """The network measured by ``rows`` (perfkit's collectives rows, or nccl-tests' as
    :mod:`perfkit.ingest.nccl_tests` reads them); one line of :class:`BadInputError` when no
    all-reduce, all-gather or reduce-scatter fits well at 2 or more ranks."""
    from perfkit.analyse.commfit import DEFAULT_BY, fit_alpha_beta

    if rows.empty:
        raise BadInputError(f"--network {source}: no collective rows in it")
    notes = list(notes or [])
    by = [c for c in (*DEFAULT_BY, "hosts") if c in rows]
    fits = fit_alpha_beta(rows, by=by)
    links = _links_from_fits(fits, source, notes, rows=rows, by=by)
    if not links:  # no good fit at all: the best rejected ones, marked, rather than no prediction
        links = _links_from_fits(fits, source, notes, rejected=True, rows=rows, by=by)
    if not links:
        raise BadInputError(f"--network {source}: no all_reduce, all_gather or reduce_scatter with an α-β fit "
                            "at 2 or more ranks to model the network from")
    backends = sorted({str(b) for b in rows["backend"].dropna()}) if "backend" in rows else []
    return NetworkModel(links=links, source=source, notes=tuple(notes), backend=backends[0] if len(backends) == 1 else None)
