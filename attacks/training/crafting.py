"""Crafting for adversarial training: the attack engine called inside a training graph.

Adversarial training crafts inside ``train_step`` (already a ``tf.function``), so it cannot use
the public attacks, which validate their arguments eagerly. :func:`ascend` calls the same
compiled loop they use (:func:`attacks._engine.iterative_loop`) without validation;
:func:`robust_correct` and :func:`robust_accuracy` measure accuracy under PGD with it (Madry et
al., "Towards Deep Learning Models Resistant to Adversarial Attacks", ICLR 2018). The losses the
training methods share (:func:`cross_entropy`, :func:`kl_to_logits`, :func:`accuracy`) live here.

Shapes: ``x`` float32 ``[B, ...]``, labels ``y`` int32 ``[B]``, logits ``[B, C]``.

>>> import tensorflow as tf
>>> w = tf.constant([[1.0, -1.0], [-2.0, 2.0]])
>>> logits_fn = lambda z: z @ w
>>> x, y = tf.constant([[0.5, 0.5]]), tf.constant([1])
>>> x_adv = ascend(logits_fn, lambda z: cross_entropy(z, y), x, eps=0.1, step_size=0.05,
...                steps=3, norm="linf", clip_min=0.0, clip_max=1.0, seed=[0, 0], start="none")
>>> [round(float(v), 3) for v in x_adv[0]]
[0.6, 0.4]
>>> robust_correct(logits_fn, x, y, eps=0.1, norm="linf", clip_min=0.0, clip_max=1.0,
...                steps=5).numpy().tolist()
[1.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from .._engine import iterative_loop
from .._validate import MAX_RESTARTS, MAX_STEPS, check_eps, check_positive_int
from ..norms import canonical_norm

__all__ = ["accuracy", "ascend", "cross_entropy", "inference_logits", "kl_to_logits",
           "robust_accuracy", "robust_correct"]

LogitsFn = Callable[[tf.Tensor], tf.Tensor]


def cross_entropy(logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """Per-example softmax cross-entropy ``[B]`` of ``logits [B, C]`` at int labels ``y [B]``."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def kl_to_logits(p: tf.Tensor, logits_q: tf.Tensor) -> tf.Tensor:
    """``KL(p || softmax(logits_q))`` per example ``[B]``; ``p [B, C]`` probabilities."""
    logq = tf.nn.log_softmax(logits_q)
    return tf.reduce_sum(p * (tf.math.log(tf.maximum(p, 1e-12)) - logq), axis=-1)


def accuracy(logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """Fraction (float32 scalar) of rows whose arg-max logit is the int32 label ``y``."""
    return tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
                                  tf.float32))


def ascend(logits_fn: LogitsFn, objective: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor, *,
           eps: Any, step_size: Any, steps: int, norm: str, clip_min: float, clip_max: float,
           seed: Any, start: str | Callable = "uniform", restarts: int = 1,
           labels: tf.Tensor | None = None) -> tf.Tensor:
    """``steps`` steps of projected steepest ascent on ``objective(logits_fn(x_adv)) [B]``.

    The engine's loop, no validation (callable inside a ``tf.function``): ``norm`` canonical,
    ``steps``/``restarts`` Python ints, ``eps``/``step_size`` scalars (tensors allowed),
    ``clip_min``/``clip_max`` scalars, ``seed`` a stateless ``[2]`` seed. ``start`` is
    ``"uniform"`` (a uniform point of the ball), ``"none"`` (``x``) or ``start(x, seed) ->
    x0``. With ``labels`` (int ``[B]``) and several restarts the worst case per example is kept
    (misclassified first, then the higher objective). Returns ``x_adv`` like ``x``, under
    ``tf.stop_gradient``.
    """
    def value_fn(xa, y_, y_true_):
        logits = logits_fn(xa)
        value = tf.cast(objective(logits), xa.dtype)
        if labels is None:
            return value, tf.zeros([tf.shape(xa)[0]], tf.bool)
        pred = tf.argmax(logits, axis=-1, output_type=labels.dtype)
        return value, tf.not_equal(pred, labels)

    loop = iterative_loop(value_fn, norm=norm, steps=int(steps), restarts=int(restarts),
                          rand_init=start == "uniform", init=start if callable(start) else None)
    dtype = x.dtype
    unused = tf.zeros([tf.shape(x)[0]], tf.int64)
    x_adv, _, _ = loop(x, unused, unused, tf.cast(eps, dtype), tf.cast(step_size, dtype),
                       tf.constant(clip_min, dtype), tf.constant(clip_max, dtype),
                       tf.cast(seed, tf.int32))
    return tf.stop_gradient(x_adv)


def robust_correct(logits_fn: LogitsFn, x: tf.Tensor, y: tf.Tensor, *, eps: Any, norm: str,
                   clip_min: float, clip_max: float, steps: int, restarts: int = 1,
                   seed: Any = (17, 0)) -> tf.Tensor:
    """Per example 1.0/0.0 (float32 ``[B]``): correct on ``x`` and still correct under
    PGD-``steps`` (step ``2.5 eps / steps``, uniform random starts, worst case over
    ``restarts``). Graph-safe: call it inside a ``tf.function``."""
    y = tf.cast(y, tf.int32)
    eps = tf.cast(eps, tf.float32)
    clean_ok = tf.equal(tf.argmax(logits_fn(x), -1, output_type=tf.int32), y)
    x_adv = ascend(logits_fn, lambda z: cross_entropy(z, y), x, eps=eps,
                   step_size=2.5 * eps / float(max(steps, 1)), steps=steps, norm=norm,
                   clip_min=clip_min, clip_max=clip_max, seed=tf.constant(seed, tf.int32),
                   restarts=restarts, labels=y)
    adv_ok = tf.equal(tf.argmax(logits_fn(x_adv), -1, output_type=tf.int32), y)
    return tf.cast(tf.logical_and(clean_ok, adv_ok), tf.float32)


def inference_logits(model: Callable) -> LogitsFn:
    """``x -> float32 logits`` of ``model`` called in inference mode."""
    return lambda z: tf.cast(model(z, training=False), tf.float32)


def robust_accuracy(model: Callable, x: Any, y: Any, *, eps: float, norm: str = "linf",
                    clip_min: float = 0.0, clip_max: float = 1.0, steps: int = 50,
                    restarts: int = 1, batch_size: int = 256, seed: int = 0) -> float:
    """Accuracy of ``model`` under PGD-``steps`` with ``restarts`` (worst case per example).

    A compact in-training check (the catastrophic-overfitting guard and the fallback report);
    the full evaluation is :func:`attacks.evaluate`. ``x`` float ``[N, ...]``, ``y`` int ``[N]``.
    """
    norm = canonical_norm(norm)
    check_eps(eps)
    check_positive_int(steps, "steps", minimum=0, maximum=MAX_STEPS)
    check_positive_int(restarts, "restarts", maximum=MAX_RESTARTS)
    check_positive_int(batch_size, "batch_size")
    logits_fn = inference_logits(model)

    @tf.function(reduce_retracing=True)
    def batch_fn(xb, yb):
        return robust_correct(logits_fn, xb, yb, eps=eps, norm=norm, clip_min=clip_min,
                              clip_max=clip_max, steps=steps, restarts=restarts, seed=(seed, 1))

    oks = []
    for i in range(0, len(x), batch_size):
        xb = tf.convert_to_tensor(x[i:i + batch_size], tf.float32)
        yb = tf.convert_to_tensor(np.asarray(y[i:i + batch_size]).reshape(-1), tf.int32)
        oks.append(batch_fn(xb, yb).numpy())
    return float(np.mean(np.concatenate(oks)))
