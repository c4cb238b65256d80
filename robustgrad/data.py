"""Embedded datasets and ``tf.data`` pipelines.

The default dataset is scikit-learn's handwritten digits (1,797 images of 8×8 pixels, ten
classes), which ships inside scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import number, positive_int

__all__ = ["load_digits", "make_dataset"]


def load_digits(test_size: float = 0.25, seed: int = 0) -> tuple[
        tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
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

    test_size = number(test_size, "test_size", minimum=0, maximum=1, min_inclusive=False,
                       max_inclusive=False)
    seed = positive_int(seed, "seed", minimum=0)
    bunch = _sk_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., None]
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=int(seed)
    )
    return (x_train, y_train), (x_test, y_test)


def make_dataset(
    x: Any, y: Any = None, batch_size: int = 128, shuffle: bool = True, seed: int = 0,
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
    batch_size = positive_int(batch_size, "batch_size")
    n = len(x)
    if y is not None and len(y) != n:
        raise ValueError(f"x and y must have the same length, got {n} and {len(y)}")
    ds = tf.data.Dataset.from_tensor_slices((x, y) if y is not None else x)
    if shuffle:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
