"""Embedded datasets and ``tf.data`` pipelines.

The default dataset is scikit-learn's handwritten digits (1,797 images of 8×8 pixels, ten
classes), which ships inside scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["load_digits", "make_dataset"]


def load_digits(test_size: float = 0.25, seed: int = 0):
    """scikit-learn's digits as ``(x_train, y_train), (x_test, y_test)``, like ``keras.datasets``.

    Images are float32 in ``[0, 1]`` (the 0–16 intensities divided by 16), shape ``(N, 8, 8, 1)``;
    labels are int64 in ``0..9``. The split is stratified and fixed by ``seed`` (75/25 by
    default: 1,347 training and 450 test images).

    Example:
      >>> (x_train, y_train), (x_test, y_test) = load_digits()
      >>> x_train.shape, x_test.shape, x_train.dtype.name, y_train.dtype.name
      ((1347, 8, 8, 1), (450, 8, 8, 1), 'float32', 'int64')
    """
    from sklearn.datasets import load_digits as _sk_digits
    from sklearn.model_selection import train_test_split

    if not isinstance(test_size, (int, float)) or isinstance(test_size, bool) or not (
        0.0 < test_size < 1.0
    ):
        raise ValueError(f"test_size must be a fraction in (0, 1), got {test_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    bunch = _sk_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., None]
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=int(seed)
    )
    return (x_train, y_train), (x_test, y_test)


def make_dataset(
    x, y=None, batch_size: int = 128, shuffle: bool = True, seed: int = 0,
    repeat: bool = False, drop_remainder: bool = False,
) -> tf.data.Dataset:
    """A batched, prefetched ``tf.data.Dataset`` of ``(x, y)`` (or ``x``) arrays.

    Shuffling uses a fixed ``seed`` and reshuffles each epoch deterministically.

    Example:
      >>> (x, y), _ = load_digits()
      >>> ds = make_dataset(x, y, batch_size=64)
      >>> xb, yb = next(iter(ds)); xb.shape
      TensorShape([64, 8, 8, 1])
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    n = len(x)
    if y is not None and len(y) != n:
        raise ValueError(f"x and y must have the same length, got {n} and {len(y)}")
    ds = tf.data.Dataset.from_tensor_slices((x, y) if y is not None else x)
    if shuffle:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
