"""Training steps whose loss is exact under any number of replicas, and a custom loop.

Under a strategy each replica sees a slice of the global batch and the
optimizer SUMS the replicas' gradients. For the sum to equal the gradient of
the mean loss over the global batch, each replica must divide its *summed*
per-example loss by the number of examples in the *whole* global batch:

    loss_on_replica = sum(per_example_loss on this replica) / global_count

`global_count` is all-reduced every step, so it is right for the last,
partial batch too, where replicas get uneven slices (even none). Keras 3's
built-in `fit` instead scales each replica's *mean* loss by
1/num_replicas_in_sync, which is wrong whenever the slices are uneven, and so
is the common recipe `compute_average_loss(..., global_batch_size=GLOBAL)`,
which divides a partial batch by the full batch size. See docs/numerics.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import keras
import tensorflow as tf

from mdtrain.augment import apply_packed
from mdtrain.compat import ExactFitHooks
from mdtrain.norm import all_reduce_sum, example_weights


def global_example_count(local_batch_size) -> tf.Tensor:
    """Examples in the global batch: the sum of every replica's local count."""
    return all_reduce_sum(tf.cast(local_batch_size, tf.float32))


def replica_loss(per_example_loss: tf.Tensor, local_count=None, *, global_count=None) -> tf.Tensor:
    """This replica's share of the global mean loss (see module doc).

    Summing `replica_loss` over replicas gives the mean of `per_example_loss`
    over the whole global batch, whatever the slices' sizes.

    Args:
        per_example_loss: shape (local_batch,), this replica's examples.
        local_count: examples this replica really holds, when
            `per_example_loss` also holds zero-weighted padding. Defaults to
            None (the length of `per_example_loss`).
        global_count: the global example count when already all-reduced
            (`global_example_count`). Defaults to None (all-reduced here).

    Returns:
        A scalar: local sum / global example count.
    """
    if global_count is None:
        if local_count is None:
            local_count = tf.shape(per_example_loss)[0]
        global_count = global_example_count(local_count)
    count = tf.cast(tf.maximum(global_count, 1.0), per_example_loss.dtype)  # exact: an integer
    return tf.reduce_sum(per_example_loss) / count


def pad_empty_slice(images: tf.Tensor, labels: tf.Tensor):
    """`(images, labels, 0/1 weights, real count)`; an empty slice gets a zero example of weight 0.

    The replica still joins the step's all-reduces; oneDNN CPU convolutions mis-shape an
    empty batch (tensorflow/tensorflow#112639) and its batch statistics would be NaN.
    """
    count = tf.shape(labels)[0]
    pad = tf.cast(tf.equal(count, 0), tf.int32)
    zeros = tf.zeros(tf.concat([[pad], tf.shape(images)[1:]], 0), images.dtype)
    images = tf.concat([images, zeros], 0)
    labels = tf.concat([labels, tf.zeros([pad], labels.dtype)], 0)
    weights = tf.concat([tf.ones([count]), tf.zeros([pad])], 0)
    return images, labels, weights, count


def _compiled_step(strategy: tf.distribute.Strategy, step_fn, element_spec):
    """`strategy.run(step_fn, (batch,))` as one graph, traced once for `element_spec`.

    `fit` and `custom_fit` both run this graph, so they end with the same weights bit for bit;
    the element spec (batch size unknown) spares a second trace for the last, partial batch.
    """

    @tf.function(input_signature=[element_spec])
    def step(batch):
        outputs = strategy.run(step_fn, args=(batch,))
        first = strategy.experimental_local_results  # equal on every replica here
        return tf.nest.map_structure(lambda value: first(value)[0], outputs)

    return step


def build_optimizer(trainer: keras.Model) -> None:
    """Creates the optimizer's variables now, under the trainer's strategy.

    Created lazily in a replica context they make later traces fail ("must feed a value for
    placeholder"); a restored optimizer state needs them to exist.
    """
    if not trainer.optimizer.built:
        with trainer.distribute_strategy.scope():
            trainer.optimizer.build(trainer.net.trainable_variables)


@dataclass(frozen=True)
class StepStats:
    """What the last training step consumed: global examples, and seconds spent waiting for them."""

    batch_size: int
    input_wait_s: float


class ExactTrainer(ExactFitHooks, keras.Model):
    """Wraps a classifier with train and test steps that are exact under a strategy.

    `fit` and `custom_fit` run every training step through the same compiled
    step, so they end with the same weights bit for bit.
    After each step `last_step` holds its real global batch size (all-reduced
    from the data, right for a partial batch and after a mid-epoch resume)
    and the seconds the loop waited for the batch; `mdtrain.monitor` reads it.

    Args:
        net: the classifier (images in, class probabilities out).
        class_weights: optional weight per class, multiplied into each
            example's loss (Keras' `class_weight` meaning). Defaults to None.
        augment: the `AugmentPolicy` to apply inside the training step, on
            each replica's device, to batches that come as `(images, labels,
            transforms)` (`InputData(augment_in="model")`); None when the
            batches come augmented or not at all. Defaults to None.

    Example:

    >>> trainer = ExactTrainer(build_model("small-cnn", 5, 64))  # doctest: +SKIP
    >>> trainer.compile(optimizer="adam")
    >>> trainer.fit(train_ds, epochs=3)
    """

    def __init__(self, net: keras.Model, class_weights=None, augment=None, **kwargs):
        super().__init__(**kwargs)
        self.net = net
        self.augment = augment
        self.class_weights = (
            None if class_weights is None else tf.constant(class_weights, tf.float32)
        )
        self.per_example_loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.last_step: StepStats | None = None
        self._steps: dict[str, object] = {}  # compiled steps by element spec

    def compile(self, optimizer="rmsprop", **kwargs):
        """Keras' `compile`, refusing what the exact steps would silently ignore.

        The loss and metrics are built in (per-example sparse cross-entropy,
        loss and accuracy); every step runs on its own (no
        `steps_per_execution`); XLA is off under `tf.distribute`.

        Raises:
            ValueError: for `loss`, `metrics`, `weighted_metrics`,
                `loss_weights`, `steps_per_execution` > 1 or `jit_compile=True`.
        """
        ignored = [k for k in ("loss", "metrics", "weighted_metrics", "loss_weights")
                   if kwargs.get(k) is not None]  # fmt: skip
        if kwargs.get("steps_per_execution", 1) != 1:
            ignored.append("steps_per_execution")
        if kwargs.get("jit_compile") is True:
            ignored.append("jit_compile")
        if ignored:
            raise ValueError(
                f"ExactTrainer.compile: {', '.join(ignored)} cannot be set; the trainer "
                "has its own loss and metrics and runs one compiled step at a time"
            )
        kwargs["jit_compile"] = False
        super().compile(optimizer=optimizer, **kwargs)
        self._steps = {}

    def call(self, images, training=False):
        return self.net(images, training=training)

    @property
    def metrics(self):
        return [self.loss_tracker, self.accuracy_metric]

    def _update_metrics(self, labels, probabilities, losses, weights) -> dict:
        self.loss_tracker.update_state(losses, sample_weight=weights)
        self.accuracy_metric.update_state(labels, probabilities, sample_weight=weights)
        return {m.name: m.result() for m in self.metrics}

    def train_step(self, data):
        """One replica's training step (Keras' hook); returns the metrics' results as logs."""
        return self._counted_train_step(data)[1]

    def _counted_train_step(self, data):
        """`train_step` that also returns the step's global example count, for `last_step`."""
        global_count, outputs = self._descend(data)
        return global_count, self._update_metrics(*outputs)

    def train_step_sums(self, data):
        """One replica's step that returns its metric sums instead of updating the metrics.

        Parameter-server training schedules this one: there the metrics'
        variables would live on the parameter servers, and Keras 3 updates a
        variable by reading it and writing the sum back, so two workers'
        updates could interleave and one be lost. Summed on the coordinator
        from each step's own result, the loss curve is exact.

        Returns:
            A float32 vector: the step's summed (class-weighted) loss, its
            number of correct predictions, and its number of examples.
        """
        _, (labels, probabilities, losses, weights) = self._descend(data)
        weights = tf.cast(weights, tf.float32)
        predicted = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        correct = tf.cast(predicted == tf.cast(labels, tf.int32), tf.float32)
        sums = [tf.cast(losses, tf.float32) * weights, correct * weights, weights]
        return tf.stack([tf.reduce_sum(values) for values in sums])

    def _descend(self, data):
        """Applies one replica's gradients; returns the global count and the metrics' inputs."""
        images, labels, weights, count = pad_empty_slice(*self._augmented(data))
        global_count = global_example_count(count)
        with tf.GradientTape() as tape, example_weights(weights):
            probabilities = self.net(images, training=True)
            losses = self.per_example_loss(labels, probabilities)
            if self.class_weights is not None:
                class_weight = tf.gather(self.class_weights, tf.cast(labels, tf.int32))
                losses = losses * tf.cast(class_weight, losses.dtype)
            loss = replica_loss(losses * tf.cast(weights, losses.dtype), global_count=global_count)
            # Identity unless mixed float16 wrapped the optimizer in a
            # LossScaleOptimizer, which then unscales in apply().
            scaled = self.optimizer.scale_loss(loss)
        variables = self.net.trainable_variables
        gradients = tape.gradient(scaled, variables)
        self.optimizer.apply(gradients, variables)  # all-reduces (sums) across replicas
        return global_count, (labels, probabilities, losses, weights)

    def _augmented(self, data):
        """`(images, labels)`, the images augmented here when the batch carries transforms."""
        if len(data) == 2:
            return data
        if self.augment is None:
            raise ValueError(
                "ExactTrainer: the batches carry transforms (InputData(augment_in='model')) "
                "but the trainer has no policy to apply them: pass augment=the policy"
            )
        images, labels, transforms = data
        return apply_packed(images, self.augment, transforms), labels

    def train_one_step(self, iterator) -> StepStats:
        """Fetches one distributed batch from `iterator` and trains on it.

        Raises:
            StopIteration: when `iterator` is exhausted.
        """
        key = repr(iterator.element_spec)
        if key not in self._steps:
            build_optimizer(self)
            self._steps[key] = _compiled_step(
                self.distribute_strategy, self._counted_train_step, iterator.element_spec
            )
        start = time.perf_counter()
        batch = next(iterator)
        waited = time.perf_counter() - start
        global_count, _ = self._steps[key](batch)
        self.last_step = StepStats(int(global_count), waited)
        return self.last_step

    def test_step(self, data):
        # Evaluation never augments: transforms drawn for training are left unused.
        images, labels, weights, _ = pad_empty_slice(*data[:2])
        probabilities = self.net(images, training=False)
        losses = self.per_example_loss(labels, probabilities)  # no class weights
        return self._update_metrics(labels, probabilities, losses, weights)


def metric_logs(trainer: keras.Model, prefix: str = "") -> dict[str, float]:
    """The trainer's metrics as Keras logs, `{prefix + name: value}` (`"val_"` for validation)."""
    return {prefix + m.name: float(m.result()) for m in trainer.metrics}


def _distributed(strategy: tf.distribute.Strategy, dataset):
    """`dataset` split over the replicas, unless it is already (or None)."""
    done = dataset is None or isinstance(dataset, tf.distribute.DistributedDataset)
    return dataset if done else strategy.experimental_distribute_dataset(dataset)


def custom_fit(
    trainer: ExactTrainer,
    strategy: tf.distribute.Strategy,
    train_ds: tf.data.Dataset,
    *,
    epochs: int,
    steps_per_epoch: int,
    val_ds: tf.data.Dataset | None = None,
    initial_epoch: int = 0,
    callbacks: list | None = None,
    verbose: int = 2,
) -> keras.callbacks.History:
    """Trains with a hand-written `strategy.run` loop; same numerics as `trainer.fit`.

    Each step fetches one distributed batch and runs the trainer's compiled
    step on every replica (`ExactTrainer.train_one_step`). Validation runs
    distributed too. Keras callbacks (checkpoints, early stopping, backups,
    mdtrain's monitor) work as with `fit`.

    Args:
        trainer: a compiled `ExactTrainer`, created under `strategy.scope()`.
        strategy: the strategy.
        train_ds: globally batched dataset holding epochs `initial_epoch`…`epochs - 1`
            back to back (`InputData.train_epochs`), or one distributed already
            (`InputData.for_strategy`).
        epochs: index of the epoch to stop before.
        steps_per_epoch: steps in one epoch.
        val_ds: globally batched validation data, or distributed. Defaults to None.
        initial_epoch: first epoch to run. Defaults to 0.
        callbacks: Keras callbacks. Defaults to None.
        verbose: 0 silent, 1 progress bar, 2 one line per epoch. Defaults to 2.

    Returns:
        The `History` callback; `.history` maps metric names to per-epoch lists.
    """
    train_dist, val_dist = _distributed(strategy, train_ds), _distributed(strategy, val_ds)
    if val_ds is not None:
        test_step = _compiled_step(strategy, trainer.test_step, val_dist.element_spec)
    history = keras.callbacks.History()
    cbs = keras.callbacks.CallbackList(
        [*(callbacks or []), history],
        add_progbar=verbose > 0,
        model=trainer,
        verbose=verbose,
        epochs=epochs,
        steps=steps_per_epoch,
    )
    trainer.stop_training = False
    iterator = iter(train_dist)
    cbs.on_train_begin()
    logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        trainer.reset_metrics()
        cbs.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            cbs.on_train_batch_begin(step)
            trainer.train_one_step(iterator)
            # Reading the metrics is a cross-worker reduction under multi-worker
            # training, and each eager one starts threads: only a progress bar needs
            # them every step.
            cbs.on_train_batch_end(step, metric_logs(trainer) if verbose == 1 else None)
        logs = metric_logs(trainer)
        if val_ds is not None:  # one distributed pass, adding its `val_` metrics to `logs`
            trainer.reset_metrics()
            cbs.on_test_begin()
            for batch in val_dist:
                test_step(batch)
            logs.update(metric_logs(trainer, "val_"))
            cbs.on_test_end(logs)
        cbs.on_epoch_end(epoch, logs)
        if trainer.stop_training:
            break
    cbs.on_train_end(logs)
    return history
