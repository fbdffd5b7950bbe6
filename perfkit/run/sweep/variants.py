"""A/B variants of a sweep: what differs between the sides, checked before anything runs.

A spec's ``variants:`` names two or more ways to run every configuration::

    variants:
      - name: base
        python: /opt/venvs/torch-2.12/bin/python   # another torch build (needs perfkit + ipykernel)
      - name: change
        env: {NCCL_ALGO: Ring, PYTORCH_TUNABLEOP_ENABLED: "1"}
        parameters: {min_run_time_s: 0.2}            # fixed parameter overrides
    rounds: 5                                        # each configuration runs 5 times per variant

Every configuration runs under every variant, **interleaved**: round 1 runs A then B, round 2 B
then A, and so on, so that drift on a shared machine (thermal, a neighbour's job, a background
compaction) lands on both sides alike instead of on whichever side ran second. Each (configuration,
variant, round) is a configuration of its own to the engine (its own id, kernel, ledger entries,
results file and status), so resume, failure classes, slots and Slurm work as for any sweep; its
rows carry ``variant`` and ``round`` columns. ``perfkit compare DIR --by variant`` reads them.

An interpreter that does not exist, does not run, or cannot import perfkit and ipykernel is bad
input (exit 2) found before the first configuration starts, not an hour later on side B.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...core.cpu_share import with_threads
from ...core.errors import BadInputError

__all__ = ["Variant", "parse_variants", "parse_rounds", "check_interpreter", "interleaved", "kernel_env"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KEYS = {"name", "python", "env", "parameters"}
# Set per device slot by the engine; a variant that set them would break slot isolation.
_SLOT_OWNED = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(kw_only=True, frozen=True)
class Variant:
    """One side of an A/B sweep."""

    name: str
    python: str | None = None
    """The interpreter its kernels run (absolute path); None: the sweep's own."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of its kernels, over the slot's (``OMP_NUM_THREADS`` included)."""
    parameters: Mapping[str, object] = field(default_factory=dict)
    """Parameter values it fixes in every configuration."""

    @property
    def kernel_key(self) -> tuple:
        """Kernels of two variants with the same key are interchangeable."""
        return (self.python, tuple(sorted(self.env.items())))


def kernel_env(slot_env: Mapping[str, str] | None, variant: Variant | None) -> dict[str, str]:
    """The environment of a kernel of ``variant`` on a slot: the variant's variables over the
    slot's; a variant's ``OMP_NUM_THREADS`` alone sets the thread count (:func:`with_threads`)."""
    return with_threads(slot_env or {}, variant.env if variant is not None else {})


def parse_variants(raw: object, base: Path) -> tuple[Variant, ...]:
    """The spec's ``variants:`` list, structurally checked (interpreters are checked separately)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(v, Mapping) for v in raw):
        raise BadInputError("'variants' must be a list of at least two mappings (name, python, env, parameters)")
    variants = []
    for item in raw:
        unknown = set(item) - _KEYS
        if unknown:
            raise BadInputError(f"unknown key(s) {sorted(unknown)} in a variant; valid: {sorted(_KEYS)}")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise BadInputError(f"variant name {name!r}: use letters, digits, '.', '-' and '_' (it names files)")
        env = item.get("env") or {}
        if not isinstance(env, Mapping) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
            raise BadInputError(f"variant {name!r}: 'env' must map variable names to single values")
        owned = sorted(set(env) & set(_SLOT_OWNED) | {k for k in env if str(k).startswith("PERFKIT_")})
        if owned:
            raise BadInputError(f"variant {name!r} sets {owned}: the sweep assigns devices and perfkit's "
                                f"variables per slot; vary something else")
        params = item.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise BadInputError(f"variant {name!r}: 'parameters' must be a mapping of parameter name → value")
        python = item.get("python")
        if python is not None:
            if not isinstance(python, str) or not python:
                raise BadInputError(f"variant {name!r}: 'python' must be the path of an interpreter")
            path = Path(os.path.expanduser(python))
            python = str(path if path.is_absolute() else (base / path))
        variants.append(Variant(name=name, python=python, parameters=dict(params),
                                env={str(k): _env_text(v) for k, v in env.items()}))
    names = [v.name for v in variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BadInputError(f"variant names must be unique; repeated: {duplicates}")
    if len({(v.kernel_key, json.dumps(v.parameters, sort_keys=True, default=str)) for v in variants}) < len(variants):
        raise BadInputError("two variants differ in nothing (same python, env and parameters): "
                            "an A/A check is two sweeps, or one variant with rounds")
    return tuple(variants)


def _env_text(value: object) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def parse_rounds(raw: object) -> int:
    if raw is None:
        return 1
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise BadInputError(f"rounds must be a positive integer, got {raw!r}")
    return raw


_PROBE = ("import json, sys, perfkit, ipykernel\n"
          "print(json.dumps({'perfkit': getattr(perfkit, '__version__', '?'), 'python': sys.version.split()[0]}))")


def check_interpreter(variant: Variant, timeout_s: float = 120) -> dict:
    """Run the variant's interpreter once: it must start and import perfkit and ipykernel.
    Returns what it reported (perfkit and Python versions); raises BadInputError otherwise."""
    if variant.python is None:
        return {}
    path = Path(variant.python)
    if not path.exists():
        raise BadInputError(f"variant {variant.name!r}: interpreter {variant.python} does not exist")
    if not os.access(path, os.X_OK) or path.is_dir():
        raise BadInputError(f"variant {variant.name!r}: {variant.python} is not an executable interpreter")
    try:
        done = subprocess.run([str(path), "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **variant.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInputError(f"variant {variant.name!r}: {variant.python} did not run: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInputError(f"variant {variant.name!r}: {variant.python} cannot import perfkit and ipykernel "
                            f"({last}); install them there: {variant.python} -m pip install -e <perfkit checkout>")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def interleaved(points: Sequence, variants: Sequence[Variant], rounds: int) -> list[tuple[object, Variant | None, int]]:
    """Every (point, variant, round) in run order: round by round, each point under every variant,
    the variants' order reversed every other round (A B, B A, A B, ...)."""
    sides: Sequence[Variant | None] = variants or [None]
    order = []
    for r in range(1, rounds + 1):
        for point in points:
            for v in (sides if r % 2 else list(reversed(sides))):
                order.append((point, v, r))
    return order
