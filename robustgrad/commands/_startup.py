"""TensorFlow's start-up, without its native log lines (unless ``robustgrad --verbose``).

In TF 2.21 a few lines are written straight to file descriptor 2 by native code while
``import tensorflow`` runs and when the devices are first listed -- before absl's logging is set
up, so ``TF_CPP_MIN_LOG_LEVEL`` cannot silence them: the "All log messages before
absl::InitializeLog()" warning, the oneDNN notice (``port.cc``), the CUDA stubs
(``cudart_stub.cc``, ``cuda_platform.cc``'s failed ``cuInit`` on a machine without a GPU
driver), the CPU feature guard. :func:`import_tensorflow` points fd 2 at a temporary file for
exactly that span, restores it, and writes back everything it caught except those known lines,
so a real error, a Python warning or a traceback is never hidden (the filter lives in
:mod:`robustgrad.native_stderr`, which Ray workers use too). ``TF_CPP_MIN_LOG_LEVEL`` (set
to 2 unless the user set it) quiets TensorFlow's later info lines as usual.

Example:
  >>> bool(is_startup_noise("I0000 00:00:1796.980825    6593 port.cc:153] oneDNN custom operations are on."))
  True
  >>> is_startup_noise("Traceback (most recent call last):")
  False
"""

from __future__ import annotations

import sys

from robustgrad.native_stderr import (  # noqa: F401 - re-exported for the command line
    filtered_native_stderr,
    is_startup_noise,
    quiet_tensorflow_startup,
)

__all__ = ["filtered_native_stderr", "import_tensorflow", "is_startup_noise"]


def import_tensorflow(verbose: bool = False):
    """Import TensorFlow and list its devices; quietly unless ``verbose``. Returns the module."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    if verbose:
        import tensorflow as tf

        tf.config.list_physical_devices()
        return tf
    quiet_tensorflow_startup()
    return sys.modules["tensorflow"]
