"""Sensitivity analysis of a classifier's input-output map.

How much does the model's output move when its input moves? Five measures, from cheapest to
costliest, all per example:

* :func:`saliency` -- the input gradient of one logit (or of the loss) (Simonyan, Vedaldi &
  Zisserman, *Deep Inside Convolutional Networks*, 2014).
* :func:`smoothgrad` -- the saliency averaged over Gaussian perturbations of the input (Smilkov et
  al., *SmoothGrad: removing noise by adding noise*, 2017).
* :func:`class_jacobian_norms` -- the norm of every class's input gradient, from
  :func:`robustgrad.batch_jacobian` over mini-batches with ``chunk_size`` classes differentiated at
  once, so a 10-class model on a large set runs in bounded memory.
* :func:`jacobian_spectral_norm` -- the largest singular value of the logits' Jacobian
  ``J(x) = d logits / d x`` by power iteration on ``J^T J`` with :func:`robustgrad.jvp` (``J v``)
  and :func:`robustgrad.vjp` (``J^T u``); the Jacobian is never materialised, and ``n`` iterations
  cost about ``2n`` gradient passes.
* :func:`local_lipschitz` -- an empirical local Lipschitz constant: the largest input-gradient
  norm (dual to the ball's norm) of a scalar function of the logits found over the ``eps``-ball by
  PGD (:func:`attacks.projected_gradient_descent` with ``loss_fn``). It is a *lower* bound on the
  true local constant (Yang et al., *A Closer Look at Accuracy vs. Robustness*, NeurIPS 2020, use
  the same estimator).

A model is any callable ``model(x, training=False) -> logits [B, C]``; it is called in inference
mode. Inputs are float ``[B, ...]``; outputs are float32.

Example::

    >>> import keras, tensorflow as tf
    >>> from attacks import sensitivity
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> x = tf.random.stateless_uniform([5, 4], [0, 1])
    >>> sensitivity.saliency(model, x).shape
    TensorShape([5, 4])
    >>> sigma = sensitivity.jacobian_spectral_norm(model, x, num_iters=30, seed=0)
    >>> W = model.layers[0].kernel.numpy()                 # linear: sigma = ||W||_2 everywhere
    >>> import numpy as np
    >>> bool(np.allclose(sigma.numpy(), np.linalg.svd(W, compute_uv=False)[0], rtol=1e-3))
    True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import robustgrad

from .norms import canonical_norm
from .pgd import projected_gradient_descent

__all__ = [
    "saliency",
    "smoothgrad",
    "class_jacobian_norms",
    "jacobian_spectral_norm",
    "local_lipschitz",
    "dual_norm",
]

_DUAL = {"linf": 1, "l2": 2, "l1": np.inf}


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled(model, key, build):
    """One ``tf.function`` per (model, configuration): traced once per input signature and
    reused across calls and batches. ``build(m)`` receives a weak proxy of the model, so the
    cache does not keep the model alive."""
    try:
        per_model = _CACHE.setdefault(model, {})
        proxy = weakref.proxy(model)
    except TypeError:  # not weak-referenceable: compile afresh
        return build(model)
    if key not in per_model:
        per_model[key] = build(proxy)
    return per_model[key]


def _batch_spec(x):
    return tf.TensorSpec([None] + x.shape[1:].as_list(), x.dtype)


def tracing_count(model: Callable) -> int:
    """How many times the compiled functions cached for ``model`` have been traced (tests)."""
    return sum(f.experimental_get_tracing_count() for f in _CACHE.get(model, {}).values())


def dual_norm(g: tf.Tensor, norm: Any = "linf") -> tf.Tensor:
    """Per-example dual norm of ``g [B, ...]`` -> ``[B]``: L1 for an L-inf ball, L2 for L2,
    L-inf for L1 (the Lipschitz constant w.r.t. ``norm`` of a scalar function is the sup of
    the dual norm of its gradient)."""
    norm = canonical_norm(norm)
    flat = tf.reshape(g, [tf.shape(g)[0], -1])
    if norm == "linf":
        return tf.reduce_sum(tf.abs(flat), axis=1)
    if norm == "l2":
        return tf.norm(flat, axis=1)
    return tf.reduce_max(tf.abs(flat), axis=1)


def _check_model_x(model, x):
    if not callable(model):
        raise TypeError(f"model must be callable as model(x, training=False) -> logits, "
                        f"got {type(model).__name__}")
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"x must be a floating tensor, got dtype {x.dtype.name}")
    if x.shape.rank is None or x.shape.rank < 2:
        raise ValueError(f"x must be a batch [B, ...] with at least one feature axis, "
                         f"got shape {x.shape}")
    return tf.cast(x, tf.float32)


def _logits(model, x):
    out = model(x, training=False)
    if not tf.is_tensor(out) or out.shape.rank != 2:
        raise ValueError(f"model must return logits of shape [B, C], got "
                         f"{getattr(out, 'shape', type(out))}")
    return tf.cast(out, tf.float32)


def _labels(model, x, y):
    if y is None:
        return tf.argmax(_logits(model, x), axis=-1)
    y = tf.convert_to_tensor(y)
    if not y.dtype.is_integer or y.shape.rank != 1:
        raise ValueError(f"y must be integer class labels of shape [B], got {y.dtype.name} "
                         f"{y.shape}")
    if y.shape[0] is not None and x.shape[0] is not None and y.shape[0] != x.shape[0]:
        raise ValueError(f"y has {y.shape[0]} labels but x has {x.shape[0]} examples")
    return tf.cast(y, tf.int64)


def _scalar_fn(function):
    """``function`` -> per-example ``f(logits, y) -> [B]``."""
    if callable(function):
        return function
    if function == "logit":
        return lambda z, y: tf.gather(z, y, batch_dims=1)
    if function == "loss":
        return lambda z, y: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z)
    if function == "margin":
        def margin(z, y):
            onehot = tf.one_hot(y, tf.shape(z)[-1], dtype=z.dtype)
            return tf.reduce_sum(onehot * z, -1) - tf.reduce_max(z - 1e9 * onehot, -1)
        return margin
    raise ValueError(f"function must be 'logit', 'loss', 'margin' or a callable "
                     f"f(logits, y) -> [B], got {function!r}")


# --------------------------------------------------------------------------------------------
def saliency(model: Callable, x: Any, y: Any = None, *, function: Any = "logit",
             absolute: bool = False) -> tf.Tensor:
    """Input-gradient saliency ``d f(model(x), y) / d x`` per example.

    Args:
      model: ``model(x, training=False) -> logits [B, C]``.
      x: float ``[B, ...]``.
      y: int labels ``[B]``: the class whose logit is explained; ``None`` uses the prediction.
      function: ``"logit"`` (the class logit, default), ``"loss"`` (cross-entropy at ``y``),
        ``"margin"`` or a callable ``f(logits, y) -> [B]``.
      absolute: return ``|gradient|``.

    Returns float32 ``[B, ...]`` (the shape of ``x``).
    """
    x = _check_model_x(model, x)
    y = _labels(model, x, y)
    f = _scalar_fn(function)
    g = robustgrad.input_gradient(model, x, y, loss=lambda z, yy: f(z, yy))
    return tf.abs(g) if absolute else g


def smoothgrad(model: Callable, x: Any, y: Any = None, *, num_samples: int = 25, noise_level: float = 0.15,
               value_range: float | None = None, function: Any = "logit", absolute: bool = False,
               seed: int = 0) -> tf.Tensor:
    """SmoothGrad (Smilkov et al. 2017): the mean saliency over ``num_samples`` copies of ``x``
    with Gaussian noise of standard deviation ``noise_level * value_range``.

    Args:
      value_range: ``clip_max - clip_min`` of the data (default: ``max(x) - min(x)``).
      seed: noise seed (stateless; same seed, same result).
      Other arguments as :func:`saliency`.

    Returns float32 ``[B, ...]``. Runs as one ``tf.function`` (a ``tf.range`` loop).
    """
    x = _check_model_x(model, x)
    if isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if not float(noise_level) >= 0:
        raise ValueError(f"noise_level must be >= 0, got {noise_level!r}")
    y = _labels(model, x, y)
    if value_range is None:
        value_range = float(tf.reduce_max(x) - tf.reduce_min(x)) or 1.0
    sigma = float(noise_level) * float(value_range)
    f = _scalar_fn(function)

    def build(model):
        @tf.function(input_signature=[_batch_spec(x), tf.TensorSpec([None], tf.int64),
                                      tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)])
        def run(x, y, sigma, seed):
            acc = tf.zeros_like(x)
            for i in tf.range(int(num_samples)):
                noise = tf.random.stateless_normal(tf.shape(x), tf.stack([seed, i]),
                                                   stddev=sigma)
                g = robustgrad.input_gradient(model, x + noise, y, loss=lambda z, yy: f(z, yy))
                acc += tf.abs(g) if absolute else g
            return acc / float(num_samples)
        return run

    run = _compiled(model, ("smoothgrad", int(num_samples), function, bool(absolute),
                            _batch_spec(x)), build)
    return run(x, y, tf.constant(sigma, tf.float32), tf.constant(int(seed), tf.int32))


# --------------------------------------------------------------------------------------------
def class_jacobian_norms(model: Callable, x: Any, *, chunk_size: int | None = None,
                         batch_size: int = 256, norm: Any = "l2") -> tf.Tensor:
    """Per-example, per-class input-gradient norms ``||d logit_c / d x||`` -> float32 ``[N, C]``.

    The logits' Jacobian of each mini-batch of ``batch_size`` examples comes from
    :func:`robustgrad.batch_jacobian` with ``chunk_size`` classes differentiated at once
    (``None``: all), so peak memory is ``O(batch_size * chunk_size * dim(x))`` whatever ``N``.

    Args:
      norm: the ball's norm; the *dual* norm of each gradient row is returned (``"l2"``: L2,
        ``"linf"``: L1, ``"l1"``: L-inf).
    """
    x = _check_model_x(model, x)
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    norm = canonical_norm(norm)

    def build(model):
        # static batch shapes (one trace per distinct block size: the full blocks and the
        # remainder); robustgrad.batch_jacobian's pfor fails on ReLU models with an unknown batch
        @tf.function
        def block(xb):
            jac = robustgrad.batch_jacobian(lambda v: _logits(model, v), xb,
                                            chunk_size=chunk_size)
            b, c = tf.shape(jac)[0], tf.shape(jac)[1]
            rows = tf.reshape(jac, [b * c, -1])
            return tf.reshape(dual_norm(rows, norm), [b, c])
        return block

    block = _compiled(model, ("class_jacobian", chunk_size, norm, _batch_spec(x)), build)

    n = int(x.shape[0])
    return tf.concat([block(x[i:i + int(batch_size)]) for i in range(0, n, int(batch_size))], 0)


# --------------------------------------------------------------------------------------------
def jacobian_spectral_norm(model: Callable, x: Any, *, num_iters: int = 20, seed: int = 0,
                           return_vectors: bool = False) -> tf.Tensor:
    """Largest singular value of each example's logit Jacobian ``J_b = d logits_b / d x_b``.

    Power iteration on ``J^T J``: ``v <- J^T (J v) / ||.||`` with ``J v`` from
    :func:`robustgrad.jvp` and ``J^T u`` from :func:`robustgrad.vjp`, batched (rows are
    independent in inference mode, so one jvp/vjp of the batch does every example). Each
    iteration costs one forward-mode and one reverse-mode pass -- about two gradient passes -- and
    memory ``O(B * dim(x))``; the ``[B, C, dim(x)]`` Jacobian is never formed. The estimate
    ``||J v||`` increases monotonically to sigma_max (from below).

    Args:
      model: ``model(x, training=False) -> logits [B, C]``.
      x: float ``[B, ...]``.
      num_iters: power iterations (>= 1); convergence is geometric in
        ``(sigma_2 / sigma_1)^2``.
      seed: the random start (stateless).
      return_vectors: also return the right singular vectors ``v [B, ...]``.

    Returns float32 ``[B]`` (and ``v``). Runs as one ``tf.function`` (a ``tf.range`` loop).

    Reference: Golub & Van Loan, *Matrix Computations*, sec. 8.2 (power method); used for
    Jacobian regularisation by Yoshida & Miyato, *Spectral Norm Regularization*, 2017.
    """
    x = _check_model_x(model, x)
    if isinstance(num_iters, bool) or int(num_iters) != num_iters or num_iters < 1:
        raise ValueError(f"num_iters must be a positive integer, got {num_iters!r}")
    def normalise(v):
        n = tf.sqrt(tf.reduce_sum(tf.square(tf.reshape(v, [tf.shape(v)[0], -1])), axis=1))
        n = tf.reshape(tf.maximum(n, 1e-30), [-1] + [1] * (v.shape.rank - 1))
        return v / n

    def build(model):
        fn = lambda v: _logits(model, v)  # noqa: E731

        @tf.function(input_signature=[_batch_spec(x), tf.TensorSpec([], tf.int32),
                                      tf.TensorSpec([], tf.int32)])
        def run(x, num_iters, seed):
            v = normalise(tf.random.stateless_normal(tf.shape(x), tf.stack([seed, 7])))
            sigma = tf.zeros([tf.shape(x)[0]])
            for _ in tf.range(num_iters):
                _, jv = robustgrad.jvp(fn, (x,), (v,))                  # J v   [B, C]
                sigma = tf.norm(jv, axis=1)
                _, pullback = robustgrad.vjp(fn, x)
                (jtjv,) = pullback(jv)                                   # J^T J v  [B, ...]
                v = normalise(jtjv)
            _, jv = robustgrad.jvp(fn, (x,), (v,))
            return tf.maximum(sigma, tf.norm(jv, axis=1)), v
        return run

    run = _compiled(model, ("spectral", _batch_spec(x)), build)
    sigma, v = run(x, tf.constant(int(num_iters)), tf.constant(int(seed), tf.int32))
    return (sigma, v) if return_vectors else sigma


# --------------------------------------------------------------------------------------------
def local_lipschitz(model: Callable, x: Any, y: Any = None, *, eps: float, norm: Any = "linf",
                    clip_min: Any = None, clip_max: Any = None, function: Any = "logit", steps: int = 20,
                    restarts: int = 3, step_size: float | None = None, seed: int = 0,
                    return_points: bool = False) -> tf.Tensor:
    """Empirical local Lipschitz constant of ``f(model(x), y)`` over ``B_norm(x, eps)``.

    ``L(x) ~= max_{||x' - x|| <= eps} ||grad_x' f(x')||_*`` (``||.||_*`` the dual norm: L1 for
    ``"linf"``, L2 for ``"l2"``). The maximisation is PGD
    (:func:`attacks.projected_gradient_descent` with ``loss_fn = x' -> ||grad f(x')||_*``,
    ``restarts`` random starts, worst case kept per example) -- a double-backprop objective. For
    piecewise-linear models (ReLU, or a linear model) that gradient norm is piecewise constant and
    its own gradient is zero or absent; PGD reports that and the estimate falls back to PGD *on f
    itself*
    (the gradient norm is then evaluated at its iterates' best point and at ``x``). The result
    is always at least the gradient norm at ``x``, and a lower bound on the true local constant.

    Args:
      model: ``model(x, training=False) -> logits [B, C]``.
      x: float ``[B, ...]``. y: int labels ``[B]`` (``None``: predictions).
      eps, norm, clip_min, clip_max: the ball and the input domain, as for the attacks.
      function: ``"logit"`` (the class-``y`` logit), ``"loss"``, ``"margin"`` or
        ``f(logits, y) -> [B]``.
      steps, restarts, step_size, seed: PGD's settings.
      return_points: also return the maximising points ``[B, ...]`` and the method used.

    Returns float32 ``[B]`` (and ``(points, method)`` with ``return_points``), where ``method``
    is ``"pgd_gradient_norm"`` or ``"pgd_on_function"``.
    """
    x = _check_model_x(model, x)
    y = _labels(model, x, y)
    norm = canonical_norm(norm)
    f = _scalar_fn(function)

    def grad_norm(xa, labels):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(xa)
            value = tf.reduce_sum(tf.cast(f(_logits(model, xa), labels), tf.float32))
        g = tape.gradient(value, xa)
        if g is None:
            raise ValueError("function: f(model(x), y) does not depend on x (no gradient path)")
        return dual_norm(g, norm)

    center = grad_norm(x, y)
    common = dict(eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max, steps=steps,
                  restarts=restarts, step_size=step_size, seed=seed)

    # PGD's loss_fn sees only x' (its eager probe passes the first rows): bind the labels.
    def objective(xa):
        return grad_norm(xa, y[: tf.shape(xa)[0]])

    def on_function(xa):
        return tf.cast(f(_logits(model, xa), y[: tf.shape(xa)[0]]), tf.float32)

    method = "pgd_gradient_norm"
    try:
        points = projected_gradient_descent(None, x, loss_fn=objective, **common)
    except ValueError as exc:
        # the gradient norm is constant (linear model: no gradient path) or piecewise constant
        # (ReLU): PGD cannot ascend it. f itself depends on x (checked by grad_norm above).
        if "piecewise constant" not in str(exc) and "does not depend" not in str(exc):
            raise
        method = "pgd_on_function"
        points = projected_gradient_descent(None, x, loss_fn=on_function, **common)
    value = tf.maximum(center, grad_norm(tf.cast(points, tf.float32), y))
    return (value, (points, method)) if return_points else value
