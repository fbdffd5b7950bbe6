"""Notebooks as parameterized programs: their parameters, validation of values, configuration ids.

papermill only *warns* about an unknown parameter and injects any value it is given; perfkit
checks every name and value against the notebook's ``parameters`` cell before anything runs, so
a typo in a sweep of hundreds of configurations fails in a second instead of running the
defaults hundreds of times.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import BadInputError, ParameterTypeError, UnknownParameterError
from ..core.model_files import named_file_digests

#: The tag of a code cell that only views results (plots, tables, advice): from the first one on, a
#: sweep hands the device to the next configuration (:mod:`perfkit.run._papermill_engine`).
VIEW_TAG = "view"

__all__ = ["VIEW_TAG", "warm_statement", "Parameter", "NotebookSpec", "read_notebook", "coerce_cli_value", "check_params", "config_id"]

_MISSING = object()


@dataclass(kw_only=True, frozen=True)
class Parameter:
    """One assignment of the notebook's ``parameters`` cell."""

    name: str
    default: object
    """The default as a Python literal; ``None`` is also used when the default is no literal."""
    literal: bool
    """Whether the default is a plain literal (its type is then enforced on overrides)."""
    source: str
    """The right-hand side as written in the cell."""
    comment: str = ""
    """A trailing ``# comment`` on the line, shown as the parameter's help."""

    @property
    def type_name(self) -> str:
        if not self.literal or self.default is None:
            return "any"
        return type(self.default).__name__


@dataclass(kw_only=True, frozen=True)
class NotebookSpec:
    """A notebook on disk, its parameters, and the hash of its code."""

    path: Path
    parameters: dict[str, Parameter]
    code_sha256: str
    """Hash of the code cells' sources only: saving the notebook with outputs in JupyterLab
    does not change the configuration ids, editing its code does."""
    imports: tuple[str, ...] = ()
    """Top-level import statements of its code cells (a warm kernel runs them in advance)."""
    check: str | None = None
    """``"module:function"`` from the notebook's metadata (``{"perfkit": {"check": ...}}``): called
    with every parameter's value (defaults, overridden by the configuration's) before anything
    runs, it raises :class:`BadInputError` for values the notebook's code would refuse, so a bad
    value in a sweep fails in a second, with exit 2, not in a kernel minutes later."""
    warm: str | None = None
    """``"module:function"`` from the metadata's ``perfkit.warm``: called in a configuration's kernel
    with its parameters (as ``check``) while the kernel is prestarted, it imports what that
    configuration will (its model's library), so the imports are not inside its measurement."""

    @property
    def names(self) -> list[str]:
        return list(self.parameters)


def read_notebook(path: str | Path) -> NotebookSpec:
    """Read ``path`` and its ``parameters`` cell; BadInputError when either is missing or broken."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"notebook {str(path)!r} not found")
    try:
        nb = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"{path} is not a readable notebook: {exc}") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise BadInputError(f"{path} is not a notebook (no cells)")
    code = [c for c in cells if c.get("cell_type") == "code"]
    tagged = [c for c in code if "parameters" in (c.get("metadata", {}).get("tags") or [])]
    if not tagged:
        raise BadInputError(
            f"{path} has no cell tagged 'parameters'; tag the cell of defaults "
            "(JupyterLab: property inspector → Cell Tags)"
        )
    if len(tagged) > 1:
        raise BadInputError(f"{path} has {len(tagged)} cells tagged 'parameters'; keep exactly one")
    _check_view_cells(code, path)
    source = _source(tagged[0])
    digest = hashlib.sha256("\n\x00".join(_source(c) for c in code).encode()).hexdigest()
    imports = tuple(stmt for c in code if c is not tagged[0] for stmt in _imports(_source(c)))
    return NotebookSpec(path=path, parameters=_parse_parameters(source, path), code_sha256=digest,
                        imports=tuple(dict.fromkeys(imports)), check=_check_target(nb, path),
                        warm=_check_target(nb, path, "warm"))


def _check_view_cells(code: list[dict], path: Path) -> None:
    """Cells tagged ``view`` only view what the cells above them recorded: a sweep hands the device
    to the next configuration before the first one runs, so no measuring cell may follow it."""
    viewing = False
    for index, cell in enumerate(code):
        is_view = VIEW_TAG in (cell.get("metadata", {}).get("tags") or [])
        if viewing and not is_view and _source(cell).strip():
            raise BadInputError(
                f"{path}: code cell {index + 1} follows a cell tagged '{VIEW_TAG}' without the tag itself; the "
                f"device is handed on before the first '{VIEW_TAG}' cell, so tag every cell after it "
                f"'{VIEW_TAG}' (it only views results) or move it above")
        viewing = viewing or is_view


def _check_target(nb: dict, path: Path, key: str = "check") -> str | None:
    meta = nb.get("metadata", {}).get("perfkit", {}) if isinstance(nb.get("metadata"), dict) else {}
    target = meta.get(key) if isinstance(meta, dict) else None
    if target is None:
        return None
    module, _, function = str(target).partition(":")
    if not module or not function.isidentifier():
        raise BadInputError(f"{path}: metadata perfkit.{key} must be 'module:function', got {target!r}")
    return str(target)


def warm_statement(spec: NotebookSpec, params: Mapping[str, object]) -> str | None:
    """The code a prestarted kernel runs for a configuration of ``spec`` with ``params``: its
    notebook's ``perfkit.warm`` function called with every parameter's value; None without one."""
    if spec.warm is None:
        return None
    module, _, function = spec.warm.partition(":")
    values = {name: p.default for name, p in spec.parameters.items()} | dict(params)
    return f"import importlib; importlib.import_module({module!r}).{function}({values!r})"


def _run_check(spec: NotebookSpec, params: Mapping[str, object]) -> None:
    """Call the notebook's value check (:attr:`NotebookSpec.check`) on its full parameter set,
    from the notebook's folder: its kernel runs there, so a relative path among the parameters
    (a user model's ``model_path``) means the same thing to the check as to the kernel."""
    import importlib
    import os

    module, _, function = spec.check.partition(":")
    try:
        check = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise BadInputError(f"{spec.path}: its value check {spec.check!r} cannot be loaded ({exc}); "
                            "fix the notebook's metadata perfkit.check") from None
    values = {name: p.default for name, p in spec.parameters.items()} | dict(params)
    here = os.getcwd()
    try:
        os.chdir(spec.path.resolve().parent)
        check(values)
    except BadInputError as exc:
        raise BadInputError(f"{spec.path.name} {json.dumps(dict(params), default=str)}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"{spec.path.name} {json.dumps(dict(params), default=str)}: "
                            f"{type(exc).__name__}: {exc}") from None
    finally:
        os.chdir(here)


def _imports(source: str) -> list[str]:
    # Cell magics and shell escapes are not Python; drop those lines before parsing.
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [ast.get_source_segment(text, node) for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _parse_parameters(source: str, path: Path) -> dict[str, Parameter]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BadInputError(f"{path}: the parameters cell is not valid Python ({exc.msg}, line {exc.lineno})") from None
    lines = source.splitlines()
    params: dict[str, Parameter] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        rhs = ast.get_source_segment(source, value) or ""
        try:
            default, literal = ast.literal_eval(value), True
        except ValueError:
            default, literal = None, False
        # The help text is a trailing comment after the assignment on its last line.
        tail = lines[node.end_lineno - 1][node.end_col_offset:] if node.end_lineno else ""
        comment = tail.split("#", 1)[1].strip() if "#" in tail else ""
        params[name] = Parameter(name=name, default=default, literal=literal, source=rhs, comment=comment)
    if not params:
        raise BadInputError(f"{path}: the parameters cell assigns no names")
    return params


def coerce_cli_value(param: Parameter, text: str) -> object:
    """Turn a command-line string into a value of the parameter's type.

    A ``str`` default takes the text as it is (never evaluated); other types are read as a
    Python literal (``ast.literal_eval``: data only, never code), else as JSON (``{"split":
    false}``, ``[1, null]``: what a shell script or another tool writes), with ``true``/``false``
    accepted for booleans.
    """
    if param.literal and isinstance(param.default, str):
        return text
    lowered = text.strip().lower()
    if isinstance(param.default, bool) and lowered in {"true", "false"}:
        return lowered == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    try:
        value = json.loads(text)
    except ValueError:
        if not param.literal or param.default is None:
            return text  # untyped parameter: a plain string
        raise ParameterTypeError(param.name, param.type_name, text) from None
    if not param.literal or param.default is None:
        return value if isinstance(value, (dict, list)) else text  # a bare JSON word stays text there
    return value


def _type_ok(default: object, value: object) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def check_params(spec: NotebookSpec, params: Mapping[str, object], *,
                 complete: bool = True) -> dict[str, object]:
    """Validate names and types against the notebook, then the values with the notebook's own
    check when it names one (:attr:`NotebookSpec.check`); return the values, ints widened to
    float where the default is a float (so ``1`` and ``1.0`` are one configuration).
    ``complete=False``: ``params`` are part of a configuration (a sweep's fixed parameters, an
    exclusion rule): names and types only, the value check waits for the whole configuration."""
    checked: dict[str, object] = {}
    for name, value in params.items():
        param = spec.parameters.get(name)
        if param is None:
            raise UnknownParameterError(name, str(spec.path), spec.names)
        if param.literal and not _type_ok(param.default, value):
            raise ParameterTypeError(name, param.type_name, value)
        if param.literal and isinstance(param.default, float) and isinstance(value, int):
            value = float(value)
        if isinstance(value, tuple):
            value = list(value)
        checked[name] = value
    if complete and spec.check is not None:
        _run_check(spec, checked)
    return checked


def config_id(spec: NotebookSpec, params: Mapping[str, object]) -> str:
    """Stable id of (notebook code, parameters, the model files they name): the notebook's stem and
    12 hex digits.

    A parameter naming a local model file — ``hf:./folder`` (its ``config.json``), or a user's entry
    point ``module:function`` whose module lies in ``model_path`` or beside the notebook (its source,
    :mod:`perfkit.core.model_files`) — adds that file's digest to the id, so editing the model makes a
    new configuration and a resumed sweep runs it again instead of keeping the row of the old code.
    ``model_path`` is the configuration's, else the notebook's default. Ids of configurations that
    name no such file are as before."""
    blob = {"code": spec.code_sha256, "params": dict(params)}
    files = _model_files(spec, params)
    if files:
        blob["files"] = files
    text = json.dumps(blob, sort_keys=True, default=str)
    return f"{spec.path.stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _model_files(spec: NotebookSpec, params: Mapping[str, object]) -> dict[str, str]:
    """Parameter → digest of the local model files it names, defaults included (a notebook whose
    default ``impls`` name the user's module is measuring that module too)."""
    defaults = {n: p.default for n, p in spec.parameters.items() if p.literal}
    merged = {**defaults, **params}
    model_path = merged.get("model_path")
    return named_file_digests(merged, spec.path.parent, model_path=model_path if isinstance(model_path, str) else None)

