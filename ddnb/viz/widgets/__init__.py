"""Widgets that run work on a cluster: each change of a control starts a run on the
cluster's processes (`cluster.run`, `cluster.resize`, or a `ddnb` function that does) and
redraws what came back with a plot of `ddnb.viz`. One module per widget:

    worker_count          WorkerCountExplorer: resize, measure, redraw       (00, 05, 06)
    collective_explorer   CollectiveExplorer: one collective on k ranks       (03)
    parameter_server      ParameterServerExplorer: Run trains with the knobs  (04)
    decentralized         DecentralizedExplorer: D-PSGD / AD-PSGD runs        (05b)
    gradient_flow         GradientFlowWidget: re-trains, draws each layer     (06, 07)
    horovod_knobs         HorovodKnobs: fusion threshold, cycle time, fp16     (07)
    partition_explorer    PartitionExplorer: one cut of the layers            (08)
    memory_timeline       MemoryTimelineWidget: one step's memory per rank    (11)
    moe                   MoELoadExplorer: where the tokens went              (13)
    compression           CompressionExplorer: accuracy, bytes, speedup       (14)

The plots they draw take plain data and live in `ddnb.viz`, which never imports this
package's modules (only `ddnb.viz`'s own __init__ re-exports a few widgets); widgets whose
controls only recompute a formula or redraw data (`ddnb.viz.PipelineExplorer`,
`ddnb.viz.ZeroMemoryExplorer`, ...) stay beside their plots.

Widgets draw their figures into an `ipywidgets.Image` (PNG bytes), not an Output widget:
an image is part of the widget's state, so it is saved with the notebook and never leaks
into the cell's outputs, whoever runs the notebook (JupyterLab, nbclient, nbval).
Taught in `notebooks/00_getting_started.ipynb` and the chapters named above.
"""
