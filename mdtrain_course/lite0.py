"""EfficientNet-Lite0 in the place of a Keras application that could not download its weights.

Notebook 06's plain-Keras transfer learning builds `EfficientNetV2B0` with
ImageNet weights; offline (Kaggle's code competitions) the download fails,
and `offline_base` hands the lesson the library's offline Lite0 base instead.
"""

from __future__ import annotations

from mdtrain import lite0


def _is_failed_download(error: BaseException) -> bool:
    # Keras' get_file turns a URLError into Exception("URL fetch failure on ...") raised
    # from the URLError's handler; a socket error (OSError) may also come through as is.
    while error is not None:
        if isinstance(error, OSError) or str(error).startswith("URL fetch failure"):
            return True
        error = error.__cause__ or error.__context__
    return False


def offline_base(error: Exception, image_size: int | None = 224, name: str = "efficientnet-lite0"):
    """EfficientNet-Lite0's ImageNet base, in place of a Keras application that failed to download.

    A `keras.applications` model with `weights="imagenet"` downloads its
    weights on first use, which raises without network. Pass that error here:
    for a failed download this prints one line saying so and returns
    EfficientNet-Lite0's ImageNet feature extractor, which, like
    `EfficientNetV2B0(include_top=False, weights="imagenet", pooling="avg")`,
    takes 0–255 images and gives 1280 pooled features. Any other error (a
    wrong argument, say) is raised again unchanged.

    Args:
        error: what the Keras application raised.
        image_size: side of the square input. Defaults to 224.
        name: the base's name. Defaults to `"efficientnet-lite0"`.

    Returns:
        `mdtrain.lite0.imagenet_classifier(image_size).get_layer("base")`,
        named `name`: a functional model, trainable, not compiled.

    Raises:
        Exception: `error` itself, when it is not a failed download.
        UsageError: if the Lite0 weights package is not installed either.

    Example:

    >>> try:  # doctest: +SKIP
    ...     base = keras.applications.EfficientNetV2B0(include_top=False, weights="imagenet")
    ... except Exception as error:
    ...     base = offline_base(error)
    """
    if not _is_failed_download(error):
        raise error
    lite0.lite0_torch_file()  # without the package either: say what to install, before any work
    print(
        "The ImageNet weights cannot be downloaded here (no network): EfficientNet-Lite0, "
        f"whose ImageNet weights come with the package {lite0.WEIGHTS_PACKAGE.replace('_', '-')}, "
        "takes the base's place"
    )
    base = lite0.imagenet_classifier(image_size).get_layer("base")
    base.name = name
    return base
