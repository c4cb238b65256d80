"""The transformation contract, shared helpers, :func:`identity` and :func:`chain`.

A :class:`GradientTransformation` is an ``(init, update)`` pair of pure functions over ``tf.nest``
structures whose leaves are float tensors or variables; its state is a nest of tensors only. Every
other module of :mod:`robustgrad.transforms` builds on the helpers here (leaf conversion and
checks, the float32 global norm shared within one step, the stateless-transformation factory).

>>> import tensorflow as tf
>>> from robustgrad.transforms import chain, identity
>>> t = chain(identity(), identity())
>>> u, s = t.update([tf.constant([1.0, 2.0])], t.init([tf.zeros(2)]))
>>> u[0].numpy().tolist(), s
([1.0, 2.0], (EmptyState(), EmptyState()))
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

__all__ = ["EmptyState", "GradientTransformation", "chain", "global_norm", "identity"]


class GradientTransformation(NamedTuple):
    """An ``(init, update)`` pair.

    ``init(params) -> state``: ``params`` is a nest of float tensors/variables; the state is a nest
    of tensors (possibly empty).
    ``update(updates, state, params=None) -> (updates, state)``: ``updates`` has the structure of
    ``params``; the returned updates keep each leaf's shape and dtype.
    """

    init: Callable[..., Any]
    update: Callable[..., Any]


class EmptyState(NamedTuple):
    """State of a stateless transformation (no tensors)."""


# --------------------------------------------------------------------------------------------
# Leaf helpers (used by every transformation module)
# --------------------------------------------------------------------------------------------


def _as_tensor(x):
    """Read a leaf (tensor, tf.Variable, Keras 3 variable, IndexedSlices, array) as a tensor."""
    if isinstance(x, tf.IndexedSlices):
        return tf.convert_to_tensor(x)
    if isinstance(x, tf.Tensor):
        return x
    value = getattr(x, "value", None)  # Keras 3 variable -> underlying tf.Variable (TF backend)
    if isinstance(value, tf.Variable):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(x)


def _leaf_dtype(x):
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return tf.convert_to_tensor(x).dtype
    return tf.as_dtype(dtype)


def _check_float_leaves(flat, name):
    for i, leaf in enumerate(flat):
        if leaf is None:
            raise ValueError(f"{name}: leaf {i} is None (a missing gradient?); "
                             "every leaf must be a float tensor")
        dtype = _leaf_dtype(leaf)
        if not dtype.is_floating:
            raise TypeError(f"{name}: leaf {i} has dtype {dtype.name}; expected a float dtype")


def _flatten_checked(tree, name):
    flat = tf.nest.flatten(tree)
    _check_float_leaves(flat, name)
    return flat


def _assert_same_structure(a, b, name_a, name_b):
    try:
        tf.nest.assert_same_structure(a, b, check_types=False)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"{name_a} and {name_b} have different structures: {e}") from None


def _check_state(state, cls, factory):
    if not isinstance(state, cls):
        raise TypeError(f"state: expected the {cls.__name__} from {factory}.init, "
                        f"got {type(state).__name__}")


def _zeros_like_tree(tree):
    return tf.nest.map_structure(lambda x: tf.zeros_like(_as_tensor(x)), tree)


def _zeros_state_like_params(params):
    """Zeros of each leaf's shape in its state dtype (:func:`_leaf_dtype`); a shape with an
    unknown dimension (a traced batch) is read at run time."""
    def zeros(p):
        t = _as_tensor(p)
        return tf.zeros(t.shape if t.shape.is_fully_defined() else tf.shape(t), _leaf_dtype(p))
    return tf.nest.map_structure(zeros, params)


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _walk_states(state, cls):
    """Yield every ``cls`` instance inside a nested state (tuples, lists, dicts, namedtuples)."""
    if isinstance(state, cls):
        yield state
    if _is_namedtuple(state) or isinstance(state, (list, tuple)):
        for s in state:
            yield from _walk_states(s, cls)
    elif isinstance(state, dict):
        for s in state.values():
            yield from _walk_states(s, cls)


def _as_transformation(t, name):
    if not isinstance(t, GradientTransformation):
        raise TypeError(f"{name} must be a GradientTransformation, got {type(t).__name__}")
    return t


def _stateless(fn, name):
    """A transformation with empty state whose update maps ``(updates, params) -> updates``."""

    def init(params):
        _flatten_checked(params, "params")
        return EmptyState()

    def update(updates, state, params=None):
        _flatten_checked(updates, "updates")
        if params is not None:
            _assert_same_structure(updates, params, "updates", "params")
        return fn(updates, params), state

    init.__qualname__ = f"{name}.init"
    update.__qualname__ = f"{name}.update"
    return GradientTransformation(init, update)


# --------------------------------------------------------------------------------------------
# The global norm, computed once per step
# --------------------------------------------------------------------------------------------


def _sq_sum_f32(x):
    """``sum(x**2)`` in float32 (one fused ``L2Loss`` op: few ops keep graph-mode steps cheap)."""
    x = tf.cast(x, tf.float32) if x.dtype != tf.float32 else x
    return 2.0 * tf.nn.l2_loss(x)


_NORMS = threading.local()


@contextlib.contextmanager
def _shared_norms():
    """Within this context, :func:`global_norm` of the same tensors in the same graph is computed
    once (GradientStep's ``grad_norm``, apply_if_finite's check and clip_by_global_norm's norm are
    usually the same expression; fewer ops matter for small models in graph mode)."""
    outer = getattr(_NORMS, "cache", None)
    if outer is None:
        _NORMS.cache = {}
    try:
        yield
    finally:
        if outer is None:
            _NORMS.cache = None


def global_norm(tree: Any) -> tf.Tensor:
    """Global L2 norm of a nest of tensors as a float32 scalar (``sqrt(sum_i ||x_i||^2)``).

    Leaves of any float dtype are accumulated in float32. Non-finite leaves give a non-finite norm.

    >>> float(global_norm([tf.constant([3.0]), tf.constant([4.0], tf.float64)]))
    5.0
    """
    flat = [_as_tensor(x) for x in tf.nest.flatten(tree)]
    if not flat:
        return tf.constant(0.0, tf.float32)
    cache = getattr(_NORMS, "cache", None)
    if cache is not None:
        key = (id(tf.compat.v1.get_default_graph()), tuple(id(x) for x in flat))
        hit = cache.get(key)
        if hit is not None:
            return hit[0]
    if len(flat) == 1:
        norm = tf.sqrt(_sq_sum_f32(flat[0]))
    else:
        norm = tf.sqrt(2.0 * tf.add_n([tf.nn.l2_loss(tf.cast(x, tf.float32)) for x in flat]))
    if cache is not None:
        cache[key] = (norm, flat)  # keeping the inputs alive keeps their ids unique
    return norm


def tag_update(update: Callable, **info: Any) -> Callable:
    """``update`` with ``info`` set as attributes: what GradientStep's fused Adam path reads back
    with ``getattr`` (``_rg_chain``, ``_rg_adam``, ``_rg_lr``)."""
    for name, value in info.items():
        setattr(update, name, value)
    return update


# --------------------------------------------------------------------------------------------
# identity and chain
# --------------------------------------------------------------------------------------------


def identity() -> GradientTransformation:
    """The transformation that returns its input unchanged (empty state).

    >>> u, s = identity().update([tf.constant([1.0, -2.0])], EmptyState())
    >>> u[0].numpy().tolist(), s
    ([1.0, -2.0], EmptyState())
    """
    return _stateless(lambda u, p: tf.nest.map_structure(_as_tensor, u), "identity")


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply ``transforms`` in order, each to the previous one's output.

    The state is a tuple with one entry per transformation.

    >>> from robustgrad.transforms import clip_by_global_norm, clip_by_value
    >>> t = chain(clip_by_value(1.0), clip_by_global_norm(1.0))
    >>> u, _ = t.update([tf.constant([3.0, 4.0])], t.init([tf.zeros(2)]))
    >>> u[0].numpy().astype(float).round(4).tolist()
    [0.7071, 0.7071]
    """
    ts = tuple(_as_transformation(t, f"transforms[{i}]") for i, t in enumerate(transforms))

    def init(params):
        return tuple(t.init(params) for t in ts)

    def update(updates, state, params=None):
        if not isinstance(state, tuple) or len(state) != len(ts):
            raise ValueError(f"state: expected a tuple of {len(ts)} states from chain.init, "
                             f"got {type(state).__name__}")
        new_state = []
        with _shared_norms():
            for t, s in zip(ts, state):
                updates, s = t.update(updates, s, params)
                new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, tag_update(update, _rg_chain=ts))  # the parts, for the fused path
