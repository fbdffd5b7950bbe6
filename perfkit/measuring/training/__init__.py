"""The training step and everything that shapes it: its configuration, the parallel wrappers
(DDP, ZeRO 1–3 / FSDP2, tensor parallel; a new parallelism goes in ``parallel.py``), the
pipeline with its stages and schedules, the memory model and saved activations, the OOM-edge
search and scaling runs over world sizes. May import ``core``, ``analyse``, ``run.launch``,
``measuring.workloads`` (what it trains) and ``measuring.ops`` (counting and traces)."""
