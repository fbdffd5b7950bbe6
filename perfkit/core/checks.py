"""The value checks every configuration runs before any work: each raises
:class:`~perfkit.core.errors.BadInputError` with one line that names the parameter, what it must
be and what it got, so ``perfkit run``/``perfkit sweep`` exit 2 with the same words everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from perfkit.core.errors import BadInputError

__all__ = ["one_of", "integer_at_least", "seconds_at_least_zero"]


def one_of(name: str, value, choices: Iterable) -> None:
    """``value`` must be one of ``choices`` (listed in their order in the message)."""
    choices = tuple(choices)
    if value not in choices:
        raise BadInputError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def integer_at_least(name: str, value, least: int) -> None:
    """``value`` must be an ``int`` (not a ``bool``) and ``>= least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadInputError(f"{name} must be an integer >= {least}, got {value!r}")


def seconds_at_least_zero(name: str, value) -> None:
    """``value`` must be a finite number of seconds ``>= 0`` (an ``int`` or ``float``, not a ``bool``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadInputError(f"{name} must be a number of seconds >= 0, got {value!r}")
