"""Learning-rate schedules and optimizers of adversarial-training recipes.

Every schedule is a function of the optimizer's update count, serialisable with the trainer
(``.keras`` files and checkpoints keep it), peaking at ``peak``:

* ``"constant"`` -- ``peak`` throughout;
* ``"cosine"`` -- cosine decay from ``peak`` to ``alpha * peak`` over the run (the earlier
  default of ``train-classifier``);
* ``"cyclic"`` -- the one-cycle (triangular) schedule of Wong et al., "Fast is better than
  free: revisiting adversarial training", ICLR 2020: linear from 0 up to ``peak`` at
  ``warmup`` (a fraction of the run; 2/5 in their MNIST and CIFAR-10 code), then linear down
  to 0 at the end;
* ``"piecewise"`` -- ``peak``, multiplied by ``decay`` at each fraction of ``boundaries``
  (Rice et al., "Overfitting in adversarially robust deep learning", ICML 2020: x0.1 at
  epochs 100 and 150 of 200, i.e. ``boundaries=(0.5, 0.75)``).

The learning rate of step ``t`` (0-based) is the schedule's value at ``t + 1`` updates, as
PyTorch recipes set it per batch before stepping (``lr_schedule(epoch + (i + 1) / n)``).

:func:`make_optimizer` builds Adam or SGD with momentum over one of these schedules.

>>> s = learning_rate_schedule("cyclic", 5e-3, total_steps=10)
>>> [round(float(s(t)), 5) for t in (0, 3, 5, 9)]
[0.00125, 0.005, 0.00333, 0.0]
>>> s2 = learning_rate_schedule("piecewise", 0.1, total_steps=8)
>>> [round(float(s2(t)), 4) for t in (2, 3, 4, 5, 6, 7)]
[0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from robustgrad.checks import choice, number, positive_int

__all__ = ["OPTIMIZERS", "SCHEDULES", "StepSchedule", "learning_rate_schedule", "make_optimizer"]

#: the schedule names :func:`learning_rate_schedule` knows
SCHEDULES: tuple[str, ...] = ("constant", "cosine", "cyclic", "piecewise")
#: the optimizer names :func:`make_optimizer` knows
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")


@keras.saving.register_keras_serializable(package="attacks")
class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """One of :data:`SCHEDULES` as a Keras schedule (see the module doc); ``step`` is the
    0-based update count, the value returned the learning rate of that update (float32)."""

    def __init__(self, name: str, peak: float, total_steps: int, warmup: float = 0.4,
                 boundaries: Sequence[float] = (0.5, 0.75), decay: float = 0.1,
                 alpha: float = 0.01) -> None:
        self.name = choice(name, "schedule", SCHEDULES)
        self.peak = float(number(peak, "lr", minimum=0, min_inclusive=False))
        self.total_steps = positive_int(total_steps, "total_steps")
        self.warmup = float(number(warmup, "warmup", minimum=0, maximum=1))
        self.boundaries = tuple(float(number(b, "boundaries", minimum=0, maximum=1))
                                for b in boundaries)
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError(f"boundaries must be increasing fractions of the run in [0, 1]; "
                             f"got {list(boundaries)}")
        self.decay = float(number(decay, "decay", minimum=0, maximum=1))
        self.alpha = float(number(alpha, "alpha", minimum=0, maximum=1))

    def __call__(self, step: Any) -> tf.Tensor:
        total = float(self.total_steps)
        t = tf.cast(step, tf.float32) + 1.0
        frac = tf.minimum(t / total, 1.0)
        peak = tf.constant(self.peak, tf.float32)
        if self.name == "constant":
            return peak
        if self.name == "cosine":
            cos = 0.5 * (1.0 + tf.cos(3.141592653589793 * frac))
            return peak * ((1.0 - self.alpha) * cos + self.alpha)
        if self.name == "cyclic":
            up = max(self.warmup, 1e-12)
            rising = frac / up
            falling = (1.0 - frac) / max(1.0 - self.warmup, 1e-12)
            return peak * tf.clip_by_value(tf.where(frac <= up, rising, falling), 0.0, 1.0)
        # piecewise: multiply by decay past each boundary (a step is past b when t > b * total)
        factor = tf.constant(1.0, tf.float32)
        for b in self.boundaries:
            factor = tf.where(t > b * total, factor * self.decay, factor)
        return peak * factor

    def get_config(self) -> dict:
        """The constructor arguments (for ``.keras`` files and checkpoints)."""
        return {"name": self.name, "peak": self.peak, "total_steps": self.total_steps,
                "warmup": self.warmup, "boundaries": list(self.boundaries),
                "decay": self.decay, "alpha": self.alpha}


def learning_rate_schedule(name: str, peak: float, total_steps: int, **kwargs: Any) -> StepSchedule:
    """The schedule ``name`` (one of :data:`SCHEDULES`) peaking at ``peak`` over ``total_steps``
    optimizer updates; ``kwargs`` are :class:`StepSchedule`'s (``warmup``, ``boundaries``,
    ``decay``, ``alpha``). ``ValueError`` names a bad argument."""
    return StepSchedule(name, peak, total_steps, **kwargs)


def make_optimizer(name: str, schedule: Any, *, momentum: float = 0.9, nesterov: bool = False,
                   **kwargs: Any) -> keras.optimizers.Optimizer:
    """``"adam"`` (Kingma & Ba 2015) or ``"sgd"`` (with ``momentum``, optionally Nesterov) over
    ``schedule`` (a float or a Keras schedule). Weight decay is not an optimizer option here:
    :class:`~attacks.training.AdversarialTrainer` adds ``weight_decay * w`` to the gradient
    (PyTorch's coupled L2, which the published recipes use). ``kwargs`` go to the Keras
    optimizer (e.g. ``gradient_accumulation_steps``).

    >>> make_optimizer("sgd", 0.1, momentum=0.9).__class__.__name__
    'SGD'
    >>> make_optimizer("rmsprop", 0.1)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: optimizer must be one of ('adam', 'sgd'), got 'rmsprop'
    """
    name = choice(name, "optimizer", OPTIMIZERS)
    if name == "adam":
        return keras.optimizers.Adam(schedule, **kwargs)
    momentum = float(number(momentum, "momentum", minimum=0, maximum=1, max_inclusive=False))
    return keras.optimizers.SGD(schedule, momentum=momentum, nesterov=bool(nesterov), **kwargs)
