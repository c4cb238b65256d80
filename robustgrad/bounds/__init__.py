"""Bounds of a network's outputs over a set of inputs: IBP, CROWN, CROWN-IBP, alpha-CROWN.

Bound propagation is the core's third way through a model, beside ``grad``/``vjp`` and ``jvp``:

- ``"ibp"`` -- interval bound propagation (Gowal et al. 2018, "On the Effectiveness of Interval
  Bound Propagation for Training Verifiably Robust Models"): a forward pass over boxes.
- ``"crown"`` -- CROWN (Zhang et al. 2018, "Efficient Neural Network Robustness Certification with
  General Activation Functions"): a backward pass of linear bounds through the layers (a VJP of
  linear relaxations), with the adaptive lower slope for unstable ReLUs; the pre-activation bounds
  of every ReLU are computed by CROWN too (the definition of auto_LiRPA's method ``"CROWN"``),
  intersected with IBP's (both are sound), and only for the neurons IBP cannot prove stable (a
  stable ReLU's relaxation is exact whatever its bounds).
- ``"crown-ibp"`` -- CROWN-IBP (Zhang et al. 2020, "Towards Stable and Efficient Training of
  Verifiably Robust Neural Networks"): IBP for the intermediate bounds, CROWN for the last layer.
- ``"alpha-crown"`` -- alpha-CROWN (Xu et al. 2021, "Fast and Complete: Enabling Complete Neural
  Network Verification with Rapid and Massively Parallel Incomplete Verifiers"): CROWN whose
  unstable ReLUs' lower slopes are optimised by projected Adam, per specification row and per
  intermediate neuron (``iterations``, ``lr``, ``lr_decay``: auto_LiRPA's defaults 20, 0.5,
  0.98), starting from CROWN's and keeping the best bound seen: never looser than CROWN. tanh
  and sigmoid keep CROWN's relaxation.

A verification specification ``C`` (``[B, S, num_outputs]``) asks for bounds of ``C @ outputs``;
:func:`margin_spec` builds the usual one (``z_y - z_j`` for every ``j != y``). ``C`` is merged into
the model's last linear layers before bounding, which is tighter than bounding the logits and
subtracting (Gowal et al. 2018, section 3).

Layers are handled by a table (layer type -> interval rule and linear relaxation): Dense, Conv2D,
ReLU, tanh and sigmoid (layers or the ``activation=`` of Dense/Conv2D; tanh/sigmoid by the
general-activation relaxation of Zhang et al. 2018), Flatten, Reshape,
AveragePooling2D, GlobalAveragePooling2D, BatchNormalization (inference), Add (layer or ``x + y``),
Dropout-like layers (identity at inference), Rescaling, Normalization, Identity, InputLayer, and
nested Sequential/functional models. Any other layer is a ``ValueError`` that names it: never a
silent identity.

Entries:

- :func:`compute_bounds`, :func:`compute_ball_bounds`: validated, compiled, chunked (Keras models).
- :func:`compute_bounds_unchecked`: the same without validation, inside a compiled training step.
- :func:`affine_stack_bounds`: a plain stack of dense layers given as tensors or variables (the
  ``tf.Module`` networks of :mod:`agents`), unchecked, differentiable w.r.t. the weights.

The engine's private modules: ``_rules`` (the linear rules), ``_activations`` (ReLU, tanh,
sigmoid), ``_pooling`` (max pooling), ``_keras_graph`` (the Keras layer table), ``_engine`` (the
propagation), ``_patches`` (convolutions' intermediate bounds by patches), ``_alpha``
(alpha-CROWN's optimisation), ``_methods`` (a method name's propagation, for any batch size),
``_stack`` (the plain stack) and ``_api`` (the validated entries).

>>> import keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model.layers[0].set_weights([np.array([[1.0], [-2.0]], "float32"), np.zeros(1, "float32")])
>>> lb, ub = compute_bounds(model, [[0.0, 0.0]], [[1.0, 1.0]])
>>> lb.numpy().tolist(), ub.numpy().tolist()   # x1 - 2 x2 over the unit square
([[-2.0]], [[1.0]])
"""

from __future__ import annotations

from ._api import (
    METHODS,
    BoundedModel,
    _bounded,  # noqa: F401  (the cached BoundedModel of a model; read by attacks)
    compute_ball_bounds,
    compute_bounds,
    compute_bounds_unchecked,
    margin_spec,
)
from ._stack import affine_stack_bounds

__all__ = ["METHODS", "BoundedModel", "affine_stack_bounds", "compute_ball_bounds",
           "compute_bounds", "compute_bounds_unchecked", "margin_spec"]
