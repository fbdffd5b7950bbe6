"""User code named by an entry point, ``package.module:function``, imported with one line of error.

A model (:mod:`perfkit.measuring.workloads.user`), a kernel and its input maker
(:mod:`perfkit.measuring.ops.user_kernels`) are all named this way; ``model_path`` is put first on
``sys.path`` (a notebook's folder-relative path made absolute, so a later ``chdir`` does not move it).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable

from perfkit.core.errors import BadInputError

__all__ = ["load_entry_point", "split_entry_point"]

_ENTRY_POINT = re.compile(r"^([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")


def split_entry_point(target: str) -> tuple[str, str] | None:
    """``("package.module", "function")`` of ``package.module:function``; None for anything else."""
    m = _ENTRY_POINT.match(target) if isinstance(target, str) else None
    return (m.group(1), m.group(2)) if m else None


def _import_module(module: str, model_path: str | None, what: str):
    if model_path:
        model_path = os.path.abspath(model_path)  # a later chdir must not move it
        if model_path not in sys.path:
            sys.path.insert(0, model_path)
    try:
        return importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any failure to import is the user's to see, in one line
        where = f" (model_path {model_path!r})" if model_path else " (set model_path or PYTHONPATH)"
        raise BadInputError(f"{what}: module {module!r} does not import{where}: "
                            f"{type(err).__name__}: {err}".splitlines()[0]) from None


def load_entry_point(target: str, model_path: str | None = None) -> Callable:
    """The function ``package.module:function`` names, imported (``model_path`` first on sys.path)."""
    parts = split_entry_point(target)
    if parts is None:
        raise BadInputError(f"entry point {target!r}: write it as 'package.module:function'")
    module, function = parts
    found = _import_module(module, model_path, f"entry point {target!r}")
    fn = getattr(found, function, None)
    if not callable(fn):
        raise BadInputError(f"entry point {target!r}: module {module!r} has no function {function!r}")
    return fn
