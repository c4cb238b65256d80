"""A prepared attack call: the validated batch and the objective, ready for a compiled loop.

:func:`attacks._base.prepare` builds one from an attack's arguments (every check before any
work); :func:`attacks._chunks.run_in_chunks` runs an attack's compiled call over it, a chunk of
``batch_size`` examples at a time; the attack engine (:mod:`attacks._engine`) reads its
``value_fn``, bounds and labels. It is a record: it checks nothing and computes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = ["Prepared"]


@dataclasses.dataclass
class Prepared:
    """One attack call's inputs, checked and converted (``B`` examples).

    Attributes:
      owner: the cache owner of the compiled loops (the model, or the ``loss_fn``).
      x: the inputs ``[B, ...]`` in the compute dtype (float32 for 8-bit or half inputs).
      in_dtype: the caller's dtype, that ``x_adv`` is returned in.
      y: labels (int64 ``[B]``) or the user's structure (a custom objective's target).
      y_true: int64 ``[B]``: the true or clean-predicted labels (zeros where undefined).
      lo, hi: the bounds ``clip_min``/``clip_max``, broadcastable to ``x``.
      has_success: whether success (misclassification, or reaching the target) is defined.
      num_classes: the model's number of logits, or None (a ``loss_fn``, or traced).
      value_fn: ``(x_adv, y, y_true) -> (objective [B], success [B] bool)``; pure, traceable.
      batch_size: examples per compiled call (:func:`attacks._chunks.run_in_chunks`).
      forward_passes: example rows the preparation pushed through the model (predicted labels).
      eager: whether the call was made eagerly (chunks and Python counts only then).
      key: the static part of the compiled loops' cache key.
    """

    owner: Any
    x: tf.Tensor
    in_dtype: tf.DType
    y: Any
    y_true: tf.Tensor
    lo: tf.Tensor
    hi: tf.Tensor
    has_success: bool
    num_classes: int | None
    value_fn: Callable
    batch_size: int
    forward_passes: int = 0
    eager: bool = True
    key: tuple = ()
