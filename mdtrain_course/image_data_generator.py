"""`ImageDataGenerator`, the deprecated generator notebooks 01 and 02 compare against.

The lessons give it the same augmentation as mdtrain's pipeline, so that a
comparison of speed is one of like with like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mdtrain.augment imports TensorFlow; a script's --help should not wait for it
    from mdtrain.augment import AugmentPolicy


def image_data_generator_kwargs(policy: AugmentPolicy) -> dict:
    """`policy` as keyword arguments of `ImageDataGenerator`.

    `ImageDataGenerator` has no contrast option: a policy with contrast gives
    the generator everything else.

    Args:
        policy: an `mdtrain.AugmentPolicy`.

    Returns:
        A dict for `keras.preprocessing.image.ImageDataGenerator(**kwargs)`.

    Example:

    >>> from mdtrain import AugmentPolicy
    >>> image_data_generator_kwargs(AugmentPolicy())["rotation_range"]
    20.0
    """
    kwargs = dict(
        horizontal_flip=policy.horizontal_flip,
        rotation_range=policy.rotation_degrees,
        zoom_range=policy.zoom,
        fill_mode=policy.fill_mode,
        interpolation_order=1 if policy.interpolation == "bilinear" else 0,
    )
    if policy.brightness is not None:
        kwargs["brightness_range"] = policy.brightness
    return kwargs
