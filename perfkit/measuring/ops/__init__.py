"""What ran, op by op: the dispatch-level FLOP/byte counter and its formulas, per-op profiler
times, a ``torch.profiler`` trace per configuration and rank, and the roofline's counted and
profiled step. May import ``core``, ``analyse`` and ``measuring.kernels`` (the roofs an op is
placed under); never a workload family, so every family can count and trace through it."""
