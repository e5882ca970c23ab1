"""mdtrain: multi-GPU image-classification training with TensorFlow 2 and Keras 3.

Importing the package is light (no TensorFlow); `mdtrain --version` prints
`__version__`, the one place the version lives (`pyproject.toml` reads it).
"""

__version__ = "0.1.0"
