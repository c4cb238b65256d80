"""One call for every method: the method name picks the propagation, for any batch size.

``"ibp"``, ``"crown"`` and ``"crown-ibp"`` are :func:`robustgrad.bounds._engine.propagate`;
``"alpha-crown"`` is :func:`robustgrad.bounds._alpha.optimized_bounds`, which builds on the
engine (CROWN is its first iteration). :func:`propagate` is that choice for one static batch;
:func:`propagate_any_batch` also takes an unknown batch size (``fit`` traces ``[None, ...]``), in
padded chunks of :data:`CHUNK` examples. Both are traceable and unvalidated: the entries of
:mod:`robustgrad.bounds._api` and :mod:`robustgrad.bounds._stack` validate.

>>> import numpy as np, tensorflow as tf
>>> from robustgrad.bounds._stack import StackGraph
>>> g = StackGraph([np.array([[1.0]], "float32"), np.array([[1.0]], "float32")], [None, None],
...                ["relu"])          # relu(x) on [-1, 2]
>>> lo, _ = propagate(g, tf.constant([[-1.0]]), tf.constant([[2.0]]), None, None, "crown")
>>> alo, _ = propagate(g, tf.constant([[-1.0]]), tf.constant([[2.0]]), None, None, "alpha-crown",
...                    options={"iterations": 5})
>>> round(float(lo[0, 0]), 4), round(float(alo[0, 0]), 4)   # CROWN's slope 1; the optimum 0
(-1.0, 0.0)
"""

from __future__ import annotations

import tensorflow as tf

from . import _alpha, _engine
from ._chunks import map_chunks

__all__ = ["CHUNK", "propagate", "propagate_any_batch"]

#: examples per chunk when the batch size is not static
CHUNK = 32


def propagate(graph, lower, upper, spec, ball, method, lower_only=False, options=None):
    """Bounds of the graph's output over the box (static batch ``B``) by ``method`` ->
    ``(lb, ub)`` as :func:`robustgrad.bounds._engine.propagate` (``[B, *out]``, or ``[B, S]``
    with ``spec`` [B, S, *out]; ``ub`` None with ``lower_only`` and a ``spec``). ``options``:
    alpha-CROWN's keyword arguments (``iterations``, ``lr``, ``lr_decay``; its defaults when
    None), unused by the other methods. No validation."""
    if method == "alpha-crown":
        return _alpha.optimized_bounds(graph, lower, upper, spec, ball, lower_only=lower_only,
                                       **(options or {}))
    return _engine.propagate(graph, lower, upper, spec, ball, method, lower_only)


def propagate_any_batch(graph, lower, upper, spec, ball, method, lower_only=False, options=None):
    """:func:`propagate` for a static or an unknown batch size: an unknown one is padded to
    chunks of :data:`CHUNK` examples, bounded chunk by chunk in one ``tf.map_fn``."""
    lower_only = bool(lower_only and spec is not None)
    if lower.shape[0] is not None:
        return propagate(graph, lower, upper, spec, ball, method, lower_only, options)
    k = CHUNK

    def fix(t, like):
        return tf.ensure_shape(t, [k, *like.shape[1:]])

    if spec is not None:
        out = [k, spec.shape[1]]
    else:
        out = [k, *_engine.output_shape(graph, lower.shape[1:], lower.dtype)]
    parts = [lower, upper]
    if spec is not None:
        parts.append(spec)
    if ball is not None:
        parts.append(ball[0])

    def one(a):
        lo, hi = fix(a[0], lower), fix(a[1], upper)
        s = fix(a[2], spec) if spec is not None else None
        b = (fix(a[-1], ball[0]), ball[1]) if ball is not None else None
        if lower_only:
            return propagate(graph, lo, hi, s, b, method, True, options)[0]
        return propagate(graph, lo, hi, s, b, method, options=options)

    sig = tf.TensorSpec(out, lower.dtype)
    if lower_only:
        return map_chunks(one, parts, k, sig), None
    return map_chunks(one, parts, k, (sig, sig))
