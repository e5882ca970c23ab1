"""Choosing how the monitor shows itself: widget, text, or nothing."""

from __future__ import annotations

import importlib.util
import os
import sys

from mdtrain.choices import MONITOR_DISPLAYS


def in_notebook_kernel() -> bool:
    """Whether this code runs inside an IPython kernel (Jupyter, Colab, Kaggle).

    Returns:
        ``True`` in a kernel; ``False`` in a terminal, a script or plain IPython.
    """
    if "IPython" not in sys.modules:  # never import IPython just to ask
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def resolve_display(display: str = "auto") -> str:
    """Turns ``display`` into ``"widget"``, ``"text"`` or ``"none"``.

    ``"auto"`` picks the widget dashboard inside a notebook kernel that has
    ipywidgets, unless ``MDTRAIN_SMOKE=1`` (CI logs want text); text otherwise.

    Args:
        display: One of ``"auto"``, ``"widget"``, ``"text"``, ``"none"``.
            Defaults to ``"auto"``.

    Returns:
        The concrete choice.

    Raises:
        ValueError: For any other value.

    Example:

    >>> resolve_display("text")
    'text'
    """
    if display not in MONITOR_DISPLAYS:
        raise ValueError(f"display must be one of {', '.join(MONITOR_DISPLAYS)}; got {display!r}")
    if display != "auto":
        return display
    smoke = os.environ.get("MDTRAIN_SMOKE", "") not in ("", "0")
    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    return "widget" if in_notebook_kernel() and has_widgets and not smoke else "text"
