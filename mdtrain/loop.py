"""Training steps whose loss is exact under any number of replicas, and a custom loop.

Each replica divides its summed per-example loss by the global batch's example count,
counted every step, which Keras 3's `fit` and the common recipe do not: docs/numerics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from mdtrain.augment import apply_packed
from mdtrain.compat import op_determinism_enabled
from mdtrain.norm import all_reduce_sum, example_weights
from mdtrain.trainer_hooks import ExactFitHooks, skip_together


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


def pad_empty_slice(images: tf.Tensor, labels: tf.Tensor, *more: tf.Tensor):
    """`(images, labels, *more, 0/1 weights, real count)`; an empty slice gets one zero example."""
    # Of weight 0; the replica still joins the step's all-reduces. oneDNN CPU convolutions
    # mis-shape an empty batch (tensorflow/tensorflow#112639), its batch statistics would be NaN,
    # and the fused augmentation (`more`: its transforms) would compile a zero-size XLA program.
    count = tf.shape(labels)[0]
    pad = tf.cast(tf.equal(count, 0), tf.int32)
    padded = [
        tf.concat([t, tf.zeros(tf.concat([[pad], tf.shape(t)[1:]], 0), t.dtype)], 0)
        for t in (images, labels, *more)
    ]
    return (*padded, tf.concat([tf.ones([count]), tf.zeros([pad])], 0), count)


def _compiled_step(strategy: tf.distribute.Strategy, step_fn, element_spec):
    """`strategy.run(step_fn, (batch,))` in one graph, traced once: any batch size fits."""

    @tf.function(input_signature=[element_spec])
    def step(batch):
        outputs = strategy.run(step_fn, args=(batch,))
        first = strategy.experimental_local_results  # equal on every replica here
        return tf.nest.map_structure(lambda value: first(value)[0], outputs)

    return step


def _compiled_steps(strategy: tf.distribute.Strategy, step_fn, results, timed: bool):
    """`steps(iterator, limit)`: up to `limit` steps in one graph; returns, as tensors, the steps
    run, their global examples, the seconds waited for input and the metrics' results."""
    # Op determinism refuses tf.timestamp; a Python clock (`graph_clock`) stalled this compiled
    # loop under determinism on 2 CPU replicas (2026-12-05, not yet understood), so no clock:
    # there the run's monitor stamps the training batches instead (`parts.segment_loop`).
    clock = tf.timestamp if timed else lambda: tf.constant(0.0, tf.float64)

    def fetch(iterator):
        start = clock()
        batch = iterator.get_next_as_optional()
        with tf.control_dependencies([batch.has_value()]):
            return batch, clock() - start

    def run(batch):  # one step on every replica: its global example count
        data, count = batch.get_value(), None  # None: all-reduced in the step (multi-worker)
        slices = strategy.experimental_local_results(data)
        if len(slices) == strategy.num_replicas_in_sync:  # all here: counted with no collective
            count = tf.add_n([tf.cast(tf.shape(labels)[0], tf.float32) for _, labels, *_ in slices])
        return strategy.experimental_local_results(strategy.run(step_fn, (data, count)))[0]

    @tf.function
    def one_step(iterator):  # a while_loop around one step cost the host 15% of a small step
        batch, waited = fetch(iterator)
        done, examples = tf.cond(batch.has_value(), lambda: (1, run(batch)), lambda: (0, 0.0))
        return done, examples, waited, results()

    @tf.function
    def loop(iterator, limit):
        def step(done, examples, waited, batch):
            count = run(batch)
            batch, wait = tf.cond(
                done + 1 < limit,
                lambda: fetch(iterator),
                lambda: (batch, tf.constant(0.0, tf.float64)),
            )
            return done + 1, examples + count, waited + wait, batch

        def more(done, examples, waited, batch):
            return tf.logical_and(done < limit, batch.has_value())

        batch, waited = fetch(iterator)
        done, examples, waited, _ = tf.while_loop(more, step, (0, 0.0, waited, batch))
        return done, examples, waited, results()

    def steps(iterator, limit: int):
        return one_step(iterator) if limit == 1 else loop(iterator, tf.constant(limit, tf.int32))

    return steps


def build_optimizer(trainer: keras.Model) -> None:
    """Creates the optimizer's variables now, under the trainer's strategy (restores need them)."""
    if not trainer.optimizer.built:  # made lazily in a replica context, they break later traces
        with trainer.distribute_strategy.scope():
            trainer.optimizer.build(trainer.net.trainable_variables)


@dataclass(frozen=True)
class StepStats:
    """The last call's global examples and seconds waiting for them: numbers or scalar tensors."""

    batch_size: object
    input_wait_s: object


class ExactTrainer(ExactFitHooks, keras.Model):
    """Wraps a classifier with train and test steps that are exact under a strategy.

    `fit` and `custom_fit` run the same compiled steps and end with the same
    weights bit for bit (docs/numerics.md). After each call `last_step` holds
    its real global examples and the seconds it waited, for `mdtrain.monitor`.

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
        self._steps = None  # the compiled steps (`_compiled_steps`), made on first use

    def compile(self, optimizer="rmsprop", **kwargs):
        """Keras' `compile`, refusing what the exact steps would silently ignore.

        The loss and metrics are built in (per-example sparse cross-entropy, loss and
        accuracy); XLA is off under `tf.distribute`; `steps_per_execution` as docs/numerics.md says.

        Raises:
            ValueError: for `loss`, `metrics`, `weighted_metrics`,
                `loss_weights` or `jit_compile=True`.
        """
        ignored = [
            k
            for k in ("loss", "metrics", "weighted_metrics", "loss_weights", "jit_compile")
            if kwargs.get(k) not in (None, False, "auto")
        ]
        if ignored:
            raise ValueError(
                f"ExactTrainer.compile: {', '.join(ignored)} cannot be set; the trainer "
                "has its own loss and metrics, and XLA cannot compile its all-reduces"
            )
        kwargs["jit_compile"] = False
        super().compile(optimizer=optimizer, **kwargs)
        self._steps = None

    def call(self, images, training=False):
        return self.net(images, training=training)

    @property
    def metrics(self):
        return [self.loss_tracker, self.accuracy_metric]

    def _update_metrics(self, labels, probabilities, losses, weights) -> None:
        self.loss_tracker.update_state(losses, sample_weight=weights)
        self.accuracy_metric.update_state(labels, probabilities, sample_weight=weights)

    def train_step(self, data):
        """One replica's training step (Keras' hook); returns the metrics' results as logs."""
        self._counted_train_step(data)
        return self.get_metrics_result()

    def _counted_train_step(self, data, global_count=None):
        """`train_step` that returns the step's global example count, for `last_step`."""
        global_count, outputs = self._descend(data, global_count)
        self._update_metrics(*outputs)
        return global_count

    def train_step_sums(self, data):
        """One replica's step that returns its metric sums instead of updating the metrics.

        For parameter-server training, where metrics on the servers would lose
        updates (docs/multi-worker.md, "Parameter servers").

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

    def _descend(self, data, global_count=None):
        """Applies one replica's gradients; returns the global count and the metrics' inputs."""
        images, labels, weights, count = self._padded(data)
        if global_count is None:
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
        gradients = skip_together(self.optimizer, tape.gradient(scaled, variables))
        self.optimizer.apply(gradients, variables)  # all-reduces (sums) across replicas
        return global_count, (labels, probabilities, losses, weights)

    def _padded(self, data):
        """`pad_empty_slice` of the batch, its images augmented here if it carries transforms."""
        if len(data) == 2:
            return pad_empty_slice(*data)
        if self.augment is None:
            raise ValueError(
                "ExactTrainer: the batches carry transforms (InputData(augment_in='model')) "
                "but the trainer has no policy to apply them: pass augment=the policy"
            )
        images, labels, transforms, weights, count = pad_empty_slice(*data)  # never 0 for XLA
        return apply_packed(images, self.augment, transforms), labels, weights, count

    @property
    def times_input_wait(self) -> bool:
        """Whether steps compiled now time their input wait: not under op determinism, which
        refuses `tf.timestamp` (`_compiled_steps`); there a watched dataset gives the wait."""
        return not op_determinism_enabled()

    def train_steps(self, iterator, steps: int | None = None) -> dict:
        """Trains on up to `steps` distributed batches from `iterator`, in one call.

        Args:
            iterator: an iterator over a distributed dataset of this strategy.
            steps: the most steps to run. Defaults to None (`steps_per_execution`).

        Returns:
            The metrics' results (tensors), as Keras logs.

        Raises:
            StopIteration: when `iterator` was exhausted before the first step.
        """
        if self._steps is None:
            build_optimizer(self)
            self._timed = self.times_input_wait  # as the steps are traced
            self._steps = _compiled_steps(
                self.distribute_strategy,
                self._counted_train_step,
                self.get_metrics_result,
                self._timed,
            )
        done, examples, waited, logs = self._steps(iterator, steps or self.steps_per_execution)
        if int(done) == 0:  # a host counter: no wait for the replicas' devices
            raise StopIteration
        self.last_step = StepStats(examples, waited if self._timed else None)
        return logs

    def test_step(self, data):
        # Evaluation never augments: transforms drawn for training are left unused.
        images, labels, weights, _ = pad_empty_slice(*data[:2])
        probabilities = self.net(images, training=False)
        losses = self.per_example_loss(labels, probabilities)  # no class weights
        self._update_metrics(labels, probabilities, losses, weights)
        return self.get_metrics_result()


def metric_logs(trainer: keras.Model, prefix: str = "") -> dict[str, float]:
    """The trainer's metrics as Keras logs, `{prefix + name: value}` (`"val_"` for validation)."""
    return {prefix + m.name: float(m.result()) for m in trainer.metrics}


def evaluate(trainer: keras.Model, val_ds, cbs, test_step) -> dict[str, float]:
    """One pass of `test_step` over `val_ds` between the callbacks' test hooks: its `val_` logs."""
    trainer.reset_metrics()
    cbs.on_test_begin()
    for batch in val_ds:
        test_step(batch)
    logs = metric_logs(trainer, "val_")
    cbs.on_test_end(logs)
    return logs


def _distributed(strategy: tf.distribute.Strategy, dataset):
    """`dataset` split over the replicas, unless it is already (or None)."""
    done = dataset is None or isinstance(dataset, tf.distribute.DistributedDataset)
    return dataset if done else strategy.experimental_distribute_dataset(dataset)


def callback_list(trainer, callbacks, verbose: int, epochs: int, steps_per_epoch: int):
    """`fit`'s start, for the loops that stand in for it: its `CallbackList`, and the `History`."""
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
    return cbs, history


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

    Each call runs the trainer's compiled steps (`ExactTrainer.train_steps`),
    `steps_per_execution` of them, never past an epoch's end. Validation runs
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
    cbs, history = callback_list(trainer, callbacks, verbose, epochs, steps_per_epoch)
    iterator = iter(train_dist)
    cbs.on_train_begin()
    logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        trainer.reset_metrics()
        cbs.on_epoch_begin(epoch)
        for step in range(0, steps_per_epoch, trainer.steps_per_execution):
            steps = min(trainer.steps_per_execution, steps_per_epoch - step)  # not past the epoch
            cbs.on_train_batch_begin(step)
            batch_logs = trainer.train_steps(iterator, steps)
            # Callbacks read logs on the host: only a progress bar needs them every call.
            cbs.on_train_batch_end(step + steps - 1, batch_logs if verbose == 1 else None)
        logs = metric_logs(trainer)
        if val_ds is not None:  # one distributed pass
            logs.update(evaluate(trainer, val_dist, cbs, test_step))
        cbs.on_epoch_end(epoch, logs)
        if trainer.stop_training:
            break
    cbs.on_train_end(logs)
    return history
