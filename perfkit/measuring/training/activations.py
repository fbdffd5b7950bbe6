"""The activations a training step holds: predicted from the workload's shapes, and measured.

**Activations**: the tensors autograd saves in forward for backward, counted per model from its
shapes (the method of Korthikanti et al. 2022, section 4.1, for this code: no dropout, and CPU/
flash SDPA saves q, k, v, its output and the logsumexp, never the T×T scores; the per-block
count is 4 + (4 + 2·mlp_ratio)/tp elements per token and d_model unit), at 4 bytes per
element in fp32/tf32/fp8 and 2 in bf16-pure; norm statistics, logsumexp and the fp32 loss
inputs at 4, token indices at 8. Under bf16/fp16 autocast the residual stream stays fp32, and
each Linear saves a 16-bit copy of its weight (when its input needs a gradient) and of an fp32
input: 1.57× the plain 16-bit count for the default transformer, which this model once missed.
FSDP2 gathering 16-bit weights under fp32/tf32 casts the inputs too: every activation is
16-bit, as in bf16-pure. With activation checkpointing each block keeps its input only, and one block's activations are
recomputed at a time in backward. Under ``pp`` a rank holds, at once, the saved bytes of the
microbatches its stages have run forward and not yet backward, in the order the schedule runs
them (:func:`perfkit.measuring.training.pipeline_stages.rank_actions`: GPipe all m, 1F1B p − r on rank r,
Interleaved1F1B torch's warm-up count); the zero-bubble schedules have no model (NaN, with the
reason). Beside them, :func:`backward_transient_bytes`: what the step holds at the start of backward
beyond the saved tensors (the model's output and a pair of gradients), which
:mod:`perfkit.measuring.training.memory_model` adds to find the peak. Not counted: the other
transient buffers (the weights' gradients beside a block's, the loss's 16-bit casts), the pipeline's receive buffers, the allocator's caching and fragmentation. ``convnet`` has no activation model.

**Measured** (:class:`SavedActivationMeter`), the same way on every device: the peak of the bytes
autograd holds saved over the last warm-up step, FSDP2's gathered parameters excluded
(``activation_bytes_measured``; where it cannot,
:func:`activation_measure_reason` says why). :mod:`perfkit.measuring.training.memory_model` puts both
beside the model state.
"""

from __future__ import annotations

import contextlib
import math

import torch

__all__ = ["activation_bytes", "backward_transient_bytes", "pipeline_rank_bytes", "activation_measure_reason", "SavedActivationMeter",
           "step_meter"]

#: The workloads with an activation model (the convnet has none).
MODELLED = ("mlp", "transformer")


def _element_bytes(precision: str) -> int:
    """Bytes per activation element: 16-bit under bf16/fp16 autocast and bf16-pure, else 4."""
    return 2 if precision in ("bf16", "fp16", "bf16-pure") else 4


def _activation_precision(cfg) -> str | None:
    """The precision whose accounting ``cfg``'s saved tensors follow: its own, except that FSDP2
    gathering 16-bit weights under fp32/tf32 (:attr:`~perfkit.measuring.training.config.TrainConfig.compute_dtype`
    bf16/fp16) casts the inputs too, so every activation is 16-bit without autocast's fp32
    residual and weight copies: bf16-pure's. None: fp8 with 16-bit gathers, not modelled."""
    gathered = cfg.compute_dtype in ("bf16", "fp16") and cfg.precision in ("fp32", "tf32")
    if cfg.precision == "fp8" and cfg.fsdp_param_dtype in ("bfloat16", "float16"):
        return None
    return "bf16-pure" if gathered else cfg.precision


def _saved_parts(spec, b: int, precision: str, tp: int) -> tuple[list[int], int, int]:
    """Bytes autograd saves for a batch of ``b`` without checkpointing: per block, for the stem
    and for the head with the loss (``spec`` one of :data:`MODELLED`).

    Under bf16/fp16 autocast each Linear saves a 16-bit copy of its weight (cast once per
    forward) and of an fp32 input, and the transformer's residual stream stays fp32."""
    e, autocast = _element_bytes(precision), precision in ("bf16", "fp16")
    if spec.name == "mlp":
        widths = [spec.in_features] + [spec.hidden_features] * (spec.depth - 1) + [spec.out_features]
        # Each Linear saves its input (autocast: the first one's fp32 input as a 16-bit copy), a
        # ReLU its output: the next Linear's input (one tensor in one process; on a pipeline
        # stage boundary, one on each side: see _stage_bytes). mse_loss saves its fp32 input and
        # target. The weight copy is saved for the input's gradient: none for the first layer.
        weights = [w_in * w_out * e if autocast and i else 0
                   for i, (w_in, w_out) in enumerate(zip(widths, widths[1:]))]
        return [b * w * e + c for w, c in zip(widths, weights)], 0, 2 * b * spec.out_features * 4
    if spec.name == "transformer":  # the only other one of MODELLED
        t, d, v, r = spec.seq_len, spec.d_model, spec.vocab_size, spec.mlp_ratio
        btd = b * t * d
        # Per block, split by TP: q, k, v, the SDPA output (out_proj's input: its head-merging
        # reshape is a view, SDPA returns a (b, t, h, q) layout), fc1 out, GELU out (r·d each);
        # whole: fp32 norm statistics (2 per token per LayerNorm) and logsumexp (1 per head and
        # token, split by TP). Then x, ln1 out, ln2 in, ln2 out (4 of b·t·d) in the compute
        # dtype; under autocast x and ln2 in are fp32, the norms' outputs are not saved but
        # q, k, v and fc1 each save their own 16-bit copy of one, beside the weight copies.
        block = (4 * btd + 2 * r * btd) // tp * e + (4 * b * t + b * (spec.n_heads // tp) * t) * 4
        if autocast:
            block += 2 * btd * 4 + 4 * btd * e + (4 + 2 * r) * d * d // tp * e
        else:
            block += 4 * btd * e
        # Stem: token and position indices (int64). Head: ln_f input and output (autocast: the
        # fp32 input and lm_head's 16-bit copies of the output and of its weight), ln_f
        # statistics, the fp32 log-softmax of the logits cross_entropy saves, its int64 targets.
        norm = btd * 4 + btd * e + d * v * e if autocast else 2 * btd * e
        head = norm + 2 * b * t * 4 + b * t * v * 4 + b * t * 8
        return [block] * spec.n_layers, (b * t + t) * 8, head
    raise ValueError(f"no activation model for {spec.name}")


def _backward_transient(spec, b: int, precision: str, tp: int = 1) -> int:
    """Bytes beside the saved activations at the step's peak, in backward: the model's output,
    which the step holds until its backward is done (16-bit under autocast), and the larger of
    the loss's gradient pair in fp32 (at the log-softmax's output and input, or mse's) and a
    block's widest pair of activation gradients (at the GELU's or ReLU's output and input, in
    the activations' dtype; the head's saved tensors freed by then). Compared category by
    category with the fake-tensor step (``memory_fit.predict``): the transformer's 10 bytes a
    logit this model missed put the H200's predicted edge 47 % above the measured one (2816
    against 1920 samples), the mlp's two hidden-width gradients half its peak at large batches."""
    e = _element_bytes(precision)
    if spec.name == "transformer":
        out = b * spec.seq_len * spec.vocab_size
        head_saved = out * 4  # the log-softmax's fp32 output, freed with the loss's backward
        widest = b * spec.seq_len * spec.mlp_ratio * spec.d_model // tp
    else:
        out = b * spec.out_features
        head_saved = 2 * out * 4  # mse's input and target
        widest = b * spec.hidden_features if spec.depth > 1 else 0
    return out * e + max(8 * out, 2 * widest * e - head_saved)


def _stage_bytes(spec, parts: tuple[list[int], int, int], lo: int, hi: int, *, first: bool,
                 last: bool, b: int, e: int) -> int:
    """Saved bytes of one microbatch on the pipeline stage of blocks [lo, hi)."""
    blocks, stem, head = parts
    out = sum(blocks[lo:hi]) + (stem if first else 0) + (head if last else 0)
    if spec.name == "mlp" and not last:  # the stage's last ReLU output, sent on, saved here too
        out += b * spec.hidden_features * e
    return out


def pipeline_rank_bytes(cfg, spec, b: int) -> list[float]:
    """Per rank, the most bytes autograd holds saved at once in a step: each stage's
    per-microbatch bytes, added at its forward and freed at its backward in the rank's order
    (:func:`perfkit.measuring.training.pipeline_stages.rank_actions`)."""
    from perfkit.measuring.training import pipeline_stages as ps

    parts, e = _saved_parts(spec, b, cfg.precision, 1), _element_bytes(cfg.precision)
    n_stages = cfg.world_size * cfg.stages_per_rank
    bounds = ps.stage_bounds(ps.n_blocks(spec), n_stages)
    per_stage = [_stage_bytes(spec, parts, lo, hi, first=i == 0, last=i == n_stages - 1, b=b, e=e)
                 for i, (lo, hi) in enumerate(bounds)]
    out = []
    for rank in range(cfg.world_size):
        live = peak = 0
        for kind, stage in ps.rank_actions(cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank,
                                           cfg.n_microbatches, rank):
            live += per_stage[stage] if kind == "F" else -per_stage[stage]
            peak = max(peak, live)
        out.append(float(peak))
    return out


def activation_bytes(cfg, *, batch_per_rank: int | None = None) -> tuple[float, str | None]:
    """(predicted saved-activation bytes per rank, None) for ``cfg``, or (NaN, why not); see the
    module docstring for what is counted. Under ``pp`` the rank holding the most, and
    ``batch_per_rank`` is the microbatch."""
    from perfkit.measuring.training.pipeline_stages import rank_actions
    from perfkit.measuring.training.config import workload_spec

    spec, mode = workload_spec(cfg), _activation_precision(cfg)
    if spec.name not in MODELLED:
        return math.nan, f"no activation model for {spec.name} ({' and '.join(MODELLED)} have one)"
    if mode is None:
        return math.nan, (f"no activation model for fp8 with fsdp_param_dtype {cfg.fsdp_param_dtype} "
                          "(torchao's casts beside 16-bit gathers)")
    e = _element_bytes(mode)
    if cfg.parallelism == "pp":
        b = cfg.batch_size // cfg.n_microbatches if batch_per_rank is None else batch_per_rank
        if rank_actions(cfg.pp_schedule, cfg.world_size, cfg.stages_per_rank, cfg.n_microbatches, 0) is None:
            return math.nan, (f"no activation model for {cfg.pp_schedule}: its split backward keeps "
                              "graphs past their weight-gradient step (measured: they grow with the "
                              "microbatch count); activation_bytes_measured has the real peak")
        return max(pipeline_rank_bytes(cfg, spec, b)), None
    b = cfg.batch_size // cfg.dp_size if batch_per_rank is None else batch_per_rank
    blocks, stem, head = _saved_parts(spec, b, mode, cfg.tp_size)
    if not cfg.activation_checkpointing:
        return float(sum(blocks) + stem + head), None
    if spec.name == "mlp":
        # Checkpointed, the inputs stay and one block's ReLU output is recomputed at a time.
        recomputed = b * spec.hidden_features * e if spec.depth > 1 else 0
        return float(sum(blocks) + recomputed + head), None
    # Checkpointed: every block's input (fp32 under autocast), and one block recomputed (its
    # input counted once).
    btd_x = b * spec.seq_len * spec.d_model * (4 if mode in ("bf16", "fp16") else e)
    return float(spec.n_layers * btd_x + blocks[0] - btd_x + stem + head), None


def backward_transient_bytes(cfg, *, batch_per_rank: int | None = None) -> float:
    """The bytes beyond :func:`activation_bytes` the step holds at the start of backward (the
    model's output and the loss's gradients: see ``_backward_transient``), per rank; NaN where the
    activations have no model. Under ``pp`` the last stage's, per microbatch."""
    from perfkit.measuring.training.config import workload_spec

    spec, mode = workload_spec(cfg), _activation_precision(cfg)
    if spec.name not in MODELLED or mode is None:
        return math.nan
    if cfg.parallelism == "pp":
        b = cfg.batch_size // cfg.n_microbatches if batch_per_rank is None else batch_per_rank
    else:
        b = cfg.batch_size // cfg.dp_size if batch_per_rank is None else batch_per_rank
    return float(_backward_transient(spec, b, mode, cfg.tp_size if cfg.parallelism != "pp" else 1))


def activation_measure_reason(cfg) -> str | None:
    """Why :class:`SavedActivationMeter` does not measure ``cfg``'s step (NaN, this reason),
    or None when it does (on the last warm-up step)."""
    if cfg.warmup_steps < 1:
        return "no warm-up step to measure on (warmup_steps is 0): the hooks would slow a timed step"
    if cfg.parallelism == "pp" and cfg.warmup_steps < 2:
        return ("under pp, measured on the second warm-up step (the first also runs torch's shape "
                "inference, whose graph the first stage keeps): set warmup_steps >= 2")
    if cfg.compile:
        return "not measured under torch.compile (compiled graphs save tensors below the hooks)"
    if cfg.activation_checkpointing:
        return "not measured with activation checkpointing (its recomputation installs its own hooks)"
    if cfg.parallelism not in ("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "pp"):
        return (f"not measured under {cfg.parallelism} (DTensor shards of tensor parallel are "
                "saved like activations)")
    return None


def step_meter(cfg, step: int, params, gathered=None):
    """A :class:`SavedActivationMeter` for training step ``step`` of ``cfg`` when it is the step
    measured (the last warm-up step, where :func:`activation_measure_reason` allows), else a
    null context: ``with step_meter(...) as meter:``, then ``meter`` is None or has the peak.
    ``gathered``: see :class:`SavedActivationMeter`."""
    if step == cfg.warmup_steps - 1 and activation_measure_reason(cfg) is None:
        return SavedActivationMeter(params, gathered)
    return contextlib.nullcontext()


class _Held:
    """A saved tensor as autograd keeps it while the meter is on; its release is the count's."""

    __slots__ = ("tensor", "_meter", "_ptr")

    def __init__(self, tensor: torch.Tensor, meter: "SavedActivationMeter", ptr: int):
        self.tensor, self._meter, self._ptr = tensor, meter, ptr

    def __del__(self):  # autograd dropped it: backward freed the graph
        self._meter._release(self._ptr)


class SavedActivationMeter:
    """The bytes autograd holds saved for backward on this rank, live, and their peak
    (``peak_bytes``): distinct storages (a tensor saved twice, or views of one storage, count
    once), the given parameters' storages excluded. ``with meter:`` installs
    ``torch.autograd.graph.saved_tensors_hooks`` (thread-local) around forward passes; a saved
    tensor counts until autograd drops it (backward frees the graph).

    ``gathered`` (FSDP2: :func:`perfkit.measuring.training.memory_model.fsdp_gathered` of the model), called
    at every pack and unpack, returns (bytes of unsharded parameters held now, their storage
    pointers): those storages are parameters, not activations, and the peak of the bytes over
    the samples is ``gather_peak_bytes`` (0 without FSDP2)."""

    def __init__(self, params, gathered=None):
        # FSDP2's sharded parameters are DTensors: their local shards' storages.
        self._params = {(p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
                        for p in params}
        self._live: dict[int, list[int]] = {}  # storage pointer -> [bytes, saved references]
        self.now_bytes = self.peak_bytes = self.gather_peak_bytes = 0
        self._gathered = gathered
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    def _sample(self) -> set[int]:
        if self._gathered is None:
            return set()
        held, ptrs = self._gathered()
        self.gather_peak_bytes = max(self.gather_peak_bytes, held)
        return ptrs

    def _pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._sample() or ptr == 0 or ptr in self._params:
            return tensor
        entry = self._live.setdefault(ptr, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.now_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.now_bytes)
        entry[1] += 1
        return _Held(tensor, self, ptr)

    def _unpack(self, held):
        self._sample()  # in backward: the block computing and the one prefetched
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, ptr: int) -> None:
        entry = self._live[ptr]
        entry[1] -= 1
        if entry[1] == 0:
            self.now_bytes -= entry[0]
            del self._live[ptr]
