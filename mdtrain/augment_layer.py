"""mdtrain's fused augmentation as a Keras layer, for your own model or tf.data pipeline.

Mapped over batches in tf.data, the input pipeline's CPU threads do the work; as the
model's first layer, the accelerator does, each replica drawing its own transforms.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from mdtrain.augment import AugmentPolicy, augment_batch


@keras.saving.register_keras_serializable(package="mdtrain")
class FusedAugmentation(keras.layers.Layer):
    """Random flip, rotation, zoom, brightness and contrast in one pass.

    Like Keras' random layers, it augments when called with `training=True`
    (the default when called directly, and inside `fit`) and passes images
    through at inference, so a model that holds it can be served as it is.

    Args:
        policy: the `AugmentPolicy` (ImageDataGenerator's meaning of each
            transform). Defaults to None (`AugmentPolicy()`: flip, rotation
            ±20°, zoom ±15%).
        seed: a new layer with the same seed draws the same transforms,
            call after call, in a model or a sequential `map` (parallel `map`
            calls share the generator in the order they run: for transforms
            that depend only on a batch's position, use `mdtrain.augment_batch`
            with a seed per batch). Defaults to None (random).
        **kwargs: passed to `keras.layers.Layer`.

    Input: a batch `(batch, height, width, channels)` of any dtype; integer
    images are rounded and saturate, float images are not clipped.
    Output: the same shape and dtype.

    Example:

    >>> layer = FusedAugmentation(AugmentPolicy(brightness=(0.8, 1.2)), seed=0)
    >>> layer(tf.zeros([4, 32, 32, 3], tf.uint8)).shape
    TensorShape([4, 32, 32, 3])
    """

    def __init__(self, policy: AugmentPolicy | None = None, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.policy = policy if policy is not None else AugmentPolicy()
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def call(self, images: tf.Tensor, training: bool = True) -> tf.Tensor:
        """The batch augmented with freshly drawn transforms, or as it is when not training."""
        if not training:
            return images
        seed = keras.random.randint((2,), 0, 2**31 - 1, dtype="int32", seed=self.generator)
        # Which generator state each replica reads depends on how the strategy holds the
        # layer's variable; folding in the replica's index gives every replica transforms
        # of its own whatever it reads.
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            replica = tf.cast(ctx.replica_id_in_sync_group, tf.int32)
            seed = tf.random.experimental.stateless_fold_in(seed, replica)
        return augment_batch(images, self.policy, seed)

    def compute_output_spec(self, images, training=True) -> keras.KerasTensor:
        """Same shape and dtype as the input (a uint8 batch stays uint8)."""
        return keras.KerasTensor(images.shape, dtype=images.dtype)

    def get_config(self) -> dict:
        """The layer's arguments, the policy as a plain dict (JSON for `.keras` files)."""
        policy = dataclasses.asdict(self.policy)
        return {**super().get_config(), "policy": policy, "seed": self.seed}

    @classmethod
    def from_config(cls, config: dict) -> FusedAugmentation:
        """The layer `get_config` describes; the caller's dict is left as it was."""
        config = dict(config)
        config["policy"] = AugmentPolicy(**config["policy"])  # brightness: a tuple again
        return super().from_config(config)
