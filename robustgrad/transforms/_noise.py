"""Annealed gradient noise: :func:`add_noise` (Neelakantan et al. 2015).

>>> import tensorflow as tf
>>> t = add_noise(0.1, seed=3)
>>> a, _ = t.update([tf.zeros(4)], t.init([tf.zeros(4)]))
>>> b, _ = t.update([tf.zeros(4)], t.init([tf.zeros(4)]))
>>> bool(tf.reduce_all(a[0] == b[0]))          # same seed, same step: same noise
True
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import nonnegative, positive_int
from robustgrad.transforms._base import (
    GradientTransformation,
    _as_tensor,
    _check_state,
    _flatten_checked,
)

__all__ = ["AddNoiseState", "add_noise"]


class AddNoiseState(NamedTuple):
    """State of :func:`add_noise`: ``count`` (int64 scalar, steps taken)."""

    count: Any


def add_noise(stddev: float, decay: float = 0.55, seed: int = 0) -> GradientTransformation:
    """Add annealed Gaussian noise: Neelakantan et al. 2015, "Adding Gradient Noise Improves
    Learning for Very Deep Networks", arXiv:1511.06807.

    At step ``t = 0, 1, ...`` each element gets ``N(0, sigma_t^2)`` with
    ``sigma_t^2 = stddev^2 / (1 + t)^decay`` (the paper uses ``decay = 0.55``). Noise is drawn with
    ``tf.random.stateless_normal`` from ``(seed, t, leaf index)``: the same seed gives the same noise,
    eagerly, in ``tf.function`` and under XLA.

    Args:
        stddev: float >= 0, the noise standard deviation at ``t = 0`` (sqrt of eta in the paper).
        decay: float >= 0, the annealing exponent gamma.
        seed: int, the noise seed.

    >>> t = add_noise(0.0)
    >>> u, s = t.update([tf.ones(2)], t.init([tf.ones(2)])); u[0].numpy().tolist(), int(s.count)
    ([1.0, 1.0], 1)
    """
    stddev = nonnegative(stddev, "stddev")
    decay = nonnegative(decay, "decay")
    seed = positive_int(seed, "seed", minimum=None)

    def init(params):
        _flatten_checked(params, "params")
        return AddNoiseState(count=tf.constant(0, tf.int64))

    def update(updates, state, params=None):
        _check_state(state, AddNoiseState, "add_noise")
        flat = [_as_tensor(g) for g in _flatten_checked(updates, "updates")]
        t = tf.cast(state.count, tf.float32)
        std = stddev / tf.pow(1.0 + t, decay / 2.0)
        n = len(flat)
        out = []
        for i, g in enumerate(flat):
            s = tf.stack([tf.constant(seed, tf.int64), state.count * n + i])
            noise = tf.random.stateless_normal(tf.shape(g), seed=s, dtype=tf.float32) * std
            out.append(g + tf.cast(noise, g.dtype))
        return (tf.nest.pack_sequence_as(updates, out),
                AddNoiseState(count=state.count + 1))

    return GradientTransformation(init, update)
