"""Progress on long work, where a person is watching: tqdm's notebook bar in JupyterLab, a text
bar on a terminal, nothing in a headless execution.

A sweep's executed notebooks and the test suite's output stay free of bars: under an executor
(``PERFKIT_CONTEXT`` set), in static mode (``PERFKIT_STATIC``) or with neither a kernel nor a
terminal on stderr, :func:`progress` returns the iterable unchanged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

__all__ = ["progress", "watched"]


def watched() -> bool:
    """True when someone can see a bar: a Jupyter kernel run by hand, or a terminal."""
    if os.environ.get("PERFKIT_CONTEXT") or os.environ.get("PERFKIT_STATIC"):
        return False
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is not None and type(shell).__name__ == "ZMQInteractiveShell":
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress(iterable: Iterable, *, desc: str, total: int | None = None, unit: str = "it") -> Iterable:
    """``iterable`` with a bar when :func:`watched`, else unchanged."""
    if not watched():
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit)
