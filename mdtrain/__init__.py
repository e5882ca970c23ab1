"""mdtrain: multi-GPU image-classification training with TensorFlow 2 and Keras 3.

`import mdtrain` is light and changes nothing: TensorFlow loads the first
time a name that needs it is used, and no TensorFlow or Keras setting changes
until you call `configure_devices` or `train`.

Example:

```python
import mdtrain

mdtrain.configure_devices("cpu:2")  # first, before any TensorFlow work
result = mdtrain.train(mdtrain.TrainConfig(strategy="cpu:2", epochs=3))
print(result.history[-1]["val_accuracy"])
```

The same run from its pieces, each usable on its own in your Keras code:

```python
strategy = mdtrain.make_strategy("cpu:2")
splits = mdtrain.load_splits(mdtrain.dataset_dir())
data = mdtrain.InputData(splits, image_size=32, global_batch_size=64)
with strategy.scope():
    trainer = mdtrain.ExactTrainer(mdtrain.build_model("small-cnn", 5, 32))
    trainer.compile(optimizer="adam")
trainer.fit(data.train_epochs(0, 3), epochs=3, steps_per_epoch=data.steps_per_epoch,
            validation_data=data.val_ds)
```

Documented submodules: `mdtrain.monitor`, `mdtrain.launcher`, `mdtrain.lite0`;
every other module is internal, and the course material is the package
`mdtrain_course` (README.md, "The library").
"""

from __future__ import annotations

import importlib

from mdtrain.versions import check_versions as check_versions  # re-exported

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first use (PEP 562), so
# that `import mdtrain` and `mdtrain --version` load no TensorFlow.
_EXPORTS = {
    # data: folders of images, checked and split
    "dataset_dir": "mdtrain.sources",
    "make_synthetic_dataset": "mdtrain.sources",
    "load_splits": "mdtrain.data",
    "check_dataset": "mdtrain.data",
    # the input pipeline and augmentation
    "InputData": "mdtrain.pipeline",
    "load_image": "mdtrain.images",
    "AugmentPolicy": "mdtrain.augment",
    "augment_batch": "mdtrain.augment",
    "FusedAugmentation": "mdtrain.augment_layer",
    # devices and strategies
    "configure_devices": "mdtrain.distribute",
    "make_strategy": "mdtrain.distribute",
    "BatchGeometry": "mdtrain.distribute",
    # models
    "build_model": "mdtrain.models",
    "unfreeze_top": "mdtrain.models",
    "ExactBatchNormalization": "mdtrain.norm",
    # exact training
    "ExactTrainer": "mdtrain.loop",
    "custom_fit": "mdtrain.loop",
    "replica_loss": "mdtrain.loop",
    "TrainConfig": "mdtrain.config",
    "TrainResult": "mdtrain.training",
    "train": "mdtrain.training",
    # monitoring, prediction, launching
    "make_monitor": "mdtrain.monitor",
    "predict": "mdtrain.prediction",
    "launch": "mdtrain.launcher",
    "tf_config": "mdtrain.launcher",
    # errors
    "UsageError": "mdtrain.errors",
}

__all__ = sorted([*_EXPORTS, "check_versions", "__version__"])


#: The documented submodules, importable as attributes too (`mdtrain.lite0.imagenet_classifier`).
_SUBMODULES = ("monitor", "launcher", "lite0")


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"mdtrain.{name}")  # the import sets the attribute
    raise AttributeError(f"module 'mdtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
