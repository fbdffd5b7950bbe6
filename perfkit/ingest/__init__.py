"""Readers of other tools' outputs (nccl-tests/rccl-tests, ...) into perfkit's rows, and their
import into a results directory (``perfkit import``). May import ``core`` and ``analyse``."""
