"""Certified robustness: verified accuracy from the core's bound engine (:mod:`robustgrad.bounds`).

An attack gives an upper bound on robust accuracy; a certificate gives the lower bound. An example
is *verified* at radius ``eps`` when the lower bound of every margin ``z_y - z_j`` (``j != y``)
over the ball is positive: no input in the ball, found by an attack or not, changes the label.
So on the same examples ``verified accuracy <= accuracy under any attack <= clean accuracy``.

The bounds are IBP (Gowal et al. 2018), CROWN (Zhang et al. 2018) or CROWN-IBP (Zhang et al.
2020) with the margin specification merged into the last linear layer (:func:`~robustgrad.bounds.
margin_spec`). A model that is not trained for verification (plain or PGD training) usually has
a verified accuracy near zero except at very small radii; IBP/CROWN-IBP-trained models are
verifiable at useful radii.

>>> import keras, numpy as np
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
>>> model.layers[0].set_weights([np.array([[1.0, -1.0], [0.0, 0.0]], "float32"),
...                              np.zeros(2, "float32")])   # logits (x1, -x1)
>>> x, y = np.array([[0.5, 0.0], [0.1, 0.0]], "float32"), np.array([0, 0])
>>> verified_mask(model, x, y, eps=0.2, clip_min=-1.0, clip_max=1.0).numpy().tolist()
[True, False]
>>> verified_accuracy(model, x, y, eps=0.2, clip_min=-1.0, clip_max=1.0)
0.5
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from robustgrad import bounds as _bounds
from robustgrad._checks import choice, norm_name, positive_int

from . import _validate
from ._models import check_classification_data

__all__ = ["margin_lower_bounds", "verified_accuracy", "verified_mask"]


def margin_lower_bounds(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                        method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                        batch_size: int | None = 256) -> tf.Tensor:
    """Lower bounds of the margins ``z_y - z_j`` (``j != y``, ascending) over the ball around
    each example, intersected with ``[clip_min, clip_max]``.

    Args:
      model: a Keras Sequential or functional model outputting logits (see
        :mod:`robustgrad.bounds` for the supported layers).
      x: float32/float64 ``[N, ...]`` inside ``[clip_min, clip_max]``; y: int labels ``[N]``.
      eps: radius >= 0 in the units of ``x``. norm: ``"linf"`` or ``"l2"``.
      method: ``"crown"``, ``"ibp"`` or ``"crown-ibp"``.
      clip_min, clip_max: the input domain (scalars or per feature; ``None`` unbounded).
      batch_size: examples per compiled call.

    Returns:
      ``[N, num_classes - 1]`` in ``x``'s dtype.
    """
    eps = _validate.check_eps(eps)
    norm = norm_name(norm)
    if norm not in ("linf", "l2"):
        raise ValueError(f"norm must be 'linf' or 'l2' for certification, got {norm!r}")
    method = choice(method.lower() if isinstance(method, str) else method, "method",
                    _bounds.METHODS)
    batch_size = positive_int(batch_size, "batch_size", allow_none=True)
    num_classes = check_classification_data(model, x, y)
    xt = tf.convert_to_tensor(x)
    spec = _bounds.margin_spec(tf.convert_to_tensor(y), num_classes, dtype=xt.dtype)
    lb, _ = _bounds.compute_ball_bounds(model, xt, eps, norm=norm, method=method, C=spec,
                                        clip_min=clip_min, clip_max=clip_max,
                                        batch_size=batch_size)
    return lb


def verified_mask(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                  method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                  batch_size: int | None = 256) -> tf.Tensor:
    """Per example, whether its label provably holds over the whole ball: bool ``[N]``, true where
    every margin lower bound (:func:`margin_lower_bounds`) is > 0. Arguments as there."""
    lb = margin_lower_bounds(model, x, y, eps, norm, method, clip_min=clip_min,
                             clip_max=clip_max, batch_size=batch_size)
    return tf.reduce_all(lb > 0, axis=1)


def verified_accuracy(model: Any, x: Any, y: Any, eps: float, norm: str = "linf",
                      method: str = "crown", *, clip_min: Any = 0.0, clip_max: Any = 1.0,
                      batch_size: int | None = 256) -> float:
    """The fraction of examples verified at radius ``eps`` (:func:`verified_mask`): a lower bound
    on the accuracy under any attack within the ball. Arguments as :func:`margin_lower_bounds`."""
    mask = verified_mask(model, x, y, eps, norm, method, clip_min=clip_min, clip_max=clip_max,
                         batch_size=batch_size)
    return float(tf.reduce_mean(tf.cast(mask, tf.float64)))
