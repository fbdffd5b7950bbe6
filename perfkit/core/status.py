"""How a configuration ended: the status vocabulary and the mapping from errors to it.

Shared by the notebook runner, the sweep engine and the multi-process launcher, so that an OOM
is an ``oom`` wherever it happens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import ConfigurationSkipped, ExecutionFailed

__all__ = ["STATUSES", "OK", "FAILED", "OOM", "TIMEOUT", "KILLED", "SKIPPED", "status_for_error", "is_oom_text", "error_row", "FINISHED",
           "OutOfMemoryError", "raise_for_status"]

OK, FAILED, OOM, TIMEOUT, KILLED, SKIPPED = "ok", "failed", "oom", "timeout", "killed", "skipped"
STATUSES = (OK, FAILED, OOM, TIMEOUT, KILLED, SKIPPED)
#: Statuses that a resumed sweep does not run again: the outcome is a property of the
#: configuration on this machine, not an accident (an OOM is an edge of the batch-size axis).
FINISHED = frozenset({OK, SKIPPED, OOM})

_OOM_NAMES = {"OutOfMemoryError", "MemoryError"}
# torch's CPU allocator raises a plain RuntimeError; CUDA and HIP raise torch.OutOfMemoryError
# (a RuntimeError subclass) whose text is kept here too for errors re-raised as RuntimeError.
_OOM_TEXT = re.compile(
    r"DefaultCPUAllocator: can't allocate memory|CUDA out of memory|HIP out of memory"
    r"|out of memory|Cannot allocate memory",
    re.IGNORECASE,
)


def error_row(base: Mapping, error: BaseException) -> dict:
    """The row of a configuration that ended with ``error``: ``base`` with its ``status``
    (``skipped`` with the reason for :class:`ConfigurationSkipped`, else what
    :func:`status_for_error` says) and ``error`` (the class's dotted name and message)."""
    if isinstance(error, ConfigurationSkipped):
        return {**base, "status": SKIPPED, "error": error.reason}
    name = f"{type(error).__module__}.{type(error).__qualname__}"
    return {**base, "status": status_for_error(name, str(error)), "error": f"{name}: {error}"}


def is_oom_text(text: str) -> bool:
    """Whether ``text`` (an error message, a process's output) reports an allocator running out:
    torch's CPU allocator, CUDA, HIP, the OS."""
    return bool(_OOM_TEXT.search(text or ""))


def status_for_error(error_name: str, message: str = "") -> str:
    """Map an exception's class name (possibly dotted) and message to a status."""
    short = error_name.rsplit(".", 1)[-1]
    if short == "ConfigurationSkipped":
        return SKIPPED
    if short == "ExecutionFailed":  # re-raised from a launch: its text starts with the status
        head = (message or "").split(":", 1)[0].strip()
        if head in STATUSES:
            return head
    if short in _OOM_NAMES:
        return OOM
    if short in {"RuntimeError", "AcceleratorError"} and _OOM_TEXT.search(message or ""):
        return OOM
    return FAILED


class OutOfMemoryError(ExecutionFailed):
    """A configuration's row ended ``oom``; the class name is what makes the notebook runner
    classify the execution as ``oom`` (:func:`status_for_error`)."""


def raise_for_status(row: Mapping) -> None:
    """For a notebook, after recording ``row``: return if it is ``ok``; otherwise stop the
    notebook the way its status says (skipped: :class:`ConfigurationSkipped`; oom:
    :class:`OutOfMemoryError`; failed, timeout, killed: :class:`ExecutionFailed`)."""
    status, reason = row["status"], row.get("error") or ""
    if status == OK:
        return
    if status == SKIPPED:
        raise ConfigurationSkipped(reason)
    error = OutOfMemoryError if status == OOM else ExecutionFailed
    raise error(status=status, error_name=f"{row.get('workload', 'configuration')} {status}", message=reason)
