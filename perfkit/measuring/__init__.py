"""Measuring: code that runs work on a device and returns timed, counted rows, by family.

May import ``perfkit.core``, ``perfkit.analyse`` and :mod:`perfkit.run.launch` (the launcher is how
a measurement spans processes); never plots, the sweep engine or the CLI. Each family's
``__init__`` says what it may use of the others (ARCHITECTURE.md's table, kept by
``tests/test_architecture.py``):

- :mod:`.kernels`: GEMM, the shape climb, STREAM, the measured ceilings, ``perfkit peaks``.
- :mod:`.ops`: counting what ran (FLOP, bytes), per-op profiles, traces, the roofline step.
- :mod:`.collectives`: nccl-tests-style collectives, bus bandwidth, the knob check.
- :mod:`.workloads`: the models and their configurations and tasks.
- :mod:`.training`: the training step, parallel wrappers, pipeline, memory model, activations,
  OOM edge, scaling runs.
- :mod:`.inference`: prefill and decode with a KV cache.
- :mod:`.data`: datasets, the page cache, DataLoader throughput and stalls.

(Named ``measuring``, not ``measure``, so that the package never shadows the public
:func:`perfkit.measure`.)
"""
