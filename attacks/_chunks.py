"""Running an attack in chunks: an ``x`` larger than ``batch_size`` is attacked a chunk at a time.

Every attack runs through :func:`attacks._base.prepare` (validation of the whole input, before
any work) and :func:`run_in_chunks` (the compiled call): an ``x`` of more than ``batch_size``
examples (default :data:`DEFAULT_BATCH_SIZE`, 1024) is attacked ``batch_size`` examples at a
time and the results are concatenated, so an attack's working memory stays that of one chunk
however large ``x`` is (``benchmarks/attack_memory.py``, PGD-10 on the digits CNN: peak memory
grows by 390, 475 and 623 MiB for 1024, 8192 and 32768 examples, of which 330-400 MiB is working
memory -- 0.87-1.06x the model's own forward-backward pass over one chunk -- and the rest the
input/output-sized arrays; one unchunked call on 8192 examples needed 2676 MiB).

Chunks are not padded: the last, smaller chunk reuses the same trace (the batch dimension is
relaxed); only with ``jit_compile=True`` does XLA compile once more for its shape.
Deterministic attacks return what one call on the whole batch returns (to float rounding: matrix
kernels differ with the number of rows, by an ulp). Random ones draw chunk ``k``'s randomness
from ``stateless_fold_in(seed, k)`` (:func:`chunk_seed`): a seeded call is reproducible for the
same ``seed`` and ``batch_size`` but draws other random starts than a single call on the whole
batch (the budget and bounds hold the same). Inside a ``tf.function`` (graph mode) the batch
runs in one piece.

>>> import tensorflow as tf
>>> from attacks import fast_gradient_method
>>> model = lambda x, training=False: tf.concat([x, -x], axis=1)
>>> x = tf.random.stateless_uniform([10, 1], [0, 1], 0.2, 0.8)
>>> whole = fast_gradient_method(model, x, eps=0.1, clip_min=0.0, clip_max=1.0)
>>> chunked = fast_gradient_method(model, x, eps=0.1, clip_min=0.0, clip_max=1.0, batch_size=3)
>>> bool(tf.reduce_all(whole == chunked))
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from robustgrad.checks import positive_int

from ._prepared import Prepared

__all__ = ["DEFAULT_BATCH_SIZE", "check_batch_size", "chunk_seed", "finish", "per_class_chunk",
           "run_in_chunks"]

#: examples per compiled call when an attack is given more (``batch_size=None``): enough to keep
#: a CPU busy, small enough that a chunk's activations and gradients stay a few hundred MiB for
#: a small CNN (``benchmarks/attack_memory.py``)
DEFAULT_BATCH_SIZE = 1024


def check_batch_size(batch_size: int | None) -> int:
    """The chunk size of an attack call: ``batch_size`` checked as an int >= 1, or
    :data:`DEFAULT_BATCH_SIZE` for ``None``.

    >>> check_batch_size(None), check_batch_size(64)
    (1024, 64)
    >>> check_batch_size(0)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: batch_size must be an int >= 1, got 0
    """
    return DEFAULT_BATCH_SIZE if batch_size is None else positive_int(batch_size, "batch_size")


def per_class_chunk(batch_size: int | None, classes: int | None) -> int:
    """The chunk of an attack that differentiates ``classes`` logits of each example (DeepFool,
    FAB: a Jacobian, one backward pass per class): ``batch_size`` when the caller set it, else
    :data:`DEFAULT_BATCH_SIZE` divided by ``classes`` (at least 1), so that a chunk takes about
    the memory of a gradient attack's (with 1,024 examples of 10 classes, DeepFool and FAB took
    4-5 GiB: ``benchmarks/attack_memory.py``).

    >>> per_class_chunk(None, 10), per_class_chunk(64, 10), per_class_chunk(None, None)
    (102, 64, 1024)
    """
    if batch_size is not None:
        return check_batch_size(batch_size)
    return max(1, DEFAULT_BATCH_SIZE // max(int(classes or 1), 1))


def round_toward(x_adv: tf.Tensor, x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``x_adv`` (computed in float32) in a lower-precision ``dtype`` (float16, bfloat16),
    rounded toward ``x`` wherever rounding to nearest would move it away: every coordinate of
    the result is at most as far from ``x`` as ``x_adv`` is, so the budget and the bounds the
    attack met in float32 still hold (rounding to nearest gave 0.1001 at eps 0.1).

    >>> x = tf.constant(0.2998046875)       # a float16 value
    >>> float(tf.cast(tf.cast(x + 0.1, tf.float16), tf.float32) - x) > 0.1   # to nearest
    True
    >>> float(tf.cast(round_toward(x + 0.1, x, tf.float16), tf.float32) - x) <= 0.1
    True
    """
    r = tf.cast(x_adv, dtype)
    r32 = tf.cast(r, x_adv.dtype)
    outward = tf.abs(r32 - x) > tf.abs(x_adv - x)
    bits = tf.bitcast(r, tf.int16)
    # one representable step toward x: the magnitude shrinks (bits - 1) when r is on x's far
    # side of zero's direction, grows (bits + 1) otherwise (sign-magnitude encoding)
    shrink = tf.equal(r32 > x, r32 > 0)
    stepped = tf.bitcast(bits + tf.where(shrink, tf.constant(-1, tf.int16),
                                         tf.constant(1, tf.int16)), dtype)
    # from a zero, the step is the smallest subnormal with x's sign
    tiny = tf.bitcast(tf.where(x > 0, tf.constant(1, tf.int16), tf.constant(-32767, tf.int16)),
                      dtype)
    stepped = tf.where(tf.equal(r32, 0.0), tiny, stepped)
    return tf.where(outward, stepped, r)


def finish(p: Prepared, x_adv: tf.Tensor, x: tf.Tensor | None = None) -> tf.Tensor:
    """``x_adv`` in the dtype the caller's ``x`` had (``x``: the computed-dtype rows of this
    chunk, default the whole batch); lower-precision dtypes round toward ``x``
    (:func:`round_toward`)."""
    if p.in_dtype in (tf.float16, tf.bfloat16) and x_adv.dtype != p.in_dtype:
        return round_toward(x_adv, tf.cast(p.x if x is None else x, x_adv.dtype), p.in_dtype)
    return tf.cast(x_adv, p.in_dtype)


def chunk_seed(seed: tf.Tensor, chunk: int | None) -> tf.Tensor:
    """The stateless ``[2]`` seed of chunk ``chunk`` of a call seeded ``seed``: ``seed`` itself
    for a call run in one piece (``chunk=None``), else ``stateless_fold_in(seed, chunk)``.

    >>> s = tf.constant([1, 2])
    >>> chunk_seed(s, None).numpy().tolist(), chunk_seed(s, 0).shape.as_list()
    ([1, 2], [2])
    """
    if chunk is None:
        return seed
    return tf.cast(tf.random.experimental.stateless_fold_in(seed, chunk), tf.int32)


def run_in_chunks(p: Prepared, call: Callable[..., Any]) -> tuple[tf.Tensor, list]:
    """Run an attack's compiled ``call`` over ``p``'s batch, ``p.batch_size`` examples at a time.

    ``call(x, y, y_true, chunk) -> x_adv`` or ``(x_adv, count, ...)`` attacks one chunk: ``x``
    ``[b, ...]`` in the compute dtype, ``y`` (labels or the user's structure) and ``y_true`` the
    matching rows, ``chunk`` the chunk's index (``None`` when the batch runs in one piece; derive
    the chunk's random seed with :func:`chunk_seed`). The per-example ``x_adv`` are concatenated
    in order (in the input dtype, :func:`finish`); the counts (example rows pushed through the
    model) are summed. Eager and larger than one chunk only; in graph mode, or when ``x`` fits
    in one chunk, ``call`` runs once on the whole batch.

    Returns ``(x_adv [B, ...], [count, ...])``: Python ints when eager, tensors in graph mode.
    """
    n = p.x.shape[0]
    counts: list | None
    if not p.eager or n is None or n <= p.batch_size:
        out = call(p.x, p.y, p.y_true, None)
        out = out if isinstance(out, tuple) else (out,)
        counts = [int(c) for c in out[1:]] if p.eager else list(out[1:])
        return finish(p, out[0]), counts
    pieces: list[tf.Tensor] = []
    counts = None
    for k, start in enumerate(range(0, n, p.batch_size)):
        rows = slice(start, start + p.batch_size)
        out = call(p.x[rows], tf.nest.map_structure(lambda t, r=rows: t[r], p.y),
                   p.y_true[rows], k)
        out = out if isinstance(out, tuple) else (out,)
        pieces.append(finish(p, out[0], p.x[rows]))
        chunk_counts = [int(c) for c in out[1:]]
        counts = chunk_counts if counts is None else [a + b for a, b in zip(counts, chunk_counts)]
    return tf.concat(pieces, 0), counts or []

