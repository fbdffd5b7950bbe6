"""The files a configuration's parameters name, whose contents are part of what it measures.

Two kinds, found by path alone (nothing imported, nothing downloaded):

- a local Hugging Face model, ``hf:./my-model/`` or ``hf:/models/x/config.json``: its ``config.json``
  (:func:`hf_local_config`);
- a user's entry point, ``package.module:function`` (a model, a kernel, an input maker), whose
  module lies in ``model_path`` or beside the notebook: its source file, or every ``.py`` file of
  its top-level package (a package's modules import each other) (:func:`entry_point_sources`).
  Modules of installed packages (``torch.nn.functional:rms_norm``) are not found there: the
  environment fingerprint (``env_torch``, ...) already says which version ran.

:func:`named_file_digests` gives each such parameter the sha256 of those files' contents, so that
editing the model's code or config makes a new configuration id, and a resumed sweep runs it again
instead of keeping the row of the old code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from perfkit.core.entry_points import split_entry_point

__all__ = ["hf_local_config", "entry_point_sources", "named_file_digests"]
_MAX_PACKAGE_FILES = 2000


def hf_local_config(target: str, base: Path | None = None) -> Path | None:
    """The ``config.json`` path that ``hf:<target>`` names when ``target`` is a local path (a
    folder holding it, or the file itself; relative to ``base``, else the working directory), or
    None where ``target`` is a hub id or a ``model_type``. The file may not exist: the caller says so."""
    path = Path(target).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if not (target.startswith((".", "/", "~")) or path.exists()):
        return None
    return path / "config.json" if path.is_dir() else path


def entry_point_sources(target: str, folders: Iterable[Path]) -> list[Path]:
    """The source files of ``target``'s module where it lies in one of ``folders`` (the first that
    has it, as ``sys.path`` would find it): its own file, or every ``.py`` of its top-level package."""
    named = split_entry_point(target)
    if named is None:
        return []
    parts = named[0].split(".")
    for folder in folders:
        top = folder / parts[0]
        if top.is_dir() and (top / "__init__.py").is_file():
            return sorted(top.rglob("*.py"))[:_MAX_PACKAGE_FILES]
        module = folder.joinpath(*parts[:-1], parts[-1] + ".py")
        if module.is_file():
            return [module]
    return []


def _strings(value) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _digest(files: Iterable[Path], root: Path | None = None) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update((str(f.relative_to(root)) if root and f.is_relative_to(root) else f.name).encode())
        h.update(b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def named_file_digests(params: Mapping[str, object], folder: Path, *, model_path: str | None = None) -> dict[str, str]:
    """Parameter → sha256 of the files its value names (:func:`hf_local_config`,
    :func:`entry_point_sources`), relative paths from ``folder`` (the notebook's, where its kernel
    runs); entry points are looked up in ``model_path`` (relative to ``folder``), then ``folder``.
    Parameters that name no such file are left out."""
    folders = [folder]
    if model_path:
        where = Path(model_path).expanduser()
        folders.insert(0, where if where.is_absolute() else folder / where)
    out = {}
    for name, value in params.items():
        configs: list[Path] = []
        sources: list[Path] = []
        for text in _strings(value):
            if text.startswith("hf:"):
                found = hf_local_config(text[3:], folder)
                if found is not None and found.is_file():
                    configs.append(found)
            else:
                sources += entry_point_sources(text, folders)
        if len(configs) == 1 and not sources:  # the file's own sha256, as ids have had it since 7343c43
            out[name] = hashlib.sha256(configs[0].read_bytes()).hexdigest()
        elif configs or sources:
            out[name] = _digest(dict.fromkeys(configs + sources), folder)
    return out
