"""The gradient step of every agent: a ``robustgrad.transforms`` chain, then Adam.

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
    >>> from agents.optim import Adam
    >>> v = tf.Variable([1.0, -1.0])
    >>> step = make_gradient_step(Adam([v], learning_rate=0.1), [v], max_grad_norm=0.5)
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
