""":class:`FusedAdam`: :class:`agents.optim.Adam` with each variable's update in one kernel.

The same algorithm and state (``learning_rate``, ``iterations``, ``m``, ``v``: checkpoints and
the stacked engine's export are unchanged), but each variable is updated by TensorFlow's fused
``ResourceApplyAdam`` kernel instead of about twenty separate ops (reads, moments, bias
corrections, square root, division, assignments). In graph mode without XLA every op costs a
few microseconds of executor overhead whatever its size, so for the agents' small networks the
optimiser dominated a gradient step: in PPO's CartPole update its branch went from 261 to 24 non-constant
ops per step (``benchmarks/agents_speed.py``).

The kernel computes ``lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps_hat)`` (Kingma &
Ba's "epsilon hat" form). With ``eps_hat = eps * sqrt(1 - b2^t)`` this is exactly
``lr * m_hat / (sqrt(v_hat) + eps)``, the PyTorch form :class:`agents.optim.Adam` implements; the
two differ by float rounding only.

>>> import tensorflow as tf
>>> from agents.optim import Adam
>>> w, u = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
>>> plain, fused = Adam([w], learning_rate=1e-3, eps=1e-5), FusedAdam([u], learning_rate=1e-3, eps=1e-5)
>>> for g in ([1e-4, 1.0], [3e-4, -2.0], [0.0, 0.5]):
...     _ = plain.apply_gradients([(tf.constant(g), w)])
...     _ = fused.apply_gradients([(tf.constant(g), u)])
>>> [round(float(x) / -1e-3, 3) for x in u.numpy()]
[2.46, 0.497]
>>> bool(tf.reduce_all(abs(u - w) <= 1e-5 * abs(w)))  # float rounding apart, the same steps
True
>>> int(fused.iterations.numpy()), [round(float(x), 6) for x in fused.m[0].numpy()]
(3, [3.5e-05, -0.049])
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from agents.optim import Adam


class FusedAdam(Adam):
    """:class:`agents.optim.Adam` applied through ``tf.raw_ops.ResourceApplyAdam`` (module doc)."""

    def apply_gradients(self, grads_and_vars: Iterable[tuple[tf.Tensor | None, tf.Variable]]
                        ) -> tf.Variable:
        """One Adam step for every ``(gradient, variable)`` pair (``None`` gradients skipped);
        returns the step count."""
        self.iterations.assign_add(1)
        t = tf.cast(self.iterations, tf.float32)
        beta_1_power, beta_2_power = tf.pow(self.beta_1, t), tf.pow(self.beta_2, t)
        eps_hat = self.eps * tf.sqrt(1.0 - beta_2_power)
        lr = self.learning_rate.read_value()
        for g, var in grads_and_vars:
            if g is None:
                continue
            i = self._index[id(var)]
            tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=self.m[i].handle, v=self.v[i].handle,
                beta1_power=beta_1_power, beta2_power=beta_2_power, lr=lr,
                beta1=tf.constant(self.beta_1), beta2=tf.constant(self.beta_2), epsilon=eps_hat,
                grad=tf.convert_to_tensor(g, var.dtype))
        return self.iterations


__all__ = ["FusedAdam"]
