"""The gradient of a classifier's loss with respect to its input: :func:`input_gradient`.

The one input-gradient primitive the attacks, regularisers and saliency code build on: labels
or targets checked with clear errors, the loss in float32 (also under ``mixed_float16``), and
the softmax warning when the model looks like it outputs probabilities (gradient masking).
Moved out of ``robustgrad/tape.py``, which re-exports :func:`input_gradient`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from robustgrad.checks import looks_like_probabilities

__all__ = ["ZERO_GRADIENT_FRACTION", "input_gradient", "zero_gradient_message"]

ZERO_GRADIENT_FRACTION = 0.1
"""Warn when more than this fraction of examples has an identically zero input gradient."""


def zero_gradient_message(zero: int, total: int) -> str | None:
    """The warning for ``zero`` of ``total`` examples whose input gradient is identically zero
    (``None`` at or below :data:`ZERO_GRADIENT_FRACTION` of them): whatever the model's output
    layer -- a saturated softmax, a sigmoid, a clip, a rounding -- the gradient steps cannot move
    those examples, and a robustness measured that way is gradient masking.

    >>> zero_gradient_message(1, 100) is None
    True
    >>> zero_gradient_message(8, 8)[:60]
    'the input gradient is identically zero on 8 of 8 examples (1'
    """
    if total <= 0 or zero <= ZERO_GRADIENT_FRACTION * total:
        return None
    return (f"the input gradient is identically zero on {zero} of {total} examples "
            f"({zero / total:.0%}): gradient steps cannot move them (a saturated or "
            "piecewise-constant output: gradient masking); robustness measured by a gradient "
            "attack will be overestimated")


def _ends_in_softmax(model) -> bool:
    """Whether ``model``'s last layer is a softmax (an activation or a ``Softmax`` layer): what
    can be seen of a probabilities output while tracing, when no values exist yet."""
    layers = getattr(model, "layers", None)
    if not layers:
        return False
    last = layers[-1]
    activation = getattr(last, "activation", None)
    return getattr(activation, "__name__", "") == "softmax" or type(last).__name__ == "Softmax"


def _warn_if_probabilities(logits, model=None) -> None:
    """The attacks' softmax warning, for the same model: on the values when eager, on the
    model's last layer while tracing (inside a ``tf.function``)."""
    eager = isinstance(logits, tf.Tensor) and hasattr(logits, "numpy")
    if (eager and looks_like_probabilities(logits.numpy())) or \
            (not eager and _ends_in_softmax(model)):
        warnings.warn(
            "model outputs look like probabilities (non-negative rows summing to 1). Attacks and "
            "objectives expect logits: gradients through a saturated softmax vanish and make a "
            "model look robust (gradient masking). Remove the final softmax.",
            UserWarning, stacklevel=3)


def _check_targets(y, logits) -> None:
    """Labels ``[B]`` in ``[0, C)`` or targets ``[B, C]`` matching the logits, as a ValueError
    naming ``y`` with the numbers (never a TensorFlow op error)."""
    yt = tf.convert_to_tensor(y)
    b, c = logits.shape[0], logits.shape[-1] if logits.shape.rank else None
    if yt.dtype.is_integer:
        if yt.shape.rank != 1:
            raise ValueError(f"y must be int labels of shape [B] or targets [B, C], got integer "
                             f"shape {yt.shape}")
        if b is not None and yt.shape[0] is not None and yt.shape[0] != b:
            raise ValueError(f"y has {yt.shape[0]} labels but x has {b} examples")
        if c is not None and hasattr(yt, "numpy") and yt.shape[0]:
            lo, hi = int(tf.reduce_min(yt)), int(tf.reduce_max(yt))
            if lo < 0 or hi >= c:
                raise ValueError(f"y has labels outside [0, {c}) (min {lo}, max {hi}); the "
                                 f"model has {c} outputs")
    elif yt.dtype.is_floating:
        if yt.shape.rank != 2 or (yt.shape.is_fully_defined() and logits.shape.is_fully_defined()
                                  and yt.shape != logits.shape):
            raise ValueError(f"y: float targets must have the logits' shape {logits.shape}, got "
                             f"{yt.shape}")
    else:
        raise ValueError(f"y must be int labels [B] or float targets [B, C], got dtype "
                         f"{yt.dtype.name}")


def _per_example_loss(loss, logits, y):
    logits = tf.cast(logits, tf.float32)
    if callable(loss):
        out = tf.convert_to_tensor(loss(logits, y))
        if out.shape.rank not in (0, 1):
            raise ValueError(
                f"loss callable must return per-example losses of shape [batch] or a scalar, "
                f"got shape {out.shape}"
            )
        return tf.cast(out, tf.float32)
    y = tf.convert_to_tensor(y)
    if loss == "crossentropy":
        if y.dtype.is_integer:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(y, tf.int64), logits=logits)
        return tf.nn.softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.float32), logits=logits)
    if loss == "margin":  # Carlini-Wagner margin: max_{j != y} z_j - z_y
        if not y.dtype.is_integer:
            y = tf.argmax(y, axis=-1)
        onehot = tf.one_hot(y, tf.shape(logits)[-1], dtype=tf.float32)
        z_y = tf.reduce_sum(onehot * logits, axis=-1)
        other = tf.reduce_max(logits - 1e9 * onehot, axis=-1)
        return other - z_y
    raise ValueError(
        f"loss must be 'crossentropy', 'margin' or a callable(logits, y), got {loss!r}"
    )


def input_gradient(
    model: Callable, x: Any, y: Any, loss: str | Callable = "crossentropy",
    training: bool = False,
) -> tf.Tensor:
    """Gradient of a classification loss with respect to the model's input.

    The per-example losses are summed before differentiating, so row ``i`` of the result is
    the gradient of example ``i``'s own loss (examples do not interact in inference mode).
    The loss is computed in float32 and the gradient returned in float32 even when the model
    runs under a ``mixed_float16`` policy, so attacks never step along rounded float16 signs.

    Args:
      model: any callable ``model(x, training=False) -> logits`` of shape ``[B, C]`` (a Keras
        model is one). Logits, not probabilities.
      x: float tensor ``[B, ...]``; not modified.
      y: int labels ``[B]`` or one-hot/probability targets ``[B, C]``.
      loss: ``"crossentropy"`` (default), ``"margin"`` (Carlini-Wagner ``max_{j≠y} z_j − z_y``)
        or a callable ``loss(logits, y) -> [B]``.
      training: the mode the model runs in (inference by default).

    Returns:
      float32 tensor with the shape of ``x``.

    Raises:
      TypeError: ``x`` is not floating point.
      ValueError: the model's output does not depend on ``x``, or ``loss`` is unknown.

    Example:
      >>> import keras
      >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
      >>> g = input_gradient(model, tf.ones([2, 4]), tf.constant([0, 2]))
      >>> g.shape, g.dtype.name
      (TensorShape([2, 4]), 'float32')
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    if not (callable(loss) or loss in ("crossentropy", "margin")):
        raise ValueError(
            f"loss must be 'crossentropy', 'margin' or a callable(logits, y), got {loss!r}"
        )
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"x must be a floating tensor, got dtype {x.dtype.name}")
    x32 = tf.cast(x, tf.float32)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(x32)
        logits = model(x32, training=training)
        if not isinstance(logits, (tf.Tensor, tf.Variable)):
            raise TypeError(f"model must return one tensor of logits [B, C], got "
                            f"{type(logits).__name__} (pick one output of a dict/tuple model)")
        if not callable(loss):
            _check_targets(y, logits)
        _warn_if_probabilities(logits, model)
        value = tf.reduce_sum(_per_example_loss(loss, logits, y))
    g = tape.gradient(value, x32)
    if g is None:
        raise ValueError(
            "the model's output does not depend on x: its input gradient would be None. "
            "Check that the model uses its input through differentiable ops."
        )
    if hasattr(g, "numpy") and g.shape.rank and g.shape[0]:  # eager: look at the values
        rows = tf.reshape(g, [tf.shape(g)[0], -1])
        zero = int(tf.reduce_sum(tf.cast(tf.reduce_all(tf.equal(rows, 0), axis=1), tf.int32)))
        message = zero_gradient_message(zero, int(g.shape[0]))
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)
    return tf.cast(g, tf.float32)

