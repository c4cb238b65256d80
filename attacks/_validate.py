"""Argument checks for the attacks: fail loud, early, naming the argument.

Scalars, integers and choices are checked by the project's one validation family,
:mod:`robustgrad.checks` (messages read ``"{name} must be ..., got ..."``); this module adds
only what is specific to attacks: the batch ``x``, its bounds and its labels.

All checks run eagerly, before any compiled work. Inside someone else's ``tf.function``
(graph mode) only the static checks (types, dtypes, shapes, Python numbers) run; value checks
on tensors (NaN, bounds, label range) need eager tensors and are skipped there.

>>> check_eps(0.1)
0.1
>>> check_positive_int(0, "steps")
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: steps must be an int >= 1, got 0
>>> check_bounds(0.0, 1.0, tf.constant([[0.5, 2.0]]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: x has values outside [clip_min, clip_max]; ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import checks as _checks

__all__ = [
    "check_eps",
    "check_positive_int",
    "check_nonnegative",
    "check_x",
    "check_bounds",
    "check_labels",
    "check_choice",
    "MAX_STEPS",
    "MAX_RESTARTS",
]

MAX_STEPS = 100_000
"""The most iterations of one attack (``steps`` of PGD, APGD, CW, DeepFool, FAB, Square's
queries, adversarial training's crafting): 100x Square's 1,000 queries and AutoAttack's 100
APGD steps x 1,000; more would run one compiled loop for hours, deaf to Ctrl-C."""

MAX_RESTARTS = 1_000
"""The most repetitions of a whole attack (``restarts``, CW's ``binary_search_steps``, APGD's
``eot_iter``): 200x AutoAttack's 5 restarts (``restarts=10**9`` ran for ever)."""


def _is_eager_value(v) -> bool:
    return not isinstance(v, tf.Tensor) or hasattr(v, "numpy")


def _unchecked(v) -> bool:
    """A variable or a symbolic tensor: its value is only known when the graph runs."""
    return isinstance(v, tf.Variable) or (isinstance(v, tf.Tensor) and not hasattr(v, "numpy"))


def check_eps(eps: Any, name: str = "eps", allow_none: bool = False) -> Any:
    """``eps`` a finite number >= 0 (a Python/NumPy number or a scalar tensor); returned as given."""
    if eps is None:
        if allow_none:
            return None
        raise ValueError(f"{name} is required (a number >= 0)")
    if not _unchecked(eps):
        _checks.nonnegative(eps, name)
    return eps


def check_nonnegative(v: Any, name: str, allow_inf: bool = False) -> Any:
    """``v`` a number >= 0 (``inf`` only with ``allow_inf``); returned as given."""
    if not _unchecked(v):
        _checks.nonnegative(v, name, allow_inf=allow_inf)
    return v


def check_positive_int(v: Any, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``v`` as an ``int`` in ``[minimum, maximum]`` (:func:`robustgrad.checks.positive_int`;
    ``maximum``: :data:`MAX_STEPS` for iterations, :data:`MAX_RESTARTS` for repetitions)."""
    return _checks.positive_int(v, name, minimum=minimum, maximum=maximum)


def check_choice(v: Any, name: str, choices: Iterable) -> Any:
    """``v`` if it is one of ``choices`` (:func:`robustgrad.checks.choice`)."""
    return _checks.choice(v, name, choices)


def check_x(x: Any, name: str = "x") -> tf.Tensor:
    """``x`` a floating tensor of rank >= 2 (batch first) without NaN/Inf. Returns a tensor."""
    if isinstance(x, (tf.Tensor, tf.Variable)):
        t = tf.convert_to_tensor(x)
    else:
        a = np.asarray(x)
        if not (np.issubdtype(a.dtype, np.floating)):
            raise _checks.ArgumentTypeError(
                f"{name} must be a floating-point array (got dtype {a.dtype}); "
                "convert integer images with x.astype('float32') / scale first")
        t = tf.convert_to_tensor(a)
    if not t.dtype.is_floating:
        raise _checks.ArgumentTypeError(
            f"{name} must be a floating-point tensor (got dtype {t.dtype.name}); "
            "convert integer images with tf.cast(x, tf.float32) / scale first")
    if t.shape.rank is not None and t.shape.rank < 2:
        raise ValueError(f"{name} must be a batch of shape [B, ...] with rank >= 2, "
                         f"got shape {t.shape}")
    if _is_eager_value(t):
        if t.shape[0] == 0:
            raise ValueError(f"{name} is an empty batch")
        if not bool(tf.reduce_all(tf.math.is_finite(t))):
            raise ValueError(f"{name} contains NaN or Inf values")
    return t


def _bound_array(v, name, x):
    if v is None:
        return None
    if isinstance(v, (tf.Tensor, tf.Variable)) and not hasattr(v, "numpy"):
        return v
    a = np.asarray(v, dtype=np.float64)
    if np.isnan(a).any():
        raise ValueError(f"{name} contains NaN")
    feat = tuple(x.shape[1:])
    ok = a.ndim <= len(feat) + 1 and (a.ndim < len(feat) + 1 or a.shape[0] == 1)
    if ok:
        try:
            np.broadcast_to(a.reshape(a.shape[1:] if a.ndim == len(feat) + 1 else a.shape), feat)
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(f"{name} must be a scalar or broadcast to the per-example shape {feat}; "
                         f"got shape {a.shape}")
    return a


def check_bounds(clip_min: Any, clip_max: Any, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Bounds broadcastable to one example; ``clip_min <= clip_max``; ``x`` inside them.

    ``None`` means unbounded on that side. Returns ``(lo, hi)`` tensors of shape ``[1, *feat]``
    in ``x``'s dtype (``-inf``/``+inf`` where unbounded).
    """
    lo = _bound_array(clip_min, "clip_min", x)
    hi = _bound_array(clip_max, "clip_max", x)
    if isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray):
        if np.any(np.broadcast_to(lo, np.broadcast_shapes(lo.shape, hi.shape))
                  > np.broadcast_to(hi, np.broadcast_shapes(lo.shape, hi.shape))):
            raise ValueError("clip_min must be <= clip_max everywhere "
                             f"(got clip_min={clip_min!r}, clip_max={clip_max!r})")
    feat = [1] + [d for d in x.shape[1:]]
    dtype = x.dtype

    def full(v, fill):
        if v is None:
            t = tf.fill([1] + [int(d) for d in x.shape[1:]], tf.constant(fill, dtype))
            return t
        t = tf.cast(tf.convert_to_tensor(v), dtype)
        return tf.broadcast_to(tf.reshape(t, [1] * (len(feat) - t.shape.rank) + t.shape.as_list()),
                               feat)

    lo_t, hi_t = full(lo, -np.inf), full(hi, np.inf)
    if _is_eager_value(x):
        if not bool(tf.reduce_all(x >= lo_t)) or not bool(tf.reduce_all(x <= hi_t)):
            raise ValueError("x has values outside [clip_min, clip_max]; pass the bounds of your "
                             "input domain (e.g. clip_min=0.0, clip_max=1.0 for images in [0, 1])")
    return lo_t, hi_t


def check_labels(y: Any, n: int | None, num_classes: int | None, name: str = "y") -> tf.Tensor:
    """Integer labels of shape ``[n]`` in ``[0, num_classes)``. Returns an int64 tensor."""
    if isinstance(y, (tf.Tensor, tf.Variable)):
        t = tf.convert_to_tensor(y)
        if not t.dtype.is_integer:
            raise _checks.ArgumentTypeError(
                f"{name} must hold integer class labels, got dtype {t.dtype.name}")
    else:
        a = np.asarray(y)
        if not np.issubdtype(a.dtype, np.integer):
            raise _checks.ArgumentTypeError(
                f"{name} must hold integer class labels, got dtype {a.dtype}")
        t = tf.convert_to_tensor(a)
    if t.shape.rank != 1:
        raise ValueError(f"{name} must be a vector of labels of shape [B], got shape {t.shape}")
    if n is not None and t.shape[0] is not None and t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} labels but x has {n} examples")
    if _is_eager_value(t) and num_classes is not None:
        a = t.numpy()
        if a.size and (a.min() < 0 or a.max() >= num_classes):
            raise ValueError(f"{name} has labels outside [0, {num_classes}) "
                             f"(min {a.min()}, max {a.max()}); the model has {num_classes} outputs")
    return tf.cast(t, tf.int64)
