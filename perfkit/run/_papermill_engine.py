"""papermill's nbclient engine, executing through a kernel client that is already connected.

papermill hands nbclient a kernel manager (``km``) but no client, so nbclient starts one and
waits on it with jupyter_client's ``wait_for_ready``, which ends with 0.2 s of listening to a
silent IOPub channel: a fixed sleep on the critical path of every configuration. perfkit's
:class:`perfkit.run.execute.WarmKernel` already holds a client it knows is ready
(:meth:`~perfkit.run.execute.WarmKernel.client`), so this engine gives nbclient that one. Apart
from the client, it is papermill's ``NBClientEngine.execute_managed_notebook`` (papermill 2.7,
``papermill/engines.py``): same arguments, same merging of them, same notebook client class.

Registered with papermill as ``perfkit-connected``; used only by :func:`perfkit.run.execute.execute_config`.
"""

from __future__ import annotations

from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, logger, papermill_engines
from papermill.utils import merge_kwargs, remove_args

ENGINE_NAME = "perfkit-connected"

__all__ = ["ENGINE_NAME"]


class _ConnectedClient(PapermillNotebookClient):
    def __init__(self, nb_man, kc=None, **kw):
        super().__init__(nb_man, **kw)
        if kc is not None:  # nbclient's __init__ sets kc to None; setup_kernel starts one only if it still is
            kc.allow_stdin = False  # what nbclient sets on a client it starts
            self.kc = kc


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
