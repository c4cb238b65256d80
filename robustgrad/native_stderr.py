"""TensorFlow's native start-up lines, filtered out of file descriptor 2.

In TF 2.21 a few lines are written straight to file descriptor 2 by native code while
``import tensorflow`` runs and when the devices are first listed -- before absl's logging is set
up, so ``TF_CPP_MIN_LOG_LEVEL`` cannot silence them: the "All log messages before
absl::InitializeLog()" warning, the oneDNN notice (``port.cc``), the CUDA stubs
(``cudart_stub.cc``, ``cuda_platform.cc``'s failed ``cuInit`` on a machine without a GPU
driver), the CPU feature guard. :func:`filtered_native_stderr` points fd 2 at a temporary file
for a span, restores it, and writes back everything it caught except those known lines, so a
real error, a Python warning or a traceback is never hidden.

Used by the command line (:mod:`robustgrad.commands._startup`) and by Ray rollout workers
(:func:`quiet_tensorflow_startup` is their set-up hook, so that the workers print no more than
the main process); public so that other worker processes can start as quietly. This module
imports only the standard library.

Example:
  >>> bool(is_startup_noise("I0000 00:00:1796.980825    6593 port.cc:153] oneDNN custom operations are on."))
  True
  >>> is_startup_noise("Traceback (most recent call last):")
  False
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["filtered_native_stderr", "is_startup_noise", "quiet_tensorflow_startup"]

# glog-style lines of the native start-up ("I0000 00:00:1796.98   6593 port.cc:153] ...")
_GLOG = re.compile(r"^[IWE]\d{4} [\d:.]+\s+\d+ (?P<file>[\w.]+):\d+\] (?P<text>.*)$")
_STARTUP_FILES = {"port.cc", "cudart_stub.cc", "cpu_feature_guard.cc", "cuda_platform.cc",
                  "cuda_executor.cc", "cuda_dnn.cc", "cuda_fft.cc", "cuda_blas.cc",
                  "dso_loader.cc"}
_STARTUP_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",  # the second line of the CPU feature guard
)


def is_startup_noise(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's known native start-up messages."""
    line = line.rstrip("\n")
    if line.startswith(_STARTUP_LINES):
        return True
    match = _GLOG.match(line)
    return bool(match and match.group("file") in _STARTUP_FILES)


@contextlib.contextmanager
def filtered_native_stderr() -> Iterator[None]:
    """Catch what anything (native code included) writes to fd 2 inside the block; afterwards,
    restore fd 2 and write back every line that is not :func:`is_startup_noise`.

    >>> with filtered_native_stderr():
    ...     print("standard output is not touched")
    standard output is not touched
    """
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
    except (AttributeError, ValueError, OSError):  # no real stderr (embedded interpreter)
        yield
        return
    for stream in filter(None, (sys.stderr, sys.__stderr__)):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), fd)
        try:
            yield
        finally:
            for stream in filter(None, (sys.stderr, sys.__stderr__)):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", errors="replace")
            kept = [ln for ln in text.splitlines(keepends=True) if not is_startup_noise(ln)]
            if kept:
                os.write(fd, "".join(kept).encode("utf-8", errors="replace"))


def quiet_tensorflow_startup() -> None:
    """Import TensorFlow and list its devices with the native start-up lines filtered out
    (``TF_CPP_MIN_LOG_LEVEL`` set to 2 unless set already). A no-op once TensorFlow is imported.

    The ``worker_process_setup_hook`` of the Ray workers of :mod:`agents.backends.distributed`: it runs
    in each worker before the actor's class (and TensorFlow with it) is imported."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with filtered_native_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()  # the CUDA platform's first (noisy) initialisation
