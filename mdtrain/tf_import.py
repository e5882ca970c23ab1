"""TensorFlow's C++ chatter on the stderr file descriptor, filtered where mdtrain knows it.

While its libraries load, TensorFlow (2.19 to at least 2.21) writes absl's
"All log messages before absl::InitializeLog() ..." and an INFO line "oneDNN
custom operations are on" straight to the stderr file descriptor, before it
reads `TF_CPP_MIN_LOG_LEVEL` (tensorflow/tensorflow#100442). A command whose
promise is "one line on standard error" for bad input cannot let them through;
nor libjpeg's own messages about a bad file, beside the error mdtrain reports.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_ABSL_NOTICE = r"WARNING: All log messages before absl::InitializeLog"
# INFO lines ("I0000 00:00:1795… 123 port.cc:153] …"), absl's pre-init notice, and
# the second line of the CPU-feature notice.
_STARTUP_NOISE = re.compile(
    rf"^(I\d{{4}} [\d:.]+ +\d+ \S+:\d+\]|{_ABSL_NOTICE}|To enable the following instructions:)"
)
# libjpeg's own messages about a bad file, straight or through absl (the first one
# logged brings absl's pre-init notice with it), beside the error TensorFlow raises.
LIBJPEG_NOISE = re.compile(
    r"^(Improper call to JPEG library in state \d+$|"
    r"E\d{4} [\d:.]+ +\d+ jpeg_mem\.cc:\d+\] |"
    rf"{_ABSL_NOTICE})"
)


@contextlib.contextmanager
def stderr_without(noise: re.Pattern) -> Iterator[None]:
    """Captures file descriptor 2 (C++ writes past `sys.stderr`), then passes on all but `noise`."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines()
            kept = [line for line in lines if line.strip() and not noise.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def import_tensorflow() -> None:
    """Imports TensorFlow, dropping its start-up INFO lines when `TF_CPP_MIN_LOG_LEVEL` >= 1."""
    if "tensorflow" in sys.modules:
        return
    try:
        quiet = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")) >= 1
    except ValueError:
        quiet = False
    with stderr_without(_STARTUP_NOISE) if quiet else contextlib.nullcontext():
        import tensorflow  # noqa: F401
