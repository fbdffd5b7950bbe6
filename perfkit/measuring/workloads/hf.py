"""Hugging Face transformers models by ``model_type`` (``hf:llama``, ``hf:gpt2``, ``hf:bert``,
``hf:resnet``, ``hf:vit``, ...), built from their config with random weights: nothing downloads.

``AutoConfig.for_model(model_type, **model_size)`` and then the auto class the family has: a
causal LM (``AutoModelForCausalLM``), else a masked LM (encoders such as bert, whose causal-LM
class is a decoder variant), else an image classifier (``AutoModelForImageClassification``,
``num_labels`` and the images' ``image_size`` from ``model_size``). The tasks are perfkit's
learnable synthetic ones (:mod:`perfkit.measuring.workloads.synthetic`): next-token prediction
of arithmetic sequences for causal LMs, the tokens themselves for masked LMs, prototypes plus
noise for images. The loss is cross-entropy over ``output.logits`` in fp32.

Analytic FLOP of a text model, per token (PaLM appendix B, as perfkit's own transformer):
``6·N + 12·L·H·Q·T`` with N the parameters outside the embedding tables plus the lm head's
weight when it is tied to the token embedding (its matmul runs either way; norms and biases are
in N, a small overcount), L = ``num_hidden_layers``, H·Q = ``num_attention_heads · head_dim``,
T = ``seq_len``; the full T×T score matrix, not halved for the causal mask. Per sample: × T. A
vision model's FLOP are NaN with the reason: no 6N rule holds for convolutions or patches.
Blocks are found from the model (:func:`perfkit.measuring.workloads.user.find_blocks`: its
decoder or encoder layers, a ResNet's stages); the tensor-parallel plan is the family's
(``model._tp_plan``, ``colwise``/``rowwise`` entries; the embedding and lm head stay replicated).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from perfkit.core.errors import BadInputError
from perfkit.core.model_files import hf_local_config
from perfkit.measuring.workloads import hf_layers, hf_tasks
from perfkit.measuring.workloads.user import (UserModelSpec, find_blocks, image_task, non_embedding_params,
                                              seed_generator_batch)
from perfkit.measuring.workloads.workload import Workload, constructing_on

__all__ = ["build_hf", "check_hf", "hf_config", "task_of", "model_type_of", "config_file", "TEXT_FLOP_CONVENTION"]

TEXT_FLOP_CONVENTION = ("6N + 12·L·H·Q·T per token (PaLM app. B), the attention term per layer kind "
                        "(sliding window, latent attention, Gated DeltaNet, Mamba: "
                        "perfkit.measuring.workloads.hf_layers); N = parameters outside the "
                        "embedding tables + a tied lm head; a mixture of experts' routed experts at "
                        "top-k/E (active parameters)")
#: model_size keys perfkit takes itself for a vision model (not config fields of every family).
_VISION_OWN = ("image_size",)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise BadInputError("hf: models need Hugging Face transformers: pip install 'perfkit[hf]'") from None
    transformers.logging.set_verbosity_error()  # random-weight configs warn about token ids
    return transformers


def config_file(target: str) -> Path | None:
    """The ``config.json`` ``hf:<target>`` names, or None where it names a ``model_type``: a
    folder holding one or the file itself (``hf:./my-model/``, ``hf:/models/x/config.json``; a
    relative path is from where the run runs: a notebook's folder, as ``model_path``), else a hub
    id (``hf:org/name``) found in the local Hugging Face cache. Nothing is downloaded."""
    found = hf_local_config(target)
    if found is not None:
        if not found.is_file():
            raise BadInputError(f"hf:{target}: no config.json at {found.resolve()}: give a model's folder or its "
                                "config.json")
        return found.resolve()
    if "/" not in target:
        return None
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        raise BadInputError(f"hf:{target}: a hub id is read from the Hugging Face cache, and huggingface_hub "
                            "is not installed: pip install 'perfkit[hf]'") from None
    cached = try_to_load_from_cache(target, "config.json")
    if isinstance(cached, str):
        return Path(cached)
    raise BadInputError(f"hf:{target}: its config.json is not in the local Hugging Face cache "
                        f"({constants.HF_HUB_CACHE}) and perfkit downloads nothing: fetch it where there is a "
                        f"network (hf download {target} config.json), or give its folder: hf:./folder")


def _pretrained(target: str) -> tuple[str, dict, str | None]:
    """(model_type, the config file's fields, where they came from) of ``hf:<target>``."""
    found = config_file(target)
    if found is None:
        return target, {}, None
    import json

    try:
        fields = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise BadInputError(f"hf:{target}: {found} is not a readable JSON config ({error})") from None
    model_type = fields.pop("model_type", None) if isinstance(fields, dict) else None
    if not model_type:
        raise BadInputError(f"hf:{target}: {found} names no model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "auto_map"):
        fields.pop(key, None)
    return model_type, fields, str(found)


def model_type_of(target: str) -> str:
    """The ``model_type`` ``hf:<target>`` builds: the target itself, or its config file's."""
    return _pretrained(target)[0]


@functools.lru_cache(maxsize=None)
def _config_class(model_type: str):
    _transformers()  # first: a missing extra is one line naming it
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=5, cutoff=0.6)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise BadInputError(f"hf:{model_type}: transformers has no model_type {model_type!r}{hint}")
    return CONFIG_MAPPING[model_type]


@functools.lru_cache(maxsize=None)
def task_of(model_type: str) -> str:
    """``causal-lm``, ``masked-lm``, ``image-classification`` or one of :data:`hf_tasks.TASKS`
    (encoder–decoders, audio): which auto class builds it."""
    _config_class(model_type)
    from transformers.models.auto import modeling_auto as auto

    if task := hf_tasks.task_from_mappings(model_type, auto):
        return task
    masked, causal = auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type in causal and model_type not in masked:
        return "causal-lm"
    if model_type in masked:
        return "masked-lm"
    if model_type in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return "image-classification"
    raise BadInputError(f"hf:{model_type}: perfkit trains causal and masked LMs, encoder-decoder LMs, whisper, "
                        f"CTC speech models, AST and image classifiers; transformers has none of these for "
                        f"{model_type!r}")


#: Config keywords every family takes that its ``to_dict`` does not list: ``attn_implementation``
#: (``eager``, ``sdpa``, ...) picks the attention kernels, and with them what the counter sees:
#: SDPA's backward recomputes Q·Kᵀ (torch.utils.flop_counter counts 5 matmuls, eager's 4).
_CONFIG_KEYWORDS = {"num_labels", "attn_implementation"}


def _known_keys(model_type: str) -> set[str]:
    cls = _config_class(model_type)
    return set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | _CONFIG_KEYWORDS


def hf_config(spec: UserModelSpec):
    """The model's config from ``model_size`` (unknown keys refused, with the close ones)."""
    model_type, base, source = _pretrained(spec.target)
    sizes = spec.sizes
    task = task_of(model_type)
    own_keys = {"image-classification": _VISION_OWN, "ctc": hf_tasks.AUDIO_OWN}.get(task, ())
    own = {k: sizes.pop(k) for k in own_keys if k in sizes and k not in _config_class(model_type)().to_dict()}
    known = _known_keys(model_type)
    if unknown := sorted(set(sizes) - known):
        close = {k: difflib.get_close_matches(k, sorted(known), n=3) for k in unknown}
        hints = "; ".join(f"{k}: close {', '.join(v)}" if v else k for k, v in close.items())
        raise BadInputError(f"hf:{model_type}: model_size keys the config does not have: {hints}")
    try:
        config = _transformers().AutoConfig.for_model(model_type, **{**base, **sizes})
    except Exception as error:  # noqa: BLE001 - transformers' own validation (StrictDataclass..., ValueError)
        said = " ".join(str(error).split())
        raise BadInputError(f"hf:{model_type}: transformers refuses this model_size: {type(error).__name__}: "
                            f"{said}") from None
    _check_shapes(config, model_type)
    notes = [f"config from {source}" if source else None, _special_ids_within(config, model_type, sizes),
             hf_tasks.prepare_config(task, config, sizes)]
    own["config_note"] = "; ".join(n for n in notes if n) or None
    if task in ("causal-lm", "masked-lm", "seq2seq-lm") and spec.seq_len is not None:
        limit = getattr(config, "max_position_embeddings", None)
        if limit is not None and spec.seq_len > limit:
            raise BadInputError(f"hf:{model_type}: seq_len {spec.seq_len} > the config's "
                                f"max_position_embeddings {limit}")
    return config, own


#: (divided, divisor) config fields whose ratio must be whole: query heads share key/value heads
#: (grouped-query attention), Gated DeltaNet's value heads share its key heads.
_DIVIDES = (("num_attention_heads", "num_key_value_heads"), ("linear_num_value_heads", "linear_num_key_heads"),
            ("n_routed_experts", "n_group"))
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")


def _check_shapes(config, model_type: str) -> None:
    """Refuse, before any work, the sizes that build but fail inside the first forward (one line
    each): heads that do not divide, a hidden size the heads do not divide (no ``head_dim`` given),
    more experts per token than experts, a ``layer_types`` of another length than the layers."""
    name = f"hf:{model_type}"
    get = lambda key: getattr(config, key, None)  # noqa: E731
    for big, small in _DIVIDES:
        a, b = get(big), get(small)
        if isinstance(a, int) and isinstance(b, int) and b > 0 and a % b:
            raise BadInputError(f"{name}: {big} {a} is not a multiple of {small} {b}: each of the {b} must serve "
                                f"a whole number of the {a}")
    heads, hidden = get("num_attention_heads"), get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and not get("head_dim") and hidden % heads:
        raise BadInputError(f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                            f"(give head_dim, or sizes that divide)")
    experts = next((get(k) for k in _EXPERTS if isinstance(get(k), int) and get(k) > 0), None)
    top_k = get("num_experts_per_tok")
    if experts and isinstance(top_k, int) and top_k > experts:
        raise BadInputError(f"{name}: num_experts_per_tok {top_k} > the {experts} experts: a token is routed "
                            f"to at most every expert")
    groups, top_groups = get("n_group"), get("topk_group")
    if isinstance(groups, int) and isinstance(top_groups, int) and top_groups > groups:
        raise BadInputError(f"{name}: topk_group {top_groups} > n_group {groups}")
    types, layers = get("layer_types"), get("num_hidden_layers")
    if isinstance(types, (list, tuple)) and isinstance(layers, int) and len(types) != layers:
        raise BadInputError(f"{name}: layer_types names {len(types)} layers, num_hidden_layers is {layers}")


_SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                "cls_token_id", "mask_token_id")


def _special_ids_within(config, model_type: str, sizes: dict) -> str | None:
    """Clear the config's special token ids at or past a vocabulary ``model_size`` shrank (phi3's
    pad_token_id 32000, whisper's 50257, against vocab_size 512: the embedding refuses a padding
    index past its rows, once the kernel has started); an id the user set there is refused. Returns
    what was cleared, for the row (``model_config_note``), or None."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return None
    cleared = []
    for name in _SPECIAL_IDS:
        value = getattr(config, name, None)
        ids = value if isinstance(value, list) else [value]
        outside = [i for i in ids if isinstance(i, int) and i >= vocab]
        if not outside:
            continue
        if name in sizes:
            raise BadInputError(f"hf:{model_type}: {name} {value} is past vocab_size {vocab}: ids are 0..{vocab - 1}")
        kept = [i for i in ids if not (isinstance(i, int) and i >= vocab)]
        try:
            setattr(config, name, (kept or None) if isinstance(value, list) else None)
            cleared.append(f"{name} {value}")
        except Exception:  # noqa: BLE001 - a field that must hold an id (whisper's decoder_start_token_id)
            setattr(config, name, vocab - 1)
            cleared.append(f"{name} {value} (now {vocab - 1}, the last id: the field needs one)")
    return (f"cleared {', '.join(cleared)}: past vocab_size {vocab} (the model_size's), so no such token "
            "exists; the synthetic batches use none of them") if cleared else None


def check_hf(spec: UserModelSpec) -> None:
    """Refuse an unknown model_type or model_size key before any work (no model is built)."""
    hf_config(spec)


def _text_batch(vocab_size: int, seq_len: int, causal: bool):
    # perfkit's transformer task: x_t = (a + b·t) mod V, learnable from the last two tokens.
    max_stride = max(1, min(4, vocab_size - 1))
    t = torch.arange(seq_len + 1)

    def batch(n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab_size, (n, 1), generator=gen)
        stride = torch.randint(1, max_stride + 1, (n, 1), generator=gen)
        seq = (start + stride * t) % vocab_size
        if causal:
            return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        return seq[:, :-1].contiguous(), seq[:, :-1].contiguous()

    return batch


def _logits_loss(output, targets):
    # A whole model's output, or a pipeline stage's logits.
    logits = (output.logits if hasattr(output, "logits") else output).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _tp_plan(model, block_names: tuple[str, ...]) -> dict[str, str] | None:
    """The family's plan (``model._tp_plan``) over the model's own module names, its
    ``colwise``/``rowwise`` entries only (Megatron pairs inside each layer)."""
    plan = getattr(model, "_tp_plan", None) or {}
    names = {name for name, _ in model.named_modules()}
    out = {}
    for pattern, style in plan.items():
        if style not in ("colwise", "rowwise"):
            continue
        head, star, tail = pattern.partition("*")
        candidates = ([f"{head}{i}{tail}" for i in range(len(block_names))] if star else [pattern])
        out.update({name: style for name in candidates if name in names})
    return out or None


_DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def _stage_split(model) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(stem, head) module names when ``model`` is a llama-style causal LM that splits into
    pipeline stages (``base.embed_tokens``, ``base.layers``, ``base.norm``, ``base.rotary_emb``,
    an untied ``lm_head``: llama, qwen2, mistral, ...), else None."""
    prefix = getattr(model, "base_model_prefix", "model")
    base = getattr(model, prefix, None)
    if base is None or not all(hasattr(base, part) for part in _DECODER_PARTS) or not hasattr(model, "lm_head"):
        return None
    if model.lm_head.weight is base.embed_tokens.weight:
        return None  # tied: the first and last stage would each hold a copy, updated apart
    return (f"{prefix}.embed_tokens",), (f"{prefix}.norm", "lm_head")


class _DecoderStage(torch.nn.Module):
    """Layers ``[lo, hi)`` of a llama-style decoder as a pipeline stage: the token embedding
    before them on the first stage, the final norm and the lm head after them on the last; every
    stage computes the rotary position embeddings itself (no parameters) and attends causally
    (the family's own mask function, as its model's forward). Input: token ids (first stage) or
    hidden states; output: hidden states, or the logits (last stage)."""

    def __init__(self, model, lo: int, hi: int, *, first: bool, last: bool, autocast=None):
        super().__init__()
        base = getattr(model, model.base_model_prefix)
        self.layers = torch.nn.ModuleList(base.layers[lo:hi])
        self.rotary_emb, self.config = base.rotary_emb, model.config
        self.embed_tokens = base.embed_tokens if first else None
        self.norm, self.lm_head = (base.norm, model.lm_head) if last else (None, None)
        self.first, self.last, self.autocast = first, last, autocast
        self._mask = getattr(sys.modules[type(base).__module__], "create_causal_mask", None)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            hidden = self.embed_tokens(x) if self.first else x
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            rotary = self.rotary_emb(hidden, position_ids=positions)
            mask = (self._mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                               past_key_values=None, position_ids=positions) if self._mask else None)
            for layer in self.layers:
                hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
            if self.last:
                hidden = self.lm_head(self.norm(hidden))
        return hidden


def _expert_params(model, config) -> tuple[int, float]:
    """(parameters of the routed experts, the share of them a token uses: top-k of E) of a
    mixture of experts; (0, 1.0) for a dense model. Routed experts are the tensors with a leading
    dimension of E under an ``experts`` module (transformers' fused experts) or the modules
    ``experts.<i>`` (a list of them); a shared expert and the router count whole."""
    n_experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k", None)
    if not n_experts or not top_k:
        return 0, 1.0
    routed = sum(p.numel() for name, p in model.named_parameters()
                 if ".experts." in f".{name}" and (p.dim() == 3 and p.shape[0] == n_experts
                                                   or re.search(r"\.experts\.\d+\.", f".{name}")))
    return routed, min(top_k, n_experts) / n_experts


def _text_flop(model, config, seq_len: int) -> tuple[float, str | None]:
    """(training FLOP of one sample, None) or (NaN, why): 6·N·T for the weights, plus 3 × each
    layer's attention-like forward FLOP over its actual kind (:mod:`hf_layers`)."""
    # A mixture of experts runs each token through top-k of its E routed experts: the active
    # parameters (Fedus et al., Switch Transformers 2021; the convention MoE model cards state).
    routed, active = _expert_params(model, config)
    matmul_params = non_embedding_params(model) - routed * (1 - active)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        matmul_params += head.weight.numel()  # tied: the head's matmul is not in the non-embedding N
    layers = hf_layers.layers_of(config)
    if layers.unmodelled:
        return math.nan, f"no analytic FLOP for part of the model: {layers.unmodelled}"
    return float(6 * matmul_params * seq_len + 3 * hf_layers.attention_flop(config, seq_len, layers)), None


def rank_imports(model_type: str) -> tuple[str, ...]:
    """What a rank imports to build ``hf:<model_type>`` beyond torch: imported once before a CPU
    launch forks its ranks (:func:`perfkit.run.launch.launch`'s ``preload``), not once per rank."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type_of(model_type))
    return (__name__, f"transformers.models.{module}.modeling_{module}")


def build_hf(spec: UserModelSpec, *, device="cpu", dtype=torch.float32) -> Workload:
    """The workload of ``hf:<model_type>``: random weights from ``spec.seed``, on ``device``."""
    transformers = _transformers()
    config, own = hf_config(spec)
    task = task_of(model_type_of(spec.target))
    auto = {"causal-lm": transformers.AutoModelForCausalLM, "masked-lm": transformers.AutoModelForMaskedLM,
            "image-classification": transformers.AutoModelForImageClassification,
            "seq2seq-lm": transformers.AutoModelForSeq2SeqLM, "speech-seq2seq": transformers.AutoModelForSpeechSeq2Seq,
            "ctc": transformers.AutoModelForCTC, "audio-classification": transformers.AutoModelForAudioClassification,
            }[task]
    with torch.random.fork_rng(devices=[]), constructing_on(device):
        torch.manual_seed(spec.seed)
        model = auto.from_config(config)
    # A decoder's training step keeps no cache: with it, a checkpointed block's recomputation appends
    # to the cache its forward filled (deepseek_v3, gemma3, gpt_oss fail so). Inference passes
    # use_cache itself. (An encoder-decoder keeps its default: without a cache, whisper's decoder
    # looks for packed sequences by value, which a meta or fake tensor has not.)
    if task == "causal-lm" and hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    blocks = find_blocks(model)
    n_params = sum(p.numel() for p in model.parameters())
    loss_fn, convention = _logits_loss, TEXT_FLOP_CONVENTION
    if task in hf_tasks.TASKS:
        batch, loss_fn, flop, reason, convention, tokens = hf_tasks.task_parts(task, model, config, own, spec.seq_len,
                                                                                spec.seed)
    elif task == "image-classification":
        image_size = own.get("image_size", getattr(config, "image_size", 224))
        image_size = image_size if isinstance(image_size, int) else image_size[0]
        batch = image_task(getattr(config, "num_channels", 3), image_size, config.num_labels, spec.seed)
        flop, reason, tokens = math.nan, f"no analytic FLOP model for {spec.name} (6N holds for transformers' matmuls only)", None
    else:
        if spec.seq_len is None:
            raise BadInputError(f"{spec.name} is a text model: it needs seq_len")
        batch = _text_batch(config.vocab_size, spec.seq_len, task == "causal-lm")
        (flop, reason), tokens = _text_flop(model, config, spec.seq_len), spec.seq_len
    split = _stage_split(model) if task == "causal-lm" else None
    return Workload(
        spec=spec, model=model.to(device=device, dtype=dtype), loss_fn=loss_fn,
        n_params=n_params, n_params_non_embedding=non_embedding_params(model),
        flop_per_sample=flop, flop_reason=reason,
        flop_convention=convention if reason is None else None,
        tokens_per_sample=tokens, block_names=blocks, tp_plan=_tp_plan(model, blocks), family="hf",
        config_note=own.get("config_note"),
        stem_names=split[0] if split else (), head_names=split[1] if split else (),
        stage=_DecoderStage if split else None, _batch=seed_generator_batch(batch))
