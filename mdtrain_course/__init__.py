"""The notebook series' own material, beside the `mdtrain` library in the same wheel.

- `mdtrain_course.plots`: the notebooks' figures (sample grids, class counts
  per replica, learning curves, images/s against replicas).
- `mdtrain_course.exercises`: the checks of the notebooks' exercises, one
  module per notebook (`mdtrain_course.exercises.nb01`, ...).
- `mdtrain_course.timing`: `time_epochs`, the pipelines' images/s over whole
  epochs, repeats interleaved (notebooks 01 and 02, `benchmarks/pipeline.py`).
- `mdtrain_course.image_data_generator`: mdtrain's `AugmentPolicy` as
  `ImageDataGenerator`'s arguments, for the lessons' like-with-like comparison.
- `mdtrain_course.lite0`: `offline_base`, EfficientNet-Lite0 in place of a
  Keras application that cannot download its ImageNet weights (notebook 06).

The library (`import mdtrain`) never imports this package; it imports the
library. It is kept apart so that the library stays the library: what a
training run, another project or the command line needs, and nothing the
lessons alone use.
"""
