"""The one schedule the agents use: linear interpolation over a training budget.

It drives PPO/A2C/REINFORCE learning-rate annealing, DQN's learning-rate decay, DQN's
epsilon-greedy exploration (Mnih et al. 2015) and the importance-sampling exponent beta of
prioritised replay (Schaul et al. 2016), in Python floats (outside the graph) or scalar
tensors (inside a compiled loop).

>>> linear(1.0, 0.0, 25, 100)
0.75
>>> round(linear(1.0, 0.04, 20_000, 8_000), 12)  # held at the end value past the horizon
0.04
"""

from __future__ import annotations

import numbers
from typing import cast

import tensorflow as tf


def linear(start: float, end: float, done: float | tf.Tensor, horizon: float | tf.Tensor
           ) -> float | tf.Tensor:
    """``start + (end - start) * min(done / max(horizon, 1), 1)``.

    ``done`` and ``horizon`` are step counts (Python numbers, or float tensors of one dtype);
    the value moves from ``start`` at ``done = 0`` to ``end`` at ``done >= horizon`` and stays
    there. With Python numbers the result is a Python float, otherwise a tensor. (The end
    value is reached up to rounding: ``start + (end - start) * 1``.)

    >>> round(float(linear(0.4, 1.0, tf.constant(50.0), tf.constant(100.0))), 6)
    0.7
    """
    if isinstance(done, numbers.Real) and isinstance(horizon, numbers.Real):
        # numbers.Real has no arithmetic in typeshed; these are Python or numpy numbers
        done_, horizon_ = cast(float, done), cast(float, horizon)
        return start + (end - start) * min(done_ / max(horizon_, 1), 1.0)
    return start + (end - start) * tf.minimum(done / tf.maximum(horizon, 1.0), 1.0)
