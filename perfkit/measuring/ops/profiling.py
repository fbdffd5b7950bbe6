"""Per-op times from ``torch.profiler``, to join with :func:`perfkit.measuring.ops.counting.count_ops` counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from perfkit.core.errors import BadInputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["profile_op_times"]

def profile_op_times(fn: Callable, *args, device: str | None = None, trace_path=None, **kwargs) -> pd.DataFrame:
    """Run ``fn`` once under ``torch.profiler``; per aten op name and input shapes, its times.

    Columns: ``op`` ("aten::mm"), ``input_shapes`` (non-scalar input shapes, as in
    :func:`count_ops`), ``calls``, ``self_cpu_time_s``, ``cpu_time_s`` (inclusive),
    ``self_device_time_s``, ``device_time_s`` (inclusive; 0 on CPU), ``time_s`` (inclusive
    device time when a device was profiled, else inclusive CPU time: an op the dispatcher sees
    owns the ops its kernel calls internally). ``device`` is "cpu" or "cuda" (ROCm included);
    None profiles CUDA when it is available. ``trace_path``: also write the profiled run as a
    gzipped Chrome trace there (:func:`perfkit.measuring.ops.trace_capture.write_trace`); the frame's
    ``attrs`` then hold ``trace_path`` and ``trace_reason``.
    """
    import pandas as pd

    from torch.profiler import ProfilerActivity, profile

    from perfkit.measuring.ops.trace_capture import quiet_kineto

    if device not in (None, "cpu", "cuda"):
        raise BadInputError(
            f"profile_op_times device must be 'cpu', 'cuda' or None, got {device!r}")
    use_cuda = device == "cuda" or (device is None and torch.cuda.is_available())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    quiet_kineto(device_profiled=use_cuda)
    with profile(activities=activities, record_shapes=True) as prof:
        fn(*args, **kwargs)
        if use_cuda:
            torch.cuda.synchronize()
    trace = (None, None)
    if trace_path is not None:
        from perfkit.measuring.ops.trace_capture import write_trace

        trace = write_trace(prof, trace_path)
    rows = []
    for ev in prof.key_averages(group_by_input_shape=True):
        if not ev.key.startswith("aten::"):
            continue
        self_dev = getattr(ev, "self_device_time_total", 0.0) * 1e-6
        dev = getattr(ev, "device_time_total", 0.0) * 1e-6
        cpu = ev.cpu_time_total * 1e-6
        rows.append({
            "op": ev.key,
            "input_shapes": tuple(tuple(s) for s in (ev.input_shapes or []) if s and
                                  all(isinstance(d, int) for d in s)),
            "calls": int(ev.count), "self_cpu_time_s": ev.self_cpu_time_total * 1e-6,
            "cpu_time_s": cpu, "self_device_time_s": self_dev, "device_time_s": dev,
            "time_s": dev if use_cuda else cpu,
        })
    frame = pd.DataFrame(rows, columns=["op", "input_shapes", "calls", "self_cpu_time_s",
                                        "cpu_time_s", "self_device_time_s", "device_time_s",
                                        "time_s"])
    frame.attrs.update(trace_path=str(trace[0]) if trace[0] else None, trace_reason=trace[1])
    return frame
