"""The ledger: what ran, how it ended and why — append-only JSON-lines files in ``DIR/ledger/``.

**One file per writer.** Every :class:`Ledger` object writes its own file,
``DIR/ledger/<host>-<pid>-<random>.jsonl``, and readers merge them all. Slurm array tasks on
several nodes thus never append to one file: ``O_APPEND`` is atomic on a local filesystem but not
across NFS clients, where two nodes' lines can overwrite each other. A sweep's folder from before
(one ``DIR/ledger.jsonl``) is still read, as the oldest events.

Crash safety comes from the format, not from care: every event is one line appended and fsynced,
so a SIGKILL at any moment leaves at most one torn last line in its writer's file, which the
reader skips. The state of a configuration is its latest complete event: the highest attempt,
within it an ending over ``running``, then the latest written (``written_at``). A ``running``
event without an ending is an attempt that never finished, and a resumed sweep runs it again.

One sweep at a time per DIR: :class:`SweepLock` holds an exclusive ``flock`` on
``DIR/.perfkit-sweep.lock`` for the sweep's lifetime. The kernel releases it when the process
dies, SIGKILL included, so a stale lock never blocks a resume.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ...core.durable import fsync_dir as _fsync_dir
from ...core.errors import BadInputError

__all__ = ["LedgerEntry", "Ledger", "SweepLock", "SweepLocked", "RUNNING"]

RUNNING = "running"


@dataclass(kw_only=True, frozen=True)
class LedgerEntry:
    """One event of one configuration."""

    config_id: str
    status: str
    """``running``, or how the attempt ended (perfkit.core.status.STATUSES)."""
    attempt: int
    """1 for the first attempt; each resume or retry adds one."""
    notebook: str
    params: dict
    start: float | None = None
    """Unix time the attempt started, seconds."""
    end: float | None = None
    duration_s: float | None = None
    error_name: str | None = None
    message: str | None = None
    cell: int | None = None
    output_notebook: str | None = None
    results_path: str | None = None
    host: str | None = None
    pid: int | None = None
    slot: str | None = None
    """The device slot it ran on (CUDA_VISIBLE_DEVICES or the CPU thread share)."""
    variant: str | None = None
    """The A/B variant it ran under (None outside A/B sweeps)."""
    round: int | None = None
    """The interleaved round of an A/B sweep (or of a sweep with ``rounds``)."""
    window_start: float | None = None
    """When the configuration began measuring, Unix time, seconds (its rows'
    ``measure_window_start_unix_s``); None when no cell of it ran."""
    window_end: float | None = None
    """When it handed its device on: before its first ``view`` cell, else at its notebook's end."""
    written_at: float | None = None
    """Unix time the event was appended (set by :meth:`Ledger.append`); orders writers' files."""


class Ledger:
    """Read every writer's events under ``DIR``; append to this object's own file."""

    DIRNAME = "ledger"
    LEGACY_FILENAME = "ledger.jsonl"

    def __init__(self, directory: str | Path):
        self.directory = Path(directory) / self.DIRNAME
        self.legacy_path = Path(directory) / self.LEGACY_FILENAME
        # Created at the first append: readers (a dry run, a driver) leave no empty files behind.
        self.path = self.directory / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.jsonl"
        self._lock = threading.Lock()

    def _files(self) -> list[Path]:
        files = [self.legacy_path] if self.legacy_path.exists() else []
        try:
            files += sorted(p for p in self.directory.iterdir() if p.suffix == ".jsonl")
        except FileNotFoundError:
            pass
        return files

    def events(self) -> Iterator[LedgerEntry]:
        """Every complete event of every writer, oldest first (legacy file, then by ``written_at``)."""
        keyed = []
        for file_index, path in enumerate(self._files()):
            legacy = path == self.legacy_path
            for line_index, event in enumerate(_read_events(path)):
                # The legacy file's events predate every writer file's; within a file, its order.
                when = 0.0 if legacy or event.written_at is None else event.written_at
                keyed.append(((not legacy, when, file_index, line_index), event))
        keyed.sort(key=lambda k: k[0])
        yield from (event for _, event in keyed)

    def state(self) -> dict[str, LedgerEntry]:
        """The latest event of every configuration: highest attempt, an ending over ``running``,
        then the latest written (clocks of different nodes can disagree; attempts cannot)."""
        last: dict[str, LedgerEntry] = {}
        for event in self.events():
            prev = last.get(event.config_id)
            if prev is None or (event.attempt, event.status != RUNNING) >= (prev.attempt, prev.status != RUNNING):
                last[event.config_id] = event
        return last

    def append(self, entry: LedgerEntry) -> None:
        with self._lock:
            entry = LedgerEntry(**{**asdict(entry), "written_at": time.time()})
            data = (json.dumps(asdict(entry), default=str, sort_keys=True) + "\n").encode("utf-8")
            created = not self.path.exists()
            if created:
                self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                self._repair_torn_tail(fd)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_dir(self.directory)  # the new file's name survives a crash too

    def _repair_torn_tail(self, fd: int) -> None:
        # After a failed write (disk full) the file may end without a newline; start the next
        # event on a fresh line so the torn fragment stays an isolated, skipped line.
        size = os.fstat(fd).st_size
        if size == 0:
            return
        if os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")


def _read_events(path: Path) -> Iterator[LedgerEntry]:
    fields = set(LedgerEntry.__dataclass_fields__)
    try:
        fh = open(path, encoding="utf-8")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # a torn last line: the write it belongs to never completed
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield LedgerEntry(**{k: v for k, v in data.items() if k in fields})


class SweepLocked(BadInputError):
    """Another sweep holds the lock on this DIR (refused before anything runs: exit 2)."""

    def __init__(self, directory: Path, holder: str):
        self.directory = directory
        self.holder = holder
        super().__init__(f"another sweep is running on {directory} ({holder}); wait for it to end "
                         f"or choose another --out")


class SweepLock:
    """Exclusive, crash-released lock on a sweep directory."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / ".perfkit-sweep.lock"
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise SweepLocked(self.path.parent, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
