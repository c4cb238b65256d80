"""Training for randomized smoothing: Gaussian data augmentation.

* ``"gaussian"`` -- the base classifier of randomized smoothing (Cohen, Rosenfeld & Kolter,
  "Certified Adversarial Robustness via Randomized Smoothing", ICML 2019, section 4): the
  cross-entropy on ``x + sigma * N(0, I)``, ``sigma = eps`` (the trainer's ``eps`` is the noise's
  standard deviation, in the units of ``x``; the eps warm-up ramps it). As in their code and in
  :func:`attacks.certify.smooth_certify`, the noisy input is not clipped to the input box: train
  with the ``sigma`` you certify with.

The method is registered in :mod:`attacks.training.registry` beside the adversarial ones.

>>> import tensorflow as tf
>>> x = tf.zeros([2, 3])
>>> noisy = Gaussian().craft(None, x, None, eps=tf.constant(0.5), step_size=None, steps=0,
...                          seed=tf.constant([1, 2]))
>>> noisy.shape, bool(tf.reduce_any(noisy != 0))
(TensorShape([2, 3]), True)
"""

from __future__ import annotations

import tensorflow as tf

from .context import StepContext
from .methods import TrainingMethod

__all__ = ["Gaussian"]


class Gaussian(TrainingMethod):
    """Gaussian data augmentation (Cohen et al. 2019): cross-entropy on ``x + eps * N(0, I)``."""

    name = "gaussian"

    def default_step_size(self, eps: float, steps: int) -> float:
        """Unused (no ascent): ``eps``."""
        return eps

    def craft(self, ctx: StepContext | None, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """``x + eps * N(0, I)`` ``[B, ...]`` (stateless, from ``seed``; not clipped)."""
        noise = tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
        return x + tf.cast(eps, x.dtype) * noise
