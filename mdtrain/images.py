"""Reading one image file: what format its bytes hold, and decoding it.

Checking a dataset and training on it use the same decoder, so a file that
``mdtrain data check`` passes is a file the training pipeline can read. The
format is decided by the file's content, never by its extension.
"""

from __future__ import annotations

import os

#: Extensions that mark a file as an image candidate; anything else is ignored.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")

_EXTENSION_FORMAT = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".gif": "gif", ".bmp": "bmp"}
_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def is_image_name(path: str | os.PathLike) -> bool:
    """Whether a file name has one of `IMAGE_EXTENSIONS` (case-insensitive)."""
    return os.path.splitext(str(path))[1].lower() in IMAGE_EXTENSIONS


def extension_format(path: str | os.PathLike) -> str | None:
    """The format a file's extension claims (`"jpeg"`, `"png"`, ...), or None."""
    return _EXTENSION_FORMAT.get(os.path.splitext(str(path))[1].lower())


def sniff_format(path: str | os.PathLike) -> str | None:
    """The image format a file's first bytes announce, or None if none matches.

    Args:
        path: file to look at. Only its first 8 bytes are read.

    Returns:
        One of `"jpeg"`, `"png"`, `"gif"`, `"bmp"`, or None for content that is
        not an image TensorFlow can decode (empty files included).
    """
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


def decode_image(contents, channels: int = 3):
    """Decodes JPEG, PNG, GIF or BMP bytes to a `uint8` tensor of shape (H, W, channels).

    The format is detected from the bytes. Animated GIFs give their first
    frame; grey images are expanded to `channels`.

    Args:
        contents: scalar string tensor holding the file's bytes.
        channels: number of colour channels of the result. Defaults to 3.

    Returns:
        A `uint8` tensor of rank 3 with static channel dimension.
    """
    import tensorflow as tf

    image = tf.io.decode_image(contents, channels=channels, expand_animations=False)
    image.set_shape([None, None, channels])
    return image
