"""Derivative-based regularisers: loss terms to add inside a ``tf.GradientTape``.

Each function is pure, returns a float32 scalar and is differentiable (second order) with respect to
the model's variables: the inner derivative is taken with a nested tape that the caller's tape
records, so ``outer_tape.gradient(loss + lam * penalty, model.trainable_variables)`` works::

    >>> import keras, tensorflow as tf
    >>> from robustgrad import regularizers as R
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> x, y = tf.ones((2, 4)), tf.constant([0, 2])
    >>> with tf.GradientTape() as tape:
    ...     penalty = R.input_gradient_penalty(model, x, y)
    >>> grads = tape.gradient(penalty, model.trainable_variables)
    >>> penalty.dtype, all(g is not None for g in grads)
    (tf.float32, True)

A model is any callable ``model(x, training=False) -> logits`` of shape ``[B, C]`` (a Keras model is
one). Per-example rows must be independent (no batch statistics in the chosen ``training`` mode):
the batch sum is differentiated, so each row of the input gradient is that example's own gradient.

Randomness (``jacobian_penalty``, ``gradient_penalty``): ``seed`` may be an int (or a shape-[2]
int tensor, e.g. ``[seed, step]``) for ``tf.random.stateless_*`` -- the same seed gives the same
draw every call, so vary it with the step -- or a ``tf.random.Generator`` (fresh draws per call), or
None (TF's global RNG).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import choice, nonnegative, norm_name, number, positive_int

__all__ = [
    "crossentropy",
    "curvature_penalty",
    "gradient_penalty",
    "input_gradient_penalty",
    "jacobian_penalty",
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def crossentropy(logits: Any, y: Any) -> tf.Tensor:
    """Per-example softmax cross-entropy ``[B]`` from logits ``[B, C]`` and labels.

    ``y`` is either integer class ids ``[B]`` or a float distribution (one-hot) ``[B, C]``. Written
    with ``log_softmax`` so that it has second derivatives (TF's fused sparse op does not).
    """
    logits = tf.cast(logits, tf.float32)
    log_p = tf.nn.log_softmax(logits, axis=-1)
    y = tf.convert_to_tensor(y)
    if y.dtype.is_integer:
        if y.shape.rank is not None and logits.shape.rank is not None \
                and y.shape.rank != logits.shape.rank - 1:
            raise ValueError(f"y: integer labels must have shape [B], got {y.shape} "
                             f"for logits {logits.shape}")
        onehot = tf.one_hot(y, tf.shape(logits)[-1], dtype=tf.float32)
    elif y.dtype.is_floating:
        if y.shape.rank is not None and y.shape.rank != logits.shape.rank:
            raise ValueError(f"y: float labels must be [B, C] like the logits, got {y.shape}")
        onehot = tf.cast(y, tf.float32)
    else:
        raise TypeError(f"y: expected integer labels or float one-hot, got {y.dtype.name}")
    return -tf.reduce_sum(onehot * log_p, axis=-1)


def _resolve_loss(loss):
    if loss == "crossentropy" or loss == "ce":
        return crossentropy
    if callable(loss):
        return loss
    raise ValueError(f"loss must be 'crossentropy' or a callable loss(logits, y) -> [B], "
                     f"got {loss!r}")


def _float_input(x, name):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"{name} must be a float tensor, got dtype {x.dtype.name}")
    if x.shape.rank is not None and x.shape.rank < 1:
        raise ValueError(f"{name} must have a batch dimension, got shape {x.shape}")
    return x


def _call(model, x, training):
    out = model(x, training=training)
    out = tf.convert_to_tensor(out)
    return tf.cast(out, tf.float32) if out.dtype != tf.float32 else out


def _per_example_losses(loss_fn, logits, y):
    losses = tf.convert_to_tensor(loss_fn(logits, y))
    if losses.shape.rank is not None and losses.shape.rank != 1:
        raise ValueError(f"loss must return per-example losses of shape [B], got shape "
                         f"{losses.shape} (do not average over the batch)")
    return tf.cast(losses, tf.float32)


def _input_grad(model, x, y, loss_fn, training):
    """d sum_i loss_i / d x (rows = per-example gradients), recorded by any outer tape."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = _call(model, x, training)
        total = tf.reduce_sum(_per_example_losses(loss_fn, logits, y))
    g = tape.gradient(total, x)
    if g is None:
        raise ValueError("x: the model's output does not depend on x (gradient is None)")
    return g


def _flat_rows(g):
    return tf.reshape(tf.cast(g, tf.float32), [tf.shape(g)[0], -1])


_NORM_ORDER = {"l1": 1, "l2": 2, "linf": np.inf}


def _row_norm_sq(rows, norm):
    if norm == 2:
        return tf.reduce_sum(tf.square(rows), axis=1)
    if norm == 1:
        return tf.square(tf.reduce_sum(tf.abs(rows), axis=1))
    return tf.square(tf.reduce_max(tf.abs(rows), axis=1))


def _check_seed(seed):
    if seed is None or isinstance(seed, tf.random.Generator):
        return seed
    if isinstance(seed, bool):
        raise TypeError("seed must be an int, a shape-[2] int tensor, a tf.random.Generator or "
                        "None")
    if isinstance(seed, numbers.Integral):
        return seed
    t = tf.convert_to_tensor(seed)
    if not t.dtype.is_integer:
        raise TypeError(f"seed must be an int, a shape-[2] int tensor, a tf.random.Generator or "
                        f"None, got dtype {t.dtype.name}")
    return t


def _stateless_seed(seed, salt):
    if isinstance(seed, numbers.Integral):
        return tf.constant([int(seed), int(salt)], tf.int64)
    seed = tf.cast(tf.reshape(seed, [-1]), tf.int64)
    if seed.shape[0] == 1:
        return tf.concat([seed, [salt]], 0)
    return seed + tf.constant([0, salt], tf.int64) * 7919


def _normal(shape, seed, salt):
    if seed is None:
        return tf.random.normal(shape)
    if isinstance(seed, tf.random.Generator):
        return seed.normal(shape)
    return tf.random.stateless_normal(shape, seed=_stateless_seed(seed, salt))


def _uniform(shape, seed, salt):
    if seed is None:
        return tf.random.uniform(shape)
    if isinstance(seed, tf.random.Generator):
        return seed.uniform(shape)
    return tf.random.stateless_uniform(shape, seed=_stateless_seed(seed, salt))


# --------------------------------------------------------------------------------------------
# regularisers
# --------------------------------------------------------------------------------------------


def input_gradient_penalty(model: Callable, x: Any, y: Any, loss: str | Callable = "crossentropy",
                           norm: Any = 2, training: bool = False) -> tf.Tensor:
    """Double backpropagation: the mean squared norm of the loss's input gradient.

    Drucker & LeCun 1992, "Improving generalization performance using double backpropagation";
    Ross & Doshi-Velez 2018, "Improving the Adversarial Robustness and Interpretability of Deep
    Neural Networks by Regularizing their Input Gradients" (AAAI).

    ``penalty = mean_i ||d loss_i / d x_i||_norm ** 2`` -- ``norm=2`` is classic double backprop;
    ``norm=1`` (the dual of L-infinity) targets L-infinity robustness.

    Args:
        model: callable ``model(x, training=...) -> logits [B, C]``.
        x: float tensor ``[B, ...]``.
        y: labels for ``loss`` (integer ``[B]`` or one-hot ``[B, C]`` for cross-entropy).
        loss: ``"crossentropy"`` or a callable ``loss(logits, y) -> per-example losses [B]``.
        norm: 1, 2 or ``np.inf`` (or a name: ``"l1"``, ``"l2"``, ``"linf"``).
        training: passed to the model.

    Returns: float32 scalar, differentiable w.r.t. the model's variables.

    For a linear model ``logits = x @ W`` with cross-entropy the input gradient of example i is
    ``W @ (softmax(x_i W) - onehot(y_i))``.
    """
    norm = _NORM_ORDER[norm_name(norm)]
    loss_fn = _resolve_loss(loss)
    x = _float_input(x, "x")
    g = _input_grad(model, x, y, loss_fn, training)
    return tf.reduce_mean(_row_norm_sq(_flat_rows(g), norm))


def jacobian_penalty(model: Callable, x: Any, num_projections: int = 1, seed: Any = None,
                     training: bool = False) -> tf.Tensor:
    """Random-projection estimate of the mean squared Frobenius norm of the input-output Jacobian.

    Hoffman, Roberts & Yaida 2019, "Robust Learning with Jacobian Regularization",
    arXiv:1908.02729. For each example, with ``v`` uniform on the unit sphere of the output space
    (``C`` logits), ``C * ||v^T J||^2`` is an unbiased estimate of ``||J||_F^2``; the estimate is
    averaged over ``num_projections`` draws and over the batch (one vector-Jacobian product per
    projection, no full Jacobian).

    Args:
        model: callable ``model(x, training=...) -> outputs [B, C]`` (or ``[B, ...]``).
        x: float tensor ``[B, ...]``.
        num_projections: int >= 1.
        seed: int / shape-[2] int tensor (stateless), ``tf.random.Generator``, or None.
        training: passed to the model.

    Returns: float32 scalar estimate of ``mean_i ||d f(x_i) / d x_i||_F^2``.
    """
    num_projections = positive_int(num_projections, "num_projections")
    seed = _check_seed(seed)
    x = _float_input(x, "x")
    with tf.GradientTape(persistent=num_projections > 1) as tape:
        tape.watch(x)
        out = _call(model, x, training)
        if out.shape.rank is not None and out.shape.rank < 2:
            raise ValueError(f"model output must be [B, C, ...], got shape {out.shape}")
        flat_out = tf.reshape(out, [tf.shape(out)[0], -1])
        projections = []
        for p in range(num_projections):
            v = _normal(tf.shape(flat_out), seed, p)
            v = tf.stop_gradient(v / tf.norm(v, axis=1, keepdims=True))
            projections.append(tf.reduce_sum(flat_out * v))
    c = tf.cast(tf.shape(flat_out)[1], tf.float32)
    total = 0.0
    for proj in projections:
        g = tape.gradient(proj, x)
        if g is None:
            raise ValueError("x: the model's output does not depend on x (gradient is None)")
        total += tf.reduce_sum(tf.square(_flat_rows(g)), axis=1)
    del tape
    return tf.reduce_mean(c * total / float(num_projections))


def gradient_penalty(critic: Callable, real: Any, fake: Any, seed: Any = None,
                     target: float = 1.0, training: bool = False) -> tf.Tensor:
    """WGAN-GP gradient penalty, Gulrajani et al. 2017, "Improved Training of Wasserstein GANs",
    arXiv:1704.00028.

    ``x_hat = e * real + (1 - e) * fake`` with ``e ~ U[0, 1]`` per example;
    ``penalty = mean_i (||d critic(x_hat_i) / d x_hat_i||_2 - target)^2``. The norm uses a safe
    square root, so the penalty stays differentiable where the gradient is zero.

    Args:
        critic: callable ``critic(x, training=...) -> scores [B]`` or ``[B, 1]``.
        real, fake: float tensors of the same shape ``[B, ...]`` (``fake`` is usually the
            generator's output; gradients reach the generator through it).
        seed: int / shape-[2] int tensor (stateless), ``tf.random.Generator``, or None.
        target: float >= 0, the target norm (1 in the paper).
        training: passed to the critic.

    Returns: float32 scalar.
    """
    target = nonnegative(target, "target")
    seed = _check_seed(seed)
    real = _float_input(real, "real")
    fake = _float_input(fake, "fake")
    if real.shape.is_fully_defined() and fake.shape.is_fully_defined() \
            and real.shape != fake.shape:
        raise ValueError(f"fake has shape {fake.shape} but real has shape {real.shape}")
    if real.dtype != fake.dtype:
        raise TypeError(f"fake has dtype {fake.dtype.name} but real has {real.dtype.name}")
    rank = real.shape.rank
    e_shape = tf.concat([tf.shape(real)[:1], tf.ones([rank - 1], tf.int32)], 0)
    e = tf.cast(_uniform(e_shape, seed, 0), real.dtype)
    x_hat = e * real + (1.0 - e) * fake
    with tf.GradientTape() as tape:
        tape.watch(x_hat)
        scores = _call(critic, x_hat, training)
        total = tf.reduce_sum(scores)
    g = tape.gradient(total, x_hat)
    if g is None:
        raise ValueError("real: the critic's output does not depend on its input")
    sq = tf.reduce_sum(tf.square(_flat_rows(g)), axis=1)
    norm = tf.sqrt(tf.maximum(sq, 1e-12))
    return tf.reduce_mean(tf.square(norm - float(target)))


def curvature_penalty(model: Callable, x: Any, y: Any, h: float = 0.5,
                      loss: str | Callable = "crossentropy", direction: str = "sign",
                      training: bool = False) -> tf.Tensor:
    """CURE curvature regulariser, Moosavi-Dezfooli et al. 2019, "Robustness via curvature
    regularization, and vice versa" (CVPR), arXiv:1811.09716.

    A finite-difference Hessian-vector product along the (fixed, stop-gradient) direction ``z`` of
    the input gradient::

        z_i = d_i / ||d_i||_2,  d = sign(grad) (direction="sign", the paper) or grad ("normalized")
        penalty = mean_i || grad loss(x_i + h z_i) - grad loss(x_i) ||_2^2   (~ h^2 ||H z||^2)

    Both input gradients are recorded by the caller's tape, so the penalty is differentiable
    w.r.t. the model's variables (second order). ``h`` is in the units of ``x`` (L2 length of the
    step); the paper uses 1.5 on CIFAR-10 pixels in [0, 255]-like scale -- choose it near your
    attack budget.

    Args:
        model: callable ``model(x, training=...) -> logits [B, C]``.
        x: float tensor ``[B, ...]``.
        y: labels for ``loss``.
        h: float > 0, finite-difference step length.
        loss: ``"crossentropy"`` or a callable ``loss(logits, y) -> [B]``.
        direction: ``"sign"`` or ``"normalized"``.
        training: passed to the model.

    Returns: float32 scalar.
    """
    h = number(h, "h", minimum=0, min_inclusive=False)
    choice(direction, "direction", ("sign", "normalized"))
    loss_fn = _resolve_loss(loss)
    x = _float_input(x, "x")
    g0 = _input_grad(model, x, y, loss_fn, training)
    d = tf.stop_gradient(tf.sign(g0) if direction == "sign" else g0)
    rows = _flat_rows(d)
    row_norm = tf.norm(rows, axis=1)
    inv = tf.where(row_norm > 0, 1.0 / tf.maximum(row_norm, 1e-30), 0.0)
    z = tf.reshape(rows * inv[:, None], tf.shape(x))
    x_h = x + tf.cast(h * z, x.dtype)
    g1 = _input_grad(model, x_h, y, loss_fn, training)
    diff = _flat_rows(g1) - _flat_rows(g0)
    return tf.reduce_mean(tf.reduce_sum(tf.square(diff), axis=1))
