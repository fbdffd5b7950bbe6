"""A sweep's device slots: which devices (or cores) each owns, and the kernels it warms.

A slot runs configurations one after another. On GPUs it owns ``devices_per_config`` devices
(``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``, disjoint); on CPU the slots split the cores
(every thread variable: ``core.cpu_share.thread_env``). While one configuration runs, the slot
starts its next kernel (:class:`Slot.warm`): the notebooks' imports done, and on a GPU slot its
CUDA/HIP context made, so the next measurement starts as soon as the device is handed on.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ...core.cpu_share import affinity_cpus, thread_env
from ..warm_kernel import WarmKernel
from .spec import Config, Variant
from .variants import kernel_env

__all__ = ["device_slots", "is_gpu_slot", "Slot", "warm_next", "CUDA_CONTEXT"]

#: Run last in a GPU slot's warm kernel: the device's context made before its configuration starts
#: (about 0.3-1 s on a GPU, the first CUDA call's cost). Making a context runs no kernel on the
#: device; the configuration measuring there meanwhile shares nothing with it but the driver.
CUDA_CONTEXT = "import torch; torch.cuda.is_available() and torch.cuda.init()"


def is_gpu_slot(env: dict[str, str]) -> bool:
    return env.get("PERFKIT_SLOT", "").startswith("gpu:")


def _gpu_ids() -> list[str]:
    """Visible GPU ids without initialising CUDA in this process when there are none."""
    if not any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/kfd")):
        return []
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - a broken driver means: schedule on CPU
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(count)]
    return ids[:count]


def device_slots(workers: int, devices_per_config: int, gpu_ids: Sequence[str] | None = None,
                 cores: int | None = None) -> list[dict[str, str]]:
    """The environment of each slot: disjoint GPUs, or an equal share of the CPU cores."""
    if workers < 1:
        from ...core.errors import BadInputError

        raise BadInputError("--workers must be at least 1")
    gpu_ids = _gpu_ids() if gpu_ids is None else list(gpu_ids)
    if gpu_ids:
        # A configuration wanting more GPUs than the node has gets all of them; its notebook
        # then records what it cannot run as skipped (one config must not refuse a whole sweep).
        devices_per_config = min(devices_per_config, len(gpu_ids))
        n = min(workers, len(gpu_ids) // devices_per_config)
        slots = []
        for i in range(n):
            ids = ",".join(gpu_ids[i * devices_per_config:(i + 1) * devices_per_config])
            slots.append({"CUDA_VISIBLE_DEVICES": ids, "HIP_VISIBLE_DEVICES": ids, "PERFKIT_SLOT": f"gpu:{ids}"})
        return slots
    cores = cores or len(affinity_cpus())
    threads = max(1, cores // workers)
    return [{**thread_env(threads), "PERFKIT_SLOT": f"cpu:{i}/{workers}x{threads}"} for i in range(workers)]


class Slot:
    """One device slot: runs configurations one after another, warming the next kernel."""

    def __init__(self, name: str, env: dict[str, str], preload: Sequence[str]):
        self.name = name
        self.env = env
        self.preload = tuple(preload) + ((CUDA_CONTEXT,) if is_gpu_slot(env) else ())
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"warm-{name}")
        self._next: cf.Future | None = None
        self._next_key: tuple | None = None
        self.active: set[WarmKernel] = set()
        """The kernels of this slot's configurations still running (one measuring, others viewing)."""
        self._active_lock = threading.Lock()

    def _start(self, variant: Variant | None, background: bool = False, warm: str | None = None) -> WarmKernel:
        return WarmKernel(env=kernel_env(self.env, variant), preload=self.preload + ((warm,) if warm else ()),
                          background=background, python=variant.python if variant else None)

    def warm(self, variant: Variant | None = None, statement: str | None = None) -> None:
        """Start the next kernel (for a configuration of ``variant``) in the background; it runs
        ``statement`` too (:func:`perfkit.run.notebooks.warm_statement`: that configuration's imports)."""
        if self._next is None:
            self._next_key = variant.kernel_key if variant else None
            self._next = self._pool.submit(self._start, variant, True, statement)

    @property
    def warmed(self) -> bool:  # a kernel is starting or started for this slot's next configuration
        return self._next is not None

    def take(self, variant: Variant | None = None) -> WarmKernel:
        """A kernel for a configuration of ``variant``: the warmed one if it is of that variant's
        interpreter and environment, else a new one started now, in the foreground."""
        key = variant.kernel_key if variant else None
        if self._next is None:  # not warmed ahead (prestart off): start one now, in the foreground
            return self._start(variant)
        future, self._next = self._next, None
        kernel = future.result()
        if self._next_key != key or not kernel.foreground():  # never measure at idle priority
            kernel.shutdown()
            kernel = self._start(variant)
        return kernel

    def hold(self, kernel: WarmKernel) -> None:
        with self._active_lock:
            self.active.add(kernel)

    def drop(self, kernel: WarmKernel) -> None:
        with self._active_lock:
            self.active.discard(kernel)

    def kill_active(self) -> None:
        with self._active_lock:
            kernels = list(self.active)
        for kernel in kernels:
            kernel.kill()

    def close(self) -> None:
        if self._next is not None:
            try:
                self._next.result().shutdown()
            except Exception:  # noqa: BLE001 - a kernel that failed to start has nothing to close
                pass
        self._pool.shutdown(wait=False)


def warm_next(slot: Slot, slots: Sequence[Slot], pending: queue.Queue,
              statement: Callable[[Config], str | None] = lambda c: None) -> None:
    """Warm ``slot``'s next kernel for the first waiting configuration no other slot warmed one
    for: never more kernels warm than configurations wait. (A slot done first may still take a
    configuration another warmed for: work is not held back for a kernel's sake.)"""
    upcoming = _peek(pending, sum(s.warmed for s in slots if s is not slot))
    if upcoming is not None:
        slot.warm(upcoming.variant, statement(upcoming))


def _peek(pending: queue.Queue, skip: int = 0) -> Config | None:
    """The configuration a slot will most likely take next, past the ``skip`` that slots already
    warmed a kernel for (another slot may take it first); None when there is none."""
    with pending.mutex:
        return pending.queue[skip] if len(pending.queue) > skip else None
