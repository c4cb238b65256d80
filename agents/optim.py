"""Adam over plain ``tf.Variable``s, PyTorch-style epsilon (``eps`` added to ``sqrt(v_hat)``).

The PPO implementation details (Huang et al. 2022, detail 3) use ``eps=1e-5``. The
learning rate is a ``tf.Variable`` so that annealing does not retrace compiled steps,
and all state lives in variables, so ``tf.train.Checkpoint`` saves and restores it.

Why not ``keras.optimizers.Adam``: Keras folds the bias corrections into the step size,
``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``, which is Adam with an
effective epsilon of ``eps / sqrt(1 - b2^t)`` on ``sqrt(v_hat)``: ~32x ``eps`` at step 1,
~3x at step 100 (Kingma & Ba 2015 call this the "epsilon hat" form). The reference
implementations whose settings the agents and presets copy (CleanRL, Stable-Baselines3 on
PyTorch) add ``eps`` to ``sqrt(v_hat)``. Measured with ``eps=1e-5`` and a constant gradient
``[1e-6, 1e-4, 1e-2, 1]`` (Keras 3.15): the first step moves each weight by ``[0.091,
0.909, 0.999, 1.0] x lr`` here and by ``[0.003, 0.240, 0.969, 1.0] x lr`` in Keras, so
small gradients (PPO's policy head after global-norm clipping) learn up to 30x slower
early on. Matching PyTorch would need a per-step epsilon schedule inside Keras' optimizer.
Keras 3 optimizers also create their slots lazily on the first ``apply`` (inside the
compiled update) and track Keras variables that plain ``tf.Module`` checkpoints of the
agents do not see without extra wiring (DESIGN.md section 5). This class is 30 lines.

>>> import tensorflow as tf
>>> w = tf.Variable([0.0, 0.0])
>>> opt = Adam([w], learning_rate=1e-3, eps=1e-5)
>>> _ = opt.apply_gradients([(tf.constant([1e-4, 1.0]), w)])
>>> [round(float(x) / -1e-3, 3) for x in w.numpy()]
[0.909, 1.0]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import tensorflow as tf


class Adam(tf.Module):
    """Adam (Kingma & Ba 2015) with ``apply_gradients(grads_and_vars)``."""

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float = 3e-4, beta_1: float = 0.9,
                 beta_2: float = 0.999, eps: float = 1e-5, name: str = "adam"):
        super().__init__(name=name)
        self.learning_rate = tf.Variable(float(learning_rate), trainable=False, name="lr")
        self.beta_1, self.beta_2, self.eps = beta_1, beta_2, eps
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False, name="m") for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in variables]
        self._index = {id(v): i for i, v in enumerate(variables)}

    def apply_gradients(self, grads_and_vars: Iterable[tuple[tf.Tensor | None, tf.Variable]]
                        ) -> tf.Variable:
        """One Adam step for each ``(gradient, variable)`` pair (``None`` gradients skipped);
        returns the step counter ``iterations`` (int64)."""
        self.iterations.assign_add(1)
        t = tf.cast(self.iterations, tf.float32)
        c1 = 1.0 - tf.pow(self.beta_1, t)
        c2 = 1.0 - tf.pow(self.beta_2, t)
        for g, var in grads_and_vars:
            if g is None:
                continue
            i = self._index[id(var)]
            m, v = self.m[i], self.v[i]
            m.assign(self.beta_1 * m + (1 - self.beta_1) * g)
            v.assign(self.beta_2 * v + (1 - self.beta_2) * tf.square(g))
            denom = tf.sqrt(v / c2) + self.eps
            var.assign_sub(self.learning_rate * (m / c1) / denom)
        return self.iterations

    def apply(self, grads: Sequence[tf.Tensor | None],
              variables: Sequence[tf.Variable] | None = None) -> tf.Variable:
        """Keras-3-style alias: ``apply(grads, variables)``."""
        return self.apply_gradients(zip(grads, variables))
