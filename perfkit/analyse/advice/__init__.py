"""Advice: what binds each configuration, and what to try. Modules here may import ``perfkit.core``
and the rest of ``perfkit.analyse`` only (an analysis: rows in, findings out, never a device).

:mod:`.findings` holds the vocabulary and the ranking (:class:`Finding`, :class:`Rule`,
:func:`advise`, notes grouped); :mod:`.rules` the built-in rules as data (threshold, source,
entry points of packages' own); their code one module per family: :mod:`.training` (input,
stragglers, exposed communication, the pipeline bubble, memory headroom), :mod:`.kernels`
(collectives' latency, a GEMM below its device's roof, noise), :mod:`.compute` (host-bound,
memory-bound ops, precision), :mod:`.inference` (launch-bound generation).
"""

from .findings import *  # noqa: F401,F403 - the vocabulary every rule and view uses
from .findings import __all__  # noqa: F401
