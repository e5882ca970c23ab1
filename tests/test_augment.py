"""The fused augmentation against ImageDataGenerator: same images, same distribution."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from mdtrain.augment import (
    AugmentPolicy,
    apply_packed,
    augment_batch,
    pack_transforms,
    sample_transforms,
)
from mdtrain_course.image_data_generator import image_data_generator_kwargs

POLICY = AugmentPolicy()


def _idg():
    return tf.keras.preprocessing.image.ImageDataGenerator(**image_data_generator_kwargs(POLICY))


def _smooth_images(n: int, size: int) -> np.ndarray:
    """Gradients plus a blob: smooth enough that interpolation differences stay tiny."""
    y, x = np.mgrid[0:size, 0:size] / size
    rng = np.random.default_rng(0)
    images = []
    for _ in range(n):
        a, b, c = rng.uniform(0.2, 1.0, 3)
        blob = np.exp(-((x - a / 2) ** 2 + (y - b / 2) ** 2) * 20)
        images.append(np.stack([255 * x * a, 255 * y * b, 255 * blob * c], -1))
    return np.asarray(images, np.float32)


@pytest.mark.parametrize("kernel", ["xla", "op"])
def test_fused_transform_equals_idg_apply_transform(kernel):
    images = _smooth_images(6, 40)
    params = sample_transforms(6, POLICY, tf.constant([3, 4]))
    params["flip"] = tf.constant([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    ours = apply_packed(tf.constant(images), POLICY, pack_transforms(params, 40, 40), kernel)
    idg = _idg()
    for i in range(6):
        expected = idg.apply_transform(
            images[i],
            {
                "theta": float(np.degrees(params["theta"][i])),
                "zx": float(params["zx"][i]),
                "zy": float(params["zy"][i]),
                "flip_horizontal": bool(params["flip"][i]),
            },
        )
        np.testing.assert_allclose(ours[i].numpy(), expected, atol=1e-2)


def test_sampled_transforms_follow_idg_distribution():
    n = 2000
    ours = {k: v.numpy() for k, v in sample_transforms(n, POLICY, tf.constant([0, 7])).items()}
    idg = _idg()
    theirs = [idg.get_random_transform((64, 64, 3), seed=1000 + i) for i in range(n)]
    pairs = {
        "theta": (np.degrees(ours["theta"]), [t["theta"] for t in theirs]),
        "zx": (ours["zx"], [t["zx"] for t in theirs]),
        "zy": (ours["zy"], [t["zy"] for t in theirs]),
    }
    for name, (a, b) in pairs.items():
        assert stats.ks_2samp(a, b).pvalue > 1e-3, name
    assert abs(np.degrees(ours["theta"])).max() <= POLICY.rotation_degrees
    flips_ours = ours["flip"].mean()
    flips_theirs = np.mean([t["flip_horizontal"] for t in theirs])
    assert abs(flips_ours - 0.5) < 0.05 and abs(flips_theirs - 0.5) < 0.05


def test_stateless_seeds_reproduce_and_differ():
    images = tf.constant(_smooth_images(4, 32).astype(np.uint8))
    a = augment_batch(images, POLICY, tf.constant([1, 2]))
    b = augment_batch(images, POLICY, tf.constant([1, 2]))
    c = augment_batch(images, POLICY, tf.constant([1, 3]))
    assert a.dtype == tf.uint8 and a.shape == images.shape
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())


def test_xla_kernel_matches_tensorflow_op_on_uint8():
    images = tf.constant(np.random.default_rng(1).integers(0, 256, (3, 24, 24, 3), np.uint8))
    packed = pack_transforms(sample_transforms(3, POLICY, tf.constant([5, 6])), 24, 24)
    fast = apply_packed(images, POLICY, packed, kernel="xla").numpy().astype(int)
    reference = apply_packed(tf.cast(images, tf.float32), POLICY, packed, kernel="op").numpy()
    assert np.abs(fast - reference).max() <= 0.5 + 1e-3  # rounding only


def test_rotation_and_zoom_turn_about_the_centre_of_an_image_that_is_not_square():
    images = np.zeros([8, 31, 63, 3], np.float32)
    images[:, 14:17, 30:33] = 255.0  # a dot at the centre, row 15, column 31
    policy = AugmentPolicy(horizontal_flip=False, rotation_degrees=30, zoom=0.3)
    out = augment_batch(tf.constant(images), policy, tf.constant([3, 4])).numpy()[..., 0]
    rows, cols = np.mgrid[0:31, 0:63]
    for image in out:  # wherever it is turned or scaled to, the dot stays where it was
        mass = image.sum()
        assert abs((image * rows).sum() / mass - 15) < 0.5
        assert abs((image * cols).sum() / mass - 31) < 0.5


def test_images_of_unknown_height_and_width_are_augmented():
    images = tf.constant(np.random.default_rng(2).integers(0, 256, (2, 20, 28, 3), np.uint8))
    seed = tf.constant([7, 8])
    unknown = tf.TensorSpec([None, None, None, 3], tf.uint8)
    traced = tf.function(lambda x: augment_batch(x, POLICY, seed), input_signature=[unknown])
    np.testing.assert_array_equal(traced(images), augment_batch(images, POLICY, seed))


def test_policy_without_transforms_is_identity():
    images = tf.zeros([2, 8, 8, 3], tf.uint8)
    none = AugmentPolicy(horizontal_flip=False, rotation_degrees=0, zoom=0)
    assert augment_batch(images, none, tf.constant([0, 0])) is images


COLOUR = AugmentPolicy(brightness=(0.6, 1.4), contrast=0.3)


def test_colour_draws_follow_the_policy_and_leave_geometry_unchanged():
    seed = tf.constant([2, 9])
    plain = sample_transforms(2000, POLICY, seed)
    colour = {k: v.numpy() for k, v in sample_transforms(2000, COLOUR, seed).items()}
    for key in ("theta", "zx", "zy", "flip"):  # adding colour does not move a single pixel
        np.testing.assert_array_equal(plain[key].numpy(), colour[key])
    assert 0.6 <= colour["brightness"].min() < 0.65 and 1.35 < colour["brightness"].max() <= 1.4
    assert 0.7 <= colour["contrast"].min() < 0.75 and 1.25 < colour["contrast"].max() <= 1.3
    assert set(plain["brightness"].numpy()) == {1.0} and set(plain["contrast"].numpy()) == {1.0}


def test_brightness_is_drawn_with_image_data_generator_meaning():
    n = 2000
    ours = sample_transforms(n, COLOUR, tf.constant([4, 4]))["brightness"].numpy()
    idg = tf.keras.preprocessing.image.ImageDataGenerator(**image_data_generator_kwargs(COLOUR))
    theirs = [idg.get_random_transform((8, 8, 3), seed=i)["brightness"] for i in range(n)]
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


@pytest.mark.parametrize("kernel", ["xla", "op"])
def test_colour_is_a_gain_and_offset_in_the_same_pass(kernel):
    images = _smooth_images(4, 32)
    params = sample_transforms(4, COLOUR, tf.constant([1, 1]))
    packed = pack_transforms(params, 32, 32)
    geometry_only = apply_packed(tf.constant(images), POLICY, packed, kernel).numpy()
    b, c = params["brightness"].numpy(), params["contrast"].numpy()
    mean = images.mean(axis=(1, 2))  # per image and channel, of the source
    expected = b[:, None, None, None] * (
        (geometry_only - mean[:, None, None, :]) * c[:, None, None, None] + mean[:, None, None, :]
    )
    ours = augment_batch(tf.constant(images), COLOUR, tf.constant([1, 1]), kernel).numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-2)


def test_uint8_colour_saturates_instead_of_wrapping():
    white = tf.fill([2, 16, 16, 3], tf.constant(250, tf.uint8))
    bright = AugmentPolicy(horizontal_flip=False, rotation_degrees=0, zoom=0, brightness=(1.5, 1.5))
    out = augment_batch(white, bright, tf.constant([0, 1])).numpy()
    assert out.dtype == np.uint8 and (out == 255).all()


@pytest.mark.parametrize("kernel", ["xla", "op"])
def test_nearest_sampling_equals_idg_interpolation_order_0(kernel):
    policy = AugmentPolicy(interpolation="nearest")
    images = np.random.default_rng(2).integers(0, 256, (3, 24, 24, 3)).astype(np.float32)
    params = sample_transforms(3, policy, tf.constant([8, 1]))
    ours = apply_packed(tf.constant(images), policy, pack_transforms(params, 24, 24), kernel)
    ours = ours.numpy()
    idg = tf.keras.preprocessing.image.ImageDataGenerator(**image_data_generator_kwargs(policy))
    for i in range(3):
        expected = idg.apply_transform(images[i], {
            "theta": float(np.degrees(params["theta"][i])), "zx": float(params["zx"][i]),
            "zy": float(params["zy"][i]), "flip_horizontal": bool(params["flip"][i]),
        })  # fmt: skip
        # Only a pixel whose source point falls on a rounding tie may pick the other neighbour.
        assert (np.abs(ours[i] - expected).max(axis=-1) > 0).mean() < 0.01
        assert set(np.unique(ours[i])) <= set(np.unique(images[i]))  # no blending


@pytest.mark.parametrize(
    "kwargs", [dict(interpolation="bicubic"), dict(brightness=(1.2, 0.8)), dict(contrast=1.0)]
)
def test_bad_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        AugmentPolicy(**kwargs)
