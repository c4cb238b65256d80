"""The resumable ``tf.data`` pipeline of adversarial training: the order of every epoch depends
only on ``(seed, epoch)``, so a run resumed at epoch ``e`` sees exactly the batches an
uninterrupted run would have seen; and the standard augmentation of natural images
(pad-and-random-crop, horizontal flip: He et al. 2016's CIFAR recipe, used by Madry et al. 2018,
Rice et al. 2020 and Wong et al. 2020), computed on the fly from stateless seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from robustgrad.checks import positive_int

__all__ = ["augment_dataset", "epoch_dataset", "random_crop_flip", "steps_per_epoch"]

_PAD_MODES = ("constant", "reflect", "symmetric")


def epoch_dataset(x: Any, y: Any, batch_size: int, *, seed: int = 0, first_epoch: int = 0,
                  epochs: int = 1, drop_remainder: bool = False, shift: int = 0,
                  pad_value: float = 0.0, skip_batches: int = 0, flip: bool = False
                  ) -> tf.data.Dataset:
    """A ``tf.data`` pipeline over epochs ``first_epoch .. epochs-1`` whose order depends only on
    ``(seed, epoch)``: resuming at epoch ``e`` replays exactly the batches an uninterrupted run
    would have seen. Use with ``fit(..., steps_per_epoch=steps_per_epoch(...))``.

    ``shift=k`` augments images (NHWC) with random translations of up to ``k`` pixels (pad with
    ``pad_value``, crop), drawn from stateless seeds ``(seed, epoch, batch)`` -- also replayed
    exactly on resume; ``flip=True`` mirrors each image left-right with probability 1/2, from
    the same seeds (for natural images, not digits). ``x`` float ``[N, H, W, C]`` (any shape
    without ``shift`` and ``flip``), ``y`` int ``[N]``; the batches are
    ``(float32 [b, ...], int64 [b])``. ``skip_batches=k`` leaves out the first ``k`` batches of
    ``first_epoch`` (a run resumed from a mid-epoch checkpoint: the rest of the epoch, then the
    next ones, exactly as an uninterrupted run sees them).

    >>> import numpy as np
    >>> x, y = np.zeros((5, 2), "float32"), np.arange(5)
    >>> [len(b) for _, b in epoch_dataset(x, y, 2, epochs=2)]
    [2, 2, 1, 2, 2, 1]
    >>> [len(b) for _, b in epoch_dataset(x, y, 2, epochs=2, skip_batches=2)]
    [1, 2, 2, 1]
    """
    batch_size = positive_int(batch_size, "batch_size")
    shift = positive_int(shift, "shift", minimum=0)
    if not isinstance(flip, bool):
        raise TypeError(f"flip must be True or False, got {flip!r}")
    skip_batches = positive_int(skip_batches, "skip_batches", minimum=0)
    n = len(x)
    x = np.asarray(x, np.float32)
    if (shift or flip) and x.ndim != 4:
        raise ValueError(f"shift and flip augment images [N, H, W, C]; x has shape {x.shape}")

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
        if shift or flip:
            s = tf.stack([tf.cast(seed, tf.int64) * 7919 + e, b])
            xb = random_crop_flip(xb, s, pad=shift, flip=flip, pad_value=pad_value)
        return xb, tf.gather(ys, i)

    ds = tf.data.Dataset.range(first_epoch, epochs).flat_map(one_epoch)
    if skip_batches:
        ds = ds.skip(skip_batches)
    ds = ds.map(gather)
    return ds.prefetch(2)


def random_crop_flip(x: Any, seed: Any, *, pad: int = 4, flip: bool = True,
                     pad_value: float = 0.0, pad_mode: str = "constant") -> tf.Tensor:
    """Pad-and-random-crop and random horizontal flip of a batch of images, from a stateless seed.

    Each image of ``x`` (``[b, H, W, C]``, any float dtype) is padded by ``pad`` pixels on every
    side (``pad_mode``: ``"constant"`` with ``pad_value``, ``"reflect"`` or ``"symmetric"``), a
    random ``H x W`` window of the padded image is kept (an offset of 0..2*pad in each direction,
    i.e. a translation of up to ``pad`` pixels), and with ``flip`` the image is mirrored
    left-right with probability 1/2. ``seed`` is a stateless seed (two integers): the same seed
    gives the same batch, on any device. Returns a tensor of ``x``'s shape and dtype; ``x`` is
    not modified. Pure TensorFlow: usable inside ``tf.data`` maps and ``tf.function``.

    >>> import numpy as np
    >>> x = np.arange(2 * 4 * 4, dtype="float32").reshape(2, 4, 4, 1)
    >>> a = random_crop_flip(x, [1, 2], pad=2)
    >>> a.shape, bool(np.all(a.numpy() == random_crop_flip(x, [1, 2], pad=2).numpy()))
    (TensorShape([2, 4, 4, 1]), True)
    """
    pad = positive_int(pad, "pad", minimum=0)
    if pad_mode not in _PAD_MODES:
        raise ValueError(f"pad_mode must be one of {', '.join(_PAD_MODES)}; got {pad_mode!r}")
    x = tf.convert_to_tensor(x)
    if x.shape.rank != 4:
        raise ValueError(f"x must be a batch of images [b, H, W, C]; got shape {x.shape}")
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    if pad:
        h, w = tf.shape(x)[1], tf.shape(x)[2]
        if pad_mode != "constant" and x.shape[1] is not None and pad >= min(x.shape[1], x.shape[2]):
            raise ValueError(f"pad_mode={pad_mode!r} needs pad < the image size "
                             f"{x.shape[1]}x{x.shape[2]}; got pad={pad}")
        paddings = [[0, 0], [pad, pad], [pad, pad], [0, 0]]
        padded = (tf.pad(x, paddings, constant_values=tf.cast(pad_value, x.dtype))
                  if pad_mode == "constant" else tf.pad(x, paddings, mode=pad_mode.upper()))
        off = tf.random.stateless_uniform([tf.shape(x)[0], 2], seed, 0, 2 * pad + 1,
                                          dtype=tf.int32)
        rows = off[:, 0:1] + tf.range(h)[None, :]
        cols = off[:, 1:2] + tf.range(w)[None, :]
        x = tf.gather(padded, rows, axis=1, batch_dims=1)
        x = tf.gather(x, cols, axis=2, batch_dims=1)
    if flip:
        coin = tf.random.stateless_uniform([tf.shape(x)[0]],
                                           tf.random.experimental.stateless_fold_in(seed, 1))
        x = tf.where((coin < 0.5)[:, None, None, None], tf.reverse(x, [2]), x)
    return x


def augment_dataset(ds: tf.data.Dataset, *, pad: int = 4, flip: bool = True, seed: int = 0,
                    pad_value: float = 0.0, pad_mode: str = "constant") -> tf.data.Dataset:
    """``ds`` with :func:`random_crop_flip` applied to its images, on the fly.

    ``ds`` yields image batches ``[b, H, W, C]`` (or single images ``[H, W, C]``), alone or as
    the first item of a tuple (``(x, y)``: labels pass through). The ``k``-th element gets the
    stateless seed ``(seed, k)``, so iterating the dataset again, or building it again with the
    same ``seed``, gives exactly the same batches; nothing is materialised. For fresh
    augmentations every epoch, augment after ``repeat()`` (the counter keeps running) or use
    :func:`epoch_dataset` with ``shift``/``flip``, whose seeds are ``(seed, epoch, batch)``.

    >>> import numpy as np, tensorflow as tf
    >>> x = np.random.default_rng(0).random((8, 6, 6, 3), dtype="float32")
    >>> ds = tf.data.Dataset.from_tensor_slices((x, np.arange(8))).batch(4)
    >>> a = [b.numpy() for b, _ in augment_dataset(ds, pad=2, seed=1)]
    >>> b = [b.numpy() for b, _ in augment_dataset(ds, pad=2, seed=1)]
    >>> all(np.array_equal(p, q) for p, q in zip(a, b)), a[0].shape
    (True, (4, 6, 6, 3))
    """
    if not isinstance(ds, tf.data.Dataset):
        raise TypeError(f"ds must be a tf.data.Dataset, got {type(ds).__name__}")
    pad = positive_int(pad, "pad", minimum=0)
    seed = positive_int(seed, "seed", minimum=0)
    if not isinstance(flip, bool):
        raise TypeError(f"flip must be True or False, got {flip!r}")
    if pad_mode not in _PAD_MODES:
        raise ValueError(f"pad_mode must be one of {', '.join(_PAD_MODES)}; got {pad_mode!r}")
    spec = ds.element_spec
    image_spec = spec[0] if isinstance(spec, tuple) else spec
    if not isinstance(image_spec, tf.TensorSpec) or image_spec.shape.rank not in (3, 4):
        raise ValueError("ds must yield images [b, H, W, C] or [H, W, C], alone or first in a "
                         f"tuple; its elements are {spec}")
    single = image_spec.shape.rank == 3

    def apply(k, element):
        x = element[0] if isinstance(spec, tuple) else element
        s = tf.stack([tf.constant(seed, tf.int64), k])
        x = random_crop_flip(x[None] if single else x, s, pad=pad, flip=flip,
                             pad_value=pad_value, pad_mode=pad_mode)
        x = x[0] if single else x
        return (x, *element[1:]) if isinstance(spec, tuple) else x

    return ds.enumerate().map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def steps_per_epoch(n: int, batch_size: int, drop_remainder: bool = False) -> int:
    """Batches per epoch of :func:`epoch_dataset` over ``n`` examples.

    >>> steps_per_epoch(10, 4), steps_per_epoch(10, 4, drop_remainder=True)
    (3, 2)
    """
    return n // batch_size if drop_remainder else -(-n // batch_size)
