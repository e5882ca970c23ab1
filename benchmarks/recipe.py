"""Article 003's recipe beside `mdtrain train`, both as whole commands on the same data.

The recipe, as article 003 (and notebooks 02/03) write it:
`keras.utils.image_dataset_from_directory(...)` for `train/` and `val/` with
`.cache()` and `.prefetch(AUTOTUNE)`, Keras' augmentation layers inside the
model (flip, rotation ±20°, zoom ±15%: `mdtrain train`'s policy, so the two
learn the same task), the same small CNN as `mdtrain train --model small-cnn`
(built with Keras' own `BatchNormalization`, as a user writes it),
`MirroredStrategy` over 2 virtual CPU replicas, `Adam()`, `fit` for 15 epochs
at the same image size and global batch. `mdtrain train --strategy cpu:2`
runs with its defaults on the same folder.

Each round runs both commands one after the other (who goes first alternates
round by round), each timed from its start to its exit on this script's
clock (`time.perf_counter`): wall time a user waits, start-up included. The
recipe's process also evaluates its model once more after training (below);
those seconds, which a user of the recipe would not spend, are left out of its
wall time (`check_s`). The result holds each side's wall times, phases and last
validation accuracy per round, their medians, the wall ratio recipe ÷ mdtrain
taken round by round, and the same ratio of a training step's seconds.

Both sides report their phases on the same terms: `mdtrain train --json`'s
`phases`, and the recipe's from the same `PhaseClock.segment_timer` around
its `fit` (`first_step`, `training`, `validation`), with `set_up` (loading the
folders, building, compiling) before it and `after_fit` (from `fit`'s last
callback to its return, where TensorFlow's teardown stall strikes:
benchmarks/README.md) after. What no phase holds (`outside`) is the
interpreter and TensorFlow starting, and the exit. The training phase is the
epochs' steps after each side's first call (Keras' holds one step, mdtrain's
`steps_per_execution`), so the two are compared per step
(`training_step_ms`): the wall ratio tends to that ratio as the epochs grow,
and the start-up both sides pay keeps it below.

The recipe's accuracy is its trained model's on every image of `val/`, read
afresh after `fit` (`val_accuracy_on_every_image`). The figure its own `fit`
reports is kept beside it (`val_accuracy_in_fit`), with the validation batches
each epoch read (`val_batches_in_fit`): under `MirroredStrategy` a cached
`image_dataset_from_directory` validation set sometimes reads only 1-3 of its
5 batches in every pass (benchmarks/README.md has the reproduction).

Usage, from the repository root (about 1.5 minutes a round on 2 idle cores):

    python benchmarks/recipe.py [--data data/demo] [--epochs 15] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from _common import REPO, check_positive, last_json, machine_info, run_main

if TYPE_CHECKING:
    from mdtrain.phases import PhaseClock

REPLICAS = 2
#: mdtrain train's defaults for the small CNN: 32 px, 32 images per replica.
IMAGE_SIZE, BATCH_PER_REPLICA = 32, 32


def recipe_fit(
    data: str | os.PathLike,
    image_size: int,
    global_batch: int,
    epochs: int,
    devices: list[str] | None = None,
    callbacks: list | None = None,
    clock: PhaseClock | None = None,
):
    """Trains article 003's recipe; returns the model, strategy, training dataset and history.

    Args:
        data: a folder holding `train/` and `val/` class folders.
        image_size: side of the square images the loader resizes to.
        global_batch: images per step over all replicas.
        epochs: training epochs.
        devices: the strategy's devices. Defaults to None: every GPU, else the CPU.
        callbacks: Keras callbacks for `fit`. Defaults to None.
        clock: an `mdtrain.phases.PhaseClock` that gets the recipe's phases on
            `mdtrain train`'s terms: `set_up` (loading the folders, building
            and compiling), `first_step`, `training` and `validation` (its
            `segment_timer`), and `after_fit` (from `fit`'s last callback to
            its return). Defaults to None.

    Returns:
        `(model, strategy, train_ds, history)`; `train_ds.file_paths` lists the images.
    """
    import tensorflow as tf

    from mdtrain.phases import PhaseClock

    clock = clock or PhaseClock()
    with clock.phase("set_up"):
        train_ds, val_ds, strategy, model = _recipe_model(data, image_size, global_batch, devices)
    autotune = tf.data.AUTOTUNE
    timer, before, start = clock.segment_timer(), sum(clock.seconds().values()), clock.now()
    history = model.fit(
        train_ds.cache().prefetch(autotune), epochs=epochs, verbose=2,
        callbacks=[*(callbacks or []), timer], validation_data=val_ds.cache().prefetch(autotune),
    )  # fmt: skip
    in_fit = sum(clock.seconds().values()) - before  # what the timer added at fit's end
    clock.add("after_fit", clock.now() - start - in_fit)
    return model, strategy, train_ds, history


def _recipe_model(data, image_size: int, global_batch: int, devices):
    """The recipe's datasets, strategy and compiled model: `(train_ds, val_ds, strategy, model)`."""
    import keras
    import tensorflow as tf

    from mdtrain.compat import fresh_collective_keys
    from mdtrain.models import build_model

    keras.utils.set_random_seed(0)

    def load(split):
        return keras.utils.image_dataset_from_directory(
            Path(data) / split, shuffle=True, seed=0, batch_size=global_batch,
            image_size=(image_size, image_size),
        )  # fmt: skip

    train_ds, val_ds = load("train"), load("val")
    fresh_collective_keys()  # another MirroredStrategy over these devices may come before
    # NCCL, the default over GPUs, refuses two ranks on one card ("invalid usage").
    logical, physical = (len(tf.config.list_logical_devices("GPU")),
                         len(tf.config.list_physical_devices("GPU")))  # fmt: skip
    reduce = tf.distribute.ReductionToOneDevice() if logical > physical else None
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=reduce)
    layers = keras.layers
    with strategy.scope():
        augmentation = keras.Sequential(
            [layers.RandomFlip("horizontal"), layers.RandomRotation(20 / 360),
             layers.RandomZoom(0.15)], name="augmentation",
        )  # fmt: skip
        net = build_model("small-cnn", len(train_ds.class_names), image_size, batch_norm="local")
        inputs = keras.Input((image_size, image_size, 3))
        model = keras.Model(inputs, net(augmentation(inputs)))
        model.compile(optimizer=keras.optimizers.Adam(), metrics=["accuracy"],
                      loss="sparse_categorical_crossentropy")  # fmt: skip
    return train_ds, val_ds, strategy, model


def val_accuracy_on_every_image(model, data: str | os.PathLike, image_size: int,
                                global_batch: int) -> float:  # fmt: skip
    """`model`'s accuracy over every image of `data/val`, read afresh: no cache, no shuffle.

    Args:
        model: a trained classifier of 0-255 images.
        data: a folder holding `val/` class folders.
        image_size: side of the square images the loader resizes to.
        global_batch: images per evaluation step.

    Returns:
        The share of `val/`'s images whose top class is their label.
    """
    import keras

    val = keras.utils.image_dataset_from_directory(
        Path(data) / "val", shuffle=False, batch_size=global_batch,
        image_size=(image_size, image_size), verbose=False,
    )  # fmt: skip
    return model.evaluate(val, return_dict=True, verbose=0)["accuracy"]


def _validation_batches():
    """A Keras callback: the validation batches each epoch's pass read, in `counts`."""
    import keras

    class ValidationBatches(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.counts: list[int] = []

        def on_test_begin(self, logs=None):
            self.counts.append(0)

        def on_test_batch_end(self, batch, logs=None):
            self.counts[-1] += 1

    return ValidationBatches()


def _recipe_worker(data: str, epochs: int) -> dict:
    """The recipe in this process, on 2 virtual CPU replicas: its accuracies and phases."""
    from mdtrain.distribute import configure_devices
    from mdtrain.phases import PhaseClock

    configure_devices(f"cpu:{REPLICAS}")
    devices = [f"/cpu:{index}" for index in range(REPLICAS)]
    counter, global_batch = _validation_batches(), BATCH_PER_REPLICA * REPLICAS
    clock = PhaseClock()
    model, _, train_ds, history = recipe_fit(
        data, IMAGE_SIZE, global_batch, epochs, devices, [counter], clock
    )
    with clock.phase("check"):  # not the recipe's: left out of its wall time (`_timed`)
        accuracy = val_accuracy_on_every_image(model, data, IMAGE_SIZE, global_batch)
    return {
        "val_accuracy": accuracy,
        "val_accuracy_in_fit": history.history["val_accuracy"][-1],
        "val_batches_in_fit": counter.counts,
        "phases": {name: round(seconds, 3) for name, seconds in clock.seconds().items()},
        "training_steps": epochs * len(train_ds) - 1,  # Keras' first call: one step
    }


def _commands(data: str, epochs: int) -> dict[str, list[str]]:
    worker = json.dumps({"data": data, "epochs": epochs})
    return {
        "recipe": [sys.executable, __file__, "--worker", worker],
        "mdtrain": [sys.executable, "-m", "mdtrain", "train", "--data", data, "--strategy",
                    f"cpu:{REPLICAS}", "--epochs", str(epochs), "--monitor", "none", "--json"],
    }  # fmt: skip


def _timed(command: list[str]) -> dict:
    """Runs `command` to its exit: its wall seconds, phases, and the accuracy it reports.

    `wall_s` leaves out the recipe's own check (its `check` phase), which its
    users would not run; `outside` is what no phase holds (start-up and exit).
    """
    last, process_s = last_json(command, REPO)
    accuracy = last.get("val_accuracy") or (last.get("history") or [{}])[-1].get("val_accuracy")
    in_fit = {
        key: last[key] for key in ("val_accuracy_in_fit", "val_batches_in_fit") if key in last
    }
    phases = dict(last["phases"])
    check = phases.pop("check", 0.0)
    phases["outside"] = round(process_s - check - sum(phases.values()), 3)
    steps = last.get("training_steps") or _mdtrain_training_steps(last)
    return {"wall_s": round(process_s - check, 2), "process_s": round(process_s, 2),
            "check_s": check, "val_accuracy": accuracy, "phases": phases,
            "training_step_ms": round(1000 * phases["training"] / steps, 2), **in_fit}  # fmt: skip


def _mdtrain_training_steps(report: dict) -> int:
    """The steps `mdtrain train --json`'s training phase holds: all but its first call's."""
    from mdtrain.config import TrainConfig

    per_epoch = -(-report["num_train"] // report["global_batch_size"])
    first_call = min(TrainConfig(**report["config"]).resolved_steps_per_execution, per_epoch)
    return report["epochs"] * per_epoch - first_call


def _summary(runs: dict[str, list[dict]]) -> dict:
    """Medians and spreads of both sides, and the ratios recipe ÷ mdtrain round by round:
    of the wall times, and of the seconds per step of the training phases."""
    result = {}
    for side, rounds in runs.items():
        walls = [one["wall_s"] for one in rounds]
        result[side] = {"wall_s": round(statistics.median(walls), 2),
                        "wall_spread": [min(walls), max(walls)],
                        "val_accuracy": [one["val_accuracy"] for one in rounds],
                        "training_step_ms": statistics.median(
                            one["training_step_ms"] for one in rounds)}  # fmt: skip
        names = dict.fromkeys(name for one in rounds for name in one["phases"])
        result[side]["phases"] = {
            name: round(statistics.median(one["phases"].get(name, 0.0) for one in rounds), 2)
            for name in names
        }
    for key, read in (
        ("recipe_wall_vs_mdtrain", lambda run: run["wall_s"]),
        ("recipe_training_step_vs_mdtrain", lambda run: run["training_step_ms"]),
    ):
        ratios = [read(r) / read(m) for r, m in zip(runs["recipe"], runs["mdtrain"], strict=True)]
        result[key] = {"median": round(statistics.median(ratios), 2),
                       "rounds": [round(x, 2) for x in ratios]}  # fmt: skip
    return result


#: The chart's segments: (label, the phases each side's segment adds up), in run order.
CHART_SEGMENTS = [
    ("interpreter and TensorFlow starting, exit", ("outside",)),
    ("set-up: folders, model", ("set_up", "import", "devices", "data_scan", "model", "restore")),
    ("first call of the training step", ("first_step",)),
    ("training: the other steps", ("training",)),
    ("validation", ("validation",)),
    ("after fit, outputs", ("after_fit", "outputs")),
]


def phase_chart(result: dict):
    """Each side's median wall time as one bar, split into its median phases (`CHART_SEGMENTS`)."""
    from mdtrain_course.plots.common import new_figure

    summary, sides = result["summary"], ("recipe", "mdtrain")
    ratio = summary["recipe_wall_vs_mdtrain"]["median"]
    per_step = summary["recipe_training_step_vs_mdtrain"]["median"]
    title = (
        f"{result['epochs']} epochs on {result['replicas']} CPU replicas, where the wall time "
        f"goes: recipe ÷ mdtrain {ratio:.2f}× the wall, {per_step:.2f}× a step"
    )
    fig = new_figure((10, 3.0), title, layout="constrained")
    ax = fig.add_subplot()
    left = [0.0, 0.0]
    for label, names in CHART_SEGMENTS:
        widths = [sum(summary[side]["phases"].get(n, 0.0) for n in names) for side in sides]
        bars = ax.barh([0, 1], widths, left=left, label=label)
        shown = [f"{w:.1f}" if w >= 2.0 else "" for w in widths]  # where the label fits
        ax.bar_label(bars, labels=shown, label_type="center", fontsize=8)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    steps = [f"{summary[side]['training_step_ms']:.0f} ms a step" for side in sides]
    ax.set_yticks([0, 1], [f"article 003's recipe\n{steps[0]}", f"mdtrain train\n{steps[1]}"])
    ax.invert_yaxis()
    ax.set_xlabel("seconds: each phase's median over the rounds")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=7.5, frameon=False)
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="dataset folder with train/ and val/ (default: the demo "
                        "dataset, made on first use)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (default: 15)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "recipe.json"))
    parser.add_argument("--json", action="store_true", help="last line: the result as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        config = json.loads(args.worker)
        print(json.dumps(_recipe_worker(config["data"], config["epochs"])), flush=True)
        return
    check_positive(epochs=args.epochs, repeats=args.repeats)
    from mdtrain.sources import ensure_demo_dataset

    data = str(Path(args.data) if args.data else ensure_demo_dataset())
    commands, runs = _commands(data, args.epochs), {"recipe": [], "mdtrain": []}
    for number in range(args.repeats):
        for side in ("recipe", "mdtrain")[:: 1 if number % 2 == 0 else -1]:
            runs[side].append(_timed(commands[side]))
            print(f"round {number + 1} {side}: {runs[side][-1]}", file=sys.stderr, flush=True)
    result = {"summary": _summary(runs), "runs": runs, "data": data, "epochs": args.epochs,
              "replicas": REPLICAS, "machine": machine_info(),
              "command": " ".join(["python", "benchmarks/recipe.py",
                                   *(argv if argv is not None else sys.argv[1:])])}  # fmt: skip
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    phase_chart(result).savefig(output.with_suffix(".png"))
    print(json.dumps(result) if args.json else json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    run_main(main)
