"""Files that survive a crash: what the results store, the ledger and the Slurm job list share.

A rename is atomic on POSIX filesystems, but neither the new file's bytes nor the rename itself
are on disk until fsynced: write a temp file, fsync it, rename it over the target, fsync the
directory (the rename is an entry of the directory).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["fsync_dir", "write_atomic", "write_text_atomic"]


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (a new file's name, a rename) durable; best effort
    (some filesystems refuse to fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[BinaryIO], object], tmp: Path | None = None) -> None:
    """Replace ``path`` by what ``write`` writes into a binary file: readers see the old content
    or the new, never a part; on any failure the temp file (``tmp``, default a hidden sibling) is
    removed and the old content stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp or path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())  # the rename must never publish an empty or partial file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # the rename itself survives a crash


def write_text_atomic(path: Path, text: str) -> None:
    """:func:`write_atomic` of a text (UTF-8)."""
    write_atomic(path, lambda fh: fh.write(text.encode()))
