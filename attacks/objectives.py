"""Objectives the attacks *maximise*, per example (shape ``[B]``).

Built-in names (resolved by :func:`get_objective`):

* ``"ce"`` — cross-entropy of the logits with ``y``; targeted: minus the cross-entropy with the
  target, so maximising it pulls toward the target.
* ``"cw"`` — the Carlini–Wagner margin (Carlini & Wagner 2017): untargeted
  ``max_{j!=y} z_j - z_y``; targeted ``z_t - max_{j!=t} z_j``. Positive means success.
* ``"dlr"`` — the Difference of Logits Ratio (Croce & Hein 2020, eq. 6), shift- and
  scale-invariant: ``-(z_y - max_{j!=y} z_j) / (z_pi1 - z_pi3)``; the targeted version
  (eq. 7) is ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2)``, which needs the true (or clean
  predicted) label ``y`` as well as the target ``t``.

A user objective is any callable ``objective(outputs, y) -> [B]`` that the attack maximises as
given (``targeted`` then only changes what counts as success). ``outputs`` is whatever the
model returns and ``y`` whatever the caller passed, so an RL user can pass, say, clean action
probabilities as ``y`` and a KL divergence as the objective.

>>> import tensorflow as tf
>>> z = tf.constant([[2.0, 0.0, 1.0]])
>>> float(cw_margin(z, tf.constant([0]))[0])
-1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "OBJECTIVES",
    "cross_entropy",
    "cw_margin",
    "dlr",
    "targeted_dlr",
    "get_objective",
]

OBJECTIVES = ("ce", "cw", "dlr")

_ALIASES = {
    "ce": "ce", "xent": "ce", "crossentropy": "ce", "cross_entropy": "ce", "cross-entropy": "ce",
    "cw": "cw", "margin": "cw", "cw_margin": "cw", "dlr": "dlr",
}


def _onehot(y, logits):
    return tf.one_hot(tf.cast(y, tf.int32), tf.shape(logits)[-1], dtype=logits.dtype)


def cross_entropy(logits: tf.Tensor, y: Any) -> tf.Tensor:
    """Sparse softmax cross-entropy per example, from logits."""
    logits = tf.convert_to_tensor(logits)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32),
                                                          logits=logits)


def _other_max(logits, y):
    oh = _onehot(y, logits)
    big = tf.reduce_max(tf.abs(logits)) * 4.0 + 1e4
    z_y = tf.reduce_sum(oh * logits, axis=-1)
    z_other = tf.reduce_max(logits - oh * big, axis=-1)
    return z_y, z_other


def cw_margin(logits: tf.Tensor, y: Any, targeted: bool = False,
              confidence: float | None = None) -> tf.Tensor:
    """CW margin: untargeted ``max_{j!=y} z_j - z_y``; targeted ``z_y - max_{j!=y} z_j``.

    With ``confidence`` (kappa) the margin is capped at ``kappa`` (``min(margin, kappa)``), the
    form CW minimise: once an example clears the margin it stops pushing.
    """
    logits = tf.convert_to_tensor(logits)
    z_y, z_other = _other_max(logits, y)
    m = (z_y - z_other) if targeted else (z_other - z_y)
    if confidence is not None:
        m = tf.minimum(m, tf.cast(confidence, m.dtype))
    return m


def dlr(logits: tf.Tensor, y: Any) -> tf.Tensor:
    """Untargeted DLR (Croce & Hein 2020, eq. 6), maximised by the attack."""
    logits = tf.convert_to_tensor(logits)
    srt = tf.sort(logits, axis=-1, direction="DESCENDING")
    z_y, z_other = _other_max(logits, y)
    return -(z_y - z_other) / (srt[:, 0] - srt[:, 2] + 1e-12)


def targeted_dlr(logits: tf.Tensor, y: Any, target: tf.Tensor) -> tf.Tensor:
    """Targeted DLR (Croce & Hein 2020, eq. 7): ``-(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4)/2)``.

    Needs at least 4 classes; ``y`` is the true (or clean predicted) label, ``target`` the target.
    """
    logits = tf.convert_to_tensor(logits)
    srt = tf.sort(logits, axis=-1, direction="DESCENDING")
    z_y = tf.reduce_sum(_onehot(y, logits) * logits, axis=-1)
    z_t = tf.reduce_sum(_onehot(target, logits) * logits, axis=-1)
    return -(z_y - z_t) / (srt[:, 0] - 0.5 * (srt[:, 2] + srt[:, 3]) + 1e-12)


def canonical_objective(objective: Any) -> str | None:
    """The built-in name for ``objective`` or ``None`` for a callable; ``ValueError`` otherwise."""
    if callable(objective):
        return None
    if isinstance(objective, str) and objective.strip().lower() in _ALIASES:
        return _ALIASES[objective.strip().lower()]
    raise ValueError(
        f"objective must be one of {OBJECTIVES} or a callable objective(logits, y) -> [B]; "
        f"got {objective!r}")


def get_objective(objective: Any = "ce", targeted: bool = False) -> Callable:
    """An internal objective ``f(logits, y, y_true) -> [B]`` to maximise.

    ``y`` holds the labels the caller passed (targets when ``targeted``), ``y_true`` the true or
    clean-predicted labels (used only by targeted DLR). A user callable is wrapped as
    ``f(logits, y, y_true) = objective(logits, y)``.
    """
    name = canonical_objective(objective)
    if name is None:
        def user(logits, y, y_true):
            return objective(logits, y)
        return user
    if name == "ce":
        def ce(logits, y, y_true):
            v = cross_entropy(logits, y)
            return -v if targeted else v
        return ce
    if name == "cw":
        def cw(logits, y, y_true):
            return cw_margin(logits, y, targeted=targeted)
        return cw
    if targeted:
        def dlr_t(logits, y, y_true):
            return targeted_dlr(logits, y_true, y)
        return dlr_t

    def dlr_u(logits, y, y_true):
        return dlr(logits, y)
    return dlr_u
