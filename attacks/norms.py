"""Threat models: norm balls, exact projections and steepest-ascent directions.

Every function works per example on a batch ``[B, ...]``: norms are taken over all
non-batch axes. Three norms are supported, named ``"linf"``, ``"l2"`` and ``"l1"``
(``np.inf``, ``2`` and ``1`` are accepted too, see :func:`canonical_norm`).

* :func:`project` — exact Euclidean projection of a perturbation onto the ball of
  radius ``eps``; the L1 projection is the sorting algorithm of Duchi, Shalev-Shwartz,
  Singer and Chandra, "Efficient projections onto the l1-ball for learning in high
  dimensions", ICML 2008 (O(D log D) per example).
* :func:`project_l1_box` — exact Euclidean projection onto the intersection of the L1 ball and
  the box (Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image
  classifiers", ICML 2021, Sec. 3), the projection of APGD-L1.
* :func:`steepest_ascent` — the unit-norm direction ``d`` maximising ``<g, d>``:
  ``sign(g)`` for L∞, ``g / ||g||_2`` for L2, and for L1 the sparse direction that
  puts all mass on the largest ``|g_i|`` (ties share it), optionally spread over the
  top-k coordinates as in SLIDE (Tramèr & Boneh 2019) for iterative attacks.
* :func:`random_in_ball` — a uniform sample from the ball (random starts).
* :func:`clip_to_bounds` — the box ``[clip_min, clip_max]`` (scalars or per feature).

Clipping a point of the ball around an in-bounds ``x`` into the box never leaves the
ball (each coordinate only moves toward ``x``), so ``project`` then ``clip_to_bounds``
keeps both constraints.

>>> import tensorflow as tf
>>> d = project(tf.constant([[3.0, -4.0]]), 1.0, "l2")
>>> [round(float(v), 3) for v in d[0]]
[0.6, -0.8]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import NORMS, norm_name

__all__ = [
    "NORMS",
    "canonical_norm",
    "norm",
    "project",
    "project_l1",
    "project_l1_box",
    "steepest_ascent",
    "random_in_ball",
    "clip_to_bounds",
]

_TINY = 1e-12


def canonical_norm(norm: Any) -> str:
    """``"linf"``, ``"l2"`` or ``"l1"`` for any accepted spelling; ``ValueError`` otherwise.

    The project's one norm-name check, :func:`robustgrad.checks.norm_name`: the strings
    ``linf``/``l_inf``/``inf``/``l∞``, ``l2``/``2``/``l_2``, ``l1``/``1``/``l_1`` (any case),
    ``np.inf``/``float("inf")``, ``2`` and ``1``.

    >>> canonical_norm("L_inf"), canonical_norm(2), canonical_norm(1.0)
    ('linf', 'l2', 'l1')
    """
    return norm_name(norm)


def _flat(x):
    feat = x.shape[1:]
    if feat.is_fully_defined():
        return tf.reshape(x, [-1, int(np.prod(feat.as_list(), dtype=np.int64))])
    return tf.reshape(x, [tf.shape(x)[0], -1])


def _bcast(v, x):
    """A per-example [B] vector (or scalar) reshaped to broadcast against ``x``."""
    v = tf.convert_to_tensor(v, dtype=x.dtype)
    if v.shape.rank == 0:
        return v
    return tf.reshape(v, tf.concat([tf.shape(v), tf.ones([tf.rank(x) - 1], tf.int32)], 0))


def norm(delta: tf.Tensor, norm: Any = "linf") -> tf.Tensor:
    """Per-example norm of ``delta`` over its non-batch axes, shape ``[B]``."""
    n = canonical_norm(norm)
    f = _flat(delta)
    if n == "linf":
        return tf.reduce_max(tf.abs(f), axis=1)
    if n == "l2":
        return tf.sqrt(tf.reduce_sum(tf.square(f), axis=1))
    return tf.reduce_sum(tf.abs(f), axis=1)


def project_l1(delta: tf.Tensor, eps: Any) -> tf.Tensor:
    """Exact Euclidean projection of each row of ``delta`` onto the L1 ball of radius ``eps``.

    Duchi et al. 2008, Fig. 1: sort ``|v|`` decreasingly, find the largest ``rho`` with
    ``u_rho > (sum_{i<=rho} u_i - eps) / rho``, soft-threshold by ``theta``. Rows already
    inside the ball are returned unchanged. ``eps`` is a scalar or a ``[B]`` vector.
    """
    delta = tf.convert_to_tensor(delta)
    shape = tf.shape(delta)
    v = _flat(delta)
    eps = tf.convert_to_tensor(eps, dtype=v.dtype)
    eps_col = tf.reshape(eps, [-1, 1]) if eps.shape.rank else eps
    a = tf.abs(v)
    u = tf.sort(a, axis=1, direction="DESCENDING")
    css = tf.cumsum(u, axis=1)
    k = tf.cast(tf.range(1, tf.shape(v)[1] + 1), v.dtype)[None, :]
    cond = u * k > (css - eps_col)
    rho = tf.reduce_sum(tf.cast(cond, tf.int32), axis=1)  # >= 1 when eps >= 0
    rho = tf.maximum(rho, 1)
    css_rho = tf.gather(css, rho - 1, batch_dims=1)
    theta = (css_rho - tf.reshape(eps_col, [-1]) * tf.ones_like(css_rho)) / tf.cast(rho, v.dtype)
    theta = tf.maximum(theta, 0.0)
    w = tf.sign(v) * tf.maximum(a - theta[:, None], 0.0)
    inside = tf.reduce_sum(a, axis=1, keepdims=True) <= eps_col
    w = tf.where(inside, v, w)
    return tf.reshape(w, shape)


def project_l1_box(delta: tf.Tensor, eps: Any, lower: Any, upper: Any) -> tf.Tensor:
    """Exact Euclidean projection of each row of ``delta`` onto ``{d : ||d||_1 <= eps,
    lower <= d <= upper}`` (the L1 ball intersected with a box that contains 0).

    ``delta [B, ...]``; ``eps`` a scalar or ``[B]``; ``lower <= 0 <= upper`` broadcasting to
    ``delta`` (for an input ``x`` in ``[clip_min, clip_max]``: ``clip_min - x`` and
    ``clip_max - x``). The optimality conditions give ``d_i = sign(v_i) min((|v_i| - lam)^+,
    c_i)`` with ``c_i`` the room to the bound on the side of ``v_i``'s sign and the smallest
    ``lam >= 0`` that meets the budget (Croce & Hein 2021, Sec. 3); the budget used by a
    ``lam`` is piecewise linear in it, with breakpoints ``(|v_i| - c_i)^+`` and ``|v_i|``:
    sort them, evaluate, solve on the right piece (O(D log D) per row). Rows whose clip into
    the box is inside the ball are that clip. A last rescaling absorbs float rounding so the
    result never exceeds ``eps``.

    >>> d = project_l1_box(tf.constant([[0.8, -0.6, 0.1]]), 0.5, -0.2, 1.0)
    >>> [round(float(v), 3) for v in d[0]]  # lam = 0.45; the box held the second at -0.2 first
    [0.35, -0.15, 0.0]
    """
    delta = tf.convert_to_tensor(delta)
    shape = tf.shape(delta)
    v = tf.cast(_flat(delta), tf.float64)  # cumulative sums over 2D breakpoints: float64
    dt = v.dtype
    b = tf.shape(v)[0]
    lower = _flat(tf.broadcast_to(tf.cast(lower, dt), shape))
    upper = _flat(tf.broadcast_to(tf.cast(upper, dt), shape))
    lower = tf.minimum(lower, 0.0)  # the box contains 0 (float rounding of clip_min - x)
    upper = tf.maximum(upper, 0.0)
    eps = tf.cast(eps, dt)
    eps_row = tf.broadcast_to(tf.reshape(eps, [-1]), [b]) if eps.shape.rank else tf.fill([b], eps)
    a = tf.abs(v)
    cap = tf.maximum(tf.where(v >= 0, upper, -lower), 0.0)
    clipped = tf.minimum(a, cap)
    used = tf.reduce_sum(clipped, axis=1)
    starts = tf.maximum(a - cap, 0.0)  # a coordinate starts to shrink here ...
    points = tf.concat([starts, a], axis=1)  # ... and reaches 0 here
    change = tf.concat([-tf.ones_like(a), tf.ones_like(a)], axis=1)
    order = tf.argsort(points, axis=1, stable=True)
    q = tf.gather(points, order, batch_dims=1)
    slope = tf.cumsum(tf.gather(change, order, batch_dims=1), axis=1)  # on (q_k, q_{k+1})
    widths = tf.concat([q[:, 1:] - q[:, :-1], tf.zeros_like(q[:, :1])], axis=1)
    at_q = used[:, None] + tf.cumsum(slope * widths, axis=1, exclusive=True)  # budget at q_k
    k = tf.reduce_sum(tf.cast(at_q > eps_row[:, None], tf.int32), axis=1)  # first q_k within
    k = tf.clip_by_value(k, 1, 2 * tf.shape(a)[1] - 1) - 1
    lam = tf.gather(q, k, batch_dims=1) + (tf.gather(at_q, k, batch_dims=1) - eps_row) / \
        tf.maximum(-tf.gather(slope, k, batch_dims=1), 1.0)
    lam = tf.where(used > eps_row, tf.maximum(lam, 0.0), tf.zeros_like(lam))
    d = tf.sign(v) * tf.minimum(tf.maximum(a - lam[:, None], 0.0), cap)
    total = tf.reduce_sum(tf.abs(d), axis=1)
    d = d * tf.minimum(tf.constant(1.0, dt), eps_row / tf.maximum(total, _TINY))[:, None]
    # rounding to the input dtype may add an ulp: the exact sum of the rounded values stays
    # within eps (shrunk by a relative 1e-7 where it would not)
    total = tf.reduce_sum(tf.abs(tf.cast(tf.cast(d, delta.dtype), dt)), axis=1)
    scale = tf.where(total > eps_row, eps_row / tf.maximum(total, _TINY) * (1.0 - 1e-7),
                     tf.ones_like(total))
    return tf.reshape(tf.cast(d * scale[:, None], delta.dtype), shape)


def project(delta: tf.Tensor, eps: Any, norm: Any = "linf") -> tf.Tensor:
    """Euclidean projection of ``delta`` onto the ``norm`` ball of radius ``eps`` (scalar or [B])."""
    n = canonical_norm(norm)
    delta = tf.convert_to_tensor(delta)
    if n == "linf":
        e = _bcast(eps, delta)
        return tf.clip_by_value(delta, -e, e)
    if n == "l2":
        nrm = tf.sqrt(tf.reduce_sum(tf.square(_flat(delta)), axis=1))
        eps_t = tf.convert_to_tensor(eps, dtype=delta.dtype)
        factor = tf.minimum(tf.ones_like(nrm), eps_t / tf.maximum(nrm, _TINY))
        return delta * _bcast(factor, delta)
    return project_l1(delta, eps)


def steepest_ascent(grad: tf.Tensor, norm: Any = "linf", l1_top_k: Any = None) -> tf.Tensor:
    """The unit-norm direction ``d`` (``||d|| = 1``) that maximises ``<grad, d>``.

    ``linf``: ``sign(g)``. ``l2``: ``g / ||g||_2`` (zero where ``g`` is zero). ``l1``: with
    ``l1_top_k=None`` the exact maximiser — all mass on the coordinates of largest
    ``|g_i|``, shared equally between ties; with an integer ``k`` (or a fraction in (0, 1)
    of the dimension), ``sign(g)`` on the ``k`` largest ``|g_i|`` divided by ``k`` (the
    SLIDE direction, which moves faster in iterative attacks).
    """
    n = canonical_norm(norm)
    g = tf.convert_to_tensor(grad)
    if n == "linf":
        return tf.sign(g)
    f = _flat(g)
    if n == "l2":
        nrm = tf.sqrt(tf.reduce_sum(tf.square(f), axis=1))
        return g / _bcast(tf.maximum(nrm, _TINY), g)
    a = tf.abs(f)
    dim = f.shape[1] if f.shape[1] is not None else None
    if l1_top_k is None:
        mx = tf.reduce_max(a, axis=1, keepdims=True)
        sel = tf.cast(tf.logical_and(a >= mx, mx > 0), f.dtype)
    else:
        if isinstance(l1_top_k, float) and 0 < l1_top_k < 1:
            if dim is None:
                raise ValueError("l1_top_k as a fraction needs a static input dimension")
            k = max(1, int(math.ceil(l1_top_k * dim)))
        else:
            k = int(l1_top_k)
            if k < 1:
                raise ValueError(f"l1_top_k must be >= 1 or a fraction in (0, 1); got {l1_top_k}")
        if dim is not None:
            k = min(k, dim)
        kth = tf.math.top_k(a, k=k).values[:, -1:]
        sel = tf.cast(tf.logical_and(a >= kth, a > 0), f.dtype)
    cnt = tf.maximum(tf.reduce_sum(sel, axis=1, keepdims=True), 1.0)
    d = tf.sign(f) * sel / cnt
    return tf.reshape(d, tf.shape(g))


def random_in_ball(shape: Any, eps: Any, norm: Any = "linf", seed: Any = None,
                   dtype: Any = tf.float32) -> tf.Tensor:
    """A uniform sample from the ``norm`` ball of radius ``eps`` (scalar or [B]), per example.

    ``seed`` is a stateless seed (shape ``[2]`` int tensor, or an int); the same seed gives
    the same sample. L2: Gaussian direction times ``U^(1/D)``; L1: random signs times a
    normalised exponential vector times ``U^(1/D)`` (exactly uniform in the ball).
    """
    n = canonical_norm(norm)
    if seed is None:
        seed = tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32)
    elif isinstance(seed, int):
        seed = tf.constant([seed, 0], tf.int32)
    seed = tf.cast(seed, tf.int32)
    s1, s2, s3 = (tf.random.experimental.stateless_fold_in(seed, i) for i in range(3))
    shape = tf.convert_to_tensor(shape, tf.int32)
    if n == "linf":
        u = tf.random.stateless_uniform(shape, s1, minval=-1.0, maxval=1.0, dtype=dtype)
        return u * _bcast(eps, u)
    b = shape[0]
    dim = tf.reduce_prod(shape[1:])
    r = tf.random.stateless_uniform([b], s2, dtype=dtype) ** (1.0 / tf.cast(dim, dtype))
    if n == "l2":
        z = tf.random.stateless_normal([b, dim], s1, dtype=dtype)
        z = z / tf.maximum(tf.norm(z, axis=1, keepdims=True), _TINY)
    else:
        e = -tf.math.log(tf.random.stateless_uniform([b, dim], s1, minval=1e-12, maxval=1.0,
                                                     dtype=dtype))
        sgn = tf.sign(tf.random.stateless_uniform([b, dim], s3, minval=-1.0, maxval=1.0,
                                                  dtype=dtype))
        z = sgn * e / tf.reduce_sum(e, axis=1, keepdims=True)
    eps_t = tf.convert_to_tensor(eps, dtype)
    z = z * tf.reshape(r * eps_t, [-1, 1])
    return tf.reshape(z, shape)


def clip_to_bounds(x: Any, clip_min: Any, clip_max: Any) -> tf.Tensor:
    """``x`` clipped into ``[clip_min, clip_max]`` (scalars or arrays broadcasting to ``x``)."""
    x = tf.convert_to_tensor(x)
    lo = tf.cast(clip_min, x.dtype)
    hi = tf.cast(clip_max, x.dtype)
    return tf.minimum(tf.maximum(x, lo), hi)
