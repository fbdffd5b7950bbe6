"""Slurm settings: a sweep spec's ``slurm:`` mapping and the CLI's flags → submitit parameters.

Pure mapping and validation, no Slurm and no submitit: :func:`slurm_parameters` turns the settings
(the spec's ``slurm:`` keys, :data:`SLURM_KEYS`, with the CLI's overrides merged in) into the
keyword arguments of submitit's ``AutoExecutor.update_parameters``; :func:`parse_sbatch_options`
reads the repeatable ``--sbatch-option KEY=VALUE``. A bad setting raises
:class:`~perfkit.core.errors.BadInputError` (exit 2) before anything is submitted. The executor that
uses them is :mod:`.slurm`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ...core.errors import BadInputError
from .spec import Config

__all__ = ["SLURM_KEYS", "slurm_parameters", "parse_sbatch_options"]

#: The ``slurm:`` keys of a sweep spec (and the keyword overrides of :func:`run_slurm_sweep`,
#: which the CLI flags fill) → submitit's AutoExecutor parameter.
SLURM_KEYS = {
    "partition": "slurm_partition",
    "time_limit_min": "timeout_min",
    "cpus_per_task": "cpus_per_task",
    "gpus_per_task": "gpus_per_node",  # one task per array element, so per node == per task
    "mem_gb": "mem_gb",
    "array_parallelism": "slurm_array_parallelism",
    "sbatch_options": "slurm_additional_parameters",
    "setup": "slurm_setup",
}


def parse_sbatch_options(pairs: Sequence[str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (the repeatable ``--sbatch-option``) → ``{KEY: VALUE}``."""
    options: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise BadInputError(f"--sbatch-option {pair!r}: expected KEY=VALUE, e.g. account=myproj")
        options[key] = value
    return options


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"slurm {name} must be a positive integer, got {value!r}")
    return value


def _default_time_limit_min(configs: Sequence[Config]) -> int:
    # One array has one time limit: the longest perfkit limit plus a minute for the kernel to
    # start and the ending to be written; a configuration without one gets an hour.
    return max((math.ceil(c.timeout_s / 60) + 1) if c.timeout_s else 60 for c in configs)


def slurm_parameters(settings: Mapping[str, object], configs: Sequence[Config], *,
                     name: str = "perfkit-sweep") -> dict[str, object]:
    """The spec's ``slurm:`` settings (overrides merged in) → AutoExecutor.update_parameters kwargs."""
    unknown = set(settings) - set(SLURM_KEYS)
    if unknown:
        raise BadInputError(f"unknown slurm setting(s) {sorted(unknown)}; valid: {sorted(SLURM_KEYS)} "
                            f"(anything else sbatch takes goes under sbatch_options)")
    s = {k: v for k, v in settings.items() if v is not None}
    params: dict[str, object] = {"name": name, "tasks_per_node": 1, "nodes": 1,
                                 "timeout_min": _default_time_limit_min(configs)}
    for key in ("time_limit_min", "cpus_per_task", "array_parallelism"):
        if key in s:
            params[SLURM_KEYS[key]] = _positive_int(key, s[key])
    if s.get("gpus_per_task"):  # 0: ask for none, as when not given
        params["gpus_per_node"] = _positive_int("gpus_per_task", s["gpus_per_task"])
    if "partition" in s:
        if not isinstance(s["partition"], str) or not s["partition"]:
            raise BadInputError(f"slurm partition must be a name, got {s['partition']!r}")
        params["slurm_partition"] = s["partition"]
    if "mem_gb" in s:
        if not isinstance(s["mem_gb"], (int, float)) or s["mem_gb"] <= 0:
            raise BadInputError(f"slurm mem_gb must be a positive number, got {s['mem_gb']!r}")
        params["mem_gb"] = float(s["mem_gb"])
    # submitit asks for USR2 shortly before the time limit (--signal=USR2@90, to checkpoint and
    # requeue). Slurm may send it up to a minute early, so with short limits it can arrive while
    # the task's Python is still starting, and USR2's default action kills it: a ``failed`` that
    # was really a ``timeout``. A notebook is not checkpointable, so ask for a no-op signal instead.
    extra: dict[str, object] = {"signal": "CONT@30"}
    if "sbatch_options" in s:
        if not isinstance(s["sbatch_options"], Mapping):
            raise BadInputError("slurm sbatch_options must be a mapping of sbatch option → value")
        extra.update({str(k).lstrip("-"): v for k, v in s["sbatch_options"].items()})
    params["slurm_additional_parameters"] = extra
    if "setup" in s:
        setup = s["setup"]
        if not isinstance(setup, list) or not all(isinstance(x, str) for x in setup):
            raise BadInputError("slurm setup must be a list of shell lines run before each task")
        params["slurm_setup"] = list(setup)
    return params
