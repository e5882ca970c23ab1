"""Matplotlib figures for the notebooks: images, class counts, training curves, throughput.

Every function returns a `matplotlib.figure.Figure` and never calls
`plt.show()`: a notebook displays the returned figure, a script saves it,
a test inspects it. Figures are sized to read well at dpi ~80 and stay small
when committed inside a notebook.

Images may be uint8 (0-255) or float in [0, 255] or [0, 1]; tensors are
converted with `numpy.asarray`. The figures live by kind in `images`, `counts`,
`curves` and `speed`; `common` holds their shared helpers.
"""

from __future__ import annotations

from mdtrain.plots.common import DPI, RIGHT_COLOR, WRONG_COLOR
from mdtrain.plots.counts import class_counts_bar, recall_bars, replica_class_counts_plot
from mdtrain.plots.curves import accuracy_comparison, history_curves, scaling_chart, step_curves
from mdtrain.plots.images import augmentation_grid, image_grid, side_by_side_augmentations
from mdtrain.plots.speed import overlap_timeline, throughput_bars

__all__ = [
    "DPI",
    "RIGHT_COLOR",
    "WRONG_COLOR",
    "accuracy_comparison",
    "augmentation_grid",
    "class_counts_bar",
    "history_curves",
    "image_grid",
    "overlap_timeline",
    "recall_bars",
    "replica_class_counts_plot",
    "scaling_chart",
    "side_by_side_augmentations",
    "step_curves",
    "throughput_bars",
]
