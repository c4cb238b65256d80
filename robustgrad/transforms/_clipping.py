"""Clipping transformations: by value, by norm, by global norm, and adaptive (AGC).

>>> import tensorflow as tf
>>> u, _ = clip_by_global_norm(5.0).update([tf.constant([6.0, 8.0])], EmptyState())
>>> u[0].numpy().tolist()
[3.0, 4.0]
"""

from __future__ import annotations

import tensorflow as tf

from robustgrad.checks import nonnegative, number
from robustgrad.transforms._base import (
    EmptyState,  # noqa: F401  (the doctests' state)
    GradientTransformation,
    _as_tensor,
    _leaf_dtype,
    _sq_sum_f32,
    _stateless,
    global_norm,
)

__all__ = ["adaptive_clip", "clip_by_global_norm", "clip_by_norm", "clip_by_value"]


def clip_by_value(max_value: float, min_value: float | None = None) -> GradientTransformation:
    """Clip every element to ``[min_value, max_value]`` (``min_value`` defaults to ``-max_value``).

    Args:
        max_value: float >= 0 (or any float when ``min_value`` is given and <= it).
        min_value: optional float <= ``max_value``.

    >>> u, _ = clip_by_value(1.0).update([tf.constant([-3.0, 0.5, 2.0])], EmptyState())
    >>> u[0].numpy().tolist()
    [-1.0, 0.5, 1.0]
    """
    if min_value is None:
        hi = nonnegative(max_value, "max_value", allow_inf=True)
        lo = -hi
    else:
        hi = number(max_value, "max_value", allow_inf=True)
        lo = number(min_value, "min_value", maximum=hi, allow_inf=True)

    def fn(updates, params):
        def clip(g):
            g = _as_tensor(g)
            return tf.clip_by_value(g, tf.cast(lo, g.dtype), tf.cast(hi, g.dtype))

        return tf.nest.map_structure(clip, updates)

    return _stateless(fn, "clip_by_value")


def _clip_scale(norm, max_norm):
    """float32 ``min(1, max_norm / norm)`` (1 when ``norm <= max_norm``; NaN stays NaN)."""
    return tf.where(norm > max_norm, max_norm / tf.maximum(norm, 1e-30), 1.0)


def _scale_to(g, norm, max_norm):
    """``g * min(1, max_norm / norm)`` computed in float32, cast back to ``g.dtype``."""
    return g * tf.cast(_clip_scale(norm, max_norm), g.dtype)


def clip_by_norm(max_norm: float) -> GradientTransformation:
    """Rescale each tensor separately so that its L2 norm is at most ``max_norm``.

    ``g <- g * min(1, max_norm / ||g||_2)`` per leaf (``tf.clip_by_norm`` with no axes).

    >>> u, _ = clip_by_norm(1.0).update([tf.constant([3.0, 4.0]), tf.constant([0.1])], EmptyState())
    >>> [x.numpy().astype(float).round(3).tolist() for x in u]
    [[0.6, 0.8], [0.1]]
    """
    max_norm = nonnegative(max_norm, "max_norm", allow_inf=True)

    def fn(updates, params):
        def clip(g):
            g = _as_tensor(g)
            return _scale_to(g, tf.sqrt(_sq_sum_f32(g)), max_norm)

        return tf.nest.map_structure(clip, updates)

    return _stateless(fn, "clip_by_norm")


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Rescale all tensors jointly so that their global L2 norm is at most ``max_norm``.

    ``g_i <- g_i * min(1, max_norm / sqrt(sum_j ||g_j||^2))`` (Pascanu et al. 2013). A non-finite
    global norm yields non-finite updates, which :func:`apply_if_finite` then rejects.

    >>> g = [tf.constant([3.0]), tf.constant([4.0])]
    >>> u, _ = clip_by_global_norm(1.0).update(g, EmptyState())
    >>> [x.numpy().astype(float).round(3).tolist() for x in u]
    [[0.6], [0.8]]
    """
    max_norm = nonnegative(max_norm, "max_norm", allow_inf=True)

    def fn(updates, params):
        scale = _clip_scale(global_norm(updates), max_norm)
        return tf.nest.map_structure(
            lambda g: _as_tensor(g) * tf.cast(scale, _leaf_dtype(g)), updates)

    return _stateless(fn, "clip_by_global_norm")


def _unitwise_norm(x):
    """Unit-wise L2 norm, broadcastable to ``x`` (NFNets convention, HWIO/(in, out) layouts).

    rank <= 1: the whole tensor; rank 2/3: over axis 0 (one norm per output unit);
    rank >= 4: over every axis but the last.
    """
    x = tf.cast(x, tf.float32)
    rank = x.shape.rank
    if rank is None:
        raise ValueError("adaptive_clip needs tensors of known rank")
    axes: int | list[int] | None
    if rank <= 1:
        axes = None
    elif rank in (2, 3):
        axes = 0
    else:
        axes = list(range(rank - 1))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=axes, keepdims=rank > 1))


def adaptive_clip(clipping: float = 0.01, eps: float = 1e-3) -> GradientTransformation:
    """Adaptive gradient clipping (AGC), Brock et al. 2021, "High-Performance Large-Scale Image
    Recognition Without Normalization" (NFNets), arXiv:2102.06171.

    Unit-wise: for each output unit ``i`` of a weight ``W`` with gradient ``G``::

        G_i <- G_i * clipping * max(||W_i||, eps) / ||G_i||   if ||G_i|| / max(||W_i||, eps) > clipping

    Unit-wise norms: rank <= 1 leaves use the whole tensor, rank 2/3 (Dense ``(in, out)``) reduce
    over axis 0, rank 4 (Conv ``(h, w, in, out)``) over all but the last axis. Needs ``params`` in
    ``update``. The paper does not clip the final classifier layer; use :func:`masked` for that.

    Args:
        clipping: float > 0, the maximum ratio ``||G_i|| / ||W_i||`` (lambda in the paper).
        eps: float >= 0, floor for ``||W_i||`` so zero-initialised weights can still move.

    >>> w, g = [tf.constant([[3.0], [4.0]])], [tf.constant([[30.0], [40.0]])]
    >>> u, _ = adaptive_clip(0.1).update(g, EmptyState(), params=w)
    >>> u[0].numpy().astype(float).round(3).ravel().tolist()   # ||G|| capped at 0.1 * ||W|| = 0.5
    [0.3, 0.4]
    """
    clipping = number(clipping, "clipping", minimum=0, min_inclusive=False, allow_inf=True)
    eps = nonnegative(eps, "eps")

    def fn(updates, params):
        if params is None:
            raise ValueError("params: adaptive_clip needs the parameters in update(..., params=)")

        def clip(g, p):
            g = _as_tensor(g)
            p_norm = tf.maximum(_unitwise_norm(_as_tensor(p)), eps)
            g_norm = _unitwise_norm(g)
            max_norm = clipping * p_norm
            scale = tf.where(g_norm > max_norm, max_norm / tf.maximum(g_norm, 1e-30), 1.0)
            return g * tf.cast(scale, g.dtype)

        return tf.nest.map_structure(clip, updates, params)

    return _stateless(fn, "adaptive_clip")
