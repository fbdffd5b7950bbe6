"""perfkit: a performance-engineering notebook kit for PyTorch.

Measure (:func:`measure`), record (:func:`record`, :func:`skip`), load (:func:`load`) and
fingerprint (:func:`fingerprint`); everything else lives in its module (``perfkit.measuring.kernels.gemm``,
``perfkit.view.plots``, ``perfkit.view.report``, ...).

The names are resolved on first use (PEP 562): ``import perfkit.run._rank_entry`` in each of a
launch's ranks, or the engine importing ``perfkit.run.sweep``, does not pay for pandas and pyarrow
(~0.5 s of CPU per process) that only :func:`record` and :func:`load` need.
"""

from __future__ import annotations

import importlib

from .core import __version__

#: public name -> the module that defines it
_HOMES = {
    "fingerprint": ".core.env",
    "BadInputError": ".core.errors",
    "ConfigurationSkipped": ".core.errors",
    "PerfkitError": ".core.errors",
    "load": ".core.results",
    "record": ".core.results",
    "skip": ".core.results",
    "Measurement": ".core.timing",
    "measure": ".core.timing",
}

__all__ = ["__version__", "Measurement", "measure", "record", "skip", "load", "fingerprint", "PerfkitError",
           "BadInputError", "ConfigurationSkipped"]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'perfkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # resolved once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
