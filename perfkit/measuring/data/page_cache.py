"""What the page cache holds of a dataset's files, measured; asking the kernel to drop them.

**Residency** is counted with ``mincore(2)``: each file is mapped (``mmap``, ``PROT_READ``,
``MAP_SHARED``, never touched, so the mapping faults nothing in) and the kernel reports, per page
of the mapping, whether the page is in the page cache (bit 0 of each byte of the vector; the
other bits are reserved). This is what ``fincore`` of util-linux and ``vmtouch`` print. Python's
``os`` has no ``mincore``; it is called through ctypes from the C library. Where there is none
(or a file cannot be mapped) the residency is unknown: NaN with the reason in ``note``.

**Eviction** is a request: ``posix_fadvise(POSIX_FADV_DONTNEED)`` over each file, no root needed.
Linux drops the clean, unmapped pages of a disk filesystem's file (``mm/fadvise.c``: write-back
started, then the page-cache range invalidated); dirty pages, pages some process has mapped, and
every page of tmpfs or ramfs (no backing store to drop them to) stay. Whether it happened is
therefore measured afterwards (:func:`evicted`), never taken from the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["EVICTED_AT_MOST", "Residency", "residency", "evict", "evicted", "filesystem"]

#: Resident fraction up to which a dataset counts as dropped from the page cache after a request.
EVICTED_AT_MOST = 0.01


@dataclass(kw_only=True, frozen=True)
class Residency:
    """Pages of a dataset's files in the page cache, as ``mincore`` reported them."""

    resident_pages: int
    """Pages in the page cache."""
    pages: int
    """Pages the files span (each file rounded up to whole pages)."""
    note: str | None = None
    """Why the residency is unknown; None when it was measured."""

    @property
    def fraction(self) -> float:
        """``resident_pages / pages`` (unitless); NaN when unknown or there are no pages."""
        if self.note is not None or self.pages == 0:
            return math.nan
        return self.resident_pages / self.pages


def _files(path: str | Path) -> list[Path]:
    path = Path(path)
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


@functools.cache
def _mincore():
    """``(libc, None)`` with ``mmap``, ``munmap`` and ``mincore`` typed, or ``(None, reason)``."""
    if not hasattr(mmap, "MAP_SHARED") or not hasattr(mmap, "PROT_READ"):
        return None, "mincore(2) needs POSIX mmap, which this platform lacks"
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        mincore, mapper, unmapper = libc.mincore, libc.mmap, libc.munmap
    except (OSError, AttributeError, TypeError) as error:
        return None, f"mincore(2) is not available from the C library ({name}): {error}"
    mapper.restype = ctypes.c_void_p
    mapper.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
    unmapper.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc, None


def _resident_pages(libc, file: Path) -> tuple[int, int]:
    """``(resident, pages)`` of one file."""
    size = file.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    if pages == 0:
        return 0, 0
    fd = os.open(file, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)  # the mapping holds the file
    if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED
        err = ctypes.get_errno()
        raise OSError(err, f"mmap: {os.strerror(err)}", str(file))
    try:
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(addr, size, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}", str(file))
        return int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1)), pages
    finally:
        libc.munmap(addr, size)


def residency(path: str | Path) -> Residency:
    """The page-cache residency of every file under ``path`` (or of the file ``path``)."""
    libc, reason = _mincore()
    if libc is None:
        return Residency(resident_pages=0, pages=0, note=reason)
    resident = pages = 0
    for file in _files(path):
        try:
            r, p = _resident_pages(libc, file)
        except OSError as error:
            return Residency(resident_pages=0, pages=0, note=f"residency unknown: {error}")
        resident, pages = resident + r, pages + p
    return Residency(resident_pages=resident, pages=pages)


def evict(path: str | Path) -> None:
    """Ask the kernel to drop every file under ``path`` from the page cache (``posix_fadvise``
    ``DONTNEED``); a no-op where the platform lacks it. Whether it did: :func:`residency`."""
    if not hasattr(os, "posix_fadvise"):
        return
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evicted(after: Residency) -> bool | None:
    """Whether a dataset measured ``after`` an eviction request is out of the page cache
    (resident fraction at most :data:`EVICTED_AT_MOST`); None when the residency is unknown."""
    fraction = after.fraction
    return None if math.isnan(fraction) else fraction <= EVICTED_AT_MOST


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as three-digit octal escapes (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem(path: str | Path) -> str | None:
    """The type of the filesystem holding ``path`` (``ext4``, ``tmpfs``, ``nfs4``, ...), from the
    longest mount point above it in ``/proc/self/mountinfo``; None where there is none."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target, best, kind = os.path.realpath(path), -1, None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or not rest:
            continue
        mount = _unescape(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best:  # a later mount on the same point hides the earlier
            best, kind = len(mount), rest[0]
    return kind
