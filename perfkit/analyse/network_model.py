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

What the model does not know, and :attr:`Link.note` / :meth:`NetworkModel.extrapolation` say:
a group larger than the one measured crosses links the measurement did not (more nodes, another
switch tier); NCCL switches to tree algorithms at scale (log p latency: the ring's α term is an
upper bound there); an op never measured borrows the all-reduce's links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass(frozen=True)
class NetworkModel:
    links: dict[str, Link]
    source: str

    def time_s(self, op: str, size_bytes: float, world_size: int) -> float:
        """The ring cost of ``op`` over ``size_bytes`` among ``world_size`` ranks (0 for one rank).

        An op not measured is costed from those that were: an all-reduce as a reduce-scatter then
        an all-gather (the ring all-reduce is exactly that, Thakur et al. §4.4), an all-gather or a
        reduce-scatter on the other's links, else on the all-reduce's."""
        hops = ring_hops(op, world_size)  # refuses an op without a ring model
        if world_size <= 1 or size_bytes <= 0:
            return 0.0
        if op not in self.links and op == "all_reduce":
            return self.time_s("reduce_scatter", size_bytes, world_size) + self.time_s("all_gather", size_bytes, world_size)
        link = self.links.get(op) or self.links.get("all_gather" if op == "reduce_scatter" else "reduce_scatter") \
            or self.links["all_reduce"]
        return (hops * link.alpha_hop_s
                + busbw_factor(op, world_size) * size_bytes / link.bus_bytes_per_s)

    @property
    def measured_world_size(self) -> int:
        return max(link.world_size for link in self.links.values())

    def extrapolation(self, world_size: int) -> str | None:
        """What a prediction at ``world_size`` assumes beyond the measurement, or None."""
        measured = self.measured_world_size
        if world_size > measured:
            return (f"extrapolates {world_size / measured:g}x beyond the {measured} ranks the network was measured at: "
                    "links past them (more nodes, another switch tier) are assumed as fast")
        return None

    def size_flag(self, op: str, size_bytes: float) -> str | None:
        """Why ``size_bytes`` of ``op`` is outside what the network measured, or None."""
        link = self.links.get(op) or self.links.get("all_gather" if op == "reduce_scatter" else "reduce_scatter") \
            or self.links.get("all_reduce")
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
        out = [f"collectives: ring costs (Thakur, Rabenseifner & Gropp 2005) from {self.source}"]
        out += [f"{op}: {link.note}" for op, link in self.links.items()]
        for op in _MODELLED:
            if op in self.links:
                continue
            if op == "all_reduce":
                out.append("all_reduce: not fitted; costed as a reduce-scatter then an all-gather (the ring all-reduce)")
            else:
                other = "all_gather" if op == "reduce_scatter" else "reduce_scatter"
                out.append(f"{op}: not fitted; costed on {other if other in self.links else 'all_reduce'}'s links")
        return out


def _links_from_fits(fits: pd.DataFrame, source: str) -> dict[str, Link]:
    links: dict[str, Link] = {}
    for op, group in fits.groupby("op", sort=False):
        if op not in _MODELLED:
            continue
        ok = group[group["fit_ok"].astype(bool)]
        if ok.empty:
            continue
        if "inplace" in ok:  # out-of-place where measured: the form nccl-tests leads with
            outplace = ok[~ok["inplace"].astype(bool)]
            ok = outplace if not outplace.empty else ok
        row = ok.sort_values("world_size").iloc[-1]
        p0 = int(row["world_size"])
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
        note = (f"α {a / ring_hops(op, p0) * 1e6:.3g} us a hop, bus {busbw_factor(op, p0) / c / 1e9:.3g} GB/s, "
                f"fitted at {p0} ranks over {lo:.3g}-{hi:.3g} B" + how)
        links[str(op)] = Link(op=str(op), alpha_hop_s=a / ring_hops(op, p0), bus_bytes_per_s=busbw_factor(op, p0) / c,
                              world_size=p0, note=note, min_size_bytes=lo, max_size_bytes=hi)
    return links


def network_from_rows(rows: pd.DataFrame, source: str) -> NetworkModel:
    """The network measured by ``rows`` (perfkit's collectives rows, or nccl-tests' as
    :mod:`perfkit.ingest.nccl_tests` reads them); one line of :class:`BadInputError` when no
    all-reduce, all-gather or reduce-scatter fits well at 2 or more ranks."""
    from perfkit.analyse.commfit import fit_alpha_beta

    if rows.empty:
        raise BadInputError(f"--network {source}: no collective rows in it")
    links = _links_from_fits(fit_alpha_beta(rows), source)
    if not links:
        raise BadInputError(f"--network {source}: no all_reduce, all_gather or reduce_scatter with a good α-β fit "
                            "at 2 or more ranks to model the network from")
    return NetworkModel(links=links, source=source)
