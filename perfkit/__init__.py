"""perfkit: a performance-engineering notebook kit for PyTorch.

Measure (:func:`measure`), record (:func:`record`, :func:`skip`), load (:func:`load`) and
fingerprint (:func:`fingerprint`); everything else lives in its module (``perfkit.measuring.kernels.gemm``,
``perfkit.view.plots``, ``perfkit.view.report``, ...).
"""

from .core import __version__  # noqa: E402
from .core.env import fingerprint  # noqa: E402
from .core.errors import BadInputError, ConfigurationSkipped, PerfkitError  # noqa: E402
from .core.results import load, record, skip  # noqa: E402
from .core.timing import Measurement, measure  # noqa: E402

__all__ = [
    "__version__",
    "Measurement",
    "measure",
    "record",
    "skip",
    "load",
    "fingerprint",
    "PerfkitError",
    "BadInputError",
    "ConfigurationSkipped",
]
