"""The resumable ``tf.data`` pipeline of adversarial training: the order of every epoch depends
only on ``(seed, epoch)``, so a run resumed at epoch ``e`` sees exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad._checks import positive_int

__all__ = ["epoch_dataset", "steps_per_epoch"]


def epoch_dataset(x: Any, y: Any, batch_size: int, *, seed: int = 0, first_epoch: int = 0,
                  epochs: int = 1, drop_remainder: bool = False, shift: int = 0,
                  pad_value: float = 0.0, skip_batches: int = 0) -> tf.data.Dataset:
    """A ``tf.data`` pipeline over epochs ``first_epoch .. epochs-1`` whose order depends only on
    ``(seed, epoch)``: resuming at epoch ``e`` replays exactly the batches an uninterrupted run
    would have seen. Use with ``fit(..., steps_per_epoch=steps_per_epoch(...))``.

    ``shift=k`` augments images (NHWC) with random translations of up to ``k`` pixels (pad with
    ``pad_value``, crop), drawn from stateless seeds ``(seed, epoch, batch)`` -- also replayed
    exactly on resume. ``x`` float ``[N, H, W, C]`` (any shape without ``shift``), ``y`` int
    ``[N]``; the batches are ``(float32 [b, ...], int64 [b])``. ``skip_batches=k`` leaves out
    the first ``k`` batches of ``first_epoch`` (a run resumed from a mid-epoch checkpoint: the
    rest of the epoch, then the next ones, exactly as an uninterrupted run sees them).

    >>> import numpy as np
    >>> x, y = np.zeros((5, 2), "float32"), np.arange(5)
    >>> [len(b) for _, b in epoch_dataset(x, y, 2, epochs=2)]
    [2, 2, 1, 2, 2, 1]
    >>> [len(b) for _, b in epoch_dataset(x, y, 2, epochs=2, skip_batches=2)]
    [1, 2, 2, 1]
    """
    batch_size = positive_int(batch_size, "batch_size")
    shift = positive_int(shift, "shift", minimum=0)
    skip_batches = positive_int(skip_batches, "skip_batches", minimum=0)
    n = len(x)
    x = np.asarray(x, np.float32)

    def one_epoch(e):
        idx = tf.random.experimental.stateless_shuffle(
            tf.range(n), seed=tf.stack([tf.constant(seed, tf.int64), e]))
        batches = tf.data.Dataset.from_tensor_slices(idx).batch(batch_size,
                                                                drop_remainder=drop_remainder)
        return batches.enumerate().map(lambda b, i: (e, b, i))

    xs = tf.constant(x)
    ys = tf.constant(np.asarray(y).reshape(-1).astype(np.int64))

    def gather(e, b, i):
        xb = tf.gather(xs, i)
        if shift:
            s = tf.stack([tf.cast(seed, tf.int64) * 7919 + e, b])
            h, w = x.shape[1], x.shape[2]
            padded = tf.pad(xb, [[0, 0], [shift, shift], [shift, shift], [0, 0]],
                            constant_values=pad_value)
            off = tf.random.stateless_uniform([tf.shape(xb)[0], 2], s, 0, 2 * shift + 1,
                                              dtype=tf.int32)
            rows = off[:, 0:1] + tf.range(h)[None, :]
            cols = off[:, 1:2] + tf.range(w)[None, :]
            xb = tf.gather(padded, rows, axis=1, batch_dims=1)
            xb = tf.gather(xb, cols, axis=2, batch_dims=1)
        return xb, tf.gather(ys, i)

    ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    if skip_batches:
        ds = ds.skip(skip_batches)
    ds = ds.map(gather)
    return ds.prefetch(2)


def steps_per_epoch(n: int, batch_size: int, drop_remainder: bool = False) -> int:
    """Batches per epoch of :func:`epoch_dataset` over ``n`` examples.

    >>> steps_per_epoch(10, 4), steps_per_epoch(10, 4, drop_remainder=True)
    (3, 2)
    """
    return n // batch_size if drop_remainder else -(-n // batch_size)
