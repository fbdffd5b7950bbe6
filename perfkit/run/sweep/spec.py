"""Sweep specs: a notebook, fixed parameters, a grid, extra configs, exclusions — validated.

YAML (safe loader only) or the same as Python::

    notebook: ../notebooks/gemm.ipynb      # relative to the spec file
    parameters: {min_run_time_s: 0.05}     # fixed for every configuration
    grid:                                  # cartesian product, in the order written
      sizes: [[64, 128], [256, 512]]
      dtypes: [["fp32"], ["bf16"]]
    configs:                               # explicit extra configurations
      - {sizes: [32], dtypes: ["fp64"]}
    exclude:                               # drop configurations matching every key given
      - {sizes: [256, 512], dtypes: ["bf16"]}
    timeout_s: 600                         # wall-time limit per configuration
    devices_per_config: 1                  # GPUs each configuration owns (ignored on CPU)
    oom_axis: batch_size                   # after an oom, larger values of this are skipped

A spec may also hold several such parts under ``parts:`` (one list entry per notebook), sharing
the top-level ``timeout_s``/``devices_per_config`` defaults. Top-level ``variants:`` and
``rounds:`` make it an interleaved A/B sweep (:mod:`perfkit.run.sweep.variants`). Everything is checked before any
configuration runs: names against the notebook's parameters cell, values against the types of
its defaults, and no empty grids or duplicate configurations.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import BadInputError, ParameterTypeError, UnknownParameterError
from ...core.results import RunContext
from ..notebooks import NotebookSpec, check_params, config_id, read_notebook
from .variants import Variant, check_interpreter, interleaved, parse_rounds, parse_variants

__all__ = ["SweepPart", "SweepSpec", "Config", "Variant", "load_spec", "expand"]

_PART_KEYS = {"notebook", "parameters", "grid", "configs", "exclude", "timeout_s", "devices_per_config",
              "oom_axis", "name"}
_TOP_KEYS = _PART_KEYS | {"parts", "slurm", "ray", "variants", "rounds"}


@dataclass(kw_only=True, frozen=True)
class SweepPart:
    """One notebook and the configurations to run it with."""

    notebook: Path
    """The notebook to execute, once per configuration."""
    parameters: Mapping[str, object] = field(default_factory=dict)
    """Fixed parameters, shared by every configuration of this part."""
    grid: Mapping[str, Sequence[object]] = field(default_factory=dict)
    """Parameter name → values; the configurations are their cartesian product."""
    configs: Sequence[Mapping[str, object]] = ()
    """Explicit extra configurations (each merged over ``parameters``)."""
    exclude: Sequence[Mapping[str, object]] = ()
    """A configuration matching every key of one of these is dropped."""
    timeout_s: float | None = None
    """Wall-time limit per configuration; None for no limit."""
    devices_per_config: int = 1
    """GPUs each configuration owns (its slot's CUDA_VISIBLE_DEVICES); ignored on CPU."""
    oom_axis: str | None = "batch_size"
    """After an ``oom``, pending configurations equal but for a larger value of this parameter
    are ``skipped`` (an OOM is the edge of the axis, not a crash); None to run them anyway."""
    name: str | None = None

    def __post_init__(self):
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise BadInputError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if not isinstance(self.devices_per_config, int) or self.devices_per_config < 1:
            raise BadInputError(f"devices_per_config must be a positive integer, got {self.devices_per_config!r}")
        if not isinstance(self.grid, Mapping):
            raise BadInputError("grid must be a mapping of parameter name → list of values")
        for name, values in self.grid.items():
            if not isinstance(values, (list, tuple)):
                raise BadInputError(f"grid[{name!r}] must be a list of values, got {values!r}")
            if len(values) == 0:
                raise BadInputError(f"grid[{name!r}] is empty: the grid would have no configurations")


@dataclass(kw_only=True, frozen=True)
class SweepSpec:
    parts: tuple[SweepPart, ...]
    source: Path | None = None
    """The YAML file it came from, if any."""
    slurm: Mapping[str, object] = field(default_factory=dict)
    """Settings for ``--executor slurm`` (partition, time limit, ...)."""
    ray: Mapping[str, object] = field(default_factory=dict)
    """Settings for ``--executor ray`` (address, cpus_per_config)."""
    variants: tuple[Variant, ...] = ()
    """The sides of an A/B sweep; every configuration runs under each (none: a plain sweep)."""
    rounds: int = 1
    """How many times each configuration runs under each variant, interleaved."""

    def __post_init__(self):
        if self.variants and len(self.variants) < 2:
            raise BadInputError("an A/B sweep needs at least two variants")
        object.__setattr__(self, "rounds", parse_rounds(self.rounds))


@dataclass(kw_only=True, frozen=True)
class Config:
    """One configuration: a notebook and the full set of parameters it runs with."""

    config_id: str
    notebook: Path
    params: dict
    timeout_s: float | None
    devices: int
    oom_axis: str | None
    part: int
    variant: Variant | None = None
    """The A/B side it runs under (its interpreter, environment and parameter overrides)."""
    round: int = 1
    row_columns: Mapping[str, object] = field(default_factory=dict)
    """What its rows carry besides the parameters: an A/B sweep's ``variant``, ``round`` and
    ``variant_params`` (the names the variant sets); empty in a plain sweep."""

    @property
    def variant_name(self) -> str | None:
        return self.variant.name if self.variant else None

    def run_context(self, results_path: Path) -> RunContext:
        """Where its rows go and what they carry, for rows written without its kernel (an ending
        the engine or the Slurm driver records)."""
        return RunContext(results_path=results_path, config_id=self.config_id,
                          params={**self.params, **self.row_columns}, param_names=tuple(self.params),
                          notebook=self.notebook.name)


def _load_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise BadInputError(f"sweep spec {str(path)!r} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInputError(f"{path}: malformed YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise BadInputError(f"{path}: a sweep spec is a YAML mapping with at least 'notebook' and 'grid'")
    return data


def _part(raw: Mapping, base: Path, defaults: Mapping) -> SweepPart:
    unknown = set(raw) - _PART_KEYS
    if unknown:
        raise BadInputError(f"unknown key(s) {sorted(unknown)} in sweep spec; valid: {sorted(_PART_KEYS)}")
    if "notebook" not in raw:
        raise BadInputError("sweep spec has no 'notebook'")
    merged = {**{k: v for k, v in defaults.items() if k in ("timeout_s", "devices_per_config", "oom_axis")}, **raw}
    nb = Path(str(merged["notebook"]))
    for key in ("parameters",):
        if merged.get(key) is not None and not isinstance(merged[key], Mapping):
            raise BadInputError(f"'{key}' must be a mapping of parameter name → value")
    for key in ("configs", "exclude"):
        value = merged.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise BadInputError(f"'{key}' must be a list of mappings (parameter name → value)")
    return SweepPart(
        notebook=nb if nb.is_absolute() else (base / nb),
        parameters=dict(merged.get("parameters") or {}),
        grid=merged.get("grid") if merged.get("grid") is not None else {},
        configs=list(merged.get("configs") or []),
        exclude=list(merged.get("exclude") or []),
        timeout_s=merged.get("timeout_s"),
        devices_per_config=merged.get("devices_per_config", 1),
        oom_axis=merged.get("oom_axis", "batch_size"),
        name=merged.get("name"),
    )


def load_spec(path: str | Path) -> SweepSpec:
    """Read and structurally validate a YAML sweep spec (types are checked by :func:`expand`)."""
    path = Path(path)
    data = _load_yaml(path)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise BadInputError(f"unknown key(s) {sorted(unknown)} in {path}; valid: {sorted(_TOP_KEYS)}")
    base = path.resolve().parent
    if "parts" in data:
        if not isinstance(data["parts"], list) or not data["parts"]:
            raise BadInputError(f"{path}: 'parts' must be a non-empty list of sweep parts")
        parts = tuple(_part(p, base, data) for p in data["parts"])
    else:
        parts = (_part({k: v for k, v in data.items() if k in _PART_KEYS}, base, {}),)
    slurm, ray = data.get("slurm") or {}, data.get("ray") or {}
    for key, value in (("slurm", slurm), ("ray", ray)):
        if not isinstance(value, Mapping):
            raise BadInputError(f"{path}: '{key}' must be a mapping of {key.title()} settings")
    return SweepSpec(parts=parts, source=path, slurm=dict(slurm), ray=dict(ray), variants=parse_variants(data.get("variants"), base),
                     rounds=parse_rounds(data.get("rounds")))


def _matches(params: Mapping, rule: Mapping) -> bool:
    return all(k in params and params[k] == (list(v) if isinstance(v, tuple) else v) for k, v in rule.items())


def _check(nb: NotebookSpec, params: Mapping, where: str, *, complete: bool = False) -> dict:
    try:
        return check_params(nb, params, complete=complete)
    except UnknownParameterError as exc:
        raise BadInputError(f"{where}: {exc.reason}") from None
    except ParameterTypeError as exc:
        hint = ""
        if isinstance(nb.parameters[exc.name].default, (list, tuple)) and where.startswith("grid"):
            hint = f"; in a grid each value must itself be a list, e.g. {exc.name}: [[...], [...]]"
        raise BadInputError(f"{where}: {exc.reason}{hint}") from None


def expand(spec: SweepSpec, *, check_interpreters: bool = True) -> list[Config]:
    """Every configuration of the spec, validated, in a stable order (grid order, then extras);
    in an A/B sweep every point under every variant and round, interleaved. Each variant's
    interpreter is run once to check it (``check_interpreters``)."""
    points = _points(spec)
    for variant in spec.variants:
        for part_index in sorted({c.part for c in points}):
            nb = read_notebook(spec.parts[part_index].notebook)
            _check(nb, variant.parameters, f"parameters of variant {variant.name!r}")
        if check_interpreters:
            check_interpreter(variant)
    if not spec.variants and spec.rounds == 1:
        return points
    configs: list[Config] = []
    notebooks: dict[int, NotebookSpec] = {}
    seen: dict[str, Config] = {}
    for point, variant, round_ in interleaved(points, spec.variants, spec.rounds):
        nb = notebooks.get(point.part) or notebooks.setdefault(point.part, read_notebook(point.notebook))
        params = ({**point.params, **_check(nb, variant.parameters, "variant")} if variant
                  else point.params)
        if variant and variant.parameters:  # a new configuration: the notebook's value check
            _check(nb, params, f"variant {variant.name!r}", complete=True)
        base = config_id(nb, params)
        cid = f"{base}-{variant.name}-r{round_}" if variant else f"{base}-r{round_}"
        if cid in seen:
            raise BadInputError(f"variant {variant.name!r} makes {params} a duplicate configuration: its "
                                f"parameters override what the grid sweeps")
        seen[cid] = point
        tags = {"variant": variant.name if variant else None, "round": round_,
                "variant_params": sorted(variant.parameters) if variant else []}
        configs.append(Config(**{**point.__dict__, "config_id": cid, "params": params, "variant": variant,
                                 "round": round_, "row_columns": tags}))
    return configs


def _points(spec: SweepSpec) -> list[Config]:
    """The configurations of the spec's parts (one per grid point and extra), before variants."""
    configs: list[Config] = []
    seen: dict[str, str] = {}
    for index, part in enumerate(spec.parts):
        nb = read_notebook(part.notebook)
        fixed = _check(nb, part.parameters, "parameters")
        for rule in part.exclude:
            _check(nb, rule, "exclude")
        if part.oom_axis and part.oom_axis not in nb.parameters:
            part = SweepPart(**{**part.__dict__, "oom_axis": None})  # nothing to cut along
        combos = []
        if part.grid:
            names = list(part.grid)
            for values in itertools.product(*(part.grid[n] for n in names)):
                combos.append(("grid", dict(zip(names, values))))
        combos.extend(("configs", dict(extra)) for extra in part.configs)
        if not combos:
            combos = [("parameters", {})] if part.parameters else []
        if not combos:
            raise BadInputError(f"{part.notebook.name}: the spec has no grid and no configs: nothing to run")
        for where, combo in combos:
            params = {**fixed, **_check(nb, combo, f"{where} of {part.notebook.name}")}
            if any(_matches(params, rule) for rule in part.exclude):
                continue
            _check(nb, params, f"{where} of {part.notebook.name}", complete=True)
            cid = config_id(nb, params)
            if cid in seen:
                raise BadInputError(f"duplicate configuration {params} ({where}; same as {seen[cid]})")
            seen[cid] = where
            configs.append(Config(config_id=cid, notebook=part.notebook.resolve(), params=params,
                                  timeout_s=part.timeout_s, devices=part.devices_per_config,
                                  oom_axis=part.oom_axis, part=index))
    if not configs:
        raise BadInputError("every configuration is excluded: nothing to run")
    return configs
