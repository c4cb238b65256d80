"""Certified training as training methods: ``"ibp"`` (Gowal et al., "On the Effectiveness of
Interval Bound Propagation for Training Verifiably Robust Models", 2018) and ``"crown-ibp"``
(Zhang et al., "Towards Stable and Efficient Training of Verifiably Robust Neural Networks",
ICLR 2020). The loss bounds the model with :mod:`robustgrad.bounds` over the L-inf ball; the
methods are registered in :mod:`attacks.training.registry` beside the adversarial ones.

>>> CrownIbp().bound, Ibp().norms
('crown-ibp', ('linf',))
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from robustgrad import bounds as _bounds

from .context import StepContext
from .methods import StepOutputs, TrainingMethod, pgd_on_cross_entropy

__all__ = ["CrownIbp", "Ibp", "worst_case_logits"]


def _all_margins_spec(y, num_classes, dtype):
    """``C`` [B, K, K]: row ``j`` is ``e_y - e_j`` (row ``y`` is zero, so its bound is 0)."""
    onehot = tf.one_hot(y, num_classes, dtype=dtype)
    return onehot[:, None, :] - tf.eye(num_classes, dtype=dtype)[None]


def _margin_lower_bounds(model, lower, upper, spec, method):
    """Lower bounds [B, S] of ``spec @ logits`` over the boxes, differentiable w.r.t. the
    weights (the engine's unchecked entry: traced inside the training step, any batch size)."""
    return _bounds.compute_bounds_unchecked(model, lower, upper, method, spec,
                                            bound_upper=False)[0]


def worst_case_logits(model: Any, x: Any, y: Any, eps: Any, *, method: str = "ibp",
                      beta: Any = 1.0, clip_min: float = 0.0, clip_max: float = 1.0) -> tf.Tensor:
    """The worst-case logits of certified training over the L-inf ball ``||x' - x|| <= eps``
    (intersected with ``[clip_min, clip_max]``): ``z_hat_j = -lb(z_y - z_j)``, ``z_hat_y = 0``,
    so ``CE(z_hat, y)`` bounds the cross-entropy of every ``x'`` in the ball from above, and
    ``argmax z_hat = y`` exactly where every margin is verified positive (Gowal et al. 2018,
    eq. 8-9; Zhang et al. 2020, eq. 5).

    Args:
      model: a Keras model the bound engine supports (:mod:`robustgrad.bounds`), logits out.
      x: float32 ``[B, ...]``; y: int labels ``[B]``; eps: the radius (scalar, may be a tensor).
      method: ``"ibp"``, ``"crown-ibp"`` or ``"crown"``; with ``"crown-ibp"`` the lower bound
        is ``beta * CROWN-IBP + (1 - beta) * IBP`` (``beta`` a scalar in [0, 1]; the CROWN-IBP
        pass is skipped when ``beta`` is 0).
      clip_min, clip_max: the input domain.

    Returns:
      float32 ``[B, num_classes]``, differentiable w.r.t. the model's weights; runs eagerly or
      inside ``tf.function`` (no validation here: callers validate).

    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    >>> m.layers[0].set_weights([np.array([[1.0, -1.0]], "float32"), np.zeros(2, "float32")])
    >>> worst_case_logits(m, np.array([[0.5]], "float32"), np.array([0]), 0.1).numpy().round(3)
    array([[ 0. , -0.8]], dtype=float32)
    """
    x = tf.convert_to_tensor(x, tf.float32)
    y = tf.cast(tf.reshape(y, [-1]), tf.int32)
    eps = tf.cast(eps, x.dtype)
    lower = tf.maximum(x - eps, clip_min)
    upper = tf.minimum(x + eps, clip_max)
    out_shape = getattr(model, "output_shape", None)
    num_classes = int(out_shape[-1] if out_shape else _bounds.BoundedModel(model).output_shape(
        x[:1])[-1])
    spec = _all_margins_spec(y, num_classes, x.dtype)
    if method != "crown-ibp":
        return 0.0 - _margin_lower_bounds(model, lower, upper, spec, method)  # no -0.0
    beta = tf.cast(beta, x.dtype)
    ibp = _margin_lower_bounds(model, lower, upper, spec, "ibp")
    mixed = tf.cond(beta > 1e-5,
                    lambda: beta * _margin_lower_bounds(model, lower, upper, spec, "crown-ibp")
                    + (1.0 - beta) * ibp,
                    lambda: ibp)
    return 0.0 - mixed


class _Certified(TrainingMethod):
    """Certified training: ``kappa * CE(clean) + (1 - kappa) * CE(worst-case logits)``."""

    default_steps = 0
    norms = ("linf",)
    adversarial = False
    certified = True
    bound = "ibp"

    def default_step_size(self, eps: float, steps: int) -> float:
        return eps

    def check_model(self, model: Any) -> None:
        """The bound engine must read the model (a built one is checked before training)."""
        if not getattr(model, "built", False):
            return
        try:
            _bounds._bounded(model)
        except ValueError as e:
            raise ValueError(f"method {self.name!r} bounds the model with robustgrad.bounds, "
                             f"which cannot read it: {e}. Use a model of supported layers (e.g. "
                             f"any arch of make_model)"
                             ) from None

    @staticmethod
    def schedule(ctx: StepContext, eps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(kappa, beta)`` at the current ``eps`` (both 1 at eps 0, ``kappa_final`` and
        ``beta_final`` at full eps; linear in between, so a step-counter checkpoint resumes
        them)."""
        frac = tf.clip_by_value(tf.cast(eps, tf.float32) / ctx.full_eps, 0.0, 1.0)
        return (1.0 - (1.0 - ctx.kappa_final) * frac,
                1.0 - (1.0 - ctx.beta_final) * frac)

    def certified_loss(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor,
                       eps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(loss, worst-case logits, clean logits)`` at radius ``eps``."""
        kappa, beta = self.schedule(ctx, eps)
        clean_logits = ctx.logits(x, True)
        worst = worst_case_logits(ctx.model, x, y, eps, method=self.bound, beta=beta,
                                  clip_min=ctx.clip_min, clip_max=ctx.clip_max)
        loss = (kappa * tf.reduce_mean(ctx.training_ce(clean_logits, y))
                + (1.0 - kappa) * tf.reduce_mean(ctx.training_ce(worst, y)))
        return loss, worst, clean_logits

    def craft(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor, *, eps: tf.Tensor,
              step_size: tf.Tensor, steps: int, seed: tf.Tensor) -> tf.Tensor:
        """PGD on the cross-entropy (``trainer.craft`` only: training bounds, not attacks)."""
        return pgd_on_cross_entropy(ctx, x, y, eps=eps, step_size=eps / 4.0,
                                    steps=max(steps, 10), seed=seed)

    def update(self, ctx: StepContext, x: tf.Tensor, y: tf.Tensor) -> StepOutputs:
        """Differentiate :meth:`certified_loss` through the bounds, apply. The reported
        adversarial accuracy is the verified accuracy on the batch at the current eps."""
        variables = ctx.model.trainable_variables
        (loss, worst, clean_logits), grads = ctx.loss_and_gradients(
            lambda: self.certified_loss(ctx, x, y, ctx.eps), variables)
        gnorm = ctx.apply_gradients(grads, variables)
        return StepOutputs(loss, gnorm, worst, clean_logits)


class Ibp(_Certified):
    name = "ibp"
    bound = "ibp"


class CrownIbp(_Certified):
    name = "crown-ibp"
    bound = "crown-ibp"
