"""Jacobians and Hessians: ``jacobian``, ``batch_jacobian``, ``hessian``, ``hessian_diagonal``.

Rows are vector-Jacobian products with one-hot (or Rademacher) cotangents, stacked by
TensorFlow's vectorising ``pfor``, whose ``parallel_iterations`` bounds memory (``chunk_size``
here); Hessians are the Jacobian of a recorded gradient (reverse over reverse). Every function
works eagerly and inside ``tf.function``; :func:`batch_jacobian` also compiles with
``jit_compile=True`` (TensorFlow's own ``tape.batch_jacobian`` inserts an ``Assert`` that XLA
rejects). Moved out of ``robustgrad/higher.py``, which re-exports every public name here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.ops.parallel_for.control_flow_ops import pfor as _tf_pfor

from robustgrad.tape import _as_source, _check_scalar, check_connected

__all__ = ["batch_jacobian", "hessian", "hessian_diagonal", "jacobian"]


# --------------------------------------------------------------------------- helpers


def _check_chunk_size(chunk_size):
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be None or an int >= 1, got {chunk_size!r}")
    return chunk_size


def _stacked_vjps(tape, target, source, n, cotangent_fn, chunk_size, what: str,
                  zero_if_unconnected: bool = False):
    """Stack ``n`` VJPs of ``target`` w.r.t. ``source``; cotangent ``i`` is ``cotangent_fn(i)``.

    Vectorised with ``pfor``; ``chunk_size`` iterations at a time bound the memory.
    """

    def loop_fn(i):
        ct = cotangent_fn(i)
        g = tape.gradient(target, source, output_gradients=ct)
        if g is None:
            if not zero_if_unconnected:
                check_connected([None], [source], names=["x"], what=what)
            g = tf.zeros_like(source) + 0.0 * tf.reduce_sum(ct)
        return g

    static_n = tf.get_static_value(n)
    if chunk_size == 1:  # pfor wants chunks > 1: a sequential loop, one row at a time
        return tf.map_fn(
            loop_fn, tf.range(n), fn_output_signature=tf.TensorSpec(None, source.dtype),
            parallel_iterations=1,
        )
    if chunk_size is None or static_n is not None:
        return _tf_pfor(loop_fn, int(static_n) if static_n is not None else n,
                        parallel_iterations=chunk_size)
    # A dynamic row count: pfor's own chunking breaks on a dynamic remainder (an empty chunk
    # that fails to broadcast), so loop over fixed-size chunks, repeating the last row to fill
    # the final one, and drop the padding.
    n = tf.cast(n, tf.int32)
    n_chunks = (n + chunk_size - 1) // chunk_size
    rows = tf.TensorArray(source.dtype, size=n_chunks, infer_shape=False)

    def body(k, rows):
        idx = tf.minimum(k * chunk_size + tf.range(chunk_size), n - 1)
        chunk = _tf_pfor(lambda i: loop_fn(tf.gather(idx, i)), chunk_size)
        return k + 1, rows.write(k, chunk)

    _, rows = tf.while_loop(lambda k, _: k < n_chunks, body, (tf.constant(0), rows))
    return rows.concat()[:n]


def _dense_gradient(fn, args, flat, names=None):
    """Gradient of scalar ``fn(*args)`` w.r.t. the leaves ``flat``, as dense tensors.

    Called inside an outer tape or forward accumulator, which records it for the second order.
    gather/scatter give ``IndexedSlices`` gradients that a ``ForwardAccumulator`` cannot follow
    and users do not expect from an HVP or Hessian: they are densified here, while recorded.
    """
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(flat)
        value = _check_scalar(fn(*args))
    g = tape.gradient(value, flat)
    check_connected(g, flat, names, what="fn")
    return [tf.convert_to_tensor(gi) for gi in g]


# --------------------------------------------------------------------------- Jacobians


def jacobian(fn: Callable, x: Any, chunk_size: int | None = None) -> tf.Tensor:
    """Full Jacobian of ``fn`` at ``x``: shape ``fn(x).shape + x.shape``.

    Rows are VJPs with one-hot cotangents, vectorised with ``pfor``; ``chunk_size`` computes at
    most that many rows at a time, bounding peak memory. The result equals the unchunked one.

    Args:
      fn: callable of one tensor returning one tensor.
      x: floating tensor.
      chunk_size: ``None`` (all rows at once) or an int ≥ 1.

    Raises:
      ValueError: ``fn``'s output does not depend on ``x``; bad ``chunk_size``.

    Example:
      >>> J = jacobian(lambda x: tf.stack([x[0] * x[1], x[1]]), tf.constant([2.0, 3.0]))
      >>> J.numpy().tolist()
      [[3.0, 2.0], [0.0, 1.0]]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    chunk_size = _check_chunk_size(chunk_size)
    x = _as_source(x, "x")
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(x)
        y = fn(x)
    if not tf.is_tensor(y):
        raise TypeError(f"fn must return a tensor, got {type(y).__name__}")
    y_shape = tf.shape(y)
    m = y.shape.num_elements() if y.shape.is_fully_defined() else tf.size(y)

    def cotangent(i):
        return tf.reshape(tf.one_hot(i, m, dtype=y.dtype), y_shape)

    rows = _stacked_vjps(tape, y, x, m, cotangent, chunk_size, what="fn")
    out = tf.reshape(rows, tf.concat([y_shape, tf.shape(x)], 0))
    if y.shape.is_fully_defined() and x.shape.is_fully_defined():
        out = tf.ensure_shape(out, y.shape.concatenate(x.shape))
    return out


def batch_jacobian(fn: Callable, x: Any, chunk_size: int | None = None) -> tf.Tensor:
    """Per-example Jacobians: ``[B, *out.shape[1:], *x.shape[1:]]`` for row-independent ``fn``.

    ``fn`` maps a batch ``x`` ``[B, ...]`` to ``[B, ...]`` with example ``b``'s output depending
    only on example ``b``'s input (a model in inference mode). Costs one VJP per output
    feature, not per output element — about ``B``× cheaper than :func:`jacobian` of the batch.
    ``chunk_size`` bounds how many output features are differentiated at once. Compiles under
    ``tf.function(jit_compile=True)``.

    Raises:
      ValueError: the output's batch size differs from ``x``'s (when static), or ``fn`` ignores ``x``.

    Example:
      >>> W = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])   # [in=3, out=2]
      >>> J = batch_jacobian(lambda x: x @ W, tf.ones([4, 3]), chunk_size=1)
      >>> J.shape, J[0].numpy().tolist()                       # J[b] = W^T
      (TensorShape([4, 2, 3]), [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]])
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    chunk_size = _check_chunk_size(chunk_size)
    x = _as_source(x, "x")
    if x.shape.rank is not None and x.shape.rank < 1:
        raise ValueError(f"x must have a batch dimension, got shape {x.shape}")
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(x)
        y = fn(x)
    if not tf.is_tensor(y):
        raise TypeError(f"fn must return a tensor, got {type(y).__name__}")
    if y.shape.rank is not None and y.shape.rank < 1:
        raise ValueError(f"fn must return a batch [B, ...], got shape {y.shape}")
    if y.shape[0] is not None and x.shape[0] is not None and y.shape[0] != x.shape[0]:
        raise ValueError(
            f"fn's output batch size {y.shape[0]} differs from x's batch size {x.shape[0]}"
        )
    y_shape = tf.shape(y)
    b = y_shape[0]
    m = (y.shape[1:].num_elements() if y.shape[1:].is_fully_defined()
         else tf.reduce_prod(y_shape[1:]))

    def cotangent(j):
        return tf.reshape(tf.tile(tf.one_hot(j, m, dtype=y.dtype)[None], [b, 1]), y_shape)

    rows = _stacked_vjps(tape, y, x, m, cotangent, chunk_size, what="fn")  # [m, B, *x[1:]]
    rank_x = x.shape.rank
    perm = [1, 0] + list(range(2, rank_x + 1))
    out = tf.transpose(rows, perm)  # [B, m, *x[1:]]
    out = tf.reshape(out, tf.concat([y_shape, tf.shape(x)[1:]], 0))
    static = y.shape.concatenate(x.shape[1:])
    return tf.ensure_shape(out, static) if static.rank is not None else out


def hessian(fn: Callable, x: Any, chunk_size: int | None = None) -> tf.Tensor:
    """Full Hessian of scalar ``fn`` at tensor ``x``: shape ``x.shape + x.shape``.

    The Jacobian of the gradient (reverse over reverse), vectorised, ``chunk_size`` rows at a time.

    Example:
      >>> hessian(lambda x: x[0] ** 2 * x[1], tf.constant([1.0, 2.0])).numpy().tolist()
      [[4.0, 2.0], [2.0, 0.0]]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")

    x = _as_source(x, "x")
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(x)
        (g,) = _dense_gradient(fn, (x,), [x], names=["x"])
    x_shape = tf.shape(x)
    m = tf.size(x)

    def cotangent(i):
        return tf.reshape(tf.one_hot(i, m, dtype=x.dtype), x_shape)

    rows = _stacked_vjps(tape, g, x, m, cotangent, _check_chunk_size(chunk_size), what="grad fn",
                         zero_if_unconnected=True)  # a linear fn has a zero Hessian
    out = tf.reshape(rows, tf.concat([x_shape, x_shape], 0))
    return tf.ensure_shape(out, x.shape.concatenate(x.shape)) if x.shape.is_fully_defined() else out


def hessian_diagonal(
    fn: Callable, x: Any, num_samples: int = 100, seed: Any = None,
    chunk_size: int | None = None,
) -> tf.Tensor:
    """Hutchinson estimate of the Hessian's diagonal: ``mean_i v_i ⊙ (H v_i)``, ``v_i`` Rademacher.

    Unbiased; its variance falls as ``1/num_samples`` and is zero for a diagonal Hessian
    (Bekas, Kokiopoulou & Saad 2007; Hutchinson 1989).

    Args:
      fn: scalar-valued callable of one tensor ``x``.
      x: floating tensor.
      num_samples: number of probe vectors, ≥ 1.
      seed: an int, a shape-[2] int tensor, or a ``tf.random.Generator``; ``None`` draws from the
        global generator (not reproducible).
      chunk_size: how many HVPs are vectorised at once (bounds memory).

    Returns:
      a tensor with ``x``'s shape and dtype.

    Example:
      >>> d = hessian_diagonal(lambda x: tf.reduce_sum(x ** 3), tf.constant([1.0, 2.0]),
      ...                      num_samples=4, seed=0)
      >>> d.numpy().tolist()                                     # exact: diagonal Hessian
      [6.0, 12.0]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
    chunk_size = _check_chunk_size(chunk_size)
    x = _as_source(x, "x")
    shape = tf.concat([[num_samples], tf.shape(x)], 0)
    if isinstance(seed, tf.random.Generator):
        bits = seed.uniform(shape, 0, 2, dtype=tf.int32)
    elif seed is None:
        bits = tf.random.uniform(shape, 0, 2, dtype=tf.int32)
    else:
        s = tf.constant([seed, 0], tf.int64) if isinstance(seed, int) else tf.cast(seed, tf.int64)
        bits = tf.random.stateless_uniform(shape, s, 0, 2, dtype=tf.int32)
    probes = tf.cast(2 * bits - 1, x.dtype)

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as outer:
        outer.watch(x)
        (g,) = _dense_gradient(fn, (x,), [x], names=["x"])
    hv = _stacked_vjps(outer, g, x, num_samples, lambda i: tf.gather(probes, i), chunk_size,
                       what="the gradient of fn", zero_if_unconnected=True)
    hv = tf.reshape(hv, tf.shape(probes))
    return tf.reduce_mean(probes * hv, axis=0)
