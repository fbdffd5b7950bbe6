"""Measuring families: code that runs work on a device and returns timed, counted rows.

GEMM throughput and the compute/memory ceilings (:mod:`.gemm`, :mod:`.ceilings`,
:mod:`.stream`, :mod:`.shape_search`, :mod:`.peaks`), FLOP/byte counting and op profiling
(:mod:`.op_formulas`, :mod:`.counting`, :mod:`.profiling`, :mod:`.roofline_step`), collectives
(:mod:`.collectives`, :mod:`.collective_buffers`, :mod:`.collective_timing`), and training
(:mod:`.models`, :mod:`.workloads`, :mod:`.parallel`, :mod:`.train_config`, :mod:`.training`,
:mod:`.scaling_run`). Modules here may import ``perfkit.core``, ``perfkit.analyse`` and
:mod:`perfkit.run.launch` (the launcher is how a measurement spans processes); never plots,
the sweep engine or the CLI. (Named ``measuring``, not ``measure``, so that the package never
shadows the public :func:`perfkit.measure`.)
"""
