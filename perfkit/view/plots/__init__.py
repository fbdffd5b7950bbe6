"""Plots: holoviews (bokeh) objects built from results DataFrames. No measuring, no I/O.

Every function takes rows as :func:`perfkit.core.results.load` returns them and returns a holoviews
object that displays in JupyterLab and renders into the standalone report. Noisy points
(IQR/median > 0.1) are drawn hollow and say so in their hover. One module per subject.
Modules here may import ``perfkit.core``, ``perfkit.analyse`` and :mod:`perfkit.view.display` only.
"""

from ._common import ceiling_lines, display_scale, format_si, hv_bokeh, ok_rows
from .collectives import busbw_vs_size, knob_comparison
from .compare import comparison_plot, comparison_table
from .gemm import gemm_throughput
from .roofline import roofline, roofline_static
from .trace import temporal_plot, top_kernels_plot

__all__ = ["gemm_throughput", "busbw_vs_size", "knob_comparison", "roofline", "roofline_static",
           "comparison_plot", "comparison_table", "temporal_plot", "top_kernels_plot", "ceiling_lines",
           "display_scale", "format_si", "hv_bokeh", "ok_rows"]
