"""HTA's own critical-path length on trace windows, printed as JSON: run by tests/test_step_graph.py
with the interpreter of ``.venv-hta`` (HolisticTraceAnalysis 0.5.0 beside pandas < 3, which its
critical-path analysis needs: under pandas 3 it raises in ``DataFrame.drop``; ``make test`` builds it).

    python hta_critical_path.py TRACE ANNOTATION INSTANCE [TRACE ANNOTATION INSTANCE ...]

prints ``[{"trace", "annotation", "instance", "length_us"}, ...]``: the sum of the weights of the
critical path's edges (``CPGraph.get_critical_path_breakdown()["duration"]``), ``null`` where the
analysis did not succeed."""

import json
import logging
import shutil
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from hta.trace_analysis import TraceAnalysis  # noqa: E402

out = []
args = sys.argv[1:]
for trace, annotation, instance in zip(args[0::3], args[1::3], args[2::3]):
    folder = tempfile.mkdtemp()
    try:
        shutil.copy(trace, folder)  # HTA reads a folder of one rank's traces
        analysis = TraceAnalysis(trace_dir=folder)
        graph, ok = analysis.critical_path_analysis(rank=0, annotation=annotation, instance_id=int(instance))
        length = float(graph.get_critical_path_breakdown()["duration"].sum()) if ok else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out.append({"trace": trace, "annotation": annotation, "instance": int(instance), "length_us": length})
print(json.dumps(out))
