"""Analyses: pure functions from DataFrames (or log/trace text) to DataFrames; never a device.

Roofline points (:mod:`.roofline`), scaling efficiency and step breakdowns (:mod:`.scaling`),
the α–β fit of collectives (:mod:`.commfit`), memory-level plateaus (:mod:`.levels`), MFU
(:mod:`.mfu`), NCCL debug-log parsing (:mod:`.nccl_log`), Kineto traces (the package :mod:`.trace`:
reader, windows, breakdowns, op models, diff), and A/B comparisons (:mod:`.ab_stats`, :mod:`.compare`). Modules here may import ``perfkit.core`` only: a fact an analysis
shares with a measurement lives in ``perfkit.core`` (e.g. :mod:`perfkit.core.formulas`).
"""
