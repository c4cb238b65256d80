"""Custom-gradient ops: identity (or a given function) forward, a controlled backward.

Each op is a tensor-to-tensor function built with ``tf.custom_gradient`` (or with exact
``stop_gradient`` algebra where that keeps higher-order derivatives), so it composes with
anything upstream, including layers and functions that use variables: the modified gradient
flows on into them.

- :func:`clip_gradient` — clip the incoming gradient element-wise to ``[clip_min, clip_max]``.
- :func:`clip_gradient_norm` — rescale the incoming gradient to L2 norm ≤ ``max_norm``.
- :func:`scale_gradient` — multiply the incoming gradient by ``scale``.
- :func:`reverse_gradient` — the gradient-reversal layer of Ganin & Lempitsky (2015).
- :func:`straight_through` — the straight-through estimator (Bengio, Léonard & Courville 2013).
- :func:`safe_norm`, :func:`safe_sqrt` — norms and roots whose gradient at 0 is finite (0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from robustgrad.checks import number

__all__ = [
    "clip_gradient",
    "clip_gradient_norm",
    "reverse_gradient",
    "safe_norm",
    "safe_sqrt",
    "scale_gradient",
    "straight_through",
]


def _float_tensor(x, what: str = "x"):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"{what} must be a floating tensor, got dtype {x.dtype.name}")
    return x


def _number_or_tensor(value, name: str, **bounds):
    """A tensor passes unchecked (the graph's users check it: it may be a schedule, or
    per-element bounds); a Python/NumPy number is checked by :func:`robustgrad.checks.number`."""
    return value if tf.is_tensor(value) else number(value, name, **bounds)


def clip_gradient(x: Any, clip_min: Any, clip_max: Any) -> tf.Tensor:
    """Identity forward; the incoming gradient is clipped element-wise to ``[clip_min, clip_max]``.

    Args:
      x: floating tensor, any shape.
      clip_min, clip_max: numbers (or tensors broadcastable to ``x``), ``clip_min <= clip_max``.

    Example:
      >>> x = tf.constant([1.0, 2.0])
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = tf.reduce_sum(10.0 * clip_gradient(x, -1.0, 1.0))
      >>> t.gradient(y, x).numpy().tolist()
      [1.0, 1.0]
    """
    x = _float_tensor(x)
    clip_min = _number_or_tensor(clip_min, "clip_min", allow_inf=True)
    clip_max = _number_or_tensor(clip_max, "clip_max", allow_inf=True)
    if not tf.is_tensor(clip_min) and not tf.is_tensor(clip_max) and clip_min > clip_max:
        raise ValueError(f"clip_min ({clip_min}) must be <= clip_max ({clip_max})")

    @tf.custom_gradient
    def _op(t):
        def backward(dy):
            return tf.clip_by_value(dy, tf.cast(clip_min, dy.dtype), tf.cast(clip_max, dy.dtype))

        return tf.identity(t), backward

    return _op(x)


def clip_gradient_norm(x: Any, max_norm: Any, axis: int | Sequence[int] | None = None
                       ) -> tf.Tensor:
    """Identity forward; the incoming gradient is rescaled to L2 norm at most ``max_norm``.

    Args:
      x: floating tensor.
      max_norm: number > 0.
      axis: ``None`` clips the norm of the whole gradient; an int or tuple clips the norm along
        those axes (e.g. ``axis=-1`` or all but the batch axis for per-example clipping).

    Example:
      >>> x = tf.constant([0.0, 0.0])
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = tf.reduce_sum(tf.constant([3.0, 4.0]) * clip_gradient_norm(x, 1.0))
      >>> [round(float(g), 3) for g in t.gradient(y, x)]
      [0.6, 0.8]
    """
    x = _float_tensor(x)
    max_norm = _number_or_tensor(max_norm, "max_norm", minimum=0, min_inclusive=False,
                                 allow_inf=True)

    @tf.custom_gradient
    def _op(t):
        def backward(dy):
            return tf.clip_by_norm(dy, tf.cast(max_norm, dy.dtype), axes=axis)

        return tf.identity(t), backward

    return _op(x)


def scale_gradient(x: Any, scale: Any) -> tf.Tensor:
    """Identity forward; the incoming gradient is multiplied by ``scale`` (any real, or a tensor).

    ``scale=0`` is ``stop_gradient`` with a zero (not ``None``) gradient.

    Example:
      >>> x = tf.constant(3.0)
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = scale_gradient(x, 0.5) ** 2
      >>> float(t.gradient(y, x))
      3.0
    """
    x = _float_tensor(x)
    scale = _number_or_tensor(scale, "scale")

    @tf.custom_gradient
    def _op(t):
        def backward(dy):
            return dy * tf.cast(scale, dy.dtype)

        return tf.identity(t), backward

    return _op(x)


def reverse_gradient(x: Any, scale: Any = 1.0) -> tf.Tensor:
    """Identity forward; the gradient is multiplied by ``-scale`` (Ganin & Lempitsky 2015).

    Args:
      x: floating tensor.
      scale: number ≥ 0 (the λ of domain-adversarial training).

    Example:
      >>> x = tf.constant(2.0)
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = 3.0 * reverse_gradient(x, scale=0.5)
      >>> float(t.gradient(y, x))
      -1.5
    """
    return scale_gradient(x, -_number_or_tensor(scale, "scale", minimum=0))


def straight_through(forward_fn: Callable) -> Callable:
    """The straight-through estimator (Bengio, Léonard & Courville 2013).

    Returns ``f(x)`` whose value is ``forward_fn(x)`` and whose gradient w.r.t. ``x`` is the
    identity, as if ``forward_fn`` were the identity. ``forward_fn`` must keep ``x``'s shape (a
    rounding, sign, quantiser...). Variables that ``forward_fn`` uses (a learnable quantisation
    scale) receive their true gradient at that point.

    Built from exact ``stop_gradient`` algebra (``y = sg(f(x)) + (x − sg(x)) + (f(sg x) − sg f(sg x))``)
    rather than a custom gradient, so it also compiles with XLA and differentiates twice.

    Example:
      >>> ste_round = straight_through(tf.round)
      >>> x = tf.constant([0.2, 1.7])
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = ste_round(x); loss = tf.reduce_sum(3.0 * y)
      >>> y.numpy().tolist(), t.gradient(loss, x).numpy().tolist()
      ([0.0, 2.0], [3.0, 3.0])
    """
    if not callable(forward_fn):
        raise TypeError(f"forward_fn must be callable, got {type(forward_fn).__name__}")

    def _ste(x):
        x = _float_tensor(x)
        fx = tf.convert_to_tensor(forward_fn(tf.stop_gradient(x)))
        if fx.shape.is_fully_defined() and x.shape.is_fully_defined() and fx.shape != x.shape:
            raise ValueError(
                f"forward_fn must keep the input's shape for a straight-through estimator: "
                f"got {fx.shape} from {x.shape}"
            )
        fx = tf.cast(fx, x.dtype)
        return tf.stop_gradient(fx) + (x - tf.stop_gradient(x)) + (fx - tf.stop_gradient(fx))

    _ste.__name__ = f"straight_through_{getattr(forward_fn, '__name__', 'fn')}"
    return _ste


def safe_sqrt(x: Any) -> tf.Tensor:
    """``sqrt(max(x, 0))`` with gradient 0 (not ``inf``/``NaN``) at ``x <= 0``.

    Uses the double-``where`` trick, so higher derivatives stay finite too.

    Example:
      >>> x = tf.constant([0.0, 4.0])
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = tf.reduce_sum(safe_sqrt(x))
      >>> t.gradient(y, x).numpy().tolist()
      [0.0, 0.25]
    """
    x = _float_tensor(x)
    positive = x > 0
    safe_x = tf.where(positive, x, tf.ones_like(x))
    return tf.where(positive, tf.sqrt(safe_x), tf.zeros_like(x))


def safe_norm(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False
              ) -> tf.Tensor:
    """Euclidean norm along ``axis`` whose gradient at ``x = 0`` is 0, not ``NaN``.

    ``tf.norm`` has gradient ``x / ||x||`` = ``0/0`` at the origin; this returns the
    subgradient 0 there (the minimum-norm element of the subdifferential).

    Args:
      x: floating tensor.
      axis: ``None`` (all elements), an int or a tuple of ints.
      keepdims: keep reduced axes with length 1.

    Example:
      >>> x = tf.zeros([2, 3])
      >>> with tf.GradientTape() as t:
      ...     t.watch(x); y = tf.reduce_sum(safe_norm(x, axis=-1))
      >>> bool(tf.reduce_all(tf.math.is_finite(t.gradient(y, x))))
      True
    """
    x = _float_tensor(x)
    return safe_sqrt(tf.reduce_sum(tf.square(x), axis=axis, keepdims=keepdims))
