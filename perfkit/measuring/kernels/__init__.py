"""Kernels and ceilings: GEMM throughput per size and dtype, the shape climb to the best
matmul, STREAM bandwidth per memory level (C/OpenMP kernels in ``csrc/``, through ctypes) and ``perfkit peaks``.
May import ``core`` and ``analyse`` only (no workload, no launcher): a ceiling knows nothing of
what will be measured against it."""
