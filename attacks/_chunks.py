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
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from robustgrad._checks import positive_int

if TYPE_CHECKING:  # the prepared call is built in attacks._base, which imports this module
    from ._base import Prepared

__all__ = ["DEFAULT_BATCH_SIZE", "check_batch_size", "chunk_seed", "finish", "run_in_chunks"]

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
    ValueError: batch_size must be an int >= 1, got 0
    """
    return DEFAULT_BATCH_SIZE if batch_size is None else positive_int(batch_size, "batch_size")


def finish(p: Prepared, x_adv: tf.Tensor) -> tf.Tensor:
    """``x_adv`` in the dtype the caller's ``x`` had."""
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
    if not p.eager or n is None or n <= p.batch_size:
        out = call(p.x, p.y, p.y_true, None)
        out = out if isinstance(out, tuple) else (out,)
        counts = [int(c) for c in out[1:]] if p.eager else list(out[1:])
        return finish(p, out[0]), counts
    pieces, counts = [], None
    for k, start in enumerate(range(0, n, p.batch_size)):
        rows = slice(start, start + p.batch_size)
        out = call(p.x[rows], tf.nest.map_structure(lambda t, r=rows: t[r], p.y),
                   p.y_true[rows], k)
        out = out if isinstance(out, tuple) else (out,)
        pieces.append(finish(p, out[0]))
        chunk_counts = [int(c) for c in out[1:]]
        counts = chunk_counts if counts is None else [a + b for a, b in zip(counts, chunk_counts)]
    return tf.concat(pieces, 0), counts

