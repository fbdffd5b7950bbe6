"""The models a measurement runs, their configurations and tasks: perfkit's synthetic ``mlp``,
``transformer`` and ``convnet`` (seeded batches, analytic FLOP) — and the home of users' own
models next. May import ``core`` only: a workload knows nothing of how it is measured."""
