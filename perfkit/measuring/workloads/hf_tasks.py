"""Hugging Face families beyond decoder-only and encoder-only text: encoder–decoders and audio.

Each task's synthetic batch (inputs as the model's keywords, targets), loss and analytic FLOP:

- ``seq2seq-lm`` (``hf:t5``, ``hf:bart``, ...; ``AutoModelForSeq2SeqLM``): the encoder reads perfkit's
  arithmetic sequence of ``seq_len`` tokens, the decoder writes it back (teacher forcing: its
  input is the sequence shifted right after the decoder's start token). Analytic FLOP per sample,
  ``6·N·T + 12·H·Q·T²·(L_enc + 2·L_dec)`` (:data:`SEQ2SEQ_FLOP_CONVENTION`): PaLM's rule with T
  tokens through the encoder's and the decoder's parameters, self-attention in both stacks and
  the decoder's cross-attention over the T encoder positions.
- ``speech-seq2seq`` (``hf:whisper``; ``WhisperForConditionalGeneration``, the encoder–decoder it
  is): log-mel features in (``num_mel_bins`` × ``2·max_source_positions`` frames, Gaussian
  noise), the arithmetic sequence out. FLOP: ``6·N_enc·S + 6·N_xkv·S + 6·N_dec·T + 12·H·Q·(L_enc·S²
  + L_dec·T·(T + S)) + 2·conv1 + 3·conv2`` with S = ``max_source_positions``: the decoder's
  cross-attention key and value projections (N_xkv) read the S encoder frames, not the T tokens;
  the two input convolutions' forward FLOP counted exactly, conv1's backward its weight gradient
  alone (the features take none) (:data:`WHISPER_FLOP_CONVENTION`).
- ``ctc`` (``hf:wav2vec2``, ``hf:hubert``; ``AutoModelForCTC``): waveforms of ``audio_samples``
  samples (perfkit's key in ``model_size``, default 16000: 1 s at 16 kHz), random label sequences
  half the frames long, CTC loss (blank = ``pad_token_id``). FLOP NaN with the reason: the
  convolutional feature encoder follows no 6N rule. SpecAugment and LayerDrop are turned off unless
  ``model_size`` sets them (random per step and rank, they would change the work a step does).
- ``audio-classification`` (``hf:audio-spectrogram-transformer``): a class prototype plus noise,
  ``max_length`` × ``num_mel_bins``; FLOP ``6·N·P + 12·L·H·Q·P²`` over its P patches, the classifier
  once (:data:`AST_FLOP_CONVENTION`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads.user import non_embedding_params

__all__ = ["AUDIO_OWN", "TASKS", "task_from_mappings", "prepare_config", "task_parts", "decoder_start_id", "SEQ2SEQ_FLOP_CONVENTION",
           "WHISPER_FLOP_CONVENTION", "AST_FLOP_CONVENTION"]

SEQ2SEQ_FLOP_CONVENTION = ("6N·T + 12·H·Q·T²·(L_enc + 2·L_dec) per sample (PaLM app. B over both stacks, "
                           "cross-attention over T encoder positions); N = parameters outside the "
                           "embedding tables + a tied lm head")
WHISPER_FLOP_CONVENTION = ("6·N_enc·S + 6·N_xkv·S + 6·N_dec·T + 12·H·Q·(L_enc·S² + L_dec·T·(T+S)) + "
                           "2·conv1 + 3·conv2 forward FLOP per sample; S = max_source_positions frames, "
                           "N_xkv the decoder's cross-attention K/V projections (they read the S encoder "
                           "frames), N without embedding tables and convolutions, + the tied output "
                           "projection; conv1's input takes no gradient")
AST_FLOP_CONVENTION = "6N·P + 12·L·H·Q·P² per sample over its P patch tokens, the classifier once"
#: model_size keys perfkit takes itself for a waveform model (not config fields).
AUDIO_OWN = ("audio_samples",)
#: The tasks of this module, in the order a model_type is looked up (before causal and masked LMs:
#: bart and whisper have a causal-LM class too, a decoder alone).
TASKS = ("speech-seq2seq", "seq2seq-lm", "ctc", "audio-classification")
_WAVEFORM_DEFAULTS = {"mask_time_prob": 0.0, "mask_feature_prob": 0.0, "layerdrop": 0.0}


def task_from_mappings(model_type: str, auto) -> str | None:
    """This module's task of ``model_type`` from transformers' auto mappings, or None."""
    if model_type in auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        return "speech-seq2seq" if model_type == "whisper" else None
    if model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "seq2seq-lm"
    if model_type in auto.MODEL_FOR_CTC_MAPPING_NAMES:
        return "ctc"
    if model_type in auto.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES and model_type == "audio-spectrogram-transformer":
        return "audio-classification"
    return None


def prepare_config(task: str, config, sizes: dict) -> str | None:
    """Settings a task needs the same on every step and rank; what was changed, for the row's note."""
    if task != "ctc":
        return None
    changed = []
    for name, value in _WAVEFORM_DEFAULTS.items():
        if name not in sizes and getattr(config, name, value) != value:
            changed.append(f"{name} {getattr(config, name)} -> {value}")
            setattr(config, name, value)
    return (f"{', '.join(changed)}: random per step and rank, they would change the work of a step "
            "(set them in model_size to keep them)") if changed else None


def task_parts(task: str, model, config, own: dict, seq_len: int | None, seed: int):
    """``(make_batch(n, seed), loss_fn, flop_per_sample, flop_reason, convention, tokens_per_sample)``."""
    if task in ("seq2seq-lm", "speech-seq2seq"):
        if seq_len is None:
            raise BadInputError(f"hf:{config.model_type} writes text: it needs seq_len")
        limit = getattr(config, "max_target_positions", None)
        if limit is not None and seq_len > limit:
            raise BadInputError(f"hf:{config.model_type}: seq_len {seq_len} > the config's max_target_positions {limit}")
        start = decoder_start_id(config)
        if task == "seq2seq-lm":
            return (_seq2seq_batch(config.vocab_size, seq_len, start, None), _logits_loss,
                    _seq2seq_flop(model, config, seq_len), None, SEQ2SEQ_FLOP_CONVENTION, seq_len)
        features = (config.num_mel_bins, 2 * config.max_source_positions)
        return (_seq2seq_batch(config.vocab_size, seq_len, start, features), _logits_loss,
                _whisper_flop(model, config, seq_len), None, WHISPER_FLOP_CONVENTION, seq_len)
    if task == "ctc":
        samples = int(own.get("audio_samples", 16000))
        frames = int(model._get_feat_extract_output_lengths(torch.tensor(samples)))
        if frames < 2:
            raise BadInputError(f"hf:{config.model_type}: audio_samples {samples} make {max(0, frames)} frame(s) after its "
                                "feature encoder; give more samples")
        blank = config.pad_token_id if isinstance(config.pad_token_id, int) else 0
        return (_ctc_batch(samples, frames // 2, config.vocab_size, blank), _ctc_loss(blank, frames), math.nan,
                f"no analytic FLOP model for hf:{config.model_type} (its convolutional feature encoder follows "
                "no 6N rule)", None, None)
    shape = (config.max_length, config.num_mel_bins)
    return (_prototype_batch(shape, config.num_labels, seed), _logits_loss, _ast_flop(model, config), None,
            AST_FLOP_CONVENTION, None)


def decoder_start_id(config) -> int:
    """The token an encoder–decoder's decoder starts from (t5 has none but its pad token, 0)."""
    start = getattr(config, "decoder_start_token_id", None)
    return start if isinstance(start, int) else (config.pad_token_id or 0)


def _sequence(vocab_size: int, seq_len: int, n: int, gen: torch.Generator) -> torch.Tensor:
    # perfkit's arithmetic sequence x_t = (a + b·t) mod V (hf.py's text task).
    stride = torch.randint(1, max(1, min(4, vocab_size - 1)) + 1, (n, 1), generator=gen)
    start = torch.randint(0, vocab_size, (n, 1), generator=gen)
    return (start + stride * torch.arange(seq_len)) % vocab_size


def _seq2seq_batch(vocab_size: int, seq_len: int, start_id: int, features: tuple[int, int] | None):
    def batch(n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        target = _sequence(vocab_size, seq_len, n, gen)
        decoder_in = torch.cat([torch.full((n, 1), start_id), target[:, :-1]], dim=1)
        source = {"input_ids": target.clone()} if features is None else {
            "input_features": torch.randn((n, *features), generator=gen)}
        return {**source, "decoder_input_ids": decoder_in}, target

    return batch


def _ctc_batch(samples: int, label_len: int, vocab_size: int, blank: int):
    def batch(n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, vocab_size - 1, (n, label_len), generator=gen)
        labels = labels + (labels >= blank).long()  # every class but the blank
        return {"input_values": torch.randn((n, samples), generator=gen)}, labels

    return batch


def _ctc_loss(blank: int, frames: int):
    def loss(output, targets):
        logits = (output.logits if hasattr(output, "logits") else output).float()
        log_probs = F.log_softmax(logits, dim=-1).transpose(0, 1)  # (frames, n, classes)
        n, label_len = targets.shape
        return F.ctc_loss(log_probs, targets, torch.full((n,), logits.shape[1], dtype=torch.long),
                          torch.full((n,), label_len, dtype=torch.long), blank=blank, zero_infinity=True)

    return loss


def _prototype_batch(shape: tuple[int, ...], n_classes: int, seed: int):
    prototypes = torch.randn((n_classes, *shape), generator=torch.Generator().manual_seed(1_000_003 + seed))

    def batch(n: int, batch_seed: int):
        gen = torch.Generator().manual_seed(batch_seed)
        labels = torch.randint(0, n_classes, (n,), generator=gen)
        return {"input_values": prototypes[labels] + torch.randn((n, *shape), generator=gen)}, labels

    return batch


def _logits_loss(output, targets):
    logits = (output.logits if hasattr(output, "logits") else output).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _tied_head(model) -> int:
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head.weight.numel() if head is not None and embed is not None and head.weight is embed.weight else 0


def _attention_width(config) -> int:
    heads = config.num_attention_heads
    return heads * (getattr(config, "d_kv", None) or getattr(config, "head_dim", None) or config.hidden_size // heads)


def _decoder_layers(config) -> int:
    return getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None) or config.num_hidden_layers


def _seq2seq_flop(model, config, t: int) -> float:
    n = non_embedding_params(model) + _tied_head(model)
    return float(6 * n * t + 12 * _attention_width(config) * t * t * (config.num_hidden_layers + 2 * _decoder_layers(config)))


def _cross_kv_params(decoder) -> int:
    """Parameters of the decoder's cross-attention key and value projections: they read the
    encoder's output, so they run over its positions, not the decoder's tokens."""
    return sum(p.numel() for layer in decoder.layers for proj in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)
               for p in proj.parameters())


def _whisper_flop(model, config, t: int) -> float:
    encoder, decoder = model.get_encoder(), model.get_decoder()
    convs = [encoder.conv1, encoder.conv2]
    n_enc = non_embedding_params(encoder) - sum(p.numel() for c in convs for p in c.parameters())
    n_cross = _cross_kv_params(decoder)
    n_dec = non_embedding_params(decoder) + _tied_head(model) - n_cross
    s, d, mel = config.max_source_positions, config.d_model, config.num_mel_bins
    conv1 = 2 * 3 * mel * d * (2 * s)  # stride 1 over the 2S log-mel frames
    conv2 = 2 * 3 * d * d * s  # stride 2, to S frames
    hq = _attention_width(config)
    attention = 12 * hq * (config.encoder_layers * s * s + config.decoder_layers * t * (t + s))
    # conv1's backward is its weight gradient alone: the log-mel features take no gradient.
    return float(6 * n_enc * s + 6 * n_cross * s + 6 * n_dec * t + attention + 2 * conv1 + 3 * conv2)


def _ast_flop(model, config) -> float:
    body = model.audio_spectrogram_transformer
    f_dim, t_dim = body.embeddings.get_shape(config)
    patches = f_dim * t_dim + 2  # + the class and distillation tokens
    head = sum(p.numel() for p in model.classifier.parameters())
    position = body.embeddings.position_embeddings.numel() + body.embeddings.cls_token.numel() \
        + body.embeddings.distillation_token.numel()  # added, not multiplied
    n = non_embedding_params(model) - head - position
    return float(6 * n * patches + 6 * head + 12 * config.num_hidden_layers * _attention_width(config) * patches ** 2)
