"""How a launch ended: what its ranks reported and how they exited, as one status and its cause.

Each rank writes ``local<i>.json`` (its result, or its exception) into the launch's directory; the
launcher knows the exit codes of the ranks that ended on their own (started here: from waiting on
them; through torchrun: from its failure summary). :func:`outcome` turns both into a
:class:`LaunchResult`. When one rank fails its peers usually fail too ("connection closed by
peer"), so the root cause is taken in this order: an error a rank raised on its own (the
earliest), a rank that died without a result, the peers' communication errors.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from perfkit.core import checks
from perfkit.core.errors import BadInputError
from perfkit.core.status import KILLED, OK, STATUSES, TIMEOUT, status_for_error

__all__ = ["LaunchResult", "outcome", "rank_reports", "forked_rank_exit", "is_peer_loss", "exit_codes", "read_text"]

#: Characters of a rank's log kept in an error message.
_LOG_TAIL_CHARS = 4000


@dataclass(kw_only=True, frozen=True)
class LaunchResult:
    """How one multi-process launch ended."""

    status: str
    """``ok``, ``failed``, ``oom``, ``timeout`` or ``killed`` (:mod:`perfkit.core.status`)."""
    rank_results: tuple
    """Per local rank of this node (the global rank on one node): the dict the target returned,
    or None where the rank returned nothing."""
    error: str | None
    """The first failing rank's error name, message and traceback (or exit code/signal and log
    tail); None when ``ok``."""
    failed_rank: int | None
    """Global rank of the first failing rank, when one is known."""
    rank_logs: tuple[str, ...]
    """Each local rank's captured stdout+stderr text (e.g. for ``NCCL_DEBUG=INFO`` parsing)."""
    wall_time_s: float
    """Seconds from starting the ranks (or torchrun) to the end of the launch, teardown included."""

    def __post_init__(self):
        checks.one_of("status", self.status, STATUSES)
        if len(self.rank_results) != len(self.rank_logs):
            raise BadInputError("rank_results and rank_logs must have one entry per rank")

    @property
    def ok(self) -> bool:
        return self.status == OK


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def rank_reports(work_dir: str, nproc: int) -> list[dict | None]:
    return [_read_json(os.path.join(work_dir, f"local{i}.json")) for i in range(nproc)]


def forked_rank_exit(work_dir: str, local_rank: int) -> int | None:
    """A forked rank's exit status as Popen's ``returncode`` (negative: a signal), which the
    process that forked it wrote (:mod:`perfkit.run._rank_fork`); None while it runs."""
    found = _read_json(os.path.join(work_dir, f"exit{local_rank}.json"))
    return None if found is None else found["returncode"]


# torchrun's failure summary: one block per failed local rank, "rank : 1 (local_rank: 1)" then
# "exitcode : -9 (pid: ...)"; negative codes are signals.
_FAILURE_BLOCK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*exitcode\s*:\s*(-?\d+)")
# What a rank raises when a peer disappears: a consequence, never the cause, of a failure.
_PEER_LOSS_NAMES = {"DistBackendError", "DistNetworkError", "DistStoreError"}
_PEER_LOSS_TEXT = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|Broken pipe"
    r"|remote process exited|communicator was aborted|Socket Timeout",
    re.IGNORECASE,
)


def is_peer_loss(report: dict) -> bool:
    short = report["error_name"].rsplit(".", 1)[-1]
    return short in _PEER_LOSS_NAMES or bool(_PEER_LOSS_TEXT.search(report.get("message", "")))


def exit_codes(torchrun_log: str) -> dict[int, tuple[int, int]]:
    """Local rank -> (global rank, exit code) from torchrun's failure summary."""
    return {int(m[2]): (int(m[1]), int(m[3])) for m in _FAILURE_BLOCK.finditer(torchrun_log)}


def _silent_death(codes: Mapping[int, tuple[int, int]], reports, logs, launcher_log: str) -> tuple[str, int | None] | None:
    """The rank that ended without a report (exit code or signal, log tail), if there is one.

    ``codes``: local rank -> (global rank, exit code) of the ranks that ended before the launch
    stopped them (torchrun's failure summary, or the launcher's own wait). torchrun sends SIGTERM to
    the survivors once one rank has failed, so a rank ended by SIGTERM is taken as the cause only
    when no rank ended otherwise.
    """
    missing = [i for i, r in enumerate(reports) if r is None]
    if not missing:
        return None
    known = [i for i in missing if i in codes]
    primary = [i for i in known if codes[i][1] != -signal.SIGTERM]
    if primary or known:
        local_rank = (primary or known)[0]
        rank, code = codes[local_rank]
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    else:
        local_rank, rank = missing[0], None
        how = "ended without a result (no exit code was reported)"
    tail = logs[local_rank][-_LOG_TAIL_CHARS:] or launcher_log[-_LOG_TAIL_CHARS:]
    who = f"rank {rank}" if rank is not None else f"local rank {local_rank}"
    return f"{who} {how}; log tail:\n{tail}", rank


def _earliest(reports: list[dict]) -> dict | None:
    return min(reports, key=lambda r: r.get("time", float("inf"))) if reports else None


def _format_error(report: dict) -> str:
    if report["error_name"].endswith("ConfigurationSkipped"):  # a reason, not a failure: no traceback
        return report["message"]
    return f"{report['error_name']}: {report['message']}\n{report['traceback']}"


def outcome(work_dir, nproc, timed_out, codes, launcher_log, timeout_s, wall_time_s) -> LaunchResult:
    """How a launch of ``nproc`` local ranks ended, from what they left in ``work_dir`` (each
    rank's report and log), the exit ``codes`` seen, ``launcher_log`` (torchrun's, or '') and
    whether the deadline ``timeout_s`` passed (``timed_out``): ok; the root cause's status and
    traceback with the rank that raised it; timeout naming the ranks that never reported; or
    killed with the exit code and log tail of a rank that died without a report."""
    reports = rank_reports(work_dir, nproc)
    results = tuple(r["result"] if r and r.get("ok") else None for r in reports)
    logs = tuple(read_text(os.path.join(work_dir, f"local{i}.log")) for i in range(nproc))

    def result(status, error=None, failed_rank=None):
        return LaunchResult(status=status, rank_results=results, error=error,
                            failed_rank=failed_rank, rank_logs=logs, wall_time_s=wall_time_s)

    # Root cause first: an error a rank raised on its own, then a rank that died without a
    # report (its peers then fail with "connection closed"), then those peers' errors.
    errors = [r for r in reports if r is not None and not r.get("ok")]
    own = _earliest([r for r in errors if not is_peer_loss(r)])
    if own is not None:
        return result(status_for_error(own["error_name"], own["message"]), _format_error(own),
                      own["rank"])
    if all(r is not None and r.get("ok") for r in reports):
        return result(OK)
    if timed_out:
        waiting = [i for i, r in enumerate(reports) if r is None]
        return result(TIMEOUT, f"no result within {timeout_s:g} s from local ranks {waiting}; "
                               f"the process tree was killed")
    death = _silent_death(codes, reports, logs, launcher_log)
    if death is not None:
        return result(KILLED, *death)
    peer = _earliest(errors)
    return result(status_for_error(peer["error_name"], peer["message"]), _format_error(peer),
                  peer["rank"])
