"""mdtrain_course.plots: each figure holds what it should (axes, bars, patches, labels)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from mdtrain_course import plots  # noqa: E402

CLASSES = ["circle", "cross", "square"]


def _images(n: int, size: int = 8) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _bars(ax) -> list[Rectangle]:
    return [p for c in ax.containers for p in c.patches]


def test_image_grid_titles_and_frames():
    fig = plots.image_grid(_images(5), [0, 1, 2, 0, 1], CLASSES, ncols=3)
    assert len(fig.axes) == 5  # the sixth cell of the 2 x 3 grid is removed
    assert [ax.get_title() for ax in fig.axes] == ["circle", "cross", "square", "circle", "cross"]
    assert not fig.axes[0].spines["left"].get_visible()  # no prediction: no frame
    fig = plots.image_grid(_images(5), [0, 1, 2, 0, 1], CLASSES, ncols=3, predicted=[0, 2, 2, 0, 0])
    right = fig.axes[0].spines["left"]
    wrong = fig.axes[1].spines["left"]
    assert right.get_visible() and wrong.get_visible()
    assert right.get_edgecolor() != wrong.get_edgecolor()
    assert fig.axes[1].title.get_color() == plots.WRONG_COLOR
    assert not plt.get_fignums()  # not left open in pyplot: no double display in Jupyter


def test_image_grid_accepts_float_and_grayscale():
    floats = _images(2).astype(np.float32) / 255.0
    gray = _images(2)[..., :1]
    for images in (floats, gray):
        fig = plots.image_grid(images, np.array([[0], [2]]), CLASSES, title="t")
        assert len(fig.axes) == 2 and fig._suptitle.get_text() == "t"
    assert fig.axes[0].images[0].get_array().ndim == 2


def test_image_grid_rejects_mismatched_labels():
    with pytest.raises(ValueError, match="labels"):
        plots.image_grid(_images(3), [0, 1], CLASSES)


def test_image_grid_titles_clear_the_row_above():
    fig = plots.image_grid(_images(12), [0, 1, 2] * 4, CLASSES, ncols=6, title="a batch")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)  # lays the figure out as saving or showing it would
    above, below = fig.axes[0], fig.axes[6]
    title = below.title.get_window_extent(renderer)
    assert title.y1 <= above.get_window_extent(renderer).y0  # no title over an image
    assert (
        fig._suptitle.get_window_extent(renderer).y0
        >= fig.axes[0].title.get_window_extent(renderer).y1
    )


def test_image_grid_with_predictions_titles_each_image_with_its_prediction():
    fig = plots.image_grid(_images(3), [0, 1, 2], CLASSES, predicted=[0, 2, 2])
    assert [ax.get_title() for ax in fig.axes] == ["circle", "square", "square"]
    colors = [ax.title.get_color() for ax in fig.axes]
    assert colors == [plots.RIGHT_COLOR, plots.WRONG_COLOR, plots.RIGHT_COLOR]
    assert fig.axes[1].spines["left"].get_edgecolor() != fig.axes[0].spines["left"].get_edgecolor()


def test_image_grid_per_class_one_row_per_true_class_mistakes_first():
    labels = [0] * 6 + [1] * 2 + [2] * 5  # unbalanced, in class order
    predicted = [0, 0, 0, 1, 0, 2] + [1, 1] + [2, 2, 2, 2, 0]
    images = _images(len(labels))
    fig = plots.image_grid(images, labels, CLASSES, predicted=predicted, per_class=3)
    rows = {}
    for ax in fig.axes:
        rows.setdefault(ax.get_subplotspec().rowspan.start, []).append(ax)
    assert [len(r) for r in rows.values()] == [3, 2, 3]  # every class, at most 3 each
    assert [r[0].get_ylabel() for r in rows.values()] == CLASSES  # the true class names the row
    assert [ax.get_title() for ax in rows[0]] == ["cross", "square", "circle"]  # mistakes first
    assert [ax.get_title() for ax in rows[2]] == ["circle", "square", "square"]
    shown = [ax.images[0].get_array() for ax in rows[0]]
    np.testing.assert_array_equal(shown[0], images[3])  # the first mistake's own image


def test_image_grid_per_class_without_predictions_labels_rows_only():
    fig = plots.image_grid(_images(6), [0, 0, 1, 1, 2, 2], CLASSES, per_class=2)
    assert len(fig.axes) == 6 and not any(ax.get_title() for ax in fig.axes)
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == CLASSES


def test_image_grid_rejects_bad_sizes():
    with pytest.raises(ValueError, match="predicted"):
        plots.image_grid(_images(2), [0, 1], CLASSES, predicted=[0])
    with pytest.raises(ValueError, match="per_class"):
        plots.image_grid(_images(2), [0, 1], CLASSES, per_class=0)


def test_class_counts_bar_flat_and_per_split():
    fig = plots.class_counts_bar({"circle": 3, "cross": 5})
    (ax,) = fig.axes
    assert [b.get_height() for b in _bars(ax)] == [3, 5]
    assert ax.get_legend() is None
    counts = {"train": {"circle": 30, "cross": 50}, "val": {"circle": 6, "cross": 10}}
    (ax,) = plots.class_counts_bar(counts).axes
    assert sorted(b.get_height() for b in _bars(ax)) == [6, 10, 30, 50]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "val"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["circle", "cross"]


def test_augmentation_grid_has_original_first():
    fig = plots.augmentation_grid(_images(1)[0], _images(12), title="aug")
    assert len(fig.axes) == 13
    assert fig.axes[0].get_title() == "original"


def test_side_by_side_augmentations_two_3x4_grids():
    fig = plots.side_by_side_augmentations(_images(1)[0], _images(12), _images(12))
    assert len(fig.axes) == 1 + 12 + 12
    titles = {ax.get_title() for ax in fig.axes}
    assert {"original", "ImageDataGenerator", "mdtrain.augment_batch"} <= titles


def test_history_curves_train_and_val():
    history = [
        {"loss": 1.0, "accuracy": 0.5, "val_loss": 1.2, "val_accuracy": 0.4},
        {"loss": 0.5, "accuracy": 0.8, "val_loss": 0.7, "val_accuracy": 0.7},
        {"loss": 0.3, "accuracy": 0.9, "val_loss": 0.6, "val_accuracy": 0.75},
    ]
    fig = plots.history_curves(history)
    loss_ax, acc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.lines] == ["train", "validation"]
    np.testing.assert_allclose(acc_ax.lines[1].get_ydata(), [0.4, 0.7, 0.75])
    # Keras' History.history (dict of lists) without validation
    fig = plots.history_curves({"loss": [1.0, 0.4], "accuracy": [0.3, 0.6]})
    assert [len(ax.lines) for ax in fig.axes] == [1, 1]


def test_history_curves_of_two_runs_with_the_phase_boundary():
    plain = [{"loss": 1.0, "val_loss": 1.2, "accuracy": 0.5, "val_accuracy": 0.4}] * 3
    runs = {"plain": plain, "mdtrain": [{"loss": 0.9, "accuracy": 0.6}] * 2}
    loss_ax, acc_ax = plots.history_curves(runs, boundary=2).axes
    labels = ["plain train", "plain validation", "mdtrain train"]
    assert [line.get_label() for line in loss_ax.lines][:3] == labels
    assert loss_ax.lines[-1].get_xdata()[0] == 2.5  # the dashed line after epoch 2
    assert acc_ax.get_ylim()[0] > 0.3  # without num_classes the axis fits the curves


def test_throughput_bars_on_a_log_scale_first_on_top():
    timings = {
        "slow": {"median": 100, "min": 90, "max": 120},
        "fast": {"median": 1e4, "min": 9e3, "max": 1.1e4},
    }
    (ax,) = plots.throughput_bars(timings).axes
    assert ax.get_xscale() == "log"
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    np.testing.assert_allclose([b.get_width() for b in bars.patches], [100, 1e4])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["slow", "fast"]
    assert ax.yaxis_inverted()
    assert [t.get_text() for t in ax.texts] == ["100", "10,000"]


def test_overlap_timeline_draws_each_batch_in_its_lane():
    batch = {"input": (0.0, 0.01), "step": (0.01, 0.03)}
    later = {"input": (0.03, 0.04), "step": (0.04, 0.06)}
    fig = plots.overlap_timeline({"without prefetch": [batch, later], "with": [batch]})
    top, bottom = fig.axes
    step, inputs = top.collections[0], top.collections[1]  # batch 0: step, then input
    np.testing.assert_allclose(step.get_paths()[0].get_extents().x0, 10)
    np.testing.assert_allclose(inputs.get_paths()[0].get_extents().x1, 10)
    assert len(top.collections) == 4 and len(bottom.collections) == 2
    assert top.get_title(loc="left") == "without prefetch: 2 batches in 60 ms"


def test_accuracy_comparison_one_axis_zero_to_one_with_chance():
    imagenet = [{"val_accuracy": 0.9}, {"val_accuracy": 0.95}]
    runs = {"imagenet": imagenet, "scratch": [{"val_accuracy": 0.3}]}
    (ax,) = plots.accuracy_comparison(runs, chance=0.2, boundary=1).axes
    labelled = [line for line in ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["imagenet", "scratch", "chance (0.20)"]
    np.testing.assert_allclose(labelled[0].get_ydata(), [0.9, 0.95])
    assert labelled[2].get_ydata()[0] == 0.2
    assert [line.get_xdata()[0] for line in ax.lines if line not in labelled] == [1.5]  # boundary
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1


def test_recall_bars_mean_of_runs_with_whiskers():
    recalls = {"baseline": [0.9, 0.2, 0.5], "weighted": [[0.8, 0.5, 0.6], [0.6, 0.7, 0.4]]}
    (ax,) = plots.recall_bars(recalls, CLASSES).axes
    baseline, weighted = [c for c in ax.containers if isinstance(c, BarContainer)]
    np.testing.assert_allclose([b.get_height() for b in baseline.patches], [0.9, 0.2, 0.5])
    np.testing.assert_allclose([b.get_height() for b in weighted.patches], [0.7, 0.6, 0.5])
    assert baseline.errorbar is None  # one run: no whisker
    (whiskers,) = weighted.errorbar.lines[2]
    np.testing.assert_allclose([s[:, 1] for s in whiskers.get_segments()],
                               [[0.6, 0.8], [0.5, 0.7], [0.4, 0.6]])  # fmt: skip
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["baseline", "weighted"]


def test_replica_class_counts_plot_stacks_classes_per_replica():
    counts = np.array(
        [[[2, 1, 0], [0, 1, 2]], [[1, 1, 1], [3, 0, 0]]]
    )  # (steps, replicas, classes)
    fig = plots.replica_class_counts_plot(counts, CLASSES, title="r")
    assert [ax.get_title() for ax in fig.axes] == ["replica 0", "replica 1"]
    tops = [[b.get_y() + b.get_height() for b in c.patches] for c in fig.axes[1].containers]
    assert tops[-1] == [3, 3]  # each bar stacks up to its step's slice size
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == CLASSES


def test_scaling_chart_draws_each_line_and_its_ideal():
    strong, weak = [100.0, 150.0, 160.0], [40.0, 70.0, 100.0]
    rates = {"strong: global batch 64": strong, "weak: 16 per replica": weak}
    (ax,) = plots.scaling_chart([1, 2, 4], rates, title="t").axes
    labels = [line.get_label() for line in ax.lines]
    assert labels == ["strong: global batch 64", "ideal (strong)", "weak: 16 per replica",
                      "ideal (weak)"]  # fmt: skip
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [100, 200, 400])  # first figure x N
    np.testing.assert_allclose(ax.lines[3].get_ydata(), [40, 80, 160])
    assert ax.lines[0].get_color() == ax.lines[1].get_color() != ax.lines[2].get_color()
    assert ax.get_ylim()[0] == 0 and ax.get_title() == "t"


def test_step_curves_at_their_steps_with_marks():
    curves = {"plain": [0.0, 0.5, 1.0, 0.8], "mdtrain": [0.0, 0.5, 1.0, 0.8]}
    (ax,) = plots.step_curves(curves, "learning rate", steps=[0, 1, 2, 3], marks={2: "w"}).axes
    plain, mdtrain, mark = ax.lines
    assert (plain.get_label(), mdtrain.get_label()) == ("plain", "mdtrain")
    assert plain.get_linewidth() > mdtrain.get_linewidth()  # equal curves stay visible
    np.testing.assert_allclose(mdtrain.get_xdata(), [0, 1, 2, 3])
    assert list(mark.get_xdata()) == [2, 2] and [t.get_text() for t in ax.texts] == ["w"]
    (ax,) = plots.step_curves({"loss": [3.0, 2.0]}, "loss").axes
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [0, 1])  # steps 0, 1, ... by default
