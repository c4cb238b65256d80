"""SmoothAdv: adversarial training of the base classifier of randomized smoothing.

Salman, Yang, Li, Zhang, Zhang, Razenshteyn & Bubeck, "Provably Robust Deep Learning via
Adversarially Trained Smoothed Classifiers", NeurIPS 2019 (their code:
github.com/Hadisalman/smoothing-adversarial, ``code/attacks.py`` ``PGD_L2`` and
``code/train_pgd.py``). The attack targets the *soft* smoothed classifier
``G(x)_c = E_delta softmax(f(x + delta))_c``, ``delta ~ N(0, sigma^2 I)``, estimated with ``m``
noise draws that are drawn once and reused at every PGD step (SmoothAdv_PGD with ``m_train``):

    x' = argmax_{||x' - x||_2 <= eps} -log( (1/m) sum_i softmax(f(x' + delta_i))_y )

by ``steps`` L2 PGD steps of size ``2 eps / steps`` from ``x`` (their step size and start),
through the library's one attack engine (:func:`attacks.training.crafting.ascend`), inside the
box ``[clip_min, clip_max]``. The update is the cross-entropy on the ``m`` noisy copies
``x' + delta_i`` of the adversarial example, with the same noise (their ``--train-multi-noise``).

In :class:`~attacks.training.AdversarialTrainer` the method is ``"smoothadv"``: ``eps`` is the
attack's L2 radius (ramped by ``warmup_steps``, the paper's warm-up over the first 10 epochs),
``sigma`` the noise's standard deviation (constant), ``noise_draws`` is ``m`` and ``steps`` the
PGD steps (default 2: the paper's ``PGD_2steps`` models). Two differences from their code: the
attack's iterate is projected onto the ball and then clipped to the box (theirs clips, then
projects: both end inside both sets), and each update uses ``B`` images with ``m`` copies each
(theirs splits a batch of ``B`` into ``m`` updates of ``B / m`` images: pass ``batch_size / m``
to match their images per update). The noisy inputs are not clipped to the box (as in their
code and in :func:`attacks.certify.smooth_certify`). ``adv_ratio`` does not apply.

Shapes: ``x`` float32 ``[B, ...]``, ``y`` int32 ``[B]``, noise ``[m, B, ...]``.

>>> import tensorflow as tf
>>> w = tf.constant([[1.0, -1.0], [0.0, 0.0]])            # logits (x1, -x1): class 0 iff x1 > 0
>>> model = lambda z, training=False: z @ w
>>> x_adv = smoothadv_attack(model, [[0.3, 0.5]], [0], eps=0.2, sigma=0.25, noise_draws=4,
...                          steps=1, clip_min=-1.0, clip_max=1.0, seed=0)
>>> [round(float(v), 3) for v in x_adv[0]]                 # -eps along w: exact for a linear f
[0.1, 0.5]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import number, positive_int

from .context import StepContext
from .crafting import ascend, cross_entropy
from .methods import StepOutputs, TrainingMethod

__all__ = ["SmoothAdv", "gaussian_noise", "smoothadv_attack", "smoothed_cross_entropy",
           "smoothed_log_probs"]


def gaussian_noise(x: tf.Tensor, sigma: Any, draws: int, seed: Any) -> tf.Tensor:
    """``draws`` Gaussian noise tensors of standard deviation ``sigma``, ``[draws, B, ...]`` in
    ``x``'s dtype, from a stateless ``[2]`` seed."""
    shape = tf.concat([[draws], tf.shape(x)], 0)
    return tf.cast(sigma, x.dtype) * tf.random.stateless_normal(shape, seed, dtype=x.dtype)


def _noisy_batch(x, noise):
    """``x[None] + noise`` flattened to ``[m * B, ...]`` (draw-major)."""
    return tf.reshape(x[None] + noise, tf.concat([[-1], tf.shape(x)[1:]], 0))


def _average_log_probs(logits, draws):
    """``log((1/m) sum_i softmax(logits_i))`` ``[B, C]`` of draw-major logits ``[m * B, C]``."""
    logp = tf.nn.log_softmax(tf.reshape(logits, [draws, -1, tf.shape(logits)[-1]]))
    return tf.reduce_logsumexp(logp, axis=0) - tf.math.log(tf.cast(draws, logp.dtype))


def smoothed_log_probs(logits_fn: Any, x: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
    """The soft smoothed classifier's log-probabilities ``[B, C]`` at ``x [B, ...]``, estimated
    with the noise ``[m, B, ...]``: ``log((1/m) sum_i softmax(logits_fn(x + noise_i)))``.
    Differentiable w.r.t. ``x``; graph-safe (no validation)."""
    logits = tf.cast(logits_fn(_noisy_batch(x, noise)), tf.float32)
    return _average_log_probs(logits, tf.shape(noise)[0])


def _smoothadv_ascend(logits_fn, x, y, noise, *, eps, step_size, steps, clip_min, clip_max,
                      seed, scale=1.0):
    """SmoothAdv_PGD in the engine's loop (no validation): ``x_adv [B, ...]``. ``scale``
    multiplies the objective (float16 compute: no underflow; the L2 direction ignores it)."""
    return ascend(lambda z: smoothed_log_probs(logits_fn, z, noise),
                  lambda logp: scale * cross_entropy(logp, y), x, eps=eps, step_size=step_size,
                  steps=steps, norm="l2", clip_min=clip_min, clip_max=clip_max, seed=seed,
                  start="none")


def _check_data(x, y, sigma, noise_draws, seed):
    sigma = number(sigma, "sigma", minimum=0, min_inclusive=False)
    noise_draws = positive_int(noise_draws, "noise_draws")
    seed = positive_int(seed, "seed", minimum=0)
    x = tf.convert_to_tensor(np.asarray(x, np.float32))
    y = tf.reshape(tf.convert_to_tensor(np.asarray(y), tf.int32), [-1])
    if x.shape.rank < 2 or int(y.shape[0]) != int(x.shape[0]):
        raise ValueError(f"x must be [N, ...] and y [N] labels; got x {x.shape}, y {y.shape}")
    return x, y, sigma, noise_draws, seed


def _check_attack(eps, steps, step_size, clip_min, clip_max, x):
    eps = number(eps, "eps", minimum=0)
    steps = positive_int(steps, "steps")
    clip_min, clip_max = number(clip_min, "clip_min"), number(clip_max, "clip_max")
    if not clip_min < clip_max:
        raise ValueError(f"clip_min ({clip_min}) must be < clip_max ({clip_max})")
    step_size = (2.0 * eps / steps if step_size is None
                 else number(step_size, "step_size", minimum=0, min_inclusive=False))
    if float(tf.reduce_min(x)) < clip_min or float(tf.reduce_max(x)) > clip_max:
        raise ValueError(f"x must lie in [clip_min, clip_max] = [{clip_min:g}, {clip_max:g}]")
    return eps, steps, step_size, clip_min, clip_max


def smoothadv_attack(model: Any, x: Any, y: Any, *, eps: float, sigma: float,
                     noise_draws: int = 1, steps: int = 2, step_size: float | None = None,
                     clip_min: float = 0.0, clip_max: float = 1.0, seed: int = 0) -> tf.Tensor:
    """SmoothAdv_PGD (Salman et al. 2019): L2 PGD against the soft smoothed classifier.

    Args:
      model: a classifier ``model(x, training=False) -> logits [B, C]``.
      x: float ``[N, ...]`` in ``[clip_min, clip_max]``; y: int labels ``[N]``.
      eps: the L2 radius, >= 0, in the units of ``x``. sigma: the noise's standard deviation,
        > 0. noise_draws: ``m``, the noise draws of the estimate, >= 1 (drawn once from
        ``seed`` and reused at every step). steps: PGD steps, >= 1. step_size: default
        ``2 * eps / steps`` (theirs).
      clip_min, clip_max: the input box. seed: int >= 0.

    Returns:
      float32 ``[N, ...]`` with ``||x_adv - x||_2 <= eps`` per example, inside the box.
      The noise it used is :func:`gaussian_noise` ``(x, sigma, noise_draws, [seed, 0])``.
    """
    x, y, sigma, noise_draws, seed = _check_data(x, y, sigma, noise_draws, seed)
    eps, steps, step_size, clip_min, clip_max = _check_attack(eps, steps, step_size, clip_min,
                                                              clip_max, x)
    seed_t = tf.constant([seed, 0], tf.int32)
    noise = gaussian_noise(x, sigma, noise_draws, seed_t)
    logits_fn = lambda z: tf.cast(model(z, training=False), tf.float32)  # noqa: E731
    return _smoothadv_ascend(logits_fn, x, y, noise, eps=eps, step_size=step_size, steps=steps,
                             clip_min=clip_min, clip_max=clip_max, seed=seed_t)


def smoothed_cross_entropy(model: Any, x: Any, y: Any, *, sigma: float, noise_draws: int,
                           seed: int = 0) -> np.ndarray:
    """Per-example ``-log G(x)_y`` (float32 ``[N]``), the soft smoothed classifier estimated
    with ``noise_draws`` draws from ``seed`` (the noise :func:`smoothadv_attack` uses for the
    same seed): the objective SmoothAdv maximises."""
    x, y, sigma, noise_draws, seed = _check_data(x, y, sigma, noise_draws, seed)
    noise = gaussian_noise(x, sigma, noise_draws, tf.constant([seed, 0], tf.int32))
    logp = smoothed_log_probs(lambda z: model(z, training=False), x, noise)
    return cross_entropy(logp, y).numpy()


class SmoothAdv(TrainingMethod):
    """SmoothAdv_PGD training (Salman et al. 2019): see the module doc."""

    name = "smoothadv"
    default_steps = 2
    min_steps = 1
    norms = ("l2",)

    def default_step_size(self, eps: float, steps: int) -> float:
        """``2 * eps / steps`` (Salman et al.'s ``PGD_L2``)."""
        return 2.0 * eps / max(steps, 1)

    def _noise(self, ctx, x, seed):
        return gaussian_noise(x, ctx.sigma, ctx.noise_draws, seed)

    def _craft_with(self, ctx, x, y, noise, *, eps, step_size, steps, seed):
        training = ctx.craft_training  # logits unscaled: a scale would sharpen the softmax
        return _smoothadv_ascend(lambda z: ctx.logits(z, training), x, y, noise, eps=eps,
                                 step_size=step_size, steps=steps, clip_min=ctx.clip_min,
                                 clip_max=ctx.clip_max, seed=seed,
                                 scale=ctx.crafting_scale)

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """The adversarial ``x'`` ``[B, ...]`` against the smoothed classifier (noise from
        ``seed``; the update adds that noise to it)."""
        noise = self._noise(ctx, x, seed)
        return self._craft_with(ctx, x, y, noise, eps=eps, step_size=step_size,
                                steps=steps, seed=seed)

    def update(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor) -> StepOutputs:
        """Draw ``m`` noises, craft ``x'`` (inference mode), then the mean cross-entropy of the
        ``m * B`` noisy copies ``x' + delta_i`` (training mode), applied. The reported
        adversarial logits are the soft smoothed log-probabilities at ``x'`` ``[B, C]``."""
        seed = ctx.step_seed(1)
        noise = self._noise(ctx, x, seed)
        x_adv = self._craft_with(ctx, x, y, noise, eps=ctx.eps, step_size=ctx.step_size,
                                 steps=ctx.steps, seed=seed)
        labels = tf.tile(y, [ctx.noise_draws])  # draw-major, as _noisy_batch

        def loss_fn():
            logits = ctx.logits(_noisy_batch(x_adv, noise), True)
            loss = tf.reduce_mean(ctx.training_ce(logits, labels))
            return loss, _average_log_probs(logits, ctx.noise_draws), None

        variables = ctx.model.trainable_variables
        (loss, smoothed, _), grads = ctx.loss_and_gradients(loss_fn, variables)
        gnorm = ctx.apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, smoothed, None)
