"""Deprecated: the agents' Adam is now the core's transformation, ``robustgrad.transforms.adam``.

``agents.core.optim.Adam(variables, learning_rate, beta_1, beta_2, eps)`` is kept as a thin alias with
the same interface (``apply_gradients``, ``apply``, ``learning_rate``, ``iterations``, ``m``,
``v``) and the same PyTorch-style epsilon; it warns with a ``DeprecationWarning``. New code::

    from robustgrad import transforms
    step = transforms.GradientStep(transforms.chain(transforms.apply_if_finite(
        transforms.clip_by_global_norm(0.5))), transforms.adam(lr, eps=1e-5), variables)

>>> import warnings, tensorflow as tf
>>> w = tf.Variable([0.0, 0.0])
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore", DeprecationWarning)
...     opt = Adam([w], learning_rate=1e-3, eps=1e-5)
>>> _ = opt.apply_gradients([(tf.constant([1e-4, 1.0]), w)])
>>> [round(float(x) / -1e-3, 3) for x in w.numpy()]
[0.909, 1.0]
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

import tensorflow as tf

from robustgrad import transforms


class Adam(tf.Module):
    """Deprecated alias of ``transforms.adam`` applied through a ``transforms.GradientStep``."""

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float = 3e-4,
                 beta_1: float = 0.9, beta_2: float = 0.999, eps: float = 1e-5,
                 name: str = "adam"):
        warnings.warn("agents.core.optim.Adam is deprecated; use robustgrad.transforms.adam (with "
                      "transforms.GradientStep)", DeprecationWarning, stacklevel=2)
        super().__init__(name=name)
        self.learning_rate = tf.Variable(float(learning_rate), trainable=False, name="lr")
        self._variables = list(variables)
        self._step = transforms.GradientStep(
            transforms.identity(),
            transforms.adam(self.learning_rate, beta_1, beta_2, eps), self._variables)
        state = self._step.optimizer_variable_state[0]
        self.iterations = state.count
        self.m, self.v = list(tf.nest.flatten(state.mu)), list(tf.nest.flatten(state.nu))
        self._index = {id(v): i for i, v in enumerate(self._variables)}

    def apply_gradients(self, grads_and_vars: Iterable[tuple[tf.Tensor | None, tf.Variable]]
                        ) -> tf.Variable:
        """One Adam step; every variable needs a gradient here. Returns ``iterations``."""
        grads = [None] * len(self._variables)
        for g, var in grads_and_vars:
            grads[self._index[id(var)]] = g
        self._step.step(grads)
        return self.iterations

    def apply(self, grads: Sequence[tf.Tensor | None],
              variables: Sequence[tf.Variable] | None = None) -> tf.Variable:
        """Keras-3-style alias: ``apply(grads, variables)``."""
        return self.apply_gradients(zip(grads, variables or self._variables))
