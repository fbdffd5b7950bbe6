"""A measured step re-costed at another data-parallel degree: DDP and ZeRO-3 by what-if replay.

The base is one rank's :class:`~perfkit.analyse.step_graph.StepGraph` (a configuration measured
without collectives, at the per-rank batch to predict: weak scaling, each rank's compute as
measured). Onto it go the collectives the layout adds at ``world_size`` ranks, each a task of its
own lane costed by a :class:`~perfkit.analyse.network_model.NetworkModel`, with the dependencies
the wrapper has; the graph is then replayed (Lumos, Liang et al. MLSys 2025, §4: re-costed tasks on
a measured dependency graph).

**DDP** (PyTorch's ``DistributedDataParallel``, Li et al., VLDB 2020, §3.2): gradients are
all-reduced in buckets of ``bucket_cap_mb`` (the first bucket 1 MiB,
``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), in reverse parameter order, each launched when
its gradients are ready (after the device task that produced them has ended); what runs after
backward waits for the last, where ``Reducer::finalize_backward`` waits (``torch/csrc/distributed/c10d/
reducer.cpp``): GradScaler's ``unscale_`` and ``clip_grad_norm_`` cannot overlap it. A base traced
with DDP on one rank keeps its own all-reduces (gloo spans, or NCCL/RCCL kernels), re-costed.
Assumed: gradients become ready evenly in bytes over the measured backward.

**ZeRO-3** (Rajbhandari et al., SC 2020, §5.3; as FSDP2's ``fully_shard`` per block and the root,
Zhao et al., VLDB 2023): each unit's parameters are all-gathered before its forward and again
before its backward (the next unit's gather issued as a unit starts: FSDP2's prefetch of one),
its gradients reduce-scattered after its backward, the optimizer updates 1/p of the parameters.
Assumed: the blocks hold the non-embedding parameters evenly, the root the rest; forward and
backward spend equal time per block; all-gathers and reduce-scatters each on a lane of their own
(NCCL/RCCL streams), or one lane on gloo (a process group runs its collectives one at a time). FSDP2
issues them with ``async_op=False`` (``FSDPParamGroup.unshard_async_op``, its prefetches too): on a
device that only orders streams, but on a CPU step ``work.wait()`` blocks the issuing thread, so
there each collective is waited for by the next compute and none overlaps it.

**TP** (Megatron-LM, Shoeybi et al. 2019, §3: a block's attention and MLP each a column-parallel
projection then a row-parallel one): the base's compute in forward and backward is divided by the
tensor-parallel degree t, but for the ops a Megatron plan leaves replicated (norms, embeddings, the
loss: by the aten op a task ran under, a kernel by its launch's, :data:`_REPLICATED`; an RMSNorm
written as ``pow``/``mean``/``mul`` ops, as Hugging Face's is, cannot be told from the rest and is
divided), and each block adds two all-reduces of the activations
(tokens × hidden × activation bytes) in forward, after its attention and after its MLP, and two in
backward (the input gradients of the column-parallel projections), each on the critical path: the
next compute waits for it. The optimizer steps 1/t of the parameters. The batch is the base's on
every rank (strong scaling of one replica): efficiency is the base step ÷ (t × the predicted step).
Assumed: the blocks' compute split evenly; the projections' matmuls dominate what is divided.

Not modelled (said in :attr:`Prediction.assumptions`): pipeline parallelism here (re-costed from a
pipeline row: :mod:`.predict_pipeline`), TP × DP, sequence parallelism, the wrappers' own host work
(bucket copies, FSDP's copy-in/out, DTensor's dispatch), contention between a collective and compute
for the same cores or memory, stragglers.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field

import numpy as np

from perfkit.analyse.network_model import NetworkModel
from perfkit.analyse.step_graph import COMM, DEVICE, HOST, ISSUE, THREAD, WAIT, StepGraph, replay
from perfkit.core.errors import BadInputError

__all__ = ["LAYOUTS", "ModelFacts", "Prediction", "median_prediction", "what_if"]

LAYOUTS = ("ddp", "zero3", "tp")
#: Ops a Megatron plan does not shard (their time is kept under TP): by the aten op a task ran under.
_REPLICATED = re.compile(r"norm|embedding|cross_?entropy|nll_?loss|log_?softmax", re.IGNORECASE)
_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class ModelFacts:
    """What the rows say about the model the graph ran."""

    n_params: int
    n_params_non_embedding: int | None = None
    n_blocks: int | None = None
    param_bytes: int = 4
    """Bytes per parameter as gathered (4: fp32; FSDP's ``param_dtype`` makes it 2)."""
    grad_bytes: int = 4
    """Bytes per gradient element as reduced (4: fp32 gradients, also under autocast)."""
    bucket_cap_mb: float = 25.0
    tokens_per_rank: float = math.nan
    """Tokens (or samples) one rank's step processes, for throughput."""
    hidden_size: int | None = None
    """The activations' width (TP's all-reduces move tokens × hidden)."""
    act_bytes: int = 4
    """Bytes per activation element (2 under bf16/fp16 autocast)."""


@dataclass
class Prediction:
    layout: str
    world_size: int
    step_s: float
    compute_s: float
    """The step replayed with every added collective free: compute as the graph costs it."""
    exposed_comm_s: float
    comm_s: float
    """Every added collective's time, overlapped or not."""
    collectives: int
    tokens_per_s: float
    assumptions: list[str] = field(default_factory=list)
    weak_scaling_efficiency: float = math.nan
    """Data parallelism (each rank's batch kept): base step ÷ predicted step."""
    strong_scaling_efficiency: float = math.nan
    """TP (one replica's batch shared by t ranks): base step ÷ (t × predicted step)."""
    busy_share: float = math.nan
    """Pipelines: the share of the step a rank computes (:mod:`.predict_pipeline`)."""
    bubble_s: float = 0.0
    """Pipeline ranks idle in the schedule's fill and drain (0 for data parallelism)."""
    detail: dict = field(default_factory=dict)
    """What else defines the predicted point (a pipeline's schedule and microbatches)."""


def _compute_nodes(g: StepGraph) -> list[int]:
    """What the collectives wait for and what waits for them, in issue order: the device's tasks
    (not its communication kernels) where the step ran on a device, else the host's leaves (on a
    CPU the ops are the compute)."""
    device = [i for i in range(len(g)) if g.kind[i] == DEVICE and not g.is_comm(i)]
    nodes = device or [i for i in range(len(g)) if g.kind[i] == HOST]
    return sorted(nodes, key=lambda i: (_time_key(g, i), i))


def _time_key(g: StepGraph, i: int) -> float:
    """When a compute node was issued: a device task by its launch, a host leaf by its start."""
    launch = g.launcher(i) if g.kind[i] == DEVICE else -1
    return g.start_measured_us[launch if launch >= 0 else i]


class _Editor:
    """Adds a layout's collectives to a copy of the base graph, each with the edges it has: after
    the task that produced what it carries (its device-side end, in the replay's topological order)
    and before the task that waits for it."""

    def __init__(self, g: StepGraph):
        self.g = copy.deepcopy(g)
        self.nodes = _compute_nodes(self.g)
        self.on_host = not any(self.g.kind[i] == DEVICE for i in self.nodes)
        """The step computed on its host (a CPU): no streams for a collective to overlap on."""
        self.keys = np.array([_time_key(self.g, i) for i in self.nodes])  # sorted: anchors across streams
        self.added: list[int] = []
        self.producer: dict[int, int] = {}

    def before(self, t_us: float) -> int:
        """The last compute node issued at or before ``t_us`` (the first one if none)."""
        k = int(np.searchsorted(self.keys, t_us, side="right")) - 1
        return self.nodes[max(k, 0)]

    def after(self, t_us: float) -> int | None:
        """The first compute node issued at or after ``t_us`` (None past the last)."""
        k = int(np.searchsorted(self.keys, t_us, side="left"))
        return self.nodes[k] if k < len(self.nodes) else None

    def collective(self, *, op: str, lane: str, size_bytes: float, world_size: int, network: NetworkModel,
                   after: int | None, at_us: float) -> int:
        lane_nodes = [i for i in self.added if self.g.lane[i] == lane]
        n = self.g.add(name=f"{op} {size_bytes:.0f} B", kind=COMM, lane=lane, start_us=at_us,
                       dur_us=network.time_s(op, size_bytes, world_size) * 1e6,
                       release_us=at_us if after is None else -np.inf, op=op, nbytes=size_bytes)
        if lane_nodes:  # one lane runs its collectives in order
            self.g.edge(lane_nodes[-1], n, THREAD)
        if after is not None:  # starts when its producer's work has ended, where the replay puts that
            self.g.edge(after, n, ISSUE)
            self.producer[n] = after
        self.added.append(n)
        return n

    def wait(self, node: int | None, collective: int) -> None:
        if node is None:
            return
        if self.producer.get(collective) == node:  # a task cannot wait for what it produces: the next one does
            k = self.nodes.index(node) + 1
            if k >= len(self.nodes):
                return
            node = self.nodes[k]
        self.g.edge(collective, node, WAIT)

    def scale(self, nodes, factor: float) -> None:
        for i in nodes:
            self.g.dur_us[i] *= factor


def _phases(g: StepGraph) -> tuple[float, float, float, tuple[float, float] | None]:
    """(forward start, backward start, backward end, optimizer span) in measured µs."""
    if "backward" not in g.phases:
        raise BadInputError(f"{g.path}: ProfilerStep#{g.step} has no autograd functions: not a training step "
                            "to predict a data-parallel layout from")
    b0, b1 = g.phases["backward"]
    f0 = g.phases["zero_grad"][1] if "zero_grad" in g.phases else g.start_us
    return f0, b0, b1, g.phases.get("optimizer")


def _ddp(e: _Editor, facts: ModelFacts, p: int, net: NetworkModel) -> list[str]:
    _, b0, b1, opt = _phases(e.g)
    total = facts.n_params * facts.grad_bytes
    cap = facts.bucket_cap_mb * 1024 * 1024
    sizes, left = [], total
    while left > 0:
        size = min(left, _FIRST_BUCKET_BYTES if not sizes else cap)
        sizes.append(size)
        left -= size
    measured = sorted((i for i in range(len(e.g)) if e.g.is_comm(i) and e.g.op[i] == "all_reduce"),
                      key=lambda i: (e.g.start_measured_us[i], i))
    if measured:  # the wrapper ran on one rank: its all-reduces as issued, re-costed at p ranks
        share = [total / len(measured)] * len(measured) if len(measured) != len(sizes) else sizes
        for i, size in zip(measured, share):
            e.g.dur_us[i] = net.time_s("all_reduce", size, p) * 1e6
            e.g.bytes[i] = size
            e.added.append(i)
        last = measured[-1]
        how = (f"the {len(measured)} all-reduces the one-rank trace issued, re-costed"
               + ("" if len(measured) == len(sizes) else f" with the gradients split evenly among them ({len(sizes)} buckets expected)"))
    else:
        done = 0.0
        for size in sizes:
            done += size
            ready = b0 + (b1 - b0) * done / total
            last = e.collective(op="all_reduce", lane="ddp all_reduce", size_bytes=size, world_size=p, network=net,
                                after=e.before(ready), at_us=ready)
        how = "added as the gradients become ready: evenly in bytes over the measured backward"
    # Reducer::finalize_backward waits for every bucket at the end of backward: what runs after it
    # (GradScaler's unscale_, clip_grad_norm_, the optimizer) cannot overlap the last all-reduce.
    waiter = e.after(b1)
    if waiter is not None and waiter not in measured:
        e.wait(waiter, last)
    return [f"DDP: {how}; {len(sizes)} gradient buckets ({total / 2**20:.3g} MiB of {facts.grad_bytes}-byte gradients, "
            f"first 1 MiB then {facts.bucket_cap_mb:g} MiB); the first task after backward waits for the last "
            "(Reducer::finalize_backward)"]


def _zero3(e: _Editor, facts: ModelFacts, p: int, net: NetworkModel) -> list[str]:
    f0, b0, b1, opt = _phases(e.g)
    blocks = facts.n_blocks or 1
    body = facts.n_params_non_embedding if facts.n_params_non_embedding else facts.n_params
    units = [facts.n_params - body] + [body / blocks] * blocks if facts.n_params > body else [body / blocks] * blocks
    n = len(units)
    # gloo runs a process group's collectives one at a time on its thread, and FSDP2 gathers and
    # reduce-scatters on one group: one lane. NCCL/RCCL run them on streams of their own.
    serial = net.backend == "gloo"
    ag_lane, rs_lane = ("zero3 collectives",) * 2 if serial else ("zero3 all_gather", "zero3 reduce_scatter")
    blocking = e.on_host  # FSDP2's async_op=False collectives block a CPU step's thread (module docstring)
    fwd = [f0 + (b0 - f0) * k / n for k in range(n + 1)]
    bwd = [b0 + (b1 - b0) * k / n for k in range(n + 1)]
    for k, params in enumerate(units):  # forward: unit k's gather issued as unit k-1 starts
        issue = fwd[max(k - 1, 0)]
        ag = e.collective(op="all_gather", lane=ag_lane, size_bytes=params * facts.param_bytes,
                          world_size=p, network=net, after=e.before(issue) if k else None, at_us=issue)
        e.wait(e.after(issue if blocking else fwd[k]), ag)
    # Backward, in the order issued (one lane runs them so): unit j's gather as unit j-1's backward
    # starts (the root's parameters stay gathered after forward), its reduce-scatter as its own
    # backward ends, before the next unit's prefetch issued then.
    backward = [(bwd[j + 1], 0, "reduce_scatter", params * facts.grad_bytes, bwd[j + 1])
                for j, params in enumerate(reversed(units))]
    backward += [(bwd[max(j - 1, 0)], 1, "all_gather", params * facts.param_bytes, bwd[j])
                 for j, params in enumerate(reversed(units)) if not (n > blocks and j == n - 1)]
    last = None
    for issue, _, op, size, needed in sorted(backward, key=lambda t: t[:2]):
        c = e.collective(op=op, lane=ag_lane if op == "all_gather" else rs_lane, size_bytes=size, world_size=p,
                         network=net, after=e.before(issue), at_us=issue)
        if op == "reduce_scatter":
            last = c
        if op == "all_gather" or blocking:
            e.wait(e.after(issue if blocking else needed), c)
    start = opt[0] if opt else b1
    e.wait(e.after(start), last)
    if opt:
        e.scale([i for i in e.nodes if opt[0] <= _time_key(e.g, i) <= opt[1]], 1.0 / p)
    return [f"ZeRO-3: {n} units ({blocks} blocks with {body / blocks / 1e6:.3g} M parameters each"
            + (f", the root {units[0] / 1e6:.3g} M" if n > blocks else "") + "), forward and backward split evenly among them; "
            f"{facts.param_bytes}-byte gathers, {facts.grad_bytes}-byte reduce-scatters, prefetch of one unit"
            + ("; gloo: gathers and reduce-scatters one at a time on the group's thread" if serial else
               "; gathers and reduce-scatters on streams of their own")
            + ("; a CPU step: each collective blocks the thread that issued it (FSDP2's async_op=False), none "
               "overlaps compute" if blocking else ""),
            "ZeRO-3: the optimizer's compute scaled by 1/world size (each rank updates its shard: a bandwidth-bound "
            "update; a small model's optimizer is bound by its per-tensor dispatch, which does not shrink)",
            "ZeRO-3: FSDP2's own work around each collective (copying shards into the gather's buffer and out of it, "
            "its Python hooks) is not added: a one-rank base has none of it (FSDP2 gathers nothing at world size 1)"]


def _tp(e: _Editor, facts: ModelFacts, t: int, net: NetworkModel) -> list[str]:
    f0, b0, b1, opt = _phases(e.g)
    if not facts.hidden_size:
        raise BadInputError("TP needs the activations' width: the rows have no model_hidden_size or model_d_model")
    blocks = facts.n_blocks or 1
    size = facts.tokens_per_rank * facts.hidden_size * facts.act_bytes
    sharded = [i for i in e.nodes if f0 <= _time_key(e.g, i) <= b1 and not _REPLICATED.search(e.g.aten[i])]
    kept = sum(e.g.dur_us[i] for i in e.nodes if f0 <= _time_key(e.g, i) <= b1) - sum(e.g.dur_us[i] for i in sharded)
    e.scale(sharded, 1.0 / t)
    if opt:
        e.scale([i for i in e.nodes if opt[0] <= _time_key(e.g, i) <= opt[1]], 1.0 / t)
    # Two all-reduces a block in each direction: halfway through it and at its end.
    points = [lo + (hi - lo) * (k + h) / blocks for lo, hi in ((f0, b0), (b0, b1))
              for k in range(blocks) for h in (0.5, 1.0)]
    for at in points:
        ar = e.collective(op="all_reduce", lane="tp all_reduce", size_bytes=size, world_size=t, network=net,
                          after=e.before(at), at_us=at)
        e.wait(e.after(at), ar)
    return [f"TP: forward and backward compute divided by {t} but {kept / 1e3:.3g} ms of norms, embeddings and the "
            f"loss (replicated); the optimizer's by {t}",
            f"TP: {4 * blocks} all-reduces of {size / 2**20:.3g} MiB ({facts.tokens_per_rank:g} tokens x "
            f"{facts.hidden_size} x {facts.act_bytes} B), two a block in forward and two in backward, each waited for",
            "TP: the batch of the base on every rank (one replica, strong scaling)"]


def what_if(base: StepGraph, *, layout: str, world_size: int, network: NetworkModel, facts: ModelFacts) -> Prediction:
    """The base graph with ``layout``'s collectives at ``world_size`` ranks, replayed."""
    if layout not in LAYOUTS:
        raise BadInputError(f"--layout {layout!r}: predicted layouts are {', '.join(LAYOUTS)}")
    ran = sorted({str(base.op[i]) for i in range(len(base)) if base.kind[i] == COMM})
    if ran and (layout != "ddp" or "all_reduce" not in ran or not set(ran) <= {"all_reduce", "broadcast"}):
        raise BadInputError(f"{base.path}: the step already runs {', '.join(ran)}: predict {layout} from a configuration "
                            "without collectives, or DDP from DDP on one rank")
    base_s = replay(base)[0] / 1e6
    e = _Editor(base)
    notes = {"ddp": _ddp, "zero3": _zero3, "tp": _tp}[layout](e, facts, world_size, network)
    step_s = replay(e.g)[0] / 1e6
    free = copy.deepcopy(e.g)
    for i in e.added:
        free.dur_us[i] = 0.0
    compute_s = replay(free)[0] / 1e6
    comm_s = sum(e.g.dur_us[i] for i in e.added) / 1e6
    replicas = 1 if layout == "tp" else world_size  # TP: every rank works on the one replica's batch
    if layout != "tp":
        notes += [f"weak scaling: each rank's batch and compute as measured on one rank ({base.path})"]
    efficiency = base_s * replicas / (world_size * step_s)
    sizes = _message_sizes(e, network, world_size)
    notes += [f"{m['op']}: {m['outside']} of {m['count']} messages outside the sizes the network measured ({m['flag']})"
              for m in sizes if m["outside"]]
    return Prediction(detail={"message_sizes": sizes}, layout=layout, world_size=world_size, step_s=step_s, compute_s=compute_s,
                      exposed_comm_s=max(0.0, step_s - compute_s), comm_s=comm_s, collectives=len(e.added),
                      tokens_per_s=facts.tokens_per_rank * replicas / step_s, assumptions=notes,
                      weak_scaling_efficiency=efficiency if layout != "tp" else math.nan,
                      strong_scaling_efficiency=efficiency if layout == "tp" else math.nan)


def _message_sizes(e: _Editor, network: NetworkModel, world_size: int) -> list[dict]:
    """Per collective op the layout added: how many, their size range, and how many lie outside the
    sizes the network measured (with the farthest one's flag)."""
    by_op: dict[str, list[float]] = {}
    for i in e.added:
        if e.g.bytes[i] == e.g.bytes[i]:
            by_op.setdefault(str(e.g.op[i]), []).append(float(e.g.bytes[i]))
    out = []
    for op, sizes in by_op.items():
        flags = [(network.size_flag(op, b, world_size), b) for b in sizes]
        outside = [(f, b) for f, b in flags if f]
        far = min(outside, key=lambda fb: fb[1])[0] if outside else None
        out.append({"op": op, "count": len(sizes), "min_bytes": min(sizes), "max_bytes": max(sizes),
                    "outside": len(outside), "flag": far})
    return out


def median_prediction(predictions: list[Prediction]) -> Prediction:
    """One prediction from those of each traced step: each time the median of theirs (the mean of
    the middle two for an even count), the exposed communication what the median step leaves over
    the median compute; the rest from the step whose prediction is the median's lower neighbour."""
    import statistics

    if not predictions:
        raise ValueError("no predictions to take the median of")
    ordered = sorted(predictions, key=lambda p: p.step_s)
    pick = ordered[(len(ordered) - 1) // 2]
    med = {name: statistics.median(getattr(p, name) for p in predictions)
           for name in ("step_s", "compute_s", "comm_s", "tokens_per_s", "weak_scaling_efficiency",
                        "strong_scaling_efficiency", "busy_share", "bubble_s")}
    out = copy.copy(pick)
    for name, value in med.items():
        setattr(out, name, value)
    out.exposed_comm_s = max(0.0, out.step_s - out.compute_s)
    if len(predictions) > 1:
        out.assumptions = list(pick.assumptions) + [
            f"the median of {len(predictions)} traced steps' predictions ({', '.join(f'{p.step_s * 1e3:.2f}' for p in ordered)} ms)"]
    return out
