"""Collectives as nccl-tests measures them: bus bandwidth per size, in-place and out-of-place,
timed per rank, with the knob check of ``NCCL_DEBUG=INFO``. May import ``core``, ``analyse``,
``run.launch`` (its ranks) and ``measuring.ops`` (their traces)."""
