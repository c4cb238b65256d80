"""Composable gradient transformations (optax-style) over ``tf.nest`` structures.

A :class:`GradientTransformation` is a pair of pure functions::

    state = t.init(params)                                  # a nest of tensors only
    updates, state = t.update(grads, state, params=None)    # same structure as grads

``params`` and ``grads`` are any ``tf.nest`` structure (list, tuple, dict, namedtuple) whose leaves
are float tensors, ``tf.Variable`` s or Keras 3 variables (read as tensors). The state holds tensors
only, so it can live in ``tf.Variable`` s and be checkpointed; :class:`GradientStep` does exactly that
and applies any Keras 3 optimizer after the transformation inside one compiled train step.

Transformations compose with :func:`chain`; the result is again a transformation::

    >>> import tensorflow as tf
    >>> from robustgrad import transforms as T
    >>> t = T.chain(T.zero_nonfinite(), T.clip_by_global_norm(1.0))
    >>> g = [tf.constant([3.0, float("nan")]), tf.constant([4.0])]
    >>> updates, _ = t.update(g, t.init(g))
    >>> [u.numpy().astype(float).round(3).tolist() for u in updates]
    [[0.6, 0.0], [0.8]]

Rejection and emission: :func:`apply_if_finite` and :func:`accumulate` record in their state
whether the current step should reach the optimizer (``ApplyIfFiniteState.last_finite``,
``AccumulateState.emit``). :func:`should_apply` reads those flags from any (nested) state, which is
how :class:`GradientStep` skips ``optimizer.apply_gradients`` -- so Adam's moments do not move on a
rejected or non-emitting step. A transformation used on its own returns zero updates on such steps.

The optimizer is a transformation too (optax's algebra): :func:`adam` is
``chain(scale_by_adam(), scale_by_learning_rate(lr))``, whose updates are added to the parameters;
``GradientStep(transform, adam(lr), variables)`` runs it with TensorFlow's fused Adam kernel.

One theme per module (as optax's ``transforms/``): ``_base`` (the contract, :func:`identity`,
:func:`chain`, :func:`global_norm`), ``_clipping``, ``_nonfinite`` (guards and their counts),
``_accumulate``, ``_noise``, ``_masking``, ``_adam`` (Adam and the learning rate), ``_seeds``
(the same over a leading seed axis: :func:`per_seed`, :func:`seed_axis_adam`,
:class:`SeedAxisStep`) and ``_step`` (:class:`GradientStep`). Import from this
package; the modules are an implementation detail.
"""

from robustgrad.transforms._accumulate import AccumulateState, accumulate
from robustgrad.transforms._adam import (
    ScaleByAdamState,
    ScaleByScheduleState,
    adam,
    scale_by_adam,
    scale_by_learning_rate,
)
from robustgrad.transforms._base import (
    EmptyState,
    GradientTransformation,
    chain,
    global_norm,
    identity,
)
from robustgrad.transforms._clipping import (
    adaptive_clip,
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
)
from robustgrad.transforms._masking import MaskedState, masked
from robustgrad.transforms._noise import AddNoiseState, add_noise
from robustgrad.transforms._nonfinite import (
    ApplyIfFiniteState,
    NonFiniteGradientError,
    all_finite,
    apply_if_finite,
    nonfinite_count,
    zero_nonfinite,
)
from robustgrad.transforms._seeds import (
    SeedAxisStep,
    per_seed,
    seed_axis_adam,
    seed_global_norm,
)
from robustgrad.transforms._step import GradientStep, should_apply

__all__ = [
    "AccumulateState",
    "AddNoiseState",
    "ApplyIfFiniteState",
    "EmptyState",
    "GradientStep",
    "GradientTransformation",
    "MaskedState",
    "NonFiniteGradientError",
    "ScaleByAdamState",
    "ScaleByScheduleState",
    "SeedAxisStep",
    "accumulate",
    "adam",
    "adaptive_clip",
    "add_noise",
    "all_finite",
    "apply_if_finite",
    "chain",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "global_norm",
    "identity",
    "masked",
    "nonfinite_count",
    "per_seed",
    "scale_by_adam",
    "scale_by_learning_rate",
    "seed_axis_adam",
    "seed_global_norm",
    "should_apply",
    "zero_nonfinite",
]
