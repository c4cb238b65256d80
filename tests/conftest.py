"""Shared pytest set-up: quiet TensorFlow, deterministic seeds, small helpers."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")

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
