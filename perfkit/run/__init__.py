"""Running notebooks and processes: the engine beside the data flow.

Notebook parameters (:mod:`.notebooks`), one execution under papermill (:mod:`.execute`), the
multi-process launcher and what each rank runs (:mod:`.launch`, :mod:`._rank_entry`), process
teardown (:mod:`._teardown`) and the sweep engine with its executors (:mod:`.sweep`). Modules here
may import ``perfkit.core`` only: the engine knows notebooks and parameters, not what they measure
(a rank's target is named by a string, never imported here).
"""
