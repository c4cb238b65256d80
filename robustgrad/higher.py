"""Forward and higher-order derivatives: ``jvp``, ``vjp``, ``hvp``, Hessians and Jacobians.

The vocabulary and signatures follow JAX (``jax.jvp``, ``jax.vjp``, ``jax.hessian``); the
implementation uses ``tf.autodiff.ForwardAccumulator`` for forward mode, nested
``tf.GradientTape``\\ s for reverse-over-reverse, and TensorFlow's vectorising ``pfor`` for
Jacobians, whose ``parallel_iterations`` bounds memory (``chunk_size`` here).

Every function works eagerly and inside ``tf.function``. The Jacobians and Hessians
(``jacobian``, ``batch_jacobian``, ``hessian``, ``hessian_diagonal``) live in
:mod:`robustgrad.jacobians` and are re-exported here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from robustgrad.jacobians import (  # noqa: F401 - re-exported: robustgrad.higher.jacobian etc.
    _dense_gradient,
    batch_jacobian,
    hessian,
    hessian_diagonal,
    jacobian,
)
from robustgrad.tape import _as_source, check_connected

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


