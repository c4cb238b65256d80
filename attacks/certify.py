"""Certified robustness: verified accuracy from the core's bound engine (:mod:`robustgrad.bounds`).

An attack gives an upper bound on robust accuracy; a certificate gives the lower bound. An example
is *verified* at radius ``eps`` when the lower bound of every margin ``z_y - z_j`` (``j != y``)
over the ball is positive: no input in the ball, found by an attack or not, changes the label.
So on the same examples ``verified accuracy <= accuracy under any attack <= clean accuracy``.

Randomized smoothing (Cohen et al. 2019, "Certified Adversarial Robustness via Randomized
Smoothing") certifies another classifier: ``g(x) = argmax_c P(f(x + N(0, sigma^2 I)) = c)``, with
an L2 radius ``sigma * PhiInv(pA)`` from a Clopper-Pearson lower bound ``pA`` of the top class's
probability (:func:`smooth_certify`), or abstains; :func:`smooth_predict` is its prediction with a
binomial test. Any classifier callable works (no layer restrictions); the noise draws run in one
compiled loop, seeded.

The bounds are IBP (Gowal et al. 2018), CROWN (Zhang et al. 2018), CROWN-IBP (Zhang et al.
2020) or alpha-CROWN (Xu et al. 2021) with the margin specification merged into the last linear
layer (:func:`~robustgrad.bounds.margin_spec`). A model that is not trained for verification
(plain or PGD training) usually has a verified accuracy near zero except at very small radii;
IBP/CROWN-IBP-trained models are verifiable at useful radii.

>>> import keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
>>> model.layers[0].set_weights([np.array([[1.0, -1.0], [0.0, 0.0]], "float32"),
...                              np.zeros(2, "float32")])   # logits (x1, -x1)
>>> x, y = np.array([[0.5, 0.0], [0.1, 0.0]], "float32"), np.array([0, 0])
>>> verified_mask(model, x, y, eps=0.2, clip_min=-1.0, clip_max=1.0).numpy().tolist()
[True, False]
>>> verified_accuracy(model, x, y, eps=0.2, clip_min=-1.0, clip_max=1.0)
0.5
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad import bounds as _bounds
from robustgrad.checks import choice, norm_name, number, positive_int

from . import _validate

MAX_NOISE_DRAWS = 10**7
"""The most noise draws per example of :func:`smooth_predict` and :func:`smooth_certify`
(``n``, ``n0``): 100x Cohen et al.'s 100,000; ``n=10**12`` was a TensorFlow dtype error after
the selection draws ran (``robustgrad certify --n`` has the same bound)."""
from ._models import call_model, check_classification_data

__all__ = ["ABSTAIN", "margin_lower_bounds", "smooth_certify", "smooth_predict",
           "verified_accuracy", "verified_mask"]

#: the label :func:`smooth_predict` and :func:`smooth_certify` return when they abstain
ABSTAIN = -1


def margin_lower_bounds(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                        method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                        batch_size: int | None = 256) -> tf.Tensor:
    """Lower bounds of the margins ``z_y - z_j`` (``j != y``, ascending) over the ball around
    each example, intersected with ``[clip_min, clip_max]``.

    Args:
      model: a Keras Sequential or functional model outputting logits (see
        :mod:`robustgrad.bounds` for the supported layers).
      x: float32/float64 ``[N, ...]`` inside ``[clip_min, clip_max]``; y: int labels ``[N]``.
      eps: radius >= 0 in the units of ``x``. norm: ``"linf"`` or ``"l2"``.
      method: ``"crown"``, ``"ibp"``, ``"crown-ibp"`` or ``"alpha-crown"`` (Xu et al. 2021: CROWN
        with optimised ReLU slopes, the tightest and slowest; auto_LiRPA's default options).
      clip_min, clip_max: the input domain (scalars or per feature; ``None`` unbounded).
      batch_size: examples per compiled call.

    Returns:
      ``[N, num_classes - 1]`` in ``x``'s dtype.
    """
    eps = _validate.check_eps(eps)
    norm = norm_name(norm)
    if norm not in ("linf", "l2"):
        raise ValueError(f"norm must be 'linf' or 'l2' for certification, got {norm!r}")
    method = choice(method.lower() if isinstance(method, str) else method, "method",
                    _bounds.METHODS)
    batch_size = positive_int(batch_size, "batch_size", allow_none=True)
    num_classes = check_classification_data(model, x, y)
    xt = tf.convert_to_tensor(x)
    spec = _bounds.margin_spec(tf.convert_to_tensor(y), num_classes, dtype=xt.dtype)
    lb, _ = _bounds.compute_ball_bounds(model, xt, eps, norm=norm, method=method, C=spec,
                                        clip_min=clip_min, clip_max=clip_max,
                                        batch_size=batch_size)
    return lb


def verified_mask(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                  method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                  batch_size: int | None = 256) -> tf.Tensor:
    """Per example, whether its label provably holds over the whole ball: bool ``[N]``, true where
    every margin lower bound (:func:`margin_lower_bounds`) is > 0. Arguments as there."""
    lb = margin_lower_bounds(model, x, y, eps, norm, method, clip_min=clip_min,
                             clip_max=clip_max, batch_size=batch_size)
    return tf.reduce_all(lb > 0, axis=1)


def verified_accuracy(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                      method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                      batch_size: int | None = 256) -> float:
    """The fraction of examples verified at radius ``eps`` (:func:`verified_mask`): a lower bound
    on the accuracy under any attack within the ball. Arguments as :func:`margin_lower_bounds`."""
    mask = verified_mask(model, x, y, eps, norm, method, clip_min=clip_min, clip_max=clip_max,
                         batch_size=batch_size)
    return float(tf.reduce_mean(tf.cast(mask, tf.float64)))


# ----------------------------------------------------------------------------------------------
# Randomized smoothing (Cohen et al. 2019)
# ----------------------------------------------------------------------------------------------

class _NoiseCounter:
    """Class counts of ``model(x + sigma * noise)`` over ``num`` Gaussian draws per example, the
    draws in batches of ``draws_per_step`` inside one compiled ``tf.while_loop``."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.count = tf.function(self._count, reduce_retracing=True, autograph=False)

    def _count(self, x, sigma, num, draws_per_step, seed, num_classes):
        b = tf.shape(x)[0]
        feat = tf.shape(x)[1:]
        steps = (num + draws_per_step - 1) // draws_per_step

        def body(k, counts):
            step_seed = tf.random.experimental.stateless_fold_in(seed, k)
            shape = tf.concat([[b, draws_per_step], feat], 0)
            noisy = x[:, None] + sigma * tf.random.stateless_normal(shape, step_seed, dtype=x.dtype)
            logits = call_model(self._model, tf.reshape(noisy, tf.concat([[-1], feat], 0)))
            pred = tf.reshape(tf.argmax(logits, -1, output_type=tf.int32), [b, draws_per_step])
            valid = tf.range(draws_per_step) < num - k * draws_per_step  # the last step's extras
            onehot = tf.one_hot(pred, num_classes, dtype=tf.int32) * tf.cast(valid, tf.int32)[
                None, :, None]
            return k + 1, tf.ensure_shape(counts + tf.reduce_sum(onehot, 1), counts.shape)

        _, counts = tf.while_loop(lambda k, _: k < steps, body,
                                  [tf.constant(0), tf.zeros([b, num_classes], tf.int32)])
        return counts


_COUNTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _counter(model) -> _NoiseCounter:
    try:
        counter = _COUNTERS.get(model)
    except TypeError:
        return _NoiseCounter(model)
    if counter is None:
        counter = _COUNTERS[model] = _NoiseCounter(model)
    return counter


def _smoothing_args(model, x, sigma, alpha, batch_size, seed):
    sigma = number(sigma, "sigma", minimum=0, min_inclusive=False)
    alpha = number(alpha, "alpha", minimum=0, maximum=1, min_inclusive=False, max_inclusive=False)
    batch_size = positive_int(batch_size, "batch_size")
    if seed is None:
        seed = int(np.random.default_rng().integers(2 ** 31))
    seed = positive_int(seed, "seed", minimum=0)
    xt = _validate.check_x(x)
    out = tf.convert_to_tensor(call_model(model, xt[:1]))
    if out.shape.rank != 2 or out.shape[-1] < 2:
        raise ValueError(f"model must return logits of shape [N, C] with C >= 2, got shape "
                         f"{out.shape} for one example")
    return xt, sigma, alpha, batch_size, seed, int(out.shape[-1])


def _noise_counts(model, x, sigma, num, batch_size, seed, salt, num_classes):
    """Counts [N, C] (int64 numpy) of the base classifier's labels over ``num`` draws per example;
    ``batch_size`` noisy inputs per forward pass."""
    per_step = min(num, batch_size)
    per_call = max(1, batch_size // per_step)
    counter = _counter(model)
    out = []
    for i, start in enumerate(range(0, int(x.shape[0]), per_call)):
        chunk_seed = tf.constant([seed, salt * 1_000_003 + i], tf.int64)
        out.append(counter.count(x[start:start + per_call], tf.constant(sigma, x.dtype),
                                 tf.constant(num), tf.constant(per_step), chunk_seed,
                                 num_classes).numpy())
    return np.concatenate(out).astype(np.int64)


def smooth_predict(model: Any, x: Any, sigma: float, n: int = 100, alpha: float = 0.001, *,
                   batch_size: int = 1000, seed: int | None = None) -> np.ndarray:
    """The smoothed classifier's prediction (Cohen et al. 2019, PREDICT): the top class of ``n``
    noisy copies, or :data:`ABSTAIN` unless a two-sided binomial test of its count against the
    runner-up's rejects equality at level ``alpha`` (then the answer is wrong with probability at
    most ``alpha``).

    Args:
      model: any classifier ``model(x, training=False) -> logits [B, C]``.
      x: float ``[N, ...]``. sigma: the noise's standard deviation, > 0, in the units of ``x``.
      n: noise draws per example. alpha: the test's level, in (0, 1).
      batch_size: noisy inputs per forward pass. seed: int >= 0 (``None``: random); the same seed
        gives the same answers.

    Returns:
      int64 ``[N]``: class indices, :data:`ABSTAIN` (-1) where it abstains.

    Example:
      >>> import tensorflow as tf
      >>> model = lambda x, training=False: tf.concat([x, -x], axis=1)  # class 0 iff x > 0
      >>> smooth_predict(model, [[2.0], [-2.0], [0.0]], sigma=1.0, n=500, seed=0).tolist()
      [0, 1, -1]
    """
    from scipy import stats

    n = positive_int(n, "n", maximum=MAX_NOISE_DRAWS)
    xt, sigma, alpha, batch_size, seed, k = _smoothing_args(model, x, sigma, alpha, batch_size,
                                                           seed)
    counts = _noise_counts(model, xt, sigma, n, batch_size, seed, 2, k)
    order = np.argsort(-counts, axis=1, kind="stable")
    top, second = order[:, 0], order[:, 1]
    rows = np.arange(len(counts))
    n_a, n_b = counts[rows, top], counts[rows, second]
    labels = top.astype(np.int64)
    for i in rows:
        if stats.binomtest(int(n_a[i]), int(n_a[i] + n_b[i]), 0.5).pvalue > alpha:
            labels[i] = ABSTAIN
    return labels


def smooth_certify(model: Any, x: Any, sigma: float, n0: int = 100, n: int = 100_000,
                   alpha: float = 0.001, *, batch_size: int = 1000,
                   seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Certified L2 radii of the smoothed classifier (Cohen et al. 2019, CERTIFY).

    ``n0`` draws select the top class ``cA``; ``n`` further draws give the one-sided (1 - alpha)
    Clopper-Pearson lower bound ``pA`` of its probability. If ``pA > 1/2`` the smoothed classifier
    provably returns ``cA`` within the L2 radius ``sigma * PhiInv(pA)`` (with probability at least
    ``1 - alpha`` over the draws); otherwise it abstains.

    Args:
      model: any classifier ``model(x, training=False) -> logits [B, C]``.
      x: float ``[N, ...]``. sigma: noise standard deviation > 0.
      n0: selection draws; n: estimation draws (``n0 <= n``). alpha: in (0, 1).
      batch_size: noisy inputs per forward pass. seed: int >= 0 (``None``: random).

    Returns:
      ``(labels, radii)``: int64 ``[N]`` (:data:`ABSTAIN` where it abstains) and float64 ``[N]``
      (0 where it abstains).

    Example:
      >>> import tensorflow as tf
      >>> model = lambda x, training=False: tf.concat([x, -x], axis=1)  # class 0 iff x > 0
      >>> labels, radii = smooth_certify(model, [[0.5]], sigma=0.25, n=20_000, seed=0)
      >>> int(labels[0]), bool(0.45 < radii[0] <= 0.5)   # the exact radius is 0.5
      (0, True)
    """
    from scipy import stats

    n0 = positive_int(n0, "n0", maximum=MAX_NOISE_DRAWS)
    n = positive_int(n, "n", maximum=MAX_NOISE_DRAWS)
    if n0 > n:
        raise ValueError(f"n0 (selection draws) must be <= n (estimation draws), got n0={n0} and "
                         f"n={n}")
    xt, sigma, alpha, batch_size, seed, k = _smoothing_args(model, x, sigma, alpha, batch_size,
                                                           seed)
    selection = _noise_counts(model, xt, sigma, n0, batch_size, seed, 0, k)
    top = np.argmax(selection, axis=1)
    counts = _noise_counts(model, xt, sigma, n, batch_size, seed, 1, k)
    n_a = counts[np.arange(len(counts)), top]
    p_lower = np.where(n_a > 0, stats.beta.ppf(alpha, np.maximum(n_a, 1), n - n_a + 1), 0.0)
    certified = p_lower > 0.5
    labels = np.where(certified, top, ABSTAIN).astype(np.int64)
    radii = np.where(certified, sigma * stats.norm.ppf(np.clip(p_lower, 0.5, 1.0)), 0.0)
    return labels, radii.astype(np.float64)
