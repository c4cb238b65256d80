"""Shared pytest set-up: quiet TensorFlow, deterministic seeds, small helpers."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
# Ray's local instances in the tests bind to 127.0.0.1 only: by default Ray advertises the
# machine's interface address, so test traffic would leave the loopback range. (The slow
# two-node test, which needs cluster mode, sets this back in its own subprocesses.)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_everything():
    tf.keras.utils.set_random_seed(0) if hasattr(tf.keras.utils, "set_random_seed") else None
    np.random.seed(0)
    yield


def central_difference(f, x, eps=1e-6):
    """Central finite-difference gradient of scalar ``f`` at numpy ``x`` (float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (float(f(xp)) - float(f(xm))) / (2 * eps)
    return g
