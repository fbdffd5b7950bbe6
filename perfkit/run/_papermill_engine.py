"""papermill's nbclient engine, executing through a kernel client that is already connected, and
marking where a notebook's measuring ends.

papermill hands nbclient a kernel manager (``km``) but no client, so nbclient starts one and
waits on it with jupyter_client's ``wait_for_ready``, which ends with 0.2 s of listening to a
silent IOPub channel: a fixed sleep on the critical path of every configuration. perfkit's
:class:`perfkit.run.warm_kernel.WarmKernel` already holds a client it knows is ready
(:meth:`~perfkit.run.warm_kernel.WarmKernel.client`), so this engine gives nbclient that one. Apart
from the client and the window below, it is papermill's ``NBClientEngine.execute_managed_notebook``
(papermill 2.7, ``papermill/engines.py``): same arguments, same merging of them, same client class.

**The measurement window.** A code cell tagged ``view`` (:data:`perfkit.run.notebooks.VIEW_TAG`)
only views what the cells above it recorded. Before the first one runs, the engine waits for the
device to finish (``torch.cuda.synchronize``), hands its cached memory back (``empty_cache``),
closes the :class:`MeasureWindow` and calls its ``on_release``: the sweep then gives the slot to
the next configuration while these view cells run. A notebook without such a cell measures to
its end. Registered with papermill as ``perfkit-connected``; used only by
:func:`perfkit.run.execute.execute_config`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nbclient.util import run_sync
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, logger, papermill_engines
from papermill.utils import merge_kwargs, remove_args

from .notebooks import VIEW_TAG

ENGINE_NAME = "perfkit-connected"

__all__ = ["ENGINE_NAME", "MeasureWindow"]

# Run in the kernel before its first view cell: the device's queued work done, the caching
# allocator's free blocks returned to the device for the next configuration. Tensors the notebook
# still holds in its globals stay, and so does the kernel's CUDA/HIP context, until its view cells end.
_RELEASE_CODE = """\
import sys as _perfkit_sys
if "torch" in _perfkit_sys.modules and _perfkit_sys.modules["torch"].cuda.is_initialized():
    import gc as _perfkit_gc
    _perfkit_gc.collect()
    _perfkit_sys.modules["torch"].cuda.synchronize()
    _perfkit_sys.modules["torch"].cuda.empty_cache()
del _perfkit_sys
"""


@dataclass
class MeasureWindow:
    """When a configuration held its device for measuring, Unix time in seconds: from its first
    code cell's start to the release before its first view cell (its last cell's end without one)."""

    on_release: Callable[[], None] | None = None
    start_unix_s: float | None = None
    end_unix_s: float | None = None
    released: bool = False
    """Whether the notebook reached a view cell (its device was handed on before the notebook ended)."""

    def close(self, at_unix_s: float) -> None:
        if self.start_unix_s is not None and self.end_unix_s is None:
            self.end_unix_s = at_unix_s


class _ConnectedClient(PapermillNotebookClient):
    def __init__(self, nb_man, kc=None, window: MeasureWindow | None = None, **kw):
        super().__init__(nb_man, **kw)
        self._window = window
        if kc is not None:  # nbclient's __init__ sets kc to None; setup_kernel starts one only if it still is
            kc.allow_stdin = False  # what nbclient sets on a client it starts
            self.kc = kc

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        window = self._window
        if window is not None and cell.cell_type == "code" and cell.source.strip():
            if window.start_unix_s is None:
                window.start_unix_s = time.time()
            elif not window.released and VIEW_TAG in (cell.metadata.get("tags") or []):
                await self.async_wait_for_reply(self.kc.execute(_RELEASE_CODE, silent=True, store_history=False))
                window.close(time.time())
                window.released = True
                if window.on_release is not None:
                    window.on_release()
        return await super().async_execute_cell(cell, cell_index, *args, **kwargs)

    # papermill calls the synchronous form, which nbclient binds to its own coroutine: bind ours.
    execute_cell = run_sync(async_execute_cell)


class _ConnectedEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                 start_timeout=60, execution_timeout=None, **kwargs):
        kwargs = remove_args(["input_path"], **kwargs)
        safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
        final_kwargs = merge_kwargs(
            safe_kwargs,
            timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
            startup_timeout=start_timeout, kernel_name=kernel_name, log=logger, log_output=log_output,
            stdout_file=stdout_file, stderr_file=stderr_file,
        )
        return _ConnectedClient(nb_man, **final_kwargs).execute()


papermill_engines.register(ENGINE_NAME, _ConnectedEngine)
