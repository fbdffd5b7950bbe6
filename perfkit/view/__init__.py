"""Faces: what a person sees of the rows — plots, the standalone report, the widgets.

Plot resources inline or from a CDN (:mod:`.display`), holoviews/bokeh plots (:mod:`.plots`),
the HTML report (:mod:`.report`) and the ipywidgets panels (:mod:`.widgets`). Plots take
DataFrames and may import ``perfkit.core``, ``perfkit.analyse`` and :mod:`.display`; the report
and the widgets may also import ``perfkit.view.plots`` and ``perfkit.run``. Nothing here is
imported by ``core``, ``analyse``, ``measuring`` or ``run``.
"""
