"""Models for meta-learning as functions of their parameters: :class:`FunctionalModel`.

A learner is ``apply(params, x) -> predictions`` over a flat list of tensors, so an inner loop can
produce "fast weights" (plain tensors) that stay differentiable with respect to the meta-parameters.
:func:`mlp` builds one (with a task-batched ``batched_apply``), :func:`from_keras` wraps a Keras 3
model through ``model.stateless_call``.

>>> import tensorflow as tf
>>> model = mlp([2, 3, 1], seed=0)
>>> [tuple(v.shape) for v in model.params], model.names[0]
([(2, 3), (3,), (3, 1), (1,)], 'dense_0/kernel')
>>> tuple(model.apply(model.params, tf.ones((5, 2))).shape)
(5, 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import positive_int

__all__ = ["FunctionalModel", "from_keras", "mlp"]


class FunctionalModel(tf.Module):
    """A model as ``apply(params, x)`` plus its meta-parameters (``tf.Variable`` list).

    Args:
      apply: ``apply(params, x) -> y``; ``params`` is a list of tensors shaped like
        ``variables``; ``x`` ``[N, ...]`` float; returns ``[N, ...]``.
      variables: the meta-parameters, a list of ``tf.Variable``.
      names: optional names used in error messages (default: the variables' names).
      batched_apply: optional ``batched_apply(params, x)`` with a leading task axis on every
        parameter (``[T, *v.shape]``) and on ``x`` (``[T, N, ...]``); when given (as by
        :func:`mlp`), :class:`MetaLearner` adapts all tasks of a meta-batch at once instead of
        looping over them (same result, several times faster).

    Calling the model, ``model(x)``, evaluates it at its current variables.

    >>> w = tf.Variable([[2.0]], name="w")
    >>> m = FunctionalModel(lambda p, x: tf.matmul(x, p[0]), [w])
    >>> m(tf.constant([[3.0]])).numpy().tolist(), list(m.names)
    ([[6.0]], ['w'])
    """

    def __init__(self, apply: Callable, variables: Sequence[tf.Variable],
                 names: Sequence[str] | None = None, name: str | None = None,
                 batched_apply: Callable | None = None):
        super().__init__(name=name)
        if not callable(apply):
            raise TypeError(f"apply must be callable, got {type(apply).__name__}")
        variables = list(variables)
        if not variables:
            raise ValueError("variables must be a non-empty list of tf.Variable")
        for i, v in enumerate(variables):
            if not isinstance(v, tf.Variable):
                raise TypeError(f"variables[{i}] must be a tf.Variable, got {type(v).__name__}")
        self.apply = apply
        self.batched_apply = batched_apply
        self.params = variables
        self.names = list(names) if names is not None else [
            v.name.split(":")[0] for v in variables]

    def __call__(self, x: Any, training: bool = False) -> tf.Tensor:
        del training
        return self.apply([tf.convert_to_tensor(v) for v in self.params], x)

    def get_weights(self) -> list[np.ndarray]:
        """The parameters as numpy arrays, in ``params`` order."""
        return [v.numpy() for v in self.params]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Assign ``weights`` (as returned by :meth:`get_weights`) to the parameters."""
        for v, w in zip(self.params, weights):
            v.assign(w)


def mlp(sizes: Sequence[int], activation: str | Callable = "relu", seed: int = 0,
        dtype: tf.DType = tf.float32) -> FunctionalModel:
    """A fully connected network as a :class:`FunctionalModel`.

    Args:
      sizes: layer widths including input and output, e.g. ``[1, 40, 40, 1]`` (MAML's sinusoid
        network).
      activation: name of a ``tf.nn`` activation (``"relu"``, ``"tanh"``, ``"softplus"``...) or a
        callable; not applied after the last layer.
      seed: initialisation seed (He-normal weights, zero biases).
      dtype: parameter dtype.

    Returns a model whose ``apply(params, x)`` maps ``x [N, sizes[0]]`` to ``[N, sizes[-1]]``.
    """
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"sizes must list at least two positive widths, got {sizes}")
    sizes = [positive_int(s, f"sizes[{i}]") for i, s in enumerate(sizes)]
    act = getattr(tf.nn, activation) if isinstance(activation, str) else activation
    rng = np.random.default_rng(seed)
    variables = []
    names = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.normal(0.0, math.sqrt(2.0 / a), size=(a, b))
        variables.append(tf.Variable(tf.constant(w, dtype), name=f"dense_{i}/kernel"))
        variables.append(tf.Variable(tf.zeros([b], dtype), name=f"dense_{i}/bias"))
        names += [f"dense_{i}/kernel", f"dense_{i}/bias"]
    n_layers = len(sizes) - 1

    def apply(params, x):
        h = tf.convert_to_tensor(x, dtype)
        for i in range(n_layers):
            h = tf.matmul(h, params[2 * i]) + params[2 * i + 1]
            if i < n_layers - 1:
                h = act(h)
        return h

    def batched_apply(params, x):  # params [T, ...], x [T, N, d]
        h = tf.convert_to_tensor(x, dtype)
        for i in range(n_layers):
            h = tf.matmul(h, params[2 * i]) + params[2 * i + 1][:, None, :]
            if i < n_layers - 1:
                h = act(h)
        return h

    return FunctionalModel(apply, variables, names, name="mlp", batched_apply=batched_apply)


def from_keras(model: Any) -> FunctionalModel:
    """Wrap a built Keras 3 model (TensorFlow backend) as a :class:`FunctionalModel`.

    ``apply(params, x)`` is ``model.stateless_call(params, non_trainable, x)``; the meta-parameters
    are the model's trainable variables (their underlying ``tf.Variable``), so meta-training
    updates the Keras model in place. Non-trainable state (batch-norm statistics) is read, not
    updated.
    """
    if not getattr(model, "built", False):
        raise ValueError("model must be built (call it once or give it an Input) before from_keras")
    tvars = list(model.trainable_variables)
    if not tvars:
        raise ValueError("model has no trainable variables")
    ntv = list(model.non_trainable_variables)

    def apply(params, x):
        y, _ = model.stateless_call(list(params), [v.value for v in ntv], x, training=False)
        return y

    return FunctionalModel(apply, [v.value for v in tvars], [v.path for v in tvars],
                           name="keras_functional")
