"""Gradient accumulation: :func:`accumulate` sums ``k`` micro-steps and emits every k-th call.

>>> import tensorflow as tf
>>> t = accumulate(3, average=False)
>>> s = t.init([tf.zeros(1)])
>>> for g in (1.0, 2.0, 3.0):
...     u, s = t.update([tf.constant([g])], s)
>>> u[0].numpy().tolist(), bool(s.emit)
([6.0], True)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import positive_int
from robustgrad.transforms._base import (
    GradientTransformation,
    _as_tensor,
    _as_transformation,
    _assert_same_structure,
    _check_state,
    _flatten_checked,
    _zeros_like_tree,
    _zeros_state_like_params,
    identity,
)

__all__ = ["AccumulateState", "accumulate"]


class AccumulateState(NamedTuple):
    """State of :func:`accumulate`.

    mini_step: int32 scalar in ``[0, k)``, micro-steps summed so far.
    acc: nest like ``params``, running sum of the micro-step gradients.
    emit: bool scalar, whether the last call emitted (every k-th call).
    inner_state: state of the transformation applied to the emitted gradient (or EmptyState).
    """

    mini_step: Any
    acc: Any
    emit: Any
    inner_state: Any


def accumulate(k: int, average: bool = True,
               inner: GradientTransformation | None = None) -> GradientTransformation:
    """Gradient accumulation: sum ``k`` micro-step gradients, emit on every k-th call.

    Calls 1..k-1 of each cycle return zeros and set ``emit=False``; call k returns the mean
    (``average=True``) or the sum of the k gradients, sets ``emit=True`` and resets the sum.
    :class:`GradientStep` calls the optimizer only on emitting steps. ``inner`` (optional) is
    applied to the emitted gradient only, so its state advances once per k micro-steps; in a plain
    ``chain(accumulate(k), t)``, ``t`` runs on every call (on zeros between emissions).

    Args:
        k: int >= 1.
        average: emit the mean (True) or the sum (False).
        inner: optional GradientTransformation applied on emission.

    >>> t = accumulate(2)
    >>> s = t.init([tf.zeros(1)])
    >>> u, s = t.update([tf.constant([1.0])], s); u[0].numpy().tolist(), bool(s.emit)
    ([0.0], False)
    >>> u, s = t.update([tf.constant([3.0])], s); u[0].numpy().tolist(), bool(s.emit)
    ([2.0], True)
    """
    k = positive_int(k, "k")
    inner_t = identity() if inner is None else _as_transformation(inner, "inner")

    def init(params):
        _flatten_checked(params, "params")
        return AccumulateState(
            mini_step=tf.constant(0, tf.int32),
            acc=_zeros_state_like_params(params),
            emit=tf.constant(False),
            inner_state=inner_t.init(params),
        )

    def update(updates, state, params=None):
        _check_state(state, AccumulateState, "accumulate")
        _flatten_checked(updates, "updates")
        _assert_same_structure(updates, state.acc, "updates", "params (from init)")
        updates = tf.nest.map_structure(_as_tensor, updates)
        acc = tf.nest.map_structure(lambda a, g: a + tf.cast(g, a.dtype), state.acc, updates)
        count = state.mini_step + 1
        emit = count >= k
        if average and k > 1:
            out = tf.nest.map_structure(lambda a: a / tf.cast(k, a.dtype), acc)
        else:
            out = acc
        out = tf.nest.map_structure(lambda o, g: tf.cast(o, g.dtype), out, updates)
        zeros = _zeros_like_tree(out)
        if inner is None:
            emitted = tf.nest.map_structure(lambda o, z: tf.where(emit, o, z), out, zeros)
            new_inner = state.inner_state
        else:
            emitted, new_inner = tf.cond(
                emit,
                lambda: inner_t.update(out, state.inner_state, params),
                lambda: (zeros, state.inner_state),
            )
        new_acc = tf.nest.map_structure(lambda a: tf.where(emit, tf.zeros_like(a), a), acc)
        return emitted, AccumulateState(
            mini_step=tf.where(emit, 0, count),
            acc=new_acc,
            emit=emit,
            inner_state=new_inner,
        )

    return GradientTransformation(init, update)
