"""The step context: what a training method sees of one training step.

:class:`~attacks.training.AdversarialTrainer` hands every training method a :class:`StepContext`
(``method.update(ctx, x, y)`` in ``train_step``; ``method.craft(ctx, ...)`` from
``trainer.craft``). It carries the step's values -- the budget ``eps`` after warm-up and the
step size scaled with it -- the trainer's configuration (read-only), and the operations a method
needs: the classifier's float32 :meth:`~StepContext.logits`, the training cross-entropy
(label smoothing), the gradient of a loss through the per-replica scaling
(:meth:`~StepContext.loss_and_gradients`), the guarded update
(:meth:`~StepContext.apply_gradients`: weight decay, clipping, the non-finite guard, the
all-reduce under a ``tf.distribute`` strategy) and the step's stateless seed
(:meth:`~StepContext.step_seed`). A method written against it needs nothing else of the trainer;
:func:`attacks.training.register_method` makes it available by name.

Shapes: ``x`` float32 ``[B, ...]``, ``y`` int32 ``[B]``, logits float32 ``[B, C]``; ``eps``,
``scale`` and ``step_size`` are float32 scalar tensors.

>>> import tensorflow as tf
>>> from attacks.training import AdversarialTrainer, make_classifier
>>> trainer = AdversarialTrainer(make_classifier((8, 8), 10, width=4), method="madry", eps=0.2,
...                              steps=4, warmup_steps=4)
>>> ctx = trainer.step_context()          # step 0 of a 4-step ramp: a quarter of the budget
>>> round(float(ctx.eps), 3), ctx.full_eps, round(float(ctx.step_size), 4), ctx.norm
(0.05, 0.2, 0.0312, 'linf')
>>> x, y = tf.zeros([2, 8, 8]), tf.constant([1, 2])
>>> ctx.logits(x, training=False).shape, ctx.training_ce(ctx.logits(x, False), y).shape
(TensorShape([2, 10]), TensorShape([2]))
>>> ctx.step_seed().shape                 # a stateless [2] seed: same step, same seed
TensorShape([2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["StepContext"]


def _setting(name: str, doc: str) -> Any:
    """A read-only property returning the trainer's configuration value ``name``."""

    def get(self: StepContext) -> Any:
        return getattr(self._trainer, name)

    get.__doc__ = doc
    return property(get)


class StepContext:
    """One training step as a training method sees it (see the module doc).

    Args:
        trainer: the :class:`~attacks.training.AdversarialTrainer` running the step (the
            context reads its configuration and calls its update machinery; methods do not).
        eps: the step's budget, a float32 scalar tensor (``trainer.step_context()`` passes the
            warm-up value).

    Attributes:
        eps: this step's budget (float32 scalar; ``full_eps`` after the warm-up).
        scale: ``eps / full_eps`` (float32 scalar), the warm-up fraction.
        step_size: the configured step size scaled with ``eps`` (float32 scalar).
    """

    __slots__ = ("_trainer", "eps", "scale", "step_size")

    def __init__(self, trainer: Any, eps: tf.Tensor) -> None:
        self._trainer = trainer
        self.eps = eps
        self.scale = eps / trainer.eps
        self.step_size = trainer.step_size * self.scale

    # ------------------------------------------------------------ configuration (read-only)
    model = _setting("model", "The classifier being trained, ``model(x, training) -> logits``.")
    full_eps = _setting("eps", "The configured budget (float), reached after the warm-up.")
    norm = _setting("norm", "The threat model's norm: ``'linf'``, ``'l2'`` or ``'l1'``.")
    clip_min = _setting("clip_min", "The input box's lower bound (float).")
    clip_max = _setting("clip_max", "The input box's upper bound (float).")
    steps = _setting("steps", "Crafting steps (PGD steps; replays for ``free``), an int.")
    random_start = _setting("random_start", "Whether crafting starts at a random point.")
    craft_training = _setting("craft_training", "The model's mode while crafting (bool).")
    adv_ratio = _setting("adv_ratio", "Weight of the adversarial term against the clean one.")
    beta = _setting("beta", "TRADES' and MART's weight of the KL term (float).")
    awp_gamma = _setting("awp_gamma", "AWP's relative weight-perturbation size (float).")
    kappa_final = _setting("kappa_final", "Certified training: the clean weight at full eps.")
    beta_final = _setting("beta_final", "CROWN-IBP's bound weight at full eps (float).")
    sigma = _setting("sigma", "SmoothAdv's noise standard deviation (float).")
    noise_draws = _setting("noise_draws", "SmoothAdv's noise draws per example (int).")

    # ------------------------------------------------------------ operations
    def logits(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        """The classifier's logits ``[B, C]`` for ``x [B, ...]``, cast to float32."""
        return self._trainer._logits(x, training)

    @property
    def crafting_scale(self) -> float:
        """The factor crafting objectives are multiplied by: 1024 when the classifier computes
        in float16 (small input gradients would underflow), else 1. Sign and normalised ascent
        directions do not depend on it."""
        return self._trainer._craft_scale()

    def crafting_logits(self) -> Callable[[tf.Tensor], tf.Tensor]:
        """``x -> float32 logits [B, C]`` in the crafting mode (``craft_training``), multiplied
        by :attr:`crafting_scale` when it is not 1: the function attacks ascend."""
        scale = self.crafting_scale
        training = self.craft_training
        if scale == 1.0:
            return lambda z: self.logits(z, training)
        return lambda z: self.logits(z, training) * scale

    def training_ce(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """Per-example cross-entropy ``[B]`` of the training loss (label-smoothed when the
        trainer's ``label_smoothing > 0``; crafting objectives use the plain one)."""
        return self._trainer._training_ce(logits, y)

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """The loss to differentiate on this replica: ``loss`` divided by the replica count
        (and multiplied by the loss scale under a ``LossScaleOptimizer``)."""
        return self._trainer._scaled(loss)

    def loss_and_gradients(self, loss_fn: Callable[[], Any],
                           variables: list) -> tuple[Any, list]:
        """``(loss_fn(), gradients)``: ``loss_fn() -> (loss, ...)`` (a tuple whose first entry
        is the scalar loss) run under a tape, the :meth:`scale_loss` of its loss
        differentiated w.r.t. ``variables`` (a gradient per variable, None where unconnected)."""
        with tf.GradientTape() as tape:
            outputs = loss_fn()
            scaled = self.scale_loss(outputs[0])
        return outputs, tape.gradient(scaled, variables)

    def apply_gradients(self, grads: list, variables: list) -> tf.Tensor:
        """Update ``variables`` with ``grads`` (from :meth:`loss_and_gradients`) through the
        trainer's optimizer: weight decay, global-norm clipping, the non-finite guard and the
        all-reduce under a strategy. Returns the global gradient norm before clipping
        (float32 scalar)."""
        return self._trainer._apply_gradients(grads, variables)

    def step_seed(self, salt: int = 1) -> tf.Tensor:
        """The step's stateless seed, int32 ``[2]``, from the trainer's ``seed``, its step
        counter (saved with checkpoints: a resumed run draws the same stream), the replica id
        and ``salt`` (different salts give independent streams within one step)."""
        return self._trainer._step_seed(salt)
