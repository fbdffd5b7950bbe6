"""``perfkit fit``: will a training configuration fit a device's memory, before any GPU time is
spent? The step runs on fake tensors on this CPU (:mod:`perfkit.measuring.training.memory_fit`):
the peak per rank by category against the device's memory, the modules that hold the most, the
largest batch that fits, and the same with activation checkpointing switched."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import re
import sys
import time

from perfkit.core.errors import BadInputError, ConfigurationSkipped
from perfkit.core.specs import SPEC_TABLE, spec_peaks

__all__ = ["add_fit_command", "run_fit", "parse_bytes", "device_budget", "memory_checker"]

HELP = """\
Predicts one training step's memory per rank for MODEL without a GPU: perfkit's own training
step (the same build, wrapping, AdamW, autocast and loss as `perfkit run`) runs on fake tensors
(shapes and dtypes, no storage) as rank 0 of --world-size, in a fake process group, so FSDP2's
sharding and all-gathers are its real code. Nothing is materialised: a 7B model costs this host
a few hundred MB and tens of seconds.

Prints the predicted peak by category (parameters, gathered parameters, gradients, optimizer
state, activations, temporaries, inputs, communication buffers) against the device's memory, the
blocks holding the most, the largest global batch that fits (the peak is a line in the batch:
through this batch and one more sample per rank; --check confirms the answer with fake steps), and
the same with activation checkpointing switched. The fake steps run two at a time: this process
and a spawned one.

Not counted: the CUDA/HIP allocator's caching and fragmentation, the CUDA context, NCCL's buffers
(leave headroom: --headroom, default 10 %). Modelled parallelisms: none, ddp, zero1, zero2, zero3, fsdp.

Examples:
  perfkit fit transformer --device h100 --batch 64 --parallelism ddp --world-size 8
  perfkit fit hf:llama --size hidden_size=4096 --size num_hidden_layers=32 --size intermediate_size=11008 \\
      --size num_attention_heads=32 --size max_position_embeddings=4096 --seq-len 4096 \\
      --batch 64 --parallelism zero3 --world-size 8 --precision bf16 --device mi300x

Exit codes: 0 it fits, 1 it does not fit, 2 bad input (an unknown device without --memory-bytes, a
parallelism the fake step does not model, a model that does not build).
"""

#: The parallelisms :mod:`perfkit.measuring.training.memory_fit` models (``FIT_PARALLELISMS``;
#: a test keeps the two equal), named here so that ``--help`` does not import torch.
MODELLED = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``80e9``, ``80GB`` (10^9), ``192GiB`` (2^30) -> bytes; BadInputError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise BadInputError(f"--memory-bytes {text!r}: give a positive size such as 80e9, 80GB or 192GiB")
    return int(float(m.group(1)) * _UNITS[unit])


def device_budget(device: str | None, memory_bytes: str | None) -> tuple[int, str]:
    """(bytes per device, what they are): ``--memory-bytes`` if given, else the spec table's
    capacity of ``--device``. An unknown device is bad input that names the way out."""
    if memory_bytes is not None:
        return parse_bytes(memory_bytes), f"--memory-bytes {memory_bytes}"
    if device is None:
        raise BadInputError("give --device NAME (a device of perfkit's spec table) or --memory-bytes SIZE")
    row = spec_peaks(device)
    if row is None or row.memory_bytes is None:
        known = ", ".join(r.model for r in SPEC_TABLE if r.memory_bytes)
        raise BadInputError(f"unknown device {device!r}: its memory is not in perfkit's spec table "
                            f"(known: {known}); give --memory-bytes SIZE")
    return int(row.memory_bytes), f"{row.model}, {row.memory_bytes / 1e9:.0f} GB ({row.source})"


def memory_checker(device: str | None, memory_bytes: str | None, headroom: float = 0.10):
    """``perfkit predict --device``: a function of a measured row and another layout that predicts
    the step's peak per rank on fake tensors (as ``perfkit fit``) against the device's memory less
    ``headroom``. The device is checked here, before any work (an unknown one is bad input)."""
    device_bytes, source = device_budget(device, memory_bytes)
    budget = device_bytes * (1 - headroom)

    def check(row: dict, *, parallelism: str, world_size: int, batch_size: int) -> dict:
        from perfkit.measuring.training import memory_fit
        from perfkit.measuring.training.config import TrainConfig

        size = row.get("model_size")
        size = json.loads(size) if isinstance(size, str) and size else (size if isinstance(size, dict) else {})
        seq = row.get("seq_len")
        out = {"memory_budget_bytes": budget, "memory_budget_source": f"{source}, less {headroom:.0%} headroom"}
        try:
            cfg = TrainConfig(model=str(row.get("model")), model_size=size, model_path=row.get("model_path") or None,
                              batch_size=int(batch_size), precision=str(row.get("precision") or "fp32"),
                              parallelism=parallelism, world_size=int(world_size), device="cpu", count_flops=False,
                              **({"seq_len": int(seq)} if isinstance(seq, (int, float)) and seq == seq else {}))
            reason, method = memory_fit.fit_reason(cfg), "fake tensors (perfkit fit)"
            if reason is None:
                peak = memory_fit.predict(cfg).peak_bytes
            elif parallelism == "tp":  # the analytic model shards the plan's projections
                from perfkit.measuring.training import memory_model

                peak, reason = memory_model.predicted_peak_bytes(cfg), None
                method = "analytic (memory_model: the plan's projections sharded, activations per rank)"
                if peak != peak:  # NaN: no activation model for this model
                    peak, reason = None, (f"TP is not modelled on fake tensors, and the analytic model has no "
                                          f"activation model for {cfg.model}")
            else:
                peak = None
        except (BadInputError, ValueError, TypeError, RuntimeError) as exc:  # a model this host cannot build
            peak, reason = None, f"{type(exc).__name__}: {exc}"
        return {**out, "memory_peak_bytes_per_rank": peak, "memory_reason": reason, "memory_method": method
                if peak is not None else None, "fits": None if peak is None else bool(peak <= budget)}

    return check


def _value(text: str, key: str = ""):
    """A ``--size`` value: an int, a float, true/false, JSON for a list or an object
    (``layer_types=["linear_attention","full_attention"]``), else the string."""
    if text.lstrip().startswith(("[", "{")):
        import json

        try:
            return json.loads(text)
        except ValueError as error:
            raise BadInputError(f"--size {key}={text}: not valid JSON ({error}); quote it for the shell, "
                                f"e.g. --size '{key}=[\"a\", \"b\"]'") from None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _config(args):
    from perfkit.measuring.training.config import TrainConfig

    size = {}
    for item in args.size:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInputError(f"--size {item!r}: give KEY=VALUE (e.g. --size num_hidden_layers=32)")
        size[key] = _value(value, key)
    return TrainConfig(model=args.model, model_size=size, model_path=args.model_path, batch_size=args.batch, seq_len=args.seq_len,
                       precision=args.precision, parallelism=args.parallelism, world_size=args.world_size,
                       activation_checkpointing=args.activation_checkpointing,
                       fsdp_param_dtype=args.fsdp_param_dtype, device="cpu", count_flops=False)


def add_fit_command(sub) -> None:
    """Register ``perfkit fit`` on the CLI's subparsers."""
    p = sub.add_parser("fit", help="will a training configuration fit a device's memory (fake tensors, no GPU)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL",
                   help="transformer, mlp, convnet, hf:<model_type>, torchvision:<name> or package.module:function")
    p.add_argument("--model-path", metavar="DIR", help="a folder put first on sys.path before an entry point is imported")
    p.add_argument("--size", action="append", default=[], metavar="KEY=VALUE",
                   help="the model's size (repeatable): perfkit's model_size, or the HF config's fields; "
                        "a list or object as JSON (--size 'layer_types=[\"full_attention\"]')")
    p.add_argument("--batch", type=int, default=8, help="global batch (default 8), split over the data-parallel ranks")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per sample of a text model (default 32)")
    p.add_argument("--precision", default="fp32", help="fp32, tf32, bf16, fp16 or bf16-pure (default fp32)")
    # No choices= from memory_fit: building the CLI must not import torch (the sweep engine's
    # parser is this one); a parallelism the fake step does not model exits 2 in run_fit.
    p.add_argument("--parallelism", default="none", help=f"{', '.join(MODELLED)} (default none)")
    p.add_argument("--world-size", type=int, default=1, help="ranks (default 1); rank 0 is predicted")
    p.add_argument("--activation-checkpointing", action="store_true", help="checkpoint every block")
    p.add_argument("--fsdp-param-dtype", default=None, help="FSDP2's param_dtype (e.g. bfloat16)")
    p.add_argument("--device", help="a device of perfkit's spec table (h100, h200, a100, mi250x, mi300x, ...)")
    p.add_argument("--memory-bytes", metavar="SIZE", help="the memory per device instead (80e9, 80GB, 192GiB)")
    p.add_argument("--headroom", type=float, default=0.10,
                   help="share of the device kept free for the allocator, context and NCCL (default 0.10)")
    p.add_argument("--check", action="store_true",
                   help="confirm the largest batch with fake steps (a few more; slower on large models)")
    p.add_argument("--no-compare", action="store_true", help="skip the activation-checkpointing variant")
    p.add_argument("--top", type=int, default=5, help="blocks listed (default 5)")
    p.add_argument("--json", metavar="FILE", help="also write the prediction as JSON ('-': print it instead)")
    p.set_defaults(func=run_fit)


def _gib(n: float) -> str:
    """Bytes in binary units, right-aligned: GiB down to 1 GiB, then MiB, then KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if abs(n) >= scale:
            return f"{n / scale:8.2f} {unit}"
    return f"{n / 2**10:8.2f} KiB"


def _predict_all(cfg, compare: bool, say) -> dict:
    """Predictions of ``cfg`` and of it with one more sample per rank (the batch fit's second
    point), and (``compare``) the same two with activation checkpointing switched: this process
    and one spawned worker, on the two cores at once."""
    from perfkit.measuring.training import memory_edge, memory_fit

    configs = {"base": cfg, "base+1": memory_edge.one_more_per_rank(cfg)}
    skipped = {}
    if compare:
        other = dataclasses.replace(cfg, activation_checkpointing=not cfg.activation_checkpointing)
        if reason := _setting_reason(other):  # as training would skip it: never a copy of the other line
            skipped = {"other": ConfigurationSkipped(reason), "other+1": ConfigurationSkipped(reason)}
        else:
            configs.update({"other": other, "other+1": memory_edge.one_more_per_rank(other)})
    def attempt(fn):
        try:
            return fn()
        except BadInputError:
            raise
        except Exception as error:  # noqa: BLE001 - one variant failing is that variant's line, not the run's end
            return error

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = {k: pool.submit(memory_fit.predict, c) for k, c in configs.items() if k.endswith("+1")}
        here = {k: attempt(lambda c=c, k=k: memory_fit.predict(c, progress=say if k == "base" else None))
                for k, c in configs.items() if not k.endswith("+1")}
        return {**here, **{k: attempt(f.result) for k, f in there.items()}, **skipped}


def _setting_reason(cfg) -> str | None:
    """Why a run of ``cfg`` would be skipped for its model (activation checkpointing of a model
    that names no blocks, ...), as ``perfkit run`` decides it before any rank starts; or None."""
    from perfkit.measuring.training.config import user_model_skip_reason, workload_spec
    from perfkit.measuring.workloads.user import UserModelSpec

    spec = workload_spec(cfg)
    return user_model_skip_reason(cfg, spec) if isinstance(spec, UserModelSpec) else None


def _largest(cfg, pred, one_more, budget, check):
    from perfkit.measuring.training import memory_edge

    batch, _ = memory_edge.largest_batch(cfg, pred, budget, one_more=one_more, check=check)
    return batch


def _cannot_predict(cfg, error: BaseException) -> str:
    """One line for a step that fails on fake tensors (it would fail on the device too, or the fake
    mode lacks a kernel): its own message, and what to try where it is known."""
    text = " ".join(str(error).split())
    hint = ""
    if "Expected inputs of BF16" in text:
        hint = ("; torch's grouped GEMM (a mixture of experts' experts) takes bf16 operands on CUDA, which "
                "autocast does not cast for it: a run at this precision fails the same way; --precision "
                "bf16-pure runs it")
    variant = f" with activation checkpointing {'on' if cfg.activation_checkpointing else 'off'}"
    return (f"cannot predict {cfg.model}{variant}: its step failed on fake tensors ({type(error).__name__}: "
            f"{text}){hint}")


def run_fit(args) -> int:
    """``perfkit fit``: check, predict, print; exit 0 fits, 1 does not."""
    from perfkit.measuring.training import memory_fit

    if not 0 <= args.headroom < 1:
        raise BadInputError(f"--headroom must be in [0, 1), got {args.headroom}")
    if args.top < 0:
        raise BadInputError(f"--top must be at least 0, got {args.top}")
    device_bytes, device_source = device_budget(args.device, args.memory_bytes)
    cfg = _config(args)  # a model that does not build, a batch that does not split: exit 2 here
    reason = memory_fit.fit_reason(cfg) or _setting_reason(cfg)
    if reason:
        raise BadInputError(reason)
    budget = device_bytes * (1 - args.headroom)
    say = (lambda msg: print(f"  … {msg}", file=sys.stderr)) if args.json != "-" else (lambda _m: None)
    t0 = time.perf_counter()
    got = _predict_all(cfg, not args.no_compare, say)
    for key in ("base", "base+1"):  # the configuration asked for: without it there is no answer
        if isinstance(got[key], BaseException):
            # a crash is never a verdict: exit 1 would say "does not fit"
            raise BadInputError(_cannot_predict(cfg, got[key])) from got[key]
    pred = got["base"]
    result = {
        "model": cfg.model, "model_size": dict(cfg.model_size), "batch_size": cfg.batch_size,
        "batch_per_rank": cfg.batch_size // cfg.dp_size, "seq_len": cfg.seq_len, "precision": cfg.precision,
        "parallelism": cfg.parallelism, "world_size": cfg.world_size,
        "activation_checkpointing": cfg.activation_checkpointing,
        "device_memory_bytes": device_bytes, "device_memory_source": device_source,
        "headroom": args.headroom, "budget_bytes": int(budget),
        **pred.columns("predicted_"), "fits": pred.peak_bytes <= budget,
        "largest_batch": _largest(cfg, pred, got["base+1"], budget, args.check),
        "largest_batch_checked": args.check,
    }
    if "other" in got:
        other_cfg, other_pred = dataclasses.replace(cfg, activation_checkpointing=not cfg.activation_checkpointing), got["other"]
        failed = next((got[k] for k in ("other", "other+1") if isinstance(got[k], BaseException)), None)
        if failed is not None:  # the comparison alone is lost, with why
            result["other"] = {"activation_checkpointing": other_cfg.activation_checkpointing,
                               "error": _cannot_predict(other_cfg, failed).removeprefix("cannot predict ")}
        else:
            result["other"] = {"activation_checkpointing": other_cfg.activation_checkpointing,
                               "predicted_peak_bytes": other_pred.peak_bytes,
                               "predicted_activations_bytes": other_pred.at_peak["activations"],
                               "fits": other_pred.peak_bytes <= budget,
                               "largest_batch": _largest(other_cfg, other_pred, got["other+1"], budget, args.check)}
    result["seconds"] = time.perf_counter() - t0
    if args.json == "-":
        print(json.dumps(result, indent=2, default=str))
    else:
        print(_render(result, pred))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=2, default=str)
    return 0 if result["fits"] else 1


def _render(r: dict, pred) -> str:
    from perfkit.measuring.training.memory_fit import CATEGORIES, PHASES

    ac = "on" if r["activation_checkpointing"] else "off"
    lines = [f"{r['model']} · {r['parallelism']} on {r['world_size']} rank(s) · {r['precision']} · "
             f"batch {r['batch_size']} ({r['batch_per_rank']} per rank) × seq {r['seq_len']} · "
             f"activation checkpointing {ac}",
             f"device: {r['device_memory_source']}; budget {_gib(r['budget_bytes']).strip()} "
             f"after {r['headroom']:.0%} headroom",
             f"predicted peak per rank (rank 0, fake tensors, {r['seconds']:.1f} s): "
             f"{_gib(r['predicted_peak_bytes']).strip()} -> {'FITS' if r['fits'] else 'DOES NOT FIT'}"]
    lines += [f"  {c:<22}{_gib(r[f'predicted_{c}_bytes'])}" for c in CATEGORIES if r[f"predicted_{c}_bytes"]]
    lines.append("peak by phase: " + ", ".join(f"{p} {_gib(r[f'predicted_peak_{p}_bytes']).strip()}" for p in PHASES))
    if pred.modules:
        lines.append("blocks holding the most (parameters on this rank + what their forward keeps):")
        lines += [f"  {m.name:<40}{_gib(m.total_bytes)}" for m in pred.modules]
    how = ("confirmed with fake steps" if r["largest_batch_checked"]
           else "the peak's line through this batch and one more per rank; --check confirms")
    largest = r["largest_batch"]
    lines.append(f"largest global batch that fits: {largest if largest else 'none (not one sample per rank)'} ({how})")
    if "other" in r:
        o = r["other"]
        switched = f"with activation checkpointing {'on' if o['activation_checkpointing'] else 'off'}"
        if "error" in o:
            lines.append(f"{switched}: not predicted: {o['error']}")
        else:
            lines.append(f"{switched}: peak {_gib(o['predicted_peak_bytes']).strip()} "
                         f"({'fits' if o['fits'] else 'does not fit'}), largest batch {o['largest_batch'] or 'none'}")
    return "\n".join(lines)
