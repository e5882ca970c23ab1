"""Notebook 02's exercise check: a right pipeline passes, each structural problem is named."""

import numpy as np
import pytest
import tensorflow as tf

from mdtrain.exercises import ExerciseError, nb02

AUTOTUNE = tf.data.AUTOTUNE


@pytest.fixture(scope="module")
def names_ds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jpegs")
    paths = []
    for index in range(12):
        image = np.full((24, 24, 3), index * 20, np.uint8)
        path = folder / f"{index}.jpg"
        path.write_bytes(tf.io.encode_jpeg(image).numpy())
        paths.append(str(path))
    return tf.data.Dataset.from_tensor_slices((paths, [index % 3 for index in range(12)]))


def decode(path, label):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    return tf.cast(tf.image.resize(image, [16, 16]), tf.uint8), label


def test_the_worked_pipeline_passes(names_ds, capsys):
    fast = names_ds.map(decode, num_parallel_calls=AUTOTUNE).cache().batch(4).prefetch(AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    fast = fast.with_options(options)
    assert nb02.check_input_pipeline(fast, global_batch_size=4, image_size=16, strict=True)
    assert "it works" in capsys.readouterr().out


def test_a_serial_map_and_no_prefetch_are_named(names_ds, capsys):
    slow = names_ds.map(decode).batch(4)
    assert nb02.check_input_pipeline(slow, global_batch_size=4) is False
    out = capsys.readouterr().out
    assert "num_parallel_calls=AUTOTUNE" in out and "there is no `prefetch`" in out
    with pytest.raises(ExerciseError):
        nb02.check_input_pipeline(slow, global_batch_size=4, strict=True)


def test_a_wrong_batch_an_early_prefetch_and_float_images_are_named(names_ds, capsys):
    wrong = (
        names_ds.map(decode, num_parallel_calls=AUTOTUNE)
        .prefetch(AUTOTUNE)
        .batch(3)
        .map(lambda x, y: (tf.cast(x, tf.float32), y))
    )
    assert nb02.check_input_pipeline(wrong, global_batch_size=4, image_size=16) is False
    out = capsys.readouterr().out
    assert "`prefetch` comes before" in out and "put it last" in out
    assert "holds 3 images, not 4" in out and "keep them uint8" in out


def test_the_placeholder_and_a_non_dataset_are_named(capsys):
    assert nb02.check_input_pipeline(None, global_batch_size=4) is False
    assert "still the placeholder" in capsys.readouterr().out
    assert nb02.check_input_pipeline([1, 2], global_batch_size=4) is False
    assert "not a tf.data.Dataset" in capsys.readouterr().out
