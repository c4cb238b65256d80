"""Adam over plain ``tf.Variable``s, PyTorch-style epsilon (``eps`` added to ``sqrt(v_hat)``).

The PPO implementation details (Huang et al. 2022, detail 3) use ``eps=1e-5``. The
learning rate is a ``tf.Variable`` so that annealing does not retrace compiled steps,
and all state lives in variables, so ``tf.train.Checkpoint`` saves and restores it.
"""

from __future__ import annotations

import tensorflow as tf


class Adam(tf.Module):
    """Adam (Kingma & Ba 2015) with ``apply_gradients(grads_and_vars)``."""

    def __init__(self, variables, learning_rate=3e-4, beta_1=0.9, beta_2=0.999, eps=1e-5,
                 name="adam"):
        super().__init__(name=name)
        self.learning_rate = tf.Variable(float(learning_rate), trainable=False, name="lr")
        self.beta_1, self.beta_2, self.eps = beta_1, beta_2, eps
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False, name="m") for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in variables]
        self._index = {id(v): i for i, v in enumerate(variables)}

    def apply_gradients(self, grads_and_vars):
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

    def apply(self, grads, variables=None):
        """Keras-3-style alias: ``apply(grads, variables)``."""
        return self.apply_gradients(zip(grads, variables))
