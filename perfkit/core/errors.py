"""The exception hierarchy: one root, subclasses carrying structured fields.

Modelled on papermill's ``PapermillExecutionError``: a caller (the CLI, the sweep engine, a test)
branches on the class and reads the fields, never parses the message.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "PerfkitError",
    "BadInputError",
    "UnknownParameterError",
    "ParameterTypeError",
    "ConfigurationSkipped",
    "ExecutionFailed",
]


class PerfkitError(Exception):
    """Root of every error perfkit raises on purpose."""


class BadInputError(PerfkitError, ValueError):
    """The user's input is invalid; nothing was run. The CLI exits 2 with ``reason`` on one line."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class UnknownParameterError(BadInputError):
    """A parameter name that the notebook's ``parameters`` cell does not define."""

    def __init__(self, name: str, notebook: str, valid_names: Sequence[str]):
        self.name = name
        self.notebook = notebook
        self.valid_names = tuple(valid_names)
        super().__init__(
            f"unknown parameter {name!r} for {notebook}; valid names: {', '.join(self.valid_names)}"
        )


class ParameterTypeError(BadInputError):
    """A parameter value whose type does not match the type of the notebook's default."""

    def __init__(self, name: str, expected: str, value: object):
        self.name = name
        self.expected = expected
        self.value = value
        super().__init__(
            f"parameter {name!r} expects {expected} (the type of the notebook's default), "
            f"got {type(value).__name__} {value!r}"
        )


class ConfigurationSkipped(PerfkitError):
    """Raised by :func:`perfkit.skip`: this device cannot honour the configuration.

    The row is recorded with status ``skipped`` and ``reason`` before this is raised, so the
    executor only has to stop the notebook; it never counts as a failure.
    """

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class ExecutionFailed(PerfkitError):
    """A notebook execution did not end ``ok``.

    ``status`` is one of the failure statuses of :mod:`perfkit.core.results` (``failed``, ``oom``,
    ``timeout``, ``killed``); ``error_name``/``message``/``cell`` say where and why.
    """

    def __init__(
        self,
        *,
        status: str,
        error_name: str,
        message: str,
        cell: int | None = None,
        notebook_path: str | None = None,
    ):
        self.status = status
        self.error_name = error_name
        self.message = message
        self.cell = cell
        self.notebook_path = notebook_path
        where = f" in cell {cell}" if cell is not None else ""
        super().__init__(f"{status}: {error_name}{where}: {message}")
