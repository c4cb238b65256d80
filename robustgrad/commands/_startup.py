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

Before the import, :func:`prefer_onednn` turns on TensorFlow's oneDNN kernels for the commands
that train or attack convolutional classifiers (``TF_ENABLE_ONEDNN_OPTS=1`` unless the user set
the variable). TensorFlow enables them by itself only on CPUs with AVX-512 VNNI/BF16 or AMX; on
others (an AVX2 AMD EPYC, for one) its convolutions run on Eigen's kernels, and a PGD-10 training
step of WRN-28-10 took 1.7x the time (docs/benchmarks/training.md).

Example:
  >>> bool(is_startup_noise("I0000 00:00:1796.980825    6593 port.cc:153] oneDNN custom operations are on."))
  True
  >>> is_startup_noise("Traceback (most recent call last):")
  False
"""

from __future__ import annotations

import os
import sys

from robustgrad.native_stderr import (  # noqa: F401 - re-exported for the command line
    filtered_native_stderr,
    is_startup_noise,
    quiet_tensorflow_startup,
)

__all__ = ["ONEDNN_COMMANDS", "filtered_native_stderr", "import_tensorflow", "is_startup_noise",
           "prefer_onednn"]

ONEDNN_COMMANDS = frozenset({"train-classifier", "evaluate"})
"""The commands that run on oneDNN's kernels unless ``TF_ENABLE_ONEDNN_OPTS`` says otherwise:
their time goes to convolutions (a PGD-10 step of WRN-28-10 at batch 128, one thread, on an AVX2
AMD EPYC where TensorFlow leaves oneDNN off: 393 CPU s with it, 636 without; PyTorch 583). The
agents' commands keep TensorFlow's choice (small matrix products, measured elsewhere)."""


def prefer_onednn(command: str | None) -> bool:
    """Set ``TF_ENABLE_ONEDNN_OPTS=1`` for ``command`` (a name of :data:`ONEDNN_COMMANDS`) when
    the user has not set the variable and TensorFlow is not yet imported (it reads the variable
    once, at import). Returns whether it set it; any other command, a user's value (``0``
    included) or an imported TensorFlow leaves everything as it is.

    >>> prefer_onednn("train-agent")
    False
    """
    if (command not in ONEDNN_COMMANDS or "TF_ENABLE_ONEDNN_OPTS" in os.environ
            or "tensorflow" in sys.modules):
        return False
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    return True


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
