"""A derived index of a results folder: its rows compacted into a few Parquet parts, so one
question over thousands of small results files opens a few parts instead of every footer.

``DIR/.perfkit-index/`` (an ``IGNORE_MARKER`` keeps :func:`result_files` out) holds parts, the
rows of files of one Arrow schema and units plus the column :data:`ID` (the file a row came from)
in listing order, and ``manifest.json`` (atomic): :data:`FORMAT` and, per file, the ``(size,
mtime_ns, inode, ctime_ns)`` of the bytes read (``fstat`` of the open file), its id, part, rows.

Derived, never trusted: :func:`plan` serves from the index only files whose signature matches;
others are read directly, rows of removed or changed ones masked out by ``ID``. ``write_rows``
renames a new file over the old (a new inode); a rewrite in place keeps inode and size and may
restore the mtime (``cp -p``, ``rsync -t``), never the ctime. Timestamps tick coarsely (ext4:
jiffies; NFS, FAT: up to seconds): a file whose ctime is not older than the filesystem's clock
before the read (the lock touched) may be rewritten within that tick unseen, so its blake2b digest
is kept and checked at each question (git's "racily clean" entries) until a fold finds it older.
:func:`refresh` folds changes in where it can write: new files appended as parts, a schema's
parts rewritten as one past ``_MAX_PARTS`` or a quarter dead. A damaged index is rebuilt, else the
plain scan. Parts are renamed into place before the manifest; builders take an ``flock`` (none:
the last manifest wins); retired parts go ``_RETIRE_S`` later, strays after ``_ORPHAN_S``. A
read-only folder is scanned as it is; ``PERFKIT_NO_INDEX=1`` turns the index off.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .durable import fsync_dir, write_text_atomic
from .results_files import IGNORE_MARKER, parquet_format, result_files

__all__ = ["INDEX_DIR", "ID", "FORMAT", "NO_INDEX_ENV", "Plan", "Part", "plan", "refresh"]

INDEX_DIR = ".perfkit-index"
ID = "__perfkit_file_id"
FORMAT = 2
NO_INDEX_ENV = "PERFKIT_NO_INDEX"
_MANIFEST = "manifest.json"
_ROW_GROUP, _ROW_GROUP_BYTES = 65_536, 64 << 20  # rows, or fewer where rows are big (bounds a build's memory)
_MIN_FILES = 64  # fewer files are scanned directly (~20 ms of footers) and leave no index behind
_MAX_PARTS, _DEAD_SHARE = 8, 0.25
_RETIRE_S, _ORPHAN_S = 60.0, 3600.0
_BATCH = 256  # files read at once while building
_LOCK = True


@dataclass(frozen=True)
class Part:
    """One index part as a question reads it."""

    path: Path
    fragment: object
    """Its ``pyarrow.dataset`` fragment, footer read and checked against the manifest."""
    schema: object
    """Its schema without :data:`ID` and without metadata: the schema of every file it holds."""
    units: bytes | None
    live_ids: list[int] | None
    """The ids of the files whose rows are current; None: every row of the part is."""
    first: int
    """Listing position of its first current file."""


@dataclass(frozen=True)
class Plan:
    """How to read a folder now: index parts, plus the files the index does not hold as they are."""

    parts: list[Part]
    direct: list[Path]
    position: dict[str, int]
    """A direct file's path (as listed) → its position in the listing."""
    id_position: object
    """numpy array: file id → listing position (-1: not current)."""


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _current(e: list | None, f: Path, stats: dict) -> bool:
    """Whether manifest entry ``e`` still describes ``f``: its signature, and its bytes where racy."""
    try:
        return e is not None and tuple(e[2:6]) == stats.get(f) and (e[7] is None or _digest(f.read_bytes()) == e[7])
    except OSError:
        return False


def _stats(files: list[Path]) -> dict[Path, tuple[int, int, int, int]]:
    stats = {}
    for f in files:
        try:
            stats[f] = _signature(os.stat(f))
        except OSError:
            pass  # gone since the listing: read directly, as the plain scan would
    return stats


def _key(schema) -> str:
    """What groups files into one part: the exact Arrow schema, and the units metadata."""
    import pyarrow as pa

    if ID in schema.names:
        schema = schema.remove(schema.get_field_index(ID))
    units = (schema.metadata or {}).get(b"perfkit.units", b"")
    bare = pa.schema(list(schema))  # no schema metadata
    return hashlib.sha1(bare.serialize().to_pybytes() + b"\0" + units).hexdigest()


def _load(index: Path) -> dict | None:
    """The manifest, or None when there is none or it is not one this code wrote (another
    format, a damaged entry): the index is then rebuilt."""
    try:
        m = json.loads((index / _MANIFEST).read_text())
        ok = (m.get("format") == FORMAT and isinstance(m["next_id"], int)
              and all(isinstance(m[k], dict) for k in ("parts", "files", "retired"))
              and all(isinstance(p["key"], str) and isinstance(p["rows"], int) for p in m["parts"].values())
              and all(len(e) == 8 and (e[1] is None or e[1] in m["parts"]) and 0 <= e[0] < m["next_id"]
                      and all(isinstance(v, int) for v in (e[0], *e[2:7])) and isinstance(e[7], (str, type(None)))
                      for e in m["files"].values()))
        return m if ok else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _rel(directory: Path, f: Path) -> str:
    return f.relative_to(directory).as_posix()


def _changes(m: dict | None, directory: Path, files: list[Path], stats: dict) -> tuple[list[Path], list[str]]:
    """(files new or changed since the manifest, manifest entries no longer listed or changed)."""
    known = (m or {}).get("files", {})
    fresh, stale, listed = [], [], set()
    for f in files:
        listed.add(rel := _rel(directory, f))
        if not _current(e := known.get(rel), f, stats):
            fresh.append(f)
            stale += [rel] if e is not None else []
    stale += [rel for rel in known if rel not in listed]
    return fresh, stale


def plan(directory: Path, files: list[Path], *, create: bool = True, fold: bool = True) -> Plan | None:
    """How to answer a question over ``files`` (``result_files(directory)``) now; None: scan the
    files. With ``fold``, changes are folded into the index first where the folder is writable
    (with ``create``, the first question over ``_MIN_FILES`` files or more builds it) and an index
    that cannot be read is rebuilt once, then left to the scan; without it nothing is written:
    new and changed files are read directly, and a broken index means the scan."""
    if os.environ.get(NO_INDEX_ENV, "") not in ("", "0"):
        return None
    directory = Path(directory)
    index = directory / INDEX_DIR
    m = _load(index)
    if m is None and not (create and len(files) >= _MIN_FILES):
        return None  # no index, none to build: not even a stat
    stats = _stats(files)
    fresh, stale = _changes(m, directory, files, stats)
    if fold and (m is None or fresh or stale):
        m = refresh(directory, files, stats) or m
    for rebuilt in (False, True):
        if m is None:
            return None
        try:
            return _plan(directory, index, m, files, stats)
        except Exception as exc:
            if not _broken_index(exc):
                raise
        m = None if rebuilt or not fold else refresh(directory, files, stats, rebuild=True)
    return None


def _broken_index(exc: Exception) -> bool:
    """An error reading the index (a bad manifest entry, a missing or truncated part)."""
    import pyarrow as pa

    return isinstance(exc, (OSError, ValueError, KeyError, IndexError, TypeError, pa.lib.ArrowException))


def _plan(directory: Path, index: Path, m: dict, files: list[Path], stats: dict) -> Plan:
    import numpy as np
    import pyarrow.dataset as ds

    by_part: dict[str, list[tuple[int, int, int]]] = {}
    direct, position = [], {}
    for i, f in enumerate(files):
        e = m["files"].get(_rel(directory, f))
        if e is not None and e[1] is not None and _current(e, f, stats):
            by_part.setdefault(e[1], []).append((int(e[0]), i, int(e[6])))
        else:
            direct.append(f)
            position[str(f)] = i
    id_position = np.full(int(m["next_id"]), -1, dtype=np.int64)
    names = sorted(by_part, key=lambda n: by_part[n][0][1])
    parts = []
    if names:
        dataset = ds.dataset([str(index / n) for n in names], format=parquet_format())
        for name, fragment in zip(names, dataset.get_fragments()):
            info, live = m["parts"][name], by_part[name]
            schema = fragment.physical_schema  # reads the footer: a missing or truncated part raises here
            if fragment.metadata.num_rows != info["rows"] or _key(schema) != info["key"] or ID not in schema.names:
                raise ValueError(f"index part {name} disagrees with the manifest")
            ids = [x[0] for x in live]
            id_position[ids] = [x[1] for x in live]
            whole = sum(x[2] for x in live) == info["rows"]
            bare = schema.remove(schema.get_field_index(ID)).remove_metadata()
            parts.append(Part(path=index / name, fragment=fragment, schema=bare,
                              units=(schema.metadata or {}).get(b"perfkit.units"),
                              live_ids=None if whole else ids, first=live[0][1]))
    return Plan(parts=parts, direct=direct, position=position, id_position=id_position)


def refresh(directory: str | Path, files: list[Path] | None = None, stats: dict | None = None, *,
            rebuild: bool = False, wait: bool = False) -> dict | None:
    """Fold the folder's changes into its index (build it when there is none; ``rebuild``: from
    scratch). Returns the manifest written (with a ``summary``), or None where nothing can be
    written (a read-only folder) or another process holds the lock and ``wait`` is False."""
    import fcntl

    directory = Path(directory)
    files = result_files(directory) if files is None else files
    stats = _stats(files) if stats is None else stats
    index = directory / INDEX_DIR
    try:
        index.mkdir(exist_ok=True)
        (index / IGNORE_MARKER).touch()
        lock = open(index / ".lock", "ab")
    except OSError:
        return None  # read-only: the plain scan answers
    with lock:
        if _LOCK:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None  # another builder is at it: answer from what is there
            except OSError:
                pass  # no locks on this filesystem: atomic renames still keep the index whole
        try:
            return _refresh_locked(directory, index, files, stats, rebuild)
        except Exception as exc:
            if not _broken_index(exc):
                raise
            return None  # disk full, permissions, a damaged part: the index stays as it was


def _refresh_locked(directory: Path, index: Path, files: list[Path], stats: dict, rebuild: bool) -> dict:
    started = time.perf_counter()
    os.utime(index / ".lock")  # the filesystem's clock now: the ctime a write would get
    now = _signature(os.stat(index / ".lock"))[3]
    m = _load(index) or {"format": FORMAT, "next_id": 0, "parts": {}, "files": {}, "retired": {}}
    retire: list[str] = []
    if rebuild:  # from scratch; the old parts are retired, ids keep counting up
        retire, m["parts"], m["files"] = list(m["parts"]), {}, {}
    fresh, stale = _changes(m, directory, files, stats)
    removed = len(set(stale) - {_rel(directory, f) for f in fresh})
    for rel in stale:
        del m["files"][rel]
    for e in m["files"].values():  # racy entries just checked current: older than the clock now, trusted
        e[7] = None if e[5] < now else e[7]
    position = {_rel(directory, f): i for i, f in enumerate(files)}
    new_parts = _write_new(directory, index, m, fresh, now)
    rewritten = _compact(index, m, position, retire)
    _collect(index, m, retire)
    m["summary"] = {"files": len(files), "read": len(fresh), "changed": len(stale) - removed, "removed": removed,
                    "new_parts": new_parts, "rewritten_parts": rewritten, "parts": len(m["parts"]),
                    "rows": sum(p["rows"] for p in m["parts"].values()),
                    "not_indexed": sum(e[1] is None for e in m["files"].values()),
                    "seconds": time.perf_counter() - started}
    write_text_atomic(index / _MANIFEST, json.dumps(m, separators=(",", ":")))
    return m


def _read_source(f: Path, now: int):
    """(f, signature and digest of exactly the bytes read (``fstat`` of the open file), its table)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open(f, "rb") as fh:
            sig, data = _signature(os.fstat(fh.fileno())), fh.read()
    except OSError:  # gone since the listing
        return f, None, None
    sig = [*sig, _digest(data) if sig[3] >= now else None]
    try:
        return f, sig, pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    except Exception:  # not Parquet: recorded as not indexed, read directly (the scan's error)
        return f, sig, None


class _PartWriter:
    """One part being written: row groups of ``_ROW_GROUP`` rows, to a temp name, then renamed."""

    def __init__(self, index: Path, schema):
        import pyarrow.parquet as pq

        self.name = f"part-{uuid.uuid4().hex}.parquet"
        self.index, self.schema = index, schema
        self.tmp = index / f".{self.name}.tmp-{os.getpid()}"
        self.writer = pq.ParquetWriter(self.tmp, schema)
        self.buffer, self.buffered, self.bytes, self.rows = [], 0, 0, 0

    def add(self, table) -> None:
        if self.buffered + table.num_rows > _ROW_GROUP or self.bytes >= _ROW_GROUP_BYTES:
            self._flush()
        self.buffer.append(table)
        n = table.num_rows
        self.buffered, self.bytes, self.rows = self.buffered + n, self.bytes + table.nbytes, self.rows + n

    def _flush(self) -> None:
        import pyarrow as pa

        if self.buffer:
            self.writer.write_table(pa.concat_tables(self.buffer), row_group_size=_ROW_GROUP)
        self.buffer, self.buffered, self.bytes = [], 0, 0

    def close(self) -> str:
        self._flush()
        self.writer.close()
        with open(self.tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self.tmp, self.index / self.name)
        return self.name

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def _write_new(directory: Path, index: Path, m: dict, fresh: list[Path], now: int) -> int:
    """Read ``fresh`` whole, in listing order, into one new part per schema; their manifest entries."""
    import concurrent.futures as cf

    import pyarrow as pa
    import pyarrow.parquet as pq

    writers: dict[str, _PartWriter] = {}
    entries: list[tuple[str, list]] = []
    try:
        with cf.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            for start in range(0, len(fresh), _BATCH):
                for f, sig, table in pool.map(_read_source, fresh[start:start + _BATCH], [now] * _BATCH):
                    file_id = m["next_id"]
                    m["next_id"] += sig is not None
                    if table is None:
                        if sig is not None:
                            entries.append((_rel(directory, f), [file_id, None, *sig[:4], 0, sig[4]]))
                        continue
                    key, raw = _key(table.schema), (table.schema.metadata or {}).get(b"perfkit.units")
                    table = table.replace_schema_metadata({b"perfkit.units": raw} if raw else None).append_column(
                        pa.field(ID, pa.int64()), pa.array([file_id] * table.num_rows, pa.int64()))
                    if key not in writers:
                        writers[key] = _PartWriter(index, table.schema)
                    writers[key].add(table)
                    entries.append((_rel(directory, f), [file_id, key, *sig[:4], table.num_rows, sig[4]]))
        names = {}
        for key, w in list(writers.items()):
            name = w.close()
            del writers[key]
            if _key(pq.read_schema(index / name)) == key:  # else a type that would not come back as written
                names[key] = name
                m["parts"][name] = {"key": key, "rows": w.rows}
            else:
                (index / name).unlink(missing_ok=True)
    finally:
        for w in writers.values():
            w.abort()
    for rel, e in entries:
        e[1] = names.get(e[1])  # None: read directly each time (recorded, so not retried until it changes)
        m["files"][rel] = e
    return len(names)


def _compact(index: Path, m: dict, position: dict[str, int], retire: list[str]) -> int:
    """Drop parts no current file uses; rewrite a schema's parts as one when they are many or
    a quarter of their rows are dead. Returns the number of parts written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    live: dict[str, list[tuple[int, str, int]]] = {}
    for rel, e in m["files"].items():
        if e[1] is not None:
            live.setdefault(e[1], []).append((int(e[0]), rel, int(e[6])))
    by_key: dict[str, list[str]] = {}
    for name, info in list(m["parts"].items()):
        if name not in live:
            retire.append(name)
            del m["parts"][name]
        else:
            by_key.setdefault(info["key"], []).append(name)
    written = 0
    for key, names in by_key.items():
        rows = sum(m["parts"][n]["rows"] for n in names)
        dead = rows - sum(x[2] for n in names for x in live[n])
        if len(names) <= _MAX_PARTS and dead <= _DEAD_SHARE * rows:
            continue
        ids = [x[0] for n in names for x in live[n]]
        tables = [ds.dataset(str(index / n)).to_table(filter=ds.field(ID).isin(ids), use_threads=False)
                  for n in names]
        table = pa.concat_tables(tables).replace_schema_metadata(pq.read_schema(index / names[0]).metadata)
        order_of = np.full(int(m["next_id"]), -1, dtype=np.int64)
        order_of[ids] = [position.get(x[1], -1) for n in names for x in live[n]]
        table = table.take(pc.sort_indices(pa.array(order_of[table[ID].to_numpy()])))  # stable
        w = _PartWriter(index, table.schema)
        try:
            for start in range(0, table.num_rows, 4096):  # row groups bounded as when building
                w.add(table.slice(start, 4096))
            name = w.close()
        except BaseException:
            w.abort()
            raise
        m["parts"][name] = {"key": key, "rows": w.rows}
        for n in names:
            for _, rel, _ in live[n]:
                m["files"][rel][1] = name
            del m["parts"][n]
            retire.append(n)
        written += 1
    return written


def _collect(index: Path, m: dict, retire: list[str]) -> None:
    """Delete parts retired over ``_RETIRE_S`` ago and strays over ``_ORPHAN_S`` old; note the newly retired."""
    now = time.time()
    for name, since in list(m["retired"].items()):
        if now - since > _RETIRE_S:
            (index / name).unlink(missing_ok=True)
            del m["retired"][name]
    for name in retire:
        m["retired"].setdefault(name, now)
    known = set(m["parts"]) | set(m["retired"])
    for p in index.iterdir():
        stray = p.name.startswith("part-") or (p.name.startswith(".part-") and ".tmp-" in p.name)
        try:
            if stray and p.name not in known and now - p.stat().st_mtime > _ORPHAN_S:
                p.unlink()
        except OSError:
            pass
    fsync_dir(index)
