"""The TensorFlow and Keras releases mdtrain is tested with, read without importing them.

CI tests both ends of it (docs/development.md, "Tests and CI"); `pyproject.toml`'s
`cpu` and `gpu` extras state the same range.
"""

from __future__ import annotations

from importlib import metadata

#: Oldest and newest minor releases tested, inclusive.
TESTED = {"keras": ((3, 13), (3, 15)), "tensorflow": ((2, 20), (2, 21))}

# TensorFlow installs under several distribution names; the first one found counts.
_DISTRIBUTIONS = {"keras": ("keras",), "tensorflow": ("tensorflow", "tensorflow-cpu")}


def _installed(name: str) -> str | None:
    for distribution in _DISTRIBUTIONS[name]:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(char for char in minor if char.isdigit()) or 0)


def check_versions() -> bool:
    """Prints one line when this environment's TensorFlow or Keras is outside the tested range.

    Every notebook's setup cell calls it. mdtrain usually works outside the
    range; the line says where it has not been checked.

    Returns:
        True when both are inside the range (nothing printed).

    Example:

    >>> import mdtrain
    >>> mdtrain.check_versions()  # doctest: +SKIP
    True
    """
    untested = []
    for name, (oldest, newest) in TESTED.items():
        version = _installed(name)
        if version and not oldest <= _minor(version) <= newest:
            label = "Keras" if name == "keras" else "TensorFlow"
            tested = "{}.{} to {}.{}".format(*oldest, *newest)
            untested.append(f"{label} {version} (tested: {tested})")
    if untested:
        print(f"Note: mdtrain is not tested with {' and '.join(untested)}.")
    return not untested
