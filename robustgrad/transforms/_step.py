"""A transformation and an optimizer in one compiled step: :class:`GradientStep`.

The optimizer is a Keras 3 optimizer or itself a transformation (:func:`adam`, any chain ending in
:func:`scale_by_learning_rate`), whose updates are added to the variables. Every state lives in
``tf.Variable`` s (checkpointable), and :func:`should_apply` reads from the transformation's state
whether the optimizer runs at all on this step: a step rejected by :func:`apply_if_finite`, or a
non-emitting :func:`accumulate` step, leaves Adam's moments and step count alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from robustgrad.checks import leaf_names
from robustgrad.errors import NonFiniteGradientError
from robustgrad.transforms._accumulate import AccumulateState
from robustgrad.transforms._adam import _fused_adam_apply, _fused_adam_plan
from robustgrad.transforms._base import (
    GradientTransformation,
    _as_tensor,
    _as_transformation,
    _check_float_leaves,
    _leaf_dtype,
    _shared_norms,
    _walk_states,
    global_norm,
)
from robustgrad.transforms._nonfinite import ApplyIfFiniteState, nonfinite_count

__all__ = ["GradientStep", "should_apply"]


def should_apply(state: Any) -> tf.Tensor:
    """Bool scalar: whether the step that produced ``state`` should reach the optimizer.

    False when any :func:`apply_if_finite` inside rejected the step or any :func:`accumulate` did
    not emit. True for transformations with neither.

    >>> from robustgrad.transforms import accumulate
    >>> t = accumulate(2)
    >>> _, s = t.update([tf.ones(1)], t.init([tf.zeros(1)]))
    >>> bool(should_apply(s)), bool(should_apply(()))
    (False, True)
    """
    flags = [s.last_finite for s in _walk_states(state, ApplyIfFiniteState)]
    flags += [s.emit for s in _walk_states(state, AccumulateState)]
    if not flags:
        return tf.constant(True)
    if len(flags) == 1:
        return tf.convert_to_tensor(flags[0])
    return tf.reduce_all(tf.stack(flags))


def _tf_variable(v):
    if isinstance(v, tf.Variable):
        return v
    value = getattr(v, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(f"variables: {v!r} is neither a tf.Variable nor a Keras variable "
                    "on the TensorFlow backend")


class GradientStep(tf.Module):
    """Apply a :class:`GradientTransformation`, then an optimizer, in one step.

    The transformation state lives in non-trainable ``tf.Variable`` s (``self.state_variables``;
    an optimizer transformation's in ``self.optimizer_state_variables``), so
    ``tf.train.Checkpoint(step=step)`` saves it. ``step(grads)`` works eagerly, inside
    ``tf.function`` and under ``jit_compile=True``::

        grads -> grad_norm = global_norm(grads)
              -> updates, state = transform.update(grads, state, variables)
              -> tf.cond(should_apply(state), apply the optimizer to updates, no-op)

    so on a step rejected by :func:`apply_if_finite`, or a non-emitting :func:`accumulate` step,
    the optimizer is not called at all (Adam's moments and step count do not move).

    Args:
        transform: a GradientTransformation.
        optimizer: a Keras 3 optimizer (built here for ``variables`` if it is not yet); or a
            GradientTransformation such as :func:`adam` (``variables += optimizer.update(updates,
            state, variables)``; ``adam(...)`` with ``eps_root == 0`` runs as TensorFlow's fused
            ``ResourceApplyAdam``, one op per variable); or None (``variables += updates``: the
            transform is the whole optimizer, e.g. ``apply_if_finite(chain(..., adam(lr)))``).
        variables: list of Keras 3 or ``tf.Variable`` s, e.g. ``model.trainable_variables``.

    Returns from ``step(grads)`` (``grads``: list aligned with ``variables``, no ``None``): a dict of
    scalar tensors ``grad_norm`` (float32, global norm before the transform), ``applied`` (bool),
    ``nonfinite_steps`` (int32, consecutive non-finite steps: from the outermost apply_if_finite
    when there is one, else counted on the incoming gradients) and ``nonfinite_exceeded`` (bool,
    ``nonfinite_steps > max_nonfinite_steps``; always False without apply_if_finite).

    >>> import keras
    >>> from robustgrad.transforms import apply_if_finite, chain, clip_by_global_norm
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> step = GradientStep(chain(apply_if_finite(clip_by_global_norm(1.0), 5)),
    ...                     keras.optimizers.Adam(1e-3), model.trainable_variables)
    >>> @tf.function
    ... def train(x, y):
    ...     with tf.GradientTape() as tape:
    ...         loss = tf.reduce_mean(tf.square(model(x) - y))
    ...     return step(tape.gradient(loss, model.trainable_variables))
    >>> bool(train(tf.ones((4, 3)), tf.zeros((4, 2)))["applied"])
    True
    """

    def __init__(self, transform: GradientTransformation, optimizer: Any,
                 variables: Sequence[Any], name: str | None = None):
        super().__init__(name=name or "gradient_step")
        self._transform = _as_transformation(transform, "transform")
        if optimizer is not None and not isinstance(optimizer, GradientTransformation) \
                and not hasattr(optimizer, "apply_gradients"):
            raise TypeError("optimizer must be a Keras optimizer, a GradientTransformation "
                            f"(e.g. transforms.adam(lr)) or None, got {type(optimizer).__name__}")
        variables = list(variables)
        if not variables:
            raise ValueError("variables must not be empty")
        names = leaf_names(variables, variable_names=True)
        for i, v in enumerate(variables):
            _tf_variable(v)
            if not _leaf_dtype(v).is_floating:
                raise TypeError(f"variables[{i}] ({names[i]}) has a non-float dtype")
        self._optimizer = optimizer
        self._vars = variables
        self._names = names
        self._tf_vars = [_tf_variable(v) for v in variables]
        self._fused = None
        opt_state = ()
        if isinstance(optimizer, GradientTransformation):
            opt_state = optimizer.init(variables)
            self._fused = _fused_adam_plan(optimizer)
        elif optimizer is not None and not getattr(optimizer, "built", True):
            optimizer.build(variables)
        self._opt_structure = tf.nest.map_structure(lambda _: 0, opt_state)
        state = self._transform.init(variables)
        flat = tf.nest.flatten(state)
        for leaf in flat:
            if not isinstance(leaf, (tf.Tensor, tf.Variable)) and not hasattr(leaf, "dtype"):
                raise TypeError(f"transform: init returned a non-tensor state leaf {leaf!r}")
        self._structure = tf.nest.map_structure(lambda _: 0, state)
        with self.name_scope:
            self.state_variables = [
                tf.Variable(tf.convert_to_tensor(x), trainable=False, name=f"state_{i}")
                for i, x in enumerate(flat)
            ]
            self._nonfinite = tf.Variable(0, dtype=tf.int32, trainable=False,
                                          name="nonfinite_steps")
            if isinstance(optimizer, GradientTransformation):
                self.optimizer_state_variables = [
                    tf.Variable(tf.convert_to_tensor(x), trainable=False, name=f"opt_state_{i}")
                    for i, x in enumerate(tf.nest.flatten(opt_state))]
            else:
                self.optimizer_state_variables = []

    @property
    def transform(self) -> GradientTransformation:
        """The gradient transformation applied before the optimizer."""
        return self._transform

    @property
    def optimizer(self) -> Any:
        """The optimizer that applies the transformed gradients (Keras optimizer,
        GradientTransformation or None)."""
        return self._optimizer

    @property
    def optimizer_state(self) -> Any:
        """An optimizer transformation's current state (tensors; ``()`` for a Keras optimizer)."""
        return tf.nest.pack_sequence_as(
            self._opt_structure, [v.read_value() for v in self.optimizer_state_variables])

    @property
    def optimizer_variable_state(self) -> Any:
        """An optimizer transformation's state as the nest of ``tf.Variable`` s that hold it
        (the structure of ``optimizer.init(variables)``; e.g. ``[0].mu`` for :func:`adam`)."""
        return tf.nest.pack_sequence_as(self._opt_structure, list(self.optimizer_state_variables))

    @property
    def state(self) -> Any:
        """The current transformation state (a nest of tensors read from the variables)."""
        return tf.nest.pack_sequence_as(self._structure,
                                        [v.read_value() for v in self.state_variables])

    def __call__(self, grads: Sequence[Any]) -> dict[str, tf.Tensor]:
        return self.step(grads)

    def step(self, grads: Sequence[Any]) -> dict[str, tf.Tensor]:
        """One step on ``grads`` (aligned with ``variables``); the stats dict described above."""
        grads = list(grads) if isinstance(grads, (list, tuple)) else grads
        if not isinstance(grads, list) or len(grads) != len(self._vars):
            n = len(grads) if isinstance(grads, list) else type(grads).__name__
            raise ValueError(f"grads: expected a list of {len(self._vars)} gradients aligned "
                             f"with variables, got {n}")
        for g, name in zip(grads, self._names):
            if g is None:
                raise ValueError(f"grads: the gradient for variable {name!r} is None "
                                 "(the loss does not depend on it)")
        grads = [_as_tensor(g) for g in grads]
        _check_float_leaves(grads, "grads")
        for g, v, name in zip(grads, self._vars, self._names):
            if g.shape.is_fully_defined() and tuple(g.shape) != tuple(v.shape):
                raise ValueError(f"grads: shape {tuple(g.shape)} for variable {name!r} "
                                 f"of shape {tuple(v.shape)}")

        with _shared_norms():
            return self._step(grads)

    def _step(self, grads):
        grad_norm = global_norm(grads)
        old_flat = [v.read_value() for v in self.state_variables]
        old_state = tf.nest.pack_sequence_as(self._structure, old_flat)
        updates, new_state = self._transform.update(grads, old_state, self._vars)
        flat_new = tf.nest.flatten(new_state)
        # leaves passed through unchanged (the very same tensor) need no write
        assigns = [v.assign(tf.cast(x, v.dtype)) for v, x, old
                   in zip(self.state_variables, flat_new, old_flat) if x is not old]
        apply = should_apply(new_state)

        def do_apply():
            with tf.control_dependencies(self._apply_ops(updates)):
                return tf.constant(True)

        with tf.control_dependencies(assigns):
            static = tf.get_static_value(apply)
            if static is not None and bool(static):  # nothing can reject: no conditional
                applied = do_apply()
            else:
                applied = tf.cond(apply, do_apply, lambda: tf.constant(False))

        found = nonfinite_count(new_state)
        if found is not None:
            count, limit = found
            count = tf.identity(count)
            exceeded = count > limit
        else:
            bad = tf.logical_not(tf.math.is_finite(grad_norm))
            count = self._nonfinite.assign(tf.where(bad, self._nonfinite + 1, 0)).read_value()
            exceeded = tf.constant(False)
        return {"grad_norm": grad_norm, "applied": applied, "nonfinite_steps": count,
                "nonfinite_exceeded": exceeded}

    def _apply_ops(self, updates):
        """The optimizer applied to the transformed ``updates`` (list aligned with variables)."""
        opt = self._optimizer
        updates = [tf.cast(u, _leaf_dtype(v)) for u, v in zip(updates, self._vars)]
        if opt is None:
            return [v.assign_add(u) for v, u in zip(self._tf_vars, updates)]
        if not isinstance(opt, GradientTransformation):
            opt.apply_gradients(list(zip(updates, self._vars)))
            return []
        if self._fused is not None:
            return _fused_adam_apply(self._fused, updates, self.optimizer_variable_state,
                                     self._tf_vars)
        old_flat = [v.read_value() for v in self.optimizer_state_variables]
        state = tf.nest.pack_sequence_as(self._opt_structure, old_flat)
        steps, state = opt.update(updates, state, self._vars)
        steps = tf.nest.flatten(steps)
        assigns = [v.assign(tf.cast(x, v.dtype)) for v, x, old
                   in zip(self.optimizer_state_variables, tf.nest.flatten(state), old_flat)
                   if x is not old]
        return assigns + [v.assign_add(tf.cast(u, v.dtype)) for v, u in zip(self._tf_vars, steps)]

    @property
    def nonfinite_steps(self) -> tf.Tensor:
        """int32 scalar: consecutive non-finite steps so far (see the ``step`` stats)."""
        found = nonfinite_count(self.state)
        return tf.identity(found[0]) if found is not None else self._nonfinite.read_value()

    def raise_if_exceeded(self, stats: dict | None = None) -> None:
        """Eagerly raise :class:`NonFiniteGradientError` if the apply_if_finite limit is exceeded.

        Call it outside ``tf.function`` (e.g. after each compiled train step) with the returned
        ``stats`` or with no argument (reads the state variables).
        """
        if stats is not None:
            if not bool(stats["nonfinite_exceeded"]):
                return
            count = int(stats["nonfinite_steps"])
            found = nonfinite_count(self.state)
        else:
            found = nonfinite_count(self.state)
            if found is None or int(found[0]) <= int(found[1]):
                return
            count = int(found[0])
        limit = f" ({int(found[1])})" if found is not None else ""
        raise NonFiniteGradientError(
            f"gradients were non-finite for {count} consecutive steps, more than "
            f"apply_if_finite's max_nonfinite_steps{limit} (formerly max_consecutive_errors); "
            "stop training (lower the learning rate, check the loss for log(0)/division by zero)")
