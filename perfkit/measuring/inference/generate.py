"""Inference benchmark: prefill and decode of a GPT with a KV cache, one configuration to one row.

A decoder-only transformer from :mod:`perfkit.measuring.workloads.synthetic` (``TransformerConfig``,
weights seeded) generates exactly ``new_tokens`` tokens greedily after a ``prompt_len``-token
prompt for each of ``batch_size`` sequences (:func:`perfkit.measuring.inference.kv_cache.generate`): with
the per-layer KV cache (``kv_cache=True``) or recomputing the whole sequence every step
(``kv_cache=False``, the comparison). ``warmup_runs`` generations run untimed (compilation,
allocator, thread pools), then ``timed_runs`` generations, each with a timestamp per token,
alternate with as many one-token generations (optimum-benchmark's prefill). TTFT, TPOT, ITL,
end-to-end latency and the throughputs follow vLLM's definitions
(:mod:`perfkit.analyse.inference`; TPOT = (e2e − TTFT)/(N − 1): the prefill cancels out).

**Roofline.** One prefill and one decode step are counted by
:class:`perfkit.measuring.ops.counting.OpCounter` on the eager forward (FLOP and minimum bytes of
every aten op, :mod:`perfkit.measuring.ops.op_formulas`): the prefill of the prompt, and the decode
step at the middle of the generation (it attends to ``prompt_len + new_tokens // 2`` keys, the
mean over the generation's decode steps, whose cost is linear in the position). Their times
are TTFT and TPOT; :func:`perfkit.analyse.roofline.roofline_points` places them under the
ceilings (``prefill_*`` and ``decode_*`` columns). Decode reads every weight and the KV cache
once per token, so at batch 1 its intensity is 2 FLOP per weight read (0.5 FLOP/byte in fp32,
memory bound) and it grows with the batch; prefill reuses each weight over ``batch × prompt``
tokens and sits near the compute roof. Under ``compile`` the counts are still the eager ones (fused
kernels move fewer intermediate bytes, so a compiled point's intensity is a lower bound).

**Defaults** (``model_size`` over :data:`MODEL_DEFAULTS`: 4 layers, d_model 256, 4 heads, vocab
512; 3.4 M parameters, 13.8 MB in fp32). Chosen so that on 2 CPU cores a generation takes
milliseconds per token and both regimes show: a decode step reads 13.8 MB of weights against
2·L·t·d·4 = 4.2 MB of KV cache at t = 512 (batch 1), so TPOT grows by ~1.2× at most from a
128- to a 512-token prompt, while a 128-token prefill already runs 0.9 GFLOP of matmuls, so TTFT
grows about linearly with the prompt (attention's quadratic term is a quarter of the work at 512).

**Encoder–decoders** (``hf:t5``, ``hf:bart``, ``hf:whisper``): the prompt is the encoder's input
(``prompt_len`` tokens, or whisper's ``prompt_len`` positions of log-mel features), the decoder
generates N tokens after its start token; the prefill point is the encoder plus the first decoder
token, the decode point one decoder step over the self-attention cache and the encoder's
cross-attention keys and values (``kv_cache_bytes`` counts both).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from perfkit.analyse.inference import latency_metrics
from perfkit.core import checks
from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.core.status import OK, error_row, raise_for_status  # noqa: F401 - the notebook calls inference.raise_for_status
from perfkit.measuring.inference import cache_size
from perfkit.measuring.inference import kv_cache as kv
from perfkit.measuring.workloads import catalog
from perfkit.measuring.workloads import synthetic as workloads
from perfkit.measuring.workloads.user import UserModelSpec

__all__ = ["WORKLOAD", "PRECISIONS", "CEILINGS", "MODEL_DEFAULTS", "GENERATING_TASKS", "InferenceConfig",
           "configs_from_params", "check_params", "unsupported_reason",
           "build_model", "prompt_tokens", "prompt_inputs", "measure_roofs", "run_inference",
           "raise_for_status"]

#: The ``workload`` column of every inference row.
WORKLOAD = "inference"
#: Precisions: weights, activations and KV cache in this dtype (tf32: fp32 with TF32 matmuls).
PRECISIONS = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
              "bf16": torch.bfloat16, "fp16": torch.float16}
#: How the roofs are obtained: ``none`` (spec sheet / theoretical only: a CPU then has no
#: memory roof), ``fast`` (one matmul shape, STREAM around the decode working set: seconds),
#: ``quick`` (``perfkit peaks``' quick search; ~30 s on 2 CPU cores).
CEILINGS = ("none", "fast", "quick")
#: Hugging Face tasks that generate: decoder-only LMs and encoder–decoders (text and speech).
GENERATING_TASKS = ("causal-lm", "seq2seq-lm", "speech-seq2seq")
#: The model's size over the workload's tiny defaults (see the module docstring for why).
MODEL_DEFAULTS = {"n_layers": 4, "d_model": 256, "n_heads": 4, "vocab_size": 512}


@dataclass(kw_only=True, frozen=True)
class InferenceConfig:
    """One inference configuration. Every field becomes a column of the row."""

    model: str = "transformer"
    """perfkit's decoder (``transformer``, :data:`MODEL_DEFAULTS`) or a Hugging Face causal LM
    ``hf:<model_type>`` (random weights from its config; its own KV cache: transformers'
    ``StaticCache`` where the family compiles full-graph, else ``DynamicCache``;
    :mod:`perfkit.measuring.inference.hf_steps`), or an encoder–decoder (``hf:t5``, ``hf:bart``:
    the prompt is the encoder's input; ``hf:whisper``: ``prompt_len`` encoder positions, its
    ``max_source_positions``, of ``2·prompt_len`` log-mel frames), generating after its decoder's
    start token: TTFT is the encoder plus the first token."""
    batch_size: int = 1
    """Sequences generated together (all with the same prompt length, no padding)."""
    prompt_len: int = 128
    """Prompt tokens per sequence (P): the prefill's length."""
    new_tokens: int = 16
    """Tokens generated per sequence (N), exactly: greedy, no early stop."""
    precision: str = "fp32"
    """``fp64``, ``fp32``, ``tf32`` (GPU), ``bf16``, ``fp16``: weights, activations and cache."""
    kv_cache: bool = True
    """True: prefill once, then one token per step from the KV cache. False: every step
    recomputes the whole sequence (``GPT.forward``), the baseline the cache beats."""
    compile: bool = False
    """``torch.compile`` the step (prefill and decode); compilation happens in the warm-up."""
    compile_mode: str | None = None
    """``torch.compile`` mode (None: default; ``reduce-overhead`` uses CUDA graphs on a GPU)."""
    sdpa_backend: str = "auto"
    """``auto``, ``math``, ``flash``, ``efficient`` or ``cudnn``
    (:data:`perfkit.measuring.inference.kv_cache.SDPA_BACKENDS`); a backend without a kernel for this
    device and dtype ends the configuration ``skipped`` (a CPU has math and flash)."""
    model_size: Mapping[str, object] = field(default_factory=dict)
    """``TransformerConfig`` fields over :data:`MODEL_DEFAULTS` (``n_layers``, ``d_model``,
    ``n_heads``, ``vocab_size``, ``mlp_ratio``, ``bias``); ``seq_len`` is P + N, ``seed`` below.
    ``hf:``: the config's fields (``hidden_size``, ``num_hidden_layers``, ...)."""
    warmup_runs: int = 1
    """Untimed generations first (and as many untimed prefills)."""
    timed_runs: int = 3
    """Timed generations, each alternating with a timed one-token generation (prefill)."""
    seed: int = 0
    """Seeds the weights and the prompts."""
    device: str = "auto"
    """``auto`` (a GPU if any, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int = 0
    """CPU threads torch computes with during the run (``torch.set_num_threads``, restored
    after); 0 keeps torch's. On shared cores 1 is the steady choice: a 2-thread OpenMP region
    waits for a preempted neighbour (0.06 s became 2-4 s per generation at load 5 on 2 cores)."""
    count_ops: bool = True
    """Count the FLOP and bytes of a prefill and a decode step for the roofline."""
    ceilings: str = "fast"
    """How :func:`measure_roofs` obtains the roofs: one of :data:`CEILINGS`."""

    def __post_init__(self):
        object.__setattr__(self, "model_size", dict(self.model_size))
        checks.integer_at_least("batch_size", self.batch_size, 1)
        checks.integer_at_least("prompt_len", self.prompt_len, 1)
        checks.integer_at_least("new_tokens", self.new_tokens, 1)
        checks.integer_at_least("warmup_runs", self.warmup_runs, 0)
        checks.integer_at_least("timed_runs", self.timed_runs, 1)
        checks.integer_at_least("seed", self.seed, 0)
        checks.integer_at_least("threads", self.threads, 0)
        checks.one_of("precision", self.precision, tuple(PRECISIONS))
        checks.one_of("sdpa_backend", self.sdpa_backend, tuple(kv.SDPA_BACKENDS))
        checks.one_of("ceilings", self.ceilings, CEILINGS)
        if not (self.device in ("auto", "cpu", "cuda") or str(self.device).startswith("cuda:")):
            raise BadInputError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        if self.compile_mode is not None and not self.compile:
            raise BadInputError("compile_mode is set but compile is False: set compile True")
        if self.compile and self.warmup_runs < 1:
            raise BadInputError("compile needs warmup_runs >= 1, or compilation would be timed")
        if {"seq_len", "seed"} & set(self.model_size):
            raise BadInputError("model_size sets neither seq_len (it is prompt_len + new_tokens) "
                                "nor seed (set seed on the config)")
        family = catalog.family_of(self.model)
        if self.model != "transformer" and family != "hf":
            raise BadInputError(f"inference runs perfkit's 'transformer' or a Hugging Face causal LM "
                                f"'hf:<model_type>', got {self.model!r}")
        spec = self.spec  # unknown or bad size names fail here, before any work
        if family == "hf":
            from perfkit.measuring.workloads.hf import model_type_of, task_of

            catalog.check(spec)  # the model_type, the config's keys, positions for P + N
            task = task_of(model_type_of(spec.target))
            if task not in GENERATING_TASKS:
                raise BadInputError(f"{self.model} is a {task} model: inference generates "
                                    "with causal LMs (hf:llama, hf:qwen2, hf:gpt2, ...) and encoder-decoders "
                                    "(hf:t5, hf:bart, hf:whisper)")

    @property
    def spec(self) -> workloads.TransformerConfig | UserModelSpec:
        """The workload's spec: :data:`MODEL_DEFAULTS` and ``model_size``, positions for P + N."""
        if self.model == "hf:whisper":  # its encoder's positions are the prompt (module docstring)
            given = self.model_size.get("max_source_positions", self.prompt_len)
            if given != self.prompt_len:
                raise BadInputError(f"hf:whisper encodes prompt_len positions ({self.prompt_len}) but model_size sets "
                                    f"max_source_positions {given}: set one of them, or both equal")
            return catalog.make(self.model, {**self.model_size, "max_source_positions": self.prompt_len},
                                seed=self.seed, seq_len=self.new_tokens + 1)
        if self.model != "transformer":
            return catalog.make(self.model, self.model_size, seed=self.seed,
                                seq_len=self.prompt_len + self.new_tokens)
        return workloads.make_spec("transformer", **{**MODEL_DEFAULTS, **self.model_size,
                                                     "seq_len": self.prompt_len + self.new_tokens,
                                                     "seed": self.seed})

    def as_row(self) -> dict:
        """Fields as columns; ``model_size`` as the resolved ``model_<name>`` sizes."""
        row = asdict(self)
        row.pop("model_size")
        spec = self.spec
        if isinstance(spec, UserModelSpec):
            row.update({f"model_{k}": v for k, v in spec.sizes.items()}, model_family=spec.family,
                       **catalog.package_versions(spec.family))
            return row
        row.update({f"model_{k}": getattr(spec, k) for k in
                    ("n_layers", "d_model", "n_heads", "vocab_size", "mlp_ratio", "bias")},
                   model_family="builtin")
        return row


_NOTEBOOK_ONLY = {"batch_sizes"}


def configs_from_params(params: Mapping[str, object]) -> list[InferenceConfig]:
    """The configurations of the notebook's parameters: one per value of ``batch_sizes`` (a
    list) when given, else one; every other name is a field of :class:`InferenceConfig`."""
    names = {f for f in InferenceConfig.__dataclass_fields__}
    unknown = set(params) - names - _NOTEBOOK_ONLY
    if unknown:
        raise BadInputError(f"unknown inference parameter(s) {sorted(unknown)}; valid: "
                            f"{', '.join(sorted(names | _NOTEBOOK_ONLY))}")
    fields = {k: v for k, v in params.items() if k in names}
    sizes = params.get("batch_sizes")
    if sizes is None:
        return [InferenceConfig(**fields)]
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise BadInputError(f"batch_sizes must be a non-empty list of integers, got {sizes!r}")
    return [InferenceConfig(**{**fields, "batch_size": b}) for b in sizes]


def check_params(params: dict) -> None:
    """Raise :class:`BadInputError` when the notebook's parameters make no valid configuration
    (called by the runner before any kernel starts: notebook metadata ``perfkit.check``)."""
    configs_from_params(params)


# ---- device support --------------------------------------------------------------------------

def _device(cfg: InferenceConfig) -> str:
    from perfkit.core.devices import resolve_device

    return resolve_device(cfg.device)


def unsupported_reason(cfg: InferenceConfig) -> str | None:
    """Why this machine cannot honour ``cfg`` (for a ``skipped`` row), or None."""
    from perfkit.core.precision import support_reason
    from perfkit.measuring.kernels.ceilings import compute_dtypes

    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        return f"device {cfg.device!r} requested but no CUDA/ROCm device is visible"
    device = _device(cfg)
    if cfg.precision == "tf32":
        reason = compute_dtypes(device)["tf32"] or support_reason("tf32", device)
        if reason:
            return reason
    if device.startswith("cuda") and cfg.precision == "bf16" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support"
    if cfg.sdpa_backend != "auto":
        return kv.sdpa_backends(device)[cfg.sdpa_backend]
    return None


@contextlib.contextmanager
def _threads(threads: int):
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- the model, its prompts and its counted steps ---------------------------------------------

def build_model(cfg: InferenceConfig, device: str | None = None) -> torch.nn.Module:
    """The model of ``cfg`` (weights from ``cfg.seed``) on ``device`` in ``cfg``'s dtype, in eval mode."""
    work = catalog.build(cfg.spec, device=device or _device(cfg), dtype=PRECISIONS[cfg.precision])
    return work.model.eval()


def _vocab_size(cfg: InferenceConfig) -> int:
    spec = cfg.spec
    if isinstance(spec, UserModelSpec):
        from perfkit.measuring.workloads.hf import hf_config

        return int(hf_config(spec)[0].vocab_size)
    return spec.vocab_size


def prompt_tokens(cfg: InferenceConfig, device: str | None = None) -> torch.Tensor:
    """``[batch_size, prompt_len]`` prompt ids drawn from ``cfg.seed`` on the CPU (the same on
    every device and in every precision), then moved to ``device``."""
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, _vocab_size(cfg), (cfg.batch_size, cfg.prompt_len), generator=gen)
    return ids.to(device or _device(cfg))


def prompt_inputs(cfg: InferenceConfig, model: torch.nn.Module,
                  device: str | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """``(prompt, source)``: a decoder-only model's prompt ids and no source; an encoder–decoder's
    decoder start tokens ``[batch_size, 1]`` and its encoder's input — :func:`prompt_tokens`
    (t5, bart) or whisper's log-mel features ``[batch_size, num_mel_bins, 2·prompt_len]``
    (Gaussian, from ``cfg.seed``, in the model's dtype)."""
    from perfkit.measuring.inference.hf_steps import is_encoder_decoder

    if not is_encoder_decoder(model):
        return prompt_tokens(cfg, device), None
    from perfkit.measuring.workloads.hf_tasks import decoder_start_id

    device = device or _device(cfg)
    start = torch.full((cfg.batch_size, 1), decoder_start_id(model.config), device=device)
    if "input_features" not in inspect.signature(model.get_encoder().forward).parameters:
        return start, {"input_ids": prompt_tokens(cfg, device)}
    gen = torch.Generator().manual_seed(cfg.seed)
    features = torch.randn((cfg.batch_size, model.config.num_mel_bins, 2 * cfg.prompt_len), generator=gen)
    return start, {"input_features": features.to(device, next(model.parameters()).dtype)}


# ---- roofs and the roofline placement ---------------------------------------------------------

def measure_roofs(cfg: InferenceConfig) -> pd.DataFrame:
    """The ceilings table for ``cfg``'s points, as ``cfg.ceilings`` says (:data:`CEILINGS`).

    Always the reference rows (spec sheet on a GPU, theoretical peak on a CPU); ``fast`` and
    ``quick`` add the measured compute roof of ``cfg.precision`` and the measured memory roofs.
    ``fast`` measures one matmul (1024³ on a CPU, 8192³ on a GPU) instead of searching shapes;
    the memory roofs of both are the machine's, from the STREAM triad's default sweep and level
    rule (:func:`perfkit.measuring.kernels.ceilings.measure_ceilings`), the same as the roofline
    notebook's: DRAM only at >= 8× the caches, never a working set an L3 holds.
    A precision without a measured roof here (fp16 on a CPU) keeps the reference rows only.
    """
    from perfkit.measuring.kernels.ceilings import compute_dtypes, measure_ceilings
    from perfkit.measuring.kernels.peaks import peaks_table

    device = _device(cfg)
    table = peaks_table(device, measure=False)
    if cfg.ceilings == "none" or compute_dtypes(device).get(cfg.precision) is not None:
        return table
    if cfg.ceilings == "quick":
        measured = measure_ceilings(device, quick=True, dtypes=[cfg.precision])
    else:
        n = 1024 if device == "cpu" else 8192
        measured = measure_ceilings(device, quick=True, dtypes=[cfg.precision], shapes=[(n, n, n)])
    return pd.concat([table.dropna(axis=1, how="all"), measured.assign(device=table["device"].iloc[0])],
                     ignore_index=True)


# ---- the run ---------------------------------------------------------------------------------

def _generations(cfg: InferenceConfig, model, prompt, device: str, source=None):
    """Warm-up, then timed generations alternating with timed prefills (one-token generations,
    same cache size): (timestamps per generation, prefill seconds, last tokens, the first warm-up
    generation: its margins and top logits, untimed; None without a warm-up)."""
    step = kv.default_step(model, cfg.kv_cache, source)
    if cfg.compile:
        step = torch.compile(step, mode=cfg.compile_mode)
    sync = kv.synchronizer(device)
    total = prompt.shape[1] + cfg.new_tokens

    def gen(n: int, margins: bool = False) -> kv.Generation:
        return kv.generate(model, prompt, n, kv_cache=cfg.kv_cache, step=step, synchronize=sync,
                           max_len=total, margins=margins)

    scored = None
    try:
        for i in range(cfg.warmup_runs):
            out = gen(cfg.new_tokens, margins=i == 0)  # how near a tie each greedy choice was: untimed
            scored = out if i == 0 else scored
            gen(1)
    except RuntimeError as err:
        if any(text in str(err) for text in kv.NO_KERNEL):
            raise ConfigurationSkipped(f"sdpa_backend {cfg.sdpa_backend!r} has no kernel for "
                                       f"{cfg.precision} on {device}: {str(err).splitlines()[0]}") from None
        raise
    stamps, prefill = [], []
    for _ in range(cfg.timed_runs):  # alternating, so drift hits both alike
        out = gen(cfg.new_tokens)
        stamps.append(out.timestamps_s)
        first = gen(1).timestamps_s
        prefill.append(first[1] - first[0])
    return stamps, prefill, out.tokens, scored


def _run(cfg: InferenceConfig, ceilings: pd.DataFrame | None) -> dict:
    from perfkit.core.devices import detect
    from perfkit.core.precision import math_mode
    from perfkit.measuring.ops.counting import coverage
    from perfkit.measuring.ops.roofline_step import phase_columns

    device = _device(cfg)
    info = detect(device)
    on_device = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()
    with math_mode(cfg.precision), on_device, kv.sdpa_context(cfg.sdpa_backend), torch.no_grad(), \
            _threads(cfg.threads):
        threads = torch.get_num_threads()
        model = build_model(cfg, device)
        prompt, source = prompt_inputs(cfg, model, device)
        stamps, prefill, tokens, scored = _generations(cfg, model, prompt, device, source)
        counts = (kv.count_steps(model, prompt, cfg.new_tokens, kv_cache=cfg.kv_cache, source=source)
                  if cfg.count_ops else {})
        cache = cache_size.cache_columns(cfg, model, prompt, source, PRECISIONS[cfg.precision].itemsize) if cfg.kv_cache else {}
    metrics = latency_metrics(stamps, batch_size=cfg.batch_size, prompt_len=cfg.prompt_len,
                              prefill_samples_s=prefill)
    roofline, reasons = {}, []
    for phase, time_s in (("prefill", metrics["ttft_s"]), ("decode", metrics["tpot_s"])):
        cols, reason = phase_columns(phase, counts.get(phase), time_s, ceilings, cfg.precision)
        roofline.update(cols)
        reasons.append(reason)
    placed = [r for r in reasons if r]
    uncounted = sorted({u.op for ops in counts.values() for u in coverage(ops).uncounted})
    return {
        **cfg.as_row(), "workload": WORKLOAD, "status": OK, "error": None, **metrics, **roofline,
        "resolved_device": device, "device_name": info.name, "cpu_threads": threads,
        "sdpa_backends_available": ", ".join(k for k, v in kv.sdpa_backends(device).items() if v is None),
        "n_params": sum(p.numel() for p in model.parameters()),
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        **(cache if cfg.kv_cache else {"kv_cache_bytes": 0, "state_bytes": 0}),
        # Equal digests: equal greedy tokens (with and without the cache, across precisions).
        "tokens_digest": hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()[:16],
        # The ids themselves ([batch, N] flattened): perfkit compare's numerics say where two sides part.
        "greedy_token_ids": tokens.cpu().reshape(-1).tolist(),
        # How near a tie each choice was (top-1 minus top-2 logit, and the top-1 logit), from the
        # untimed warm-up: where two precisions part, a near-tie is rounding, not a defect.
        **({"greedy_margins": scored.margins.cpu().reshape(-1).tolist(),
            "greedy_top_logits": scored.top_logits.cpu().reshape(-1).tolist()} if scored is not None else {}),
        "roofline_reason": "; ".join(dict.fromkeys(placed)) or None,
        "uncounted_ops": ", ".join(uncounted),
    }


def run_inference(cfg: InferenceConfig, ceilings: pd.DataFrame | None = None) -> dict:
    """Run ``cfg`` and return one row, whatever happens (``status``: ok, skipped, oom, failed).

    ``ceilings`` (:func:`measure_roofs`) places the prefill and decode points on the roofline;
    without them the counted FLOP, bytes and achieved rates are still in the row.
    """
    base = {**cfg.as_row(), "workload": WORKLOAD, "error": None}
    try:
        reason = unsupported_reason(cfg)
        if reason:
            raise ConfigurationSkipped(reason)
        return _run(cfg, ceilings)
    except Exception as error:  # noqa: BLE001 - the row records every ending
        return error_row(base, error)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # after an OOM, give the next configuration a clean pool

