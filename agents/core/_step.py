"""The gradient step of every agent: a ``robustgrad.transforms`` chain, then Adam.

Adam is the core's transformation, ``transforms.adam(lr, eps=1e-5)`` (PyTorch-style epsilon, as
CleanRL and Stable-Baselines3; Huang et al. 2022, detail 3), behind the guard: the step runs as
TensorFlow's fused ``ResourceApplyAdam`` kernel, one op per variable.

Default chain: ``chain(apply_if_finite(clip_by_global_norm(max_grad_norm)))``: a
non-finite gradient (NaN observation, NaN loss) is rejected (the optimizer is not
called, so weights and Adam moments stay as they were) and counted; finite gradients
are clipped to ``max_grad_norm`` in global norm. ``step(grads)`` returns
``{"grad_norm", "applied", "nonfinite_steps", ...}`` as scalar tensors.

The agents stop training themselves after ``max_nonfinite_updates`` consecutive
rejected *updates*, so the guard's own per-step limit is set out of the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np  # noqa: F401 - used by the doctests
import tensorflow as tf

from robustgrad import transforms

_GUARD_LIMIT = 1_000_000_000


def default_transform(max_grad_norm: float | None) -> transforms.GradientTransformation:
    """``chain(apply_if_finite(clip_by_global_norm(max_grad_norm)))`` (no clip if ``None``)."""
    inner = transforms.clip_by_global_norm(max_grad_norm) if max_grad_norm else transforms.identity()
    return transforms.chain(transforms.apply_if_finite(inner, _GUARD_LIMIT))


def make_gradient_step(optimizer: Any, variables: Sequence[tf.Variable],
                       max_grad_norm: float | None = None,
                       transform: transforms.GradientTransformation | None = None
                       ) -> transforms.GradientStep:
    """A :class:`robustgrad.transforms.GradientStep` over ``variables``.

    ``transform`` (any ``GradientTransformation``) replaces the default chain; wrap it in
    ``apply_if_finite`` yourself if you still want the guard.

    >>> import numpy as np, tensorflow as tf
    >>> v = tf.Variable([1.0, -1.0])
    >>> step = make_gradient_step(transforms.adam(0.1, eps=1e-5), [v], max_grad_norm=0.5)
    >>> float(step.step([tf.constant([3.0, 4.0])])["grad_norm"])   # clipped to 0.5, applied
    5.0
    >>> before = v.numpy().copy()
    >>> stats = step.step([tf.constant([np.nan, 4.0])])            # rejected: weights unchanged
    >>> float(stats["applied"]), bool((v.numpy() == before).all())
    (0.0, True)
    """
    if transform is None:
        transform = default_transform(max_grad_norm)
    return transforms.GradientStep(transform, optimizer, list(variables), name="gradient_step")


class AdamSlots(tf.Module):
    """The agents' checkpoint entry ``optimizer``: Adam's variables under the names the previous
    version saved (``learning_rate``, ``iterations``, ``m``, ``v``), so its agents still load.

    The variables are the gradient step's own (``step.optimizer_variable_state[0]``: the
    :class:`~robustgrad.transforms.ScaleByAdamState` of ``transforms.adam``), not copies.
    ``learning_rate`` is the ``tf.Variable`` the chain reads at every step (assign it to anneal).
    """

    def __init__(self, learning_rate: tf.Variable, step: transforms.GradientStep):
        super().__init__(name="adam")
        state = step.optimizer_variable_state[0]
        self.learning_rate = learning_rate
        self.iterations = state.count
        self.m = list(tf.nest.flatten(state.mu))
        self.v = list(tf.nest.flatten(state.nu))


def make_adam_step(variables: Sequence[tf.Variable], learning_rate: float,
                   max_grad_norm: float | None = None,
                   transform: transforms.GradientTransformation | None = None
                   ) -> tuple[transforms.GradientStep, AdamSlots]:
    """``(gradient_step, optimizer)``: :func:`make_gradient_step` with
    ``transforms.adam(lr, eps=1e-5)`` (``lr`` a ``tf.Variable`` starting at ``learning_rate``) and
    the :class:`AdamSlots` view of its state that agents checkpoint as ``optimizer``.

    >>> v = tf.Variable([1.0, -1.0])
    >>> step, opt = make_adam_step([v], 0.1, max_grad_norm=0.5)
    >>> _ = step.step([tf.constant([3.0, 4.0])])
    >>> int(opt.iterations), [round(float(x), 3) for x in v.numpy()]
    (1, [0.9, -1.1])
    """
    lr = tf.Variable(float(learning_rate), trainable=False, name="lr")
    step = make_gradient_step(transforms.adam(lr, eps=1e-5), variables, max_grad_norm, transform)
    return step, AdamSlots(lr, step)


class SeedAxisAdamStep(tf.Module):
    """The default gradient step of :func:`make_adam_step` for ``S`` seeds at once: every
    variable ``[S, ...]``, seed ``s`` clipped to ``max_grad_norm`` in its own global norm,
    guarded on its own (a non-finite gradient of one seed leaves that seed's weights and Adam
    moments untouched, the others step) and stepped by its own Adam (PyTorch-style ``eps``,
    bias corrections from its own count of applied steps) — what ``S`` separate
    :func:`make_adam_step` steps do, with one op per variable for all seeds (optax's per-example
    clipping, applied to seeds). ``step(grads, active=None)``: ``active [S]`` bool freezes the
    seeds that are off (PPO's ``target_kl``); returns ``grad_norm [S]`` and ``applied [S]`` bool.

    Its attributes are :class:`AdamSlots`' (``learning_rate``, ``iterations [S]`` int64, ``m``,
    ``v``): it is both the ``gradient_step`` and the ``optimizer`` of a seed-axis agent.

    Fast path: when every seed steps and all counts are equal (no seed was ever rejected or
    frozen: the common case), the clipped gradients go to TensorFlow's fused
    ``ResourceApplyAdam``, one op per variable for all seeds (the same math, with the
    PyTorch-style ``eps`` as ``transforms.adam``'s fused path writes it); otherwise the masked
    per-seed ops above. On DQN's 256x256 network for 8 seeds the fused path takes about half the
    time of the masked one (docs/benchmarks/agents.md).

    >>> v = tf.Variable([[1.0, -1.0], [1.0, -1.0]])
    >>> step = SeedAxisAdamStep([v], 0.1, max_grad_norm=0.5)
    >>> out = step.step([tf.constant([[3.0, 4.0], [float("nan"), 0.0]])])
    >>> float(out["grad_norm"][0]), out["applied"].numpy().tolist(), step.iterations.numpy().tolist()
    (5.0, [True, False], [1, 0])
    >>> [[round(float(x), 3) for x in row] for row in v.numpy()]  # seed 0 as make_adam_step's, 1 kept
    [[0.9, -1.1], [1.0, -1.0]]
    """

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float,
                 max_grad_norm: float | None = None, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-5):
        super().__init__(name="adam")
        self.params = list(variables)
        self.num_seeds = int(self.params[0].shape[0])
        self.learning_rate = tf.Variable(float(learning_rate), trainable=False, name="lr")
        self.iterations = tf.Variable(tf.zeros([self.num_seeds], tf.int64), trainable=False,
                                      name="iterations")
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False, name="m") for v in self.params]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False, name="v") for v in self.params]
        self.max_grad_norm = max_grad_norm
        self.b1, self.b2, self.eps = b1, b2, eps

    def _per_seed(self, x, rank):
        return tf.reshape(x, (self.num_seeds,) + (1,) * (rank - 1))

    def step(self, grads: Sequence[tf.Tensor], active: tf.Tensor | None = None
             ) -> dict[str, tf.Tensor]:
        """Clip, guard and Adam per seed (class doc); ``grads`` as the variables."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g), axis=list(range(1, g.shape.rank)))
                                 for g in grads]))
        ok = tf.math.is_finite(norm)
        if active is not None:
            ok = ok & active
        if self.max_grad_norm:
            scale = tf.where(norm > self.max_grad_norm,
                             self.max_grad_norm / tf.maximum(norm, 1e-30), 1.0)
        else:
            scale = tf.ones_like(norm)
        uniform = tf.reduce_all(ok) & tf.reduce_all(
            tf.equal(self.iterations, self.iterations[0]))
        count = self.iterations + tf.cast(ok, tf.int64)
        self.iterations.assign(count)
        tf.cond(uniform, lambda: self._fused(grads, scale, count[0]),
                lambda: self._masked(grads, scale, ok, count))
        return {"grad_norm": norm, "applied": ok}

    def _fused(self, grads, scale, count):
        """Every seed steps with the same count: one ``ResourceApplyAdam`` per variable."""
        t = tf.cast(count, tf.float32)
        b1_power, b2_power = tf.pow(self.b1, t), tf.pow(self.b2, t)
        eps = self.eps * tf.sqrt(1.0 - b2_power)  # the kernel's eps on sqrt(v): PyTorch's form
        for p, m, v, g in zip(self.params, self.m, self.v, grads):
            tf.raw_ops.ResourceApplyAdam(
                var=p.handle, m=m.handle, v=v.handle, beta1_power=b1_power,
                beta2_power=b2_power, lr=tf.convert_to_tensor(self.learning_rate),
                beta1=tf.constant(self.b1), beta2=tf.constant(self.b2), epsilon=eps,
                grad=g * self._per_seed(scale, g.shape.rank))
        return tf.constant(True)

    def _masked(self, grads, scale, ok, count):
        """Seeds at different counts, or some not stepping: per-seed masked ops."""
        t = tf.cast(count, tf.float32)
        c1, c2 = 1.0 - tf.pow(self.b1, t), 1.0 - tf.pow(self.b2, t)
        for p, m, v, g in zip(self.params, self.m, self.v, grads):
            rank = g.shape.rank
            keep = self._per_seed(ok, rank)
            g = tf.where(keep, g * self._per_seed(scale, rank), 0.0)
            m_new = self.b1 * m + (1.0 - self.b1) * g
            v_new = self.b2 * v + (1.0 - self.b2) * tf.square(g)
            update = self.learning_rate * (m_new / self._per_seed(c1, rank)) / (
                tf.sqrt(v_new / self._per_seed(c2, rank)) + self.eps)
            m.assign(tf.where(keep, m_new, m))
            v.assign(tf.where(keep, v_new, v))
            p.assign(tf.where(keep, p - update, p))
        return tf.constant(False)
