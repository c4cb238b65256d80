"""A bound computation over a batch in chunks of examples: pad the batch to whole chunks, run the
computation on each chunk in one ``tf.map_fn``, stitch the rows back. Used where a batch is too
large for the processor's cache (:func:`robustgrad.bounds._engine._output_backward`) and where the
batch size is unknown when tracing (:func:`robustgrad.bounds._methods.propagate_any_batch`).

Each example's rows are computed as they would be alone in a chunk: the computation must be
per-example (no sum over the batch), which every bound pass is.

>>> import tensorflow as tf
>>> x = tf.reshape(tf.range(10.0), [5, 2])
>>> y = map_chunks(lambda a: a[0] * 2.0, (x,), 2, tf.TensorSpec([2, 2], tf.float32))
>>> y.numpy()[:, 0].tolist()
[0.0, 4.0, 8.0, 12.0, 16.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

__all__ = ["map_chunks"]


def map_chunks(fn: Callable[[tuple], Any], parts: Sequence[tf.Tensor], k: int,
               signature: Any, parallel_iterations: int | None = None) -> Any:
    """``fn`` over ``parts`` (tensors ``[B, ...]`` sharing ``B``, static or not) in chunks of ``k``
    examples, the last one zero-padded: ``fn`` gets a tuple of ``[k, ...]`` tensors and returns
    what ``signature`` (a ``tf.TensorSpec`` or a tuple of them, each ``[k, ...]``) describes; the
    result has the same structure, each ``[B, ...]``. ``parallel_iterations``: ``tf.map_fn``'s
    (1 keeps one chunk's tensors alive at a time)."""
    first = parts[0]
    n = first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]
    chunks = (n + k - 1) // k
    pad = chunks * k - n

    def split(t):  # [B, ...] -> [chunks, k, ...]
        t = tf.pad(t, [[0, pad]] + [[0, 0]] * (t.shape.rank - 1))
        if isinstance(chunks, int):
            return tf.reshape(t, [chunks, k, *t.shape[1:]])
        return tf.reshape(t, tf.concat([[chunks, k], tf.shape(t)[1:]], 0))

    out = tf.map_fn(fn, tuple(split(t) for t in parts), fn_output_signature=signature,
                    parallel_iterations=parallel_iterations)
    return tf.nest.map_structure(lambda o: tf.reshape(o, [-1, *o.shape[2:]])[:n], out)
