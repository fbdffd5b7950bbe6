"""Every workload by name, whoever's model it is: one place that turns a configuration's
``model`` (and ``model_size``, ``seed``, ``seq_len``) into a spec, checks it before any work, and
builds it.

==========================  =============  ================================================
``model``                   family         built by
==========================  =============  ================================================
``mlp``, ``transformer``,   ``builtin``    :mod:`perfkit.measuring.workloads.synthetic`
``convnet``
``package.module:function`` ``entry``      :mod:`perfkit.measuring.workloads.user`
``hf:<model_type>``         ``hf``         :mod:`perfkit.measuring.workloads.hf`
``torchvision:<name>``      ``torchvision`` :mod:`perfkit.measuring.workloads.vision_tv`
==========================  =============  ================================================
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from perfkit.core import env
from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads import configs
from perfkit.measuring.workloads.user import UserModelSpec
from perfkit.measuring.workloads.workload import Workload

__all__ = ["family_of", "make", "check", "build", "meta", "is_builtin", "package_versions", "rank_imports",
           "warm_modules", "warm_imports"]

_PREFIXES = {"hf:": "hf", "torchvision:": "torchvision"}


def family_of(model: str) -> str:
    """``builtin``, ``entry``, ``hf`` or ``torchvision``; a name that is none of them is refused."""
    if not isinstance(model, str) or not model:
        raise BadInputError(f"model must be a name, got {model!r}")
    if model in configs.NAMES:
        return "builtin"
    for prefix, family in _PREFIXES.items():
        if model.startswith(prefix):
            if not model[len(prefix):]:
                raise BadInputError(f"model {model!r}: name the model after {prefix!r}")
            return family
    if ":" in model:
        return "entry"
    raise BadInputError(f"unknown model {model!r}: one of {', '.join(configs.NAMES)}, "
                        "'package.module:function', 'hf:<model_type>' or 'torchvision:<name>'")


def is_builtin(model: str) -> bool:
    return family_of(model) == "builtin"


def make(model: str, model_size: Mapping[str, object] | None = None, *, seed: int = 0,
         seq_len: int | None = None, model_path: str | None = None):
    """The spec of ``model``: a synthetic config for perfkit's own (``seq_len`` applies to the
    transformer), a :class:`~perfkit.measuring.workloads.user.UserModelSpec` for the others."""
    size = dict(model_size or {})
    family = family_of(model)
    if family == "builtin":
        if model == "transformer" and seq_len is not None:
            size["seq_len"] = seq_len
        return configs.make_spec(model, **size, seed=seed)
    target = model.split(":", 1)[1] if family in ("hf", "torchvision") else model
    return UserModelSpec(name=model, family=family, target=target, seed=seed, seq_len=seq_len,
                         size=tuple(sorted(size.items(), key=lambda kv: kv[0])), model_path=model_path or None)


#: The user specs already checked in this process (by repr: sizes may hold lists).
_CHECKED: set[str] = set()


def _check_user(spec: UserModelSpec) -> None:
    if repr(spec) in _CHECKED:
        return
    if spec.family == "hf":
        from perfkit.measuring.workloads.hf import check_hf

        check_hf(spec)
    elif spec.family == "torchvision":
        from perfkit.measuring.workloads.vision_tv import check_torchvision

        check_torchvision(spec)
    else:
        # The entry point is imported and called on the meta device: a module that does not import,
        # a missing function or a result without model/make_batch is refused here, no memory spent.
        meta(spec)
    _CHECKED.add(repr(spec))


def check(spec) -> None:
    """Refuse what cannot be built (BadInputError, one line), before any kernel or rank starts.
    Perfkit's own configs checked themselves when made; a user's model is resolved here (cached)."""
    if isinstance(spec, UserModelSpec):
        _check_user(spec)


#: Workloads built on the meta device in this process, by repr of their spec (sizes may hold lists).
_META: dict[str, Workload] = {}


def meta(spec) -> Workload:
    """The workload of ``spec`` on the meta device (shapes, blocks, plan; no memory, no init),
    built once per process: the value check, the skip rules, the memory model and the pipeline's
    block count all read the same one, and none may change it."""
    key = repr(spec)
    if key not in _META:
        _META[key] = build(spec, device="meta")
    return _META[key]


def build(spec, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Workload:
    """The workload of ``spec`` (from :func:`make`), its weights from the spec's seed, on ``device``."""
    if not isinstance(spec, UserModelSpec):
        from perfkit.measuring.workloads.synthetic import build as build_synthetic

        return build_synthetic(spec, device=device, dtype=dtype)
    if spec.family == "hf":
        from perfkit.measuring.workloads.hf import build_hf

        return build_hf(spec, device=device, dtype=dtype)
    if spec.family == "torchvision":
        from perfkit.measuring.workloads.vision_tv import build_torchvision

        return build_torchvision(spec, device=device, dtype=dtype)
    from perfkit.measuring.workloads.user import build_entry

    return build_entry(spec, device=device, dtype=dtype)


def rank_imports(model: str) -> tuple[str, ...]:
    """Modules a rank imports to build ``model`` that a CPU launch imports once before forking its
    ranks: perfkit's and transformers' own; never a user's entry point, whose module may read a
    rank's own state (``RANK``) when imported."""
    if family_of(model) != "hf":
        return ()
    from perfkit.measuring.workloads.hf import rank_imports as hf_rank_imports

    return hf_rank_imports(model[len("hf:"):])


def warm_modules(model: object) -> tuple[str, ...]:
    """What building ``model`` imports that is worth importing before a measurement starts (a
    sweep's prestarted kernel does): transformers' modules for ``hf:``, torchvision's models;
    never a user's entry point (see :func:`rank_imports`). Nothing for a name that is no model."""
    try:
        family = family_of(model)
    except BadInputError:
        return ()
    if family == "torchvision":
        return ("torchvision.models",)
    return rank_imports(model) if family == "hf" else ()


def warm_imports(params: Mapping[str, object]) -> None:
    """The warm-up of the training and inference notebooks (their metadata ``perfkit.warm``): a
    sweep's prestarted kernel imports what a configuration with ``params`` will, outside its
    measurement window. torch.optim imports torch._dynamo when the first optimizer is made (1.26 s
    of a 1.40 s transformer training row on a 2-core host); ``hf:`` models import transformers'."""
    import importlib

    import torch._dynamo  # noqa: F401

    for module in warm_modules(params.get("model")):
        importlib.import_module(module)


def package_versions(family: str) -> dict[str, str | None]:
    """The model library's version for a row (``transformers_version``, ``torchvision_version``),
    beside the fingerprint's ``env_transformers``/``env_torchvision`` of the whole environment."""
    package = {"hf": "transformers", "torchvision": "torchvision"}.get(family)
    return {} if package is None else {f"{package}_version": env.library_version(package)}
