"""Bounds of a plain stack of dense layers given as tensors or variables (no Keras model).

``h_0 = x``, ``h_k = act_k(h_{k-1} @ W_k + b_k)``: the networks of :mod:`agents` (``tf.Module``
MLPs of ``tf.Variable``s) and any hand-written MLP. :func:`affine_stack_bounds` runs the same
engine as :func:`robustgrad.bounds.compute_bounds` (IBP, CROWN, CROWN-IBP; ReLU, tanh, sigmoid),
unchecked like :func:`robustgrad.bounds.compute_bounds_unchecked`: no validation of values, so it
traces inside a compiled training step, and gradients reach ``W`` and ``b`` (certified training,
the convex-relaxation regulariser of SA-PPO/SA-DQN; Zhang et al. 2020, "Robust Deep
Reinforcement Learning against Adversarial Perturbations on State Observations").

An element-wise monotone map in front of the stack (an observation normaliser
``clip((x - mean) / std, -c, c)``) maps a box to the box of the mapped corners: pass
``normalize(lower)`` and ``normalize(upper)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from . import _activations as _act
from . import _methods as _methods
from . import _rules as _r
from ._api import METHODS

__all__ = ["StackGraph", "affine_stack_bounds"]

_NAMES = (*_act.ACTIVATIONS, "linear")


class StackGraph:
    """A stack of dense layers as a bound graph: node ``0`` the input, then per layer a
    :class:`~robustgrad.bounds._rules.Dense` node and (unless ``"linear"``) an activation node.

    Args:
      weights: ``[in, out]`` matrices (tensors, variables or arrays), read when the bounds run.
      biases: ``[out]`` vectors or ``None``, one per weight.
      activations: one name per layer that has an activation after it, in order; the remaining
        layers (at the end) are linear.
    """

    def __init__(self, weights: Sequence[Any], biases: Sequence[Any], activations: Sequence[str]):
        self.rules: list = [None]
        self.inputs: list = [()]
        for k, (w, b) in enumerate(zip(weights, biases)):
            self._append(_r.Dense(f"layer{k}", lambda w=w: w, lambda b=b: b))
            act = activations[k] if k < len(activations) else "linear"
            if act != "linear":
                self._append(_act.ACTIVATIONS[act](f"layer{k}/{act}"))
        self.output = len(self.rules) - 1

    def _append(self, rule):
        self.inputs.append((len(self.rules) - 1,))
        self.rules.append(rule)


def _shape(t):
    return tf.TensorShape(t.shape) if hasattr(t, "shape") else tf.convert_to_tensor(t).shape


def _check_stack(weights, biases, activations, lower, method, spec):
    """Static checks only (lengths, ranks, names): nothing that reads a tensor's values."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not weights:
        raise ValueError("weights must hold at least one [in, out] matrix, got none")
    if len(biases) != len(weights):
        raise ValueError(f"biases must have one entry (a [out] vector or None) per weight: "
                         f"{len(weights)} weights, {len(biases)} biases")
    if isinstance(activations, str):
        activations = [activations] * (len(weights) - 1)
    activations = [("linear" if a is None else a) for a in activations]
    if len(activations) not in (len(weights) - 1, len(weights)):
        raise ValueError(f"activations must name {len(weights) - 1} (hidden layers) or "
                         f"{len(weights)} (every layer) activations, got {len(activations)}")
    for a in activations:
        if a not in _NAMES:
            raise ValueError(f"activations must be among {_NAMES}, got {a!r}")
    width = lower.shape[-1]
    for k, (w, b) in enumerate(zip(weights, biases)):
        shape = _shape(w)
        if shape.rank != 2 or (width is not None and shape[0] != width):
            raise ValueError(f"weights[{k}] must have shape [{width}, out], got {shape.as_list()}")
        if b is not None:
            b_shape = _shape(b)
            if b_shape.as_list() != [shape[1]]:
                raise ValueError(f"biases[{k}] must have shape [{shape[1]}], got "
                                 f"{b_shape.as_list()}")
        width = shape[1]
    if spec is not None and (spec.shape.rank != 3 or spec.shape[2] != width):
        raise ValueError(f"C must have shape [B, S, {width}], got {spec.shape.as_list()}")
    return activations


def affine_stack_bounds(weights: Sequence[Any], biases: Sequence[Any],
                        activations: str | Sequence[str | None], lower: Any, upper: Any,
                        method: str = "crown", C: Any = None,  # noqa: N803
                        lower_only: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
    """Bounds of a stack of dense layers over the box ``lower <= x <= upper``.

    The network is ``h_k = act_k(h_{k-1} @ weights[k] + biases[k])`` from ``h_0 = x``; the
    output is ``h_n`` (or ``C @ h_n``, ``C`` merged into the last linear layer). Guaranteed for
    every ``x`` in the box, up to floating-point rounding: ``lb <= output <= ub``.

    Unchecked: shapes and names are checked (statically), values are not (``lower <= upper``
    and finiteness are the caller's); no Python branch on tensor values, so it runs inside
    ``tf.function`` (an unknown batch size too), and gradients reach ``weights`` and ``biases``.

    Args:
      weights: ``n`` matrices ``[in_k, out_k]`` (tensors, ``tf.Variable`` s or arrays); the first
        ``in`` is the width of ``x``.
      biases: ``n`` vectors ``[out_k]`` or ``None``.
      activations: ``"relu"``, ``"tanh"``, ``"sigmoid"`` or ``"linear"``: one name for every
        hidden layer (the last layer linear, as in :class:`agents.core.networks.MLP`), or a sequence of
        ``n - 1`` (the last layer linear) or ``n`` names (``None`` means ``"linear"``).
      lower, upper: float32 or float64 ``[B, in]`` (the weights are cast to this dtype).
      method: ``"crown"``, ``"ibp"``, ``"crown-ibp"`` or ``"alpha-crown"`` (default options;
        not differentiable).
      C: optional specification ``[B, S, out_n]``.
      lower_only: with ``C``, the lower bounds only (``ub`` is None): the backward pass
        carries one side's coefficients, about half the work of both (an upper bound is the
        negated lower bound of ``-C``, the same numbers).

    Returns:
      ``(lb, ub)``: ``[B, out_n]``, or ``[B, S]`` with ``C``; the dtype of ``lower``.

    Raises:
      ValueError: mismatched lengths or shapes, an unknown activation or method,
        ``lower_only`` without ``C``.

    Example (``relu(x) - relu(x)`` on ``[1, 2]``: IBP is loose, CROWN exact):

    >>> import numpy as np
    >>> w = [np.array([[1.0, 1.0]], "float32"), np.array([[1.0], [-1.0]], "float32")]
    >>> lb, ub = affine_stack_bounds(w, [None, None], "relu", [[1.0]], [[2.0]], method="ibp")
    >>> lb.numpy().tolist(), ub.numpy().tolist()
    ([[-1.0]], [[1.0]])
    >>> lb, ub = affine_stack_bounds(w, [None, None], "relu", [[1.0]], [[2.0]])
    >>> lb.numpy().tolist(), ub.numpy().tolist()
    ([[0.0]], [[0.0]])
    """
    method = method.lower() if isinstance(method, str) else method
    lower = tf.convert_to_tensor(lower)
    if not lower.dtype.is_floating:
        lower = tf.cast(lower, tf.float32)
    upper = tf.cast(tf.convert_to_tensor(upper), lower.dtype)
    if lower.shape.rank != 2 or upper.shape.rank != 2:
        raise ValueError(f"lower and upper must be [B, in], got shapes {lower.shape.as_list()} "
                         f"and {upper.shape.as_list()}")
    spec = None if C is None else tf.cast(tf.convert_to_tensor(C), lower.dtype)
    weights, biases = list(weights), list(biases)
    layer_activations = _check_stack(weights, biases, activations, lower, method, spec)
    if lower_only and spec is None:
        raise ValueError("lower_only needs a specification C ([B, S, out]); without one both "
                         "sides are computed together")
    graph = StackGraph(weights, biases, layer_activations)
    return _methods.propagate_any_batch(graph, lower, upper, spec, None, method, lower_only)
