"""Kineto/Chrome traces, as users bring them (field traces from H100s, MI300Xs, MI250s, eager or
compiled) and as perfkit records them: exact times, named windows, op-level models. May import
``core`` only, as all of ``analyse``.

- :mod:`.events`: the streaming reader (``read_trace``) into compact columns;
- :mod:`.window`: which events an HTA-parity analysis looks at, and what they are;
- :mod:`.breakdown`: Holistic Trace Analysis' breakdowns, under HTA's names;
- :mod:`.diff`: two traces' kernels compared.

Everything here takes traces (paths or ``TraceEvents``) and returns DataFrames; never a device.
"""
