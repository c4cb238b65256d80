"""Forward and higher-order derivatives: ``jvp``, ``vjp``, ``hvp``, Hessians and Jacobians.

The vocabulary and signatures follow JAX (``jax.jvp``, ``jax.vjp``, ``jax.hessian``); the
implementation uses ``tf.autodiff.ForwardAccumulator`` for forward mode, nested
``tf.GradientTape``\\ s for reverse-over-reverse, and TensorFlow's vectorising ``pfor`` for
Jacobians, whose ``parallel_iterations`` bounds memory (``chunk_size`` here).

Every function works eagerly and inside ``tf.function``; :func:`batch_jacobian` also compiles
with ``jit_compile=True`` (TensorFlow's own ``tape.batch_jacobian`` inserts an ``Assert`` that
XLA rejects).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.ops.parallel_for.control_flow_ops import pfor as _tf_pfor

from robustgrad.tape import _as_source, _check_scalar, check_connected

__all__ = [
    "batch_jacobian",
    "hessian",
    "hessian_diagonal",
    "hvp",
    "jacobian",
    "jvp",
    "vjp",
]

HVP_MODES = ("forward_over_reverse", "reverse_over_reverse")


# --------------------------------------------------------------------------- helpers


def _as_args(primals, what: str):
    """``primals`` as a tuple of positional arguments, and whether it was a sequence."""
    if isinstance(primals, (tuple, list)):
        if not primals:
            raise ValueError(f"{what} must not be empty")
        return tuple(primals), True
    return (primals,), False


def _convert(args, what: str):
    return tuple(
        tf.nest.map_structure(lambda leaf, _i=i: _as_source(leaf, f"{what}[{_i}]"), a)
        for i, a in enumerate(args)
    )


def _matching_tangents(args, tangents, what: str = "tangents"):
    tans, _ = _as_args(tangents, what)
    try:
        tf.nest.assert_same_structure(args, tans)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what} must have the same structure as primals: {exc}") from None
    flat_p, flat_t = tf.nest.flatten(args), tf.nest.flatten(tans)
    out = []
    for i, (p, t) in enumerate(zip(flat_p, flat_t)):
        t = tf.convert_to_tensor(t)
        if not t.dtype.is_floating:
            raise TypeError(f"{what} must be floating point, got {t.dtype.name} at leaf {i}")
        t = tf.cast(t, p.dtype)
        if p.shape.is_fully_defined() and t.shape.is_fully_defined() and p.shape != t.shape:
            raise ValueError(
                f"{what} leaf {i} has shape {t.shape} but its primal has shape {p.shape}"
            )
        out.append(t)
    return tf.nest.pack_sequence_as(args, out)


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


# --------------------------------------------------------------------------- jvp / vjp


def jvp(fn: Callable, primals: Any, tangents: Any) -> tuple[Any, Any]:
    """Forward-mode Jacobian-vector product (like ``jax.jvp``).

    Args:
      fn: a callable of the positional arguments ``primals``; returns a tensor or structure.
      primals: a tuple/list of arguments (tensors or ``tf.nest`` structures), or one tensor.
      tangents: the same structure as ``primals``; each leaf has its primal's shape.

    Returns:
      ``(outputs, tangent_out)``: ``fn(*primals)`` and ``J · tangents`` with the structure of the
      outputs (zeros for outputs that do not depend on the primals).

    Example:
      >>> out, t = jvp(lambda x: x ** 2, (tf.constant([1.0, 3.0]),), (tf.constant([1.0, 1.0]),))
      >>> t.numpy().tolist()
      [2.0, 6.0]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    args, _ = _as_args(primals, "primals")
    args = _convert(args, "primals")
    tans = _matching_tangents(args, tangents)
    with tf.autodiff.ForwardAccumulator(tf.nest.flatten(args), tf.nest.flatten(tans)) as acc:
        out = fn(*args)
    t_out = tf.nest.map_structure(
        lambda o: acc.jvp(o, unconnected_gradients=tf.UnconnectedGradients.ZERO), out
    )
    return out, t_out


def vjp(fn: Callable, *primals: Any) -> tuple[Any, Callable]:
    """Reverse-mode vector-Jacobian product (like ``jax.vjp``).

    Returns ``(outputs, pullback)``; ``pullback(cotangents)`` takes a structure matching the
    outputs and returns a tuple with one gradient structure per primal. The pullback may be
    called several times (power iteration does).

    Raises:
      ValueError: in ``pullback``, when the outputs do not depend on a primal (named).

    Example:
      >>> out, pull = vjp(lambda x, y: x * y, tf.constant(2.0), tf.constant(5.0))
      >>> [float(g) for g in pull(tf.constant(1.0))]
      [5.0, 2.0]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not primals:
        raise ValueError("vjp needs at least one primal")
    args = _convert(primals, "primals")
    tape = tf.GradientTape(persistent=True, watch_accessed_variables=False)
    with tape:
        tape.watch(tf.nest.flatten(args))
        out = fn(*args)

    def pullback(cotangents):
        try:
            tf.nest.assert_same_structure(out, cotangents)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"cotangents must have the structure of fn's outputs: {exc}") from None
        flat_o = tf.nest.flatten(out)
        flat_c = [tf.cast(c, o.dtype) for o, c in zip(flat_o, tf.nest.flatten(cotangents))]
        for i, (o, c) in enumerate(zip(flat_o, flat_c)):
            if o.shape.is_fully_defined() and c.shape.is_fully_defined() and o.shape != c.shape:
                raise ValueError(
                    f"cotangents leaf {i} has shape {c.shape} but fn's output has shape {o.shape}"
                )
        grads = tape.gradient(flat_o, list(args), output_gradients=flat_c)
        names = []
        for i, a in enumerate(args):
            n = len(tf.nest.flatten(a))
            names.extend([f"primals[{i}]"] * n)
        check_connected(grads, list(args), names)
        return tuple(grads)

    return out, pullback


# --------------------------------------------------------------------------- hvp


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


def _hvp_reverse_over_reverse(fn, args, tans):
    flat = tf.nest.flatten(args)
    with tf.GradientTape(watch_accessed_variables=False) as outer:
        outer.watch(flat)
        g = _dense_gradient(fn, args, flat)
        dot = tf.add_n([tf.reduce_sum(gi * ti) for gi, ti in zip(g, tf.nest.flatten(tans))])
    hv = outer.gradient(dot, flat, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return tf.nest.pack_sequence_as(args, [tf.convert_to_tensor(h) for h in hv])


def _hvp_forward_over_reverse(fn, args, tans):
    flat = tf.nest.flatten(args)
    with tf.autodiff.ForwardAccumulator(flat, tf.nest.flatten(tans)) as acc:
        g = _dense_gradient(fn, args, flat)
    hv = [tf.convert_to_tensor(acc.jvp(gi, unconnected_gradients=tf.UnconnectedGradients.ZERO))
          for gi in g]
    return tf.nest.pack_sequence_as(args, hv)


def hvp(fn: Callable, primals: Any, tangents: Any, mode: str = "forward_over_reverse") -> Any:
    """Hessian-vector product ``H(primals) · tangents`` of a scalar function.

    Args:
      fn: scalar-valued callable of the positional arguments ``primals``.
      primals: a tuple/list of arguments (or one tensor); leaves are floating tensors.
      tangents: the same structure as ``primals``.
      mode: ``"forward_over_reverse"`` (a ``ForwardAccumulator`` over a gradient tape; the
        cheapest) or ``"reverse_over_reverse"`` (nested tapes, the gradient of ``<∇f, v>``).
        When forward mode does not support an op of ``fn`` it falls back, with a warning, to
        reverse-over-reverse.

    Returns:
      ``H · v`` with the structure of ``primals`` (a single tensor when ``primals`` was one).

    Raises:
      ValueError: ``fn`` is not scalar, does not depend on a primal, or ``mode`` is unknown.

    Example:
      >>> f = lambda x: tf.reduce_sum(x ** 3)           # H = diag(6 x)
      >>> hvp(f, tf.constant([1.0, 2.0]), tf.constant([1.0, 1.0])).numpy().tolist()
      [6.0, 12.0]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if mode not in HVP_MODES:
        raise ValueError(f"mode must be one of {HVP_MODES}, got {mode!r}")
    args, multi = _as_args(primals, "primals")
    args = _convert(args, "primals")
    tans = _matching_tangents(args, tangents)
    if mode == "forward_over_reverse":
        try:
            out = _hvp_forward_over_reverse(fn, args, tans)
        except (LookupError, NotImplementedError, AttributeError) as exc:
            warnings.warn(
                f"forward-mode autodiff does not support an op in fn ({exc}); falling back to "
                "mode='reverse_over_reverse'", RuntimeWarning, stacklevel=2,
            )
            out = _hvp_reverse_over_reverse(fn, args, tans)
    else:
        out = _hvp_reverse_over_reverse(fn, args, tans)
    return out if multi else out[0]


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
