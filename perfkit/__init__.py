"""perfkit: a performance-engineering notebook kit for PyTorch.

Measure (:func:`measure`), record (:func:`record`, :func:`skip`), load (:func:`load`) and
fingerprint (:func:`fingerprint`); everything else lives in its module (``perfkit.gemm``,
``perfkit.plots``, ``perfkit.report``, ...).
"""

__version__ = "0.1.0"

from .env import fingerprint  # noqa: E402
from .errors import BadInputError, ConfigurationSkipped, PerfkitError  # noqa: E402
from .results import load, record, skip  # noqa: E402
from .timing import Measurement, measure  # noqa: E402

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
