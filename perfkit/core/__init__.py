"""Ground layer: what every other package stands on, and nothing above it.

The error classes (:mod:`.errors`), the status vocabulary (:mod:`.status`), the timer and its
noise verdict (:mod:`.timing`), the results store (:mod:`.results`), the environment fingerprint
(:mod:`.env`), device detection (:mod:`.devices`) and the sourced spec-sheet tables
(:mod:`.specs`), the CPU share of a process (:mod:`.cpu_share`), the precision policy
(:mod:`.precision`) and the formulas several packages share (:mod:`.formulas`). Modules here
import nothing of perfkit outside ``perfkit.core``.
"""

#: perfkit's version (``perfkit.__version__``), kept here so the fingerprint (:mod:`.env`) can
#: record it without importing the package above ``core``.
__version__ = "0.1.0"
