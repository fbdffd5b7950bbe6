"""The ledger: what ran, how it ended and why — an append-only JSON-lines file in the sweep's DIR.

Crash safety comes from the format, not from care: every event is one line appended with
``O_APPEND`` and fsynced, so a SIGKILL at any moment leaves at most one torn last line, which
the reader skips. The state of a configuration is its last complete event; a ``running`` event
without an ending is an attempt that never finished, and a resumed sweep runs it again.

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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import BadInputError

__all__ = ["LedgerEntry", "Ledger", "SweepLock", "SweepLocked", "RUNNING"]

RUNNING = "running"


@dataclass(kw_only=True, frozen=True)
class LedgerEntry:
    """One event of one configuration."""

    config_id: str
    status: str
    """``running``, or how the attempt ended (perfkit.status.STATUSES)."""
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


class Ledger:
    """Read and append the ledger at ``DIR/ledger.jsonl``."""

    FILENAME = "ledger.jsonl"

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / self.FILENAME
        self._lock = threading.Lock()

    def events(self) -> Iterator[LedgerEntry]:
        if not self.path.exists():
            return
        fields = set(LedgerEntry.__dataclass_fields__)
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # a torn last line: the write it belongs to never completed
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    continue
                yield LedgerEntry(**{k: v for k, v in data.items() if k in fields})

    def state(self) -> dict[str, LedgerEntry]:
        """The last event of every configuration."""
        last: dict[str, LedgerEntry] = {}
        for event in self.events():
            last[event.config_id] = event
        return last

    def append(self, entry: LedgerEntry) -> None:
        line = json.dumps(asdict(entry), default=str, sort_keys=True) + "\n"
        data = line.encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                self._repair_torn_tail(fd)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)

    def _repair_torn_tail(self, fd: int) -> None:
        # After a crash mid-write the file may end without a newline; start the next event on a
        # fresh line so the torn fragment stays an isolated, skipped line.
        size = os.fstat(fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as fh:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                os.write(fd, b"\n")


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
