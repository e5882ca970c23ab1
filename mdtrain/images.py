"""Reading one image file: what format its bytes hold, and decoding it.

Checking, training and predicting share one decoder (`load_image`), which goes
by a file's content, never its extension, so a file that ``mdtrain data check``
passes is one training can read. Nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

import os

#: The format each image extension (without its dot) claims; files with another are ignored.
_EXTENSION_FORMAT = dict(jpg="jpeg", jpeg="jpeg", png="png", gif="gif", bmp="bmp", webp="webp")
_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def extension_format(path: str | os.PathLike) -> str | None:
    """The format a file's extension claims (`"jpeg"`, `"png"`, ...), or None."""
    return _EXTENSION_FORMAT.get(os.path.splitext(str(path))[1].lower()[1:])


def image_files(folder: str | os.PathLike) -> list[str]:
    """The image files under `folder`, recursively, sorted; hidden files and folders left out."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files += [
            os.path.join(dirpath, f)
            for f in sorted(filenames)
            if not f.startswith(".") and extension_format(f) is not None
        ]
    return files


def sniff_format(path: str | os.PathLike) -> str | None:
    """The image format (`"jpeg"`, `"png"`, ...) a file's first 12 bytes announce, or None."""
    with open(path, "rb") as file:
        head = file.read(12)
    if head[:4] == b"RIFF" and head[8:] == b"WEBP":
        return "webp"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def decode_image(contents):
    """JPEG, PNG, GIF (first frame), BMP or WebP bytes, by content, to a (H, W, 3) uint8 tensor."""
    import tensorflow as tf

    image = tf.io.decode_image(contents, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def load_image(path, image_size: int):
    """Reads, decodes and resizes one image file to a (size, size, 3) uint8 tensor.

    The aspect ratio is not kept (as in `image_dataset_from_directory` and
    `flow_from_directory`); bilinear resizing. JPEGs at least twice the target
    size are decoded at reduced scale first (`decode_jpeg(ratio=...)`).

    Args:
        path: scalar string tensor (or str, or bytes) naming the file.
        image_size: side of the square result.

    Returns:
        A `uint8` tensor of shape (image_size, image_size, 3).
    """
    import tensorflow as tf

    contents = tf.io.read_file(path)
    is_jpeg = tf.equal(tf.strings.substr(contents, 0, 3), b"\xff\xd8\xff")
    image = tf.cond(
        is_jpeg, lambda: _decode_reduced(contents, image_size), lambda: decode_image(contents)
    )
    image.set_shape([None, None, 3])
    image = tf.image.resize(image, [image_size, image_size])
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def _decode_reduced(contents, image_size: int):
    """Decodes a JPEG at 1/2, 1/4 or 1/8 scale when it stays at least `image_size`."""
    # libjpeg scales in the inverse DCT: a 4x-too-large photo decodes about as fast as a small
    # one, and the bilinear resize that follows sees fewer pixels.
    import tensorflow as tf

    shape = tf.image.extract_jpeg_shape(contents)
    smallest = tf.minimum(shape[0], shape[1])
    # Index of the largest ratio in (1, 2, 4, 8) that keeps the short side >= image_size.
    index = tf.reduce_sum(tf.cast(smallest >= image_size * tf.constant([2, 4, 8]), tf.int32))
    branches = [lambda r=r: tf.io.decode_jpeg(contents, channels=3, ratio=r) for r in (1, 2, 4, 8)]
    return tf.switch_case(index, branches)
