"""Input pipelines: synthetic datasets in each storage format (cached once), the page cache
they are read through, and a DataLoader's throughput, data wait per step and stall attribution.
May import ``core``, ``analyse``, ``measuring.workloads`` and ``measuring.training`` (the step
whose wait is measured)."""
