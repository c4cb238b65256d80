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


def make_seed_axis_step(variables: Sequence[tf.Variable], learning_rate: float,
                        max_grad_norm: float | None, transform: transforms.GradientTransformation | None,
                        num_seeds: int) -> tuple[Any, Any]:
    """``(gradient_step, optimizer)`` of an agent whose variables carry ``num_seeds`` seeds:
    :class:`SeedAxisAdamStep` (both) for ``S > 1``; for one seed (the seed axis of one, whose
    variables keep an ordinary agent's shapes) :func:`make_adam_step` (the fused kernel, a custom
    ``transform``, the checkpoint of before). Step either with :func:`step_on_axis`."""
    if num_seeds > 1:
        step = SeedAxisAdamStep(variables, learning_rate, max_grad_norm)
        return step, step
    return make_adam_step(variables, learning_rate, max_grad_norm, transform)


def step_on_axis(gradient_step: Any, grads: Sequence[tf.Tensor], active: tf.Tensor | None = None
                 ) -> dict:
    """One step of ``gradient_step`` (from :func:`make_seed_axis_step`) with statistics ``[S]``
    (``grad_norm``, ``applied``, ...); ``active [S]`` bool freezes the seeds that are off. One
    seed's plain step runs as it is and its statistics gain the axis of one; its ``active`` is
    true whenever it steps (PPO stops its epochs once no seed is active). Called without
    AutoGraph conversion (the steps are written with explicit ``tf.cond``).

    >>> v = tf.Variable([1.0, -1.0])
    >>> step, _ = make_seed_axis_step([v], 0.1, 0.5, None, num_seeds=1)
    >>> step_on_axis(step, [tf.constant([3.0, 4.0])])["grad_norm"].numpy().tolist()
    [5.0]
    """
    run = tf.autograph.experimental.do_not_convert(gradient_step.step)
    if isinstance(gradient_step, transforms.SeedAxisStep):
        return run(grads) if active is None else run(grads, active)
    return {k: v[None] for k, v in run(grads).items()}


class SeedAxisAdamStep(transforms.SeedAxisStep):
    """The default gradient step of :func:`make_adam_step` for ``S`` seeds at once:
    :class:`robustgrad.transforms.SeedAxisStep` (``transforms.seed_axis_adam``: seed ``s``
    clipped to ``max_grad_norm`` in its own global norm, guarded on its own and stepped by its
    own Adam with PyTorch-style ``eps``: what ``S`` separate :func:`make_adam_step` steps do),
    with its fused fast path. ``step(grads, active=None)``: ``active [S]`` bool freezes the
    seeds that are off (PPO's ``target_kl``); returns ``grad_norm [S]`` and ``applied [S]`` bool.

    Its attributes are :class:`AdamSlots`' (``learning_rate``, ``iterations [S]`` int64, ``m``,
    ``v``): it is both the ``gradient_step`` and the ``optimizer`` of a seed-axis agent, and
    checkpoints of the previous version load into it.

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
        super().__init__(variables, learning_rate, max_grad_norm, b1, b2, eps, name="adam")
