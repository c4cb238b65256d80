"""Composable gradient transformations (optax-style) over ``tf.nest`` structures.

A :class:`GradientTransformation` is a pair of pure functions::

    state = t.init(params)                                  # a nest of tensors only
    updates, state = t.update(grads, state, params=None)    # same structure as grads

``params`` and ``grads`` are any ``tf.nest`` structure (list, tuple, dict, namedtuple) whose leaves
are float tensors, ``tf.Variable`` s or Keras 3 variables (read as tensors). The state holds tensors
only, so it can live in ``tf.Variable`` s and be checkpointed; :class:`GradientStep` does exactly that
and applies any Keras 3 optimizer after the transformation inside one compiled train step.

Transformations compose with :func:`chain`; the result is again a transformation::

    >>> import tensorflow as tf
    >>> from robustgrad import transforms as T
    >>> t = T.chain(T.zero_nonfinite(), T.clip_by_global_norm(1.0))
    >>> g = [tf.constant([3.0, float("nan")]), tf.constant([4.0])]
    >>> updates, _ = t.update(g, t.init(g))
    >>> [u.numpy().astype(float).round(3).tolist() for u in updates]
    [[0.6, 0.0], [0.8]]

Rejection and emission: :func:`apply_if_finite` and :func:`accumulate` record in their state
whether the current step should reach the optimizer (``ApplyIfFiniteState.last_finite``,
``AccumulateState.emit``). :func:`should_apply` reads those flags from any (nested) state, which is
how :class:`GradientStep` skips ``optimizer.apply_gradients`` -- so Adam's moments do not move on a
rejected or non-emitting step. A transformation used on its own returns zero updates on such steps.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

__all__ = [
    "AccumulateState",
    "AddNoiseState",
    "ApplyIfFiniteState",
    "EmptyState",
    "GradientStep",
    "GradientTransformation",
    "MaskedState",
    "NonFiniteGradientError",
    "accumulate",
    "adaptive_clip",
    "add_noise",
    "all_finite",
    "apply_if_finite",
    "chain",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "global_norm",
    "identity",
    "masked",
    "nonfinite_count",
    "should_apply",
    "zero_nonfinite",
]


# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------


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


class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite`.

    notfinite_count: int32 scalar, consecutive non-finite steps (0 after a finite step).
    last_finite: bool scalar, whether the last step was accepted (finite).
    total_notfinite: int32 scalar, non-finite steps since init.
    max_consecutive_errors: int32 scalar, the configured limit (constant; kept so that consumers
        such as :class:`GradientStep` can report when it is exceeded).
    inner_state: the wrapped transformation's state (untouched on a rejected step).
    """

    notfinite_count: Any
    last_finite: Any
    total_notfinite: Any
    max_consecutive_errors: Any
    inner_state: Any


class AccumulateState(NamedTuple):
    """State of :func:`accumulate`.

    mini_step: int32 scalar in ``[0, k)``, micro-steps summed so far.
    acc: nest like ``params``, running sum of the micro-step gradients.
    emit: bool scalar, whether the last call emitted (every k-th call).
    inner_state: state of the transformation applied to the emitted gradient (or EmptyState).
    """

    mini_step: Any
    acc: Any
    emit: Any
    inner_state: Any


class AddNoiseState(NamedTuple):
    """State of :func:`add_noise`: ``count`` (int64 scalar, steps taken)."""

    count: Any


class MaskedState(NamedTuple):
    """State of :func:`masked`: the inner state over the masked-in leaves (a list)."""

    inner_state: Any


class NonFiniteGradientError(ValueError):
    """Raised (eagerly, outside the graph) when too many consecutive steps were non-finite."""


# --------------------------------------------------------------------------------------------
# Helpers
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


def _check_number(value, name, *, allow_zero=True, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


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


def global_norm(tree):
    """Global L2 norm of a nest of tensors as a float32 scalar (``sqrt(sum_i ||x_i||^2)``).

    Leaves of any float dtype are accumulated in float32. Non-finite leaves give a non-finite norm.
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


def all_finite(tree):
    """Bool scalar: every element of every leaf is finite (no NaN, no +-Inf)."""
    flat = [_as_tensor(x) for x in tf.nest.flatten(tree)]
    if not flat:
        return tf.constant(True)
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(x)) for x in flat]))


def _zeros_like_tree(tree):
    return tf.nest.map_structure(lambda x: tf.zeros_like(_as_tensor(x)), tree)


def _zeros_state_like_params(params):
    return tf.nest.map_structure(
        lambda p: tf.zeros(_as_tensor(p).shape, _leaf_dtype(p)), params)


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


def should_apply(state):
    """Bool scalar: whether the step that produced ``state`` should reach the optimizer.

    False when any :func:`apply_if_finite` inside rejected the step or any :func:`accumulate` did
    not emit. True for transformations with neither.
    """
    flags = [s.last_finite for s in _walk_states(state, ApplyIfFiniteState)]
    flags += [s.emit for s in _walk_states(state, AccumulateState)]
    if not flags:
        return tf.constant(True)
    if len(flags) == 1:
        return tf.convert_to_tensor(flags[0])
    return tf.reduce_all(tf.stack(flags))


def nonfinite_count(state):
    """``(count, limit)`` from the outermost :func:`apply_if_finite` in ``state``, else None.

    count: int32 consecutive non-finite steps; limit: its ``max_consecutive_errors``.
    """
    for s in _walk_states(state, ApplyIfFiniteState):
        return s.notfinite_count, s.max_consecutive_errors
    return None


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
# Transformations
# --------------------------------------------------------------------------------------------


def identity():
    """The transformation that returns its input unchanged (empty state)."""
    return _stateless(lambda u, p: tf.nest.map_structure(_as_tensor, u), "identity")


def chain(*transforms):
    """Apply ``transforms`` in order, each to the previous one's output.

    The state is a tuple with one entry per transformation.

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

    return GradientTransformation(init, update)


def clip_by_value(max_value, min_value=None):
    """Clip every element to ``[min_value, max_value]`` (``min_value`` defaults to ``-max_value``).

    Args:
        max_value: float >= 0 (or any float when ``min_value`` is given and <= it).
        min_value: optional float <= ``max_value``.

    >>> u, _ = clip_by_value(1.0).update([tf.constant([-3.0, 0.5, 2.0])], EmptyState())
    >>> u[0].numpy().tolist()
    [-1.0, 0.5, 1.0]
    """
    if min_value is None:
        hi = _check_number(max_value, "max_value")
        lo = -hi
    else:
        if isinstance(max_value, bool) or not isinstance(max_value, numbers.Real):
            raise TypeError(f"max_value must be a real number, got {type(max_value).__name__}")
        if isinstance(min_value, bool) or not isinstance(min_value, numbers.Real):
            raise TypeError(f"min_value must be a real number, got {type(min_value).__name__}")
        hi, lo = float(max_value), float(min_value)
        if not lo <= hi:
            raise ValueError(f"min_value ({lo}) must be <= max_value ({hi})")

    def fn(updates, params):
        def clip(g):
            g = _as_tensor(g)
            return tf.clip_by_value(g, tf.cast(lo, g.dtype), tf.cast(hi, g.dtype))

        return tf.nest.map_structure(clip, updates)

    return _stateless(fn, "clip_by_value")


def _clip_scale(norm, max_norm):
    """float32 ``min(1, max_norm / norm)`` (1 when ``norm <= max_norm``; NaN stays NaN)."""
    return tf.where(norm > max_norm, max_norm / tf.maximum(norm, 1e-30), 1.0)


def _scale_to(g, norm, max_norm):
    """``g * min(1, max_norm / norm)`` computed in float32, cast back to ``g.dtype``."""
    return g * tf.cast(_clip_scale(norm, max_norm), g.dtype)


def clip_by_norm(max_norm):
    """Rescale each tensor separately so that its L2 norm is at most ``max_norm``.

    ``g <- g * min(1, max_norm / ||g||_2)`` per leaf (``tf.clip_by_norm`` with no axes).

    >>> u, _ = clip_by_norm(1.0).update([tf.constant([3.0, 4.0]), tf.constant([0.1])], EmptyState())
    >>> [x.numpy().astype(float).round(3).tolist() for x in u]
    [[0.6, 0.8], [0.1]]
    """
    max_norm = _check_number(max_norm, "max_norm")

    def fn(updates, params):
        def clip(g):
            g = _as_tensor(g)
            return _scale_to(g, tf.sqrt(_sq_sum_f32(g)), max_norm)

        return tf.nest.map_structure(clip, updates)

    return _stateless(fn, "clip_by_norm")


def clip_by_global_norm(max_norm):
    """Rescale all tensors jointly so that their global L2 norm is at most ``max_norm``.

    ``g_i <- g_i * min(1, max_norm / sqrt(sum_j ||g_j||^2))`` (Pascanu et al. 2013). A non-finite
    global norm yields non-finite updates, which :func:`apply_if_finite` then rejects.

    >>> g = [tf.constant([3.0]), tf.constant([4.0])]
    >>> u, _ = clip_by_global_norm(1.0).update(g, EmptyState())
    >>> [x.numpy().astype(float).round(3).tolist() for x in u]
    [[0.6], [0.8]]
    """
    max_norm = _check_number(max_norm, "max_norm")

    def fn(updates, params):
        scale = _clip_scale(global_norm(updates), max_norm)
        return tf.nest.map_structure(
            lambda g: _as_tensor(g) * tf.cast(scale, _leaf_dtype(g)), updates)

    return _stateless(fn, "clip_by_global_norm")


def _unitwise_norm(x):
    """Unit-wise L2 norm, broadcastable to ``x`` (NFNets convention, HWIO/(in, out) layouts).

    rank <= 1: the whole tensor; rank 2/3: over axis 0 (one norm per output unit);
    rank >= 4: over every axis but the last.
    """
    x = tf.cast(x, tf.float32)
    rank = x.shape.rank
    if rank is None:
        raise ValueError("adaptive_clip needs tensors of known rank")
    if rank <= 1:
        axes = None
    elif rank in (2, 3):
        axes = 0
    else:
        axes = list(range(rank - 1))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=axes, keepdims=rank > 1))


def adaptive_clip(clipping=0.01, eps=1e-3):
    """Adaptive gradient clipping (AGC), Brock et al. 2021, "High-Performance Large-Scale Image
    Recognition Without Normalization" (NFNets), arXiv:2102.06171.

    Unit-wise: for each output unit ``i`` of a weight ``W`` with gradient ``G``::

        G_i <- G_i * clipping * max(||W_i||, eps) / ||G_i||   if ||G_i|| / max(||W_i||, eps) > clipping

    Unit-wise norms: rank <= 1 leaves use the whole tensor, rank 2/3 (Dense ``(in, out)``) reduce
    over axis 0, rank 4 (Conv ``(h, w, in, out)``) over all but the last axis. Needs ``params`` in
    ``update``. The paper does not clip the final classifier layer; use :func:`masked` for that.

    Args:
        clipping: float > 0, the maximum ratio ``||G_i|| / ||W_i||`` (lambda in the paper).
        eps: float >= 0, floor for ``||W_i||`` so zero-initialised weights can still move.

    >>> w, g = [tf.constant([[3.0], [4.0]])], [tf.constant([[30.0], [40.0]])]
    >>> u, _ = adaptive_clip(0.1).update(g, EmptyState(), params=w)
    >>> u[0].numpy().astype(float).round(3).ravel().tolist()   # ||G|| capped at 0.1 * ||W|| = 0.5
    [0.3, 0.4]
    """
    clipping = _check_number(clipping, "clipping", allow_zero=False)
    eps = _check_number(eps, "eps")

    def fn(updates, params):
        if params is None:
            raise ValueError("params: adaptive_clip needs the parameters in update(..., params=)")

        def clip(g, p):
            g = _as_tensor(g)
            p_norm = tf.maximum(_unitwise_norm(_as_tensor(p)), eps)
            g_norm = _unitwise_norm(g)
            max_norm = clipping * p_norm
            scale = tf.where(g_norm > max_norm, max_norm / tf.maximum(g_norm, 1e-30), 1.0)
            return g * tf.cast(scale, g.dtype)

        return tf.nest.map_structure(clip, updates, params)

    return _stateless(fn, "adaptive_clip")


def zero_nonfinite():
    """Replace NaN and +-Inf elements by zero (elementwise; finite elements untouched).

    >>> u, _ = zero_nonfinite().update([tf.constant([1.0, float("nan"), float("inf")])], EmptyState())
    >>> u[0].numpy().tolist()
    [1.0, 0.0, 0.0]
    """

    def fn(updates, params):
        def zero(g):
            g = _as_tensor(g)
            return tf.where(tf.math.is_finite(g), g, tf.constant(0, g.dtype))

        return tf.nest.map_structure(zero, updates)

    return _stateless(fn, "zero_nonfinite")


def apply_if_finite(inner, max_consecutive_errors=10):
    """Apply ``inner`` only when every incoming gradient element is finite.

    The check is ``is_finite(global_norm(updates))`` (float32), so a step whose squared norm
    overflows float32 (elements beyond ~1e19) also counts as non-finite. On a non-finite step the
    updates are zeros, ``inner``'s state is left as it was, the consecutive count
    ``notfinite_count`` grows by one and ``last_finite`` is False (so :class:`GradientStep` does
    not call the optimizer at all). A finite step resets the count.

    Unlike optax, updates are *never* applied while non-finite, even after
    ``max_consecutive_errors``: no error can be raised inside a compiled graph, so the count and the
    limit are exposed instead (``GradientStep`` reports ``nonfinite_steps`` and
    ``nonfinite_exceeded``; :meth:`GradientStep.raise_if_exceeded` raises eagerly) for the
    trainer to stop on.

    Args:
        inner: the GradientTransformation to guard.
        max_consecutive_errors: int >= 0, consecutive non-finite steps tolerated.

    >>> t = apply_if_finite(clip_by_global_norm(1.0), max_consecutive_errors=2)
    >>> s = t.init([tf.zeros(2)])
    >>> u, s = t.update([tf.constant([float("nan"), 1.0])], s)
    >>> u[0].numpy().tolist(), int(s.notfinite_count), bool(s.last_finite)
    ([0.0, 0.0], 1, False)
    """
    inner = _as_transformation(inner, "inner")
    if (isinstance(max_consecutive_errors, bool)
            or not isinstance(max_consecutive_errors, numbers.Integral)):
        raise TypeError("max_consecutive_errors must be an int, got "
                        f"{type(max_consecutive_errors).__name__}")
    if max_consecutive_errors < 0:
        raise ValueError(f"max_consecutive_errors must be >= 0, got {max_consecutive_errors}")
    limit = int(max_consecutive_errors)

    def init(params):
        return ApplyIfFiniteState(
            notfinite_count=tf.constant(0, tf.int32),
            last_finite=tf.constant(True),
            total_notfinite=tf.constant(0, tf.int32),
            max_consecutive_errors=tf.constant(limit, tf.int32),
            inner_state=inner.init(params),
        )

    def update(updates, state, params=None):
        if not isinstance(state, ApplyIfFiniteState):
            raise TypeError("state: expected the ApplyIfFiniteState from apply_if_finite.init, "
                             f"got {type(state).__name__}")
        _flatten_checked(updates, "updates")
        updates = tf.nest.map_structure(_as_tensor, updates)
        # Finite iff the float32 global norm is: one fused op per leaf, and the same expression
        # as GradientStep's grad_norm (graph optimisers share it).
        finite = tf.math.is_finite(global_norm(updates))
        # Select rather than tf.cond: inner is pure, so running it on a rejected step is harmless,
        # and elementwise selects are cheaper than a conditional in graph mode and under XLA.
        inner_updates, inner_state = inner.update(updates, state.inner_state, params)
        new_updates = tf.nest.map_structure(
            lambda u: tf.where(finite, u, tf.constant(0, u.dtype)), inner_updates)
        new_inner = tf.nest.map_structure(
            lambda new, old: tf.where(finite, new, old), inner_state, state.inner_state)
        bad = tf.cast(tf.logical_not(finite), tf.int32)
        return new_updates, ApplyIfFiniteState(
            notfinite_count=(state.notfinite_count + bad) * bad,
            last_finite=finite,
            total_notfinite=state.total_notfinite + bad,
            max_consecutive_errors=tf.convert_to_tensor(state.max_consecutive_errors),
            inner_state=new_inner,
        )

    return GradientTransformation(init, update)


def accumulate(k, average=True, inner=None):
    """Gradient accumulation: sum ``k`` micro-step gradients, emit on every k-th call.

    Calls 1..k-1 of each cycle return zeros and set ``emit=False``; call k returns the mean
    (``average=True``) or the sum of the k gradients, sets ``emit=True`` and resets the sum.
    :class:`GradientStep` calls the optimizer only on emitting steps. ``inner`` (optional) is
    applied to the emitted gradient only, so its state advances once per k micro-steps; in a plain
    ``chain(accumulate(k), t)``, ``t`` runs on every call (on zeros between emissions).

    Args:
        k: int >= 1.
        average: emit the mean (True) or the sum (False).
        inner: optional GradientTransformation applied on emission.

    >>> t = accumulate(2)
    >>> s = t.init([tf.zeros(1)])
    >>> u, s = t.update([tf.constant([1.0])], s); u[0].numpy().tolist(), bool(s.emit)
    ([0.0], False)
    >>> u, s = t.update([tf.constant([3.0])], s); u[0].numpy().tolist(), bool(s.emit)
    ([2.0], True)
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = int(k)
    inner_t = identity() if inner is None else _as_transformation(inner, "inner")

    def init(params):
        _flatten_checked(params, "params")
        return AccumulateState(
            mini_step=tf.constant(0, tf.int32),
            acc=_zeros_state_like_params(params),
            emit=tf.constant(False),
            inner_state=inner_t.init(params),
        )

    def update(updates, state, params=None):
        if not isinstance(state, AccumulateState):
            raise TypeError("state: expected the AccumulateState from accumulate.init, "
                             f"got {type(state).__name__}")
        _flatten_checked(updates, "updates")
        _assert_same_structure(updates, state.acc, "updates", "params (from init)")
        updates = tf.nest.map_structure(_as_tensor, updates)
        acc = tf.nest.map_structure(lambda a, g: a + tf.cast(g, a.dtype), state.acc, updates)
        count = state.mini_step + 1
        emit = count >= k
        if average and k > 1:
            out = tf.nest.map_structure(lambda a: a / tf.cast(k, a.dtype), acc)
        else:
            out = acc
        out = tf.nest.map_structure(lambda o, g: tf.cast(o, g.dtype), out, updates)
        zeros = _zeros_like_tree(out)
        if inner is None:
            emitted = tf.nest.map_structure(lambda o, z: tf.where(emit, o, z), out, zeros)
            new_inner = state.inner_state
        else:
            emitted, new_inner = tf.cond(
                emit,
                lambda: inner_t.update(out, state.inner_state, params),
                lambda: (zeros, state.inner_state),
            )
        new_acc = tf.nest.map_structure(lambda a: tf.where(emit, tf.zeros_like(a), a), acc)
        return emitted, AccumulateState(
            mini_step=tf.where(emit, 0, count),
            acc=new_acc,
            emit=emit,
            inner_state=new_inner,
        )

    return GradientTransformation(init, update)


def add_noise(stddev, decay=0.55, seed=0):
    """Add annealed Gaussian noise: Neelakantan et al. 2015, "Adding Gradient Noise Improves
    Learning for Very Deep Networks", arXiv:1511.06807.

    At step ``t = 0, 1, ...`` each element gets ``N(0, sigma_t^2)`` with
    ``sigma_t^2 = stddev^2 / (1 + t)^decay`` (the paper uses ``decay = 0.55``). Noise is drawn with
    ``tf.random.stateless_normal`` from ``(seed, t, leaf index)``: the same seed gives the same noise,
    eagerly, in ``tf.function`` and under XLA.

    Args:
        stddev: float >= 0, the noise standard deviation at ``t = 0`` (sqrt of eta in the paper).
        decay: float >= 0, the annealing exponent gamma.
        seed: int, the noise seed.

    >>> t = add_noise(0.0)
    >>> u, s = t.update([tf.ones(2)], t.init([tf.ones(2)])); u[0].numpy().tolist(), int(s.count)
    ([1.0, 1.0], 1)
    """
    stddev = _check_number(stddev, "stddev")
    decay = _check_number(decay, "decay")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    seed = int(seed)

    def init(params):
        _flatten_checked(params, "params")
        return AddNoiseState(count=tf.constant(0, tf.int64))

    def update(updates, state, params=None):
        if not isinstance(state, AddNoiseState):
            raise TypeError("state: expected the AddNoiseState from add_noise.init, "
                             f"got {type(state).__name__}")
        flat = [_as_tensor(g) for g in _flatten_checked(updates, "updates")]
        t = tf.cast(state.count, tf.float32)
        std = stddev / tf.pow(1.0 + t, decay / 2.0)
        n = len(flat)
        out = []
        for i, g in enumerate(flat):
            s = tf.stack([tf.constant(seed, tf.int64), state.count * n + i])
            noise = tf.random.stateless_normal(tf.shape(g), seed=s, dtype=tf.float32) * std
            out.append(g + tf.cast(noise, g.dtype))
        return (tf.nest.pack_sequence_as(updates, out),
                AddNoiseState(count=state.count + 1))

    return GradientTransformation(init, update)


def _nest_paths(tree, prefix=""):
    """Joined string paths (``"a/0"``) of the leaves of ``tree``, in ``tf.nest.flatten`` order."""
    if isinstance(tree, dict):
        items = [(str(k), tree[k]) for k in sorted(tree)]
    elif _is_namedtuple(tree):
        items = list(zip(type(tree)._fields, tree))
    elif isinstance(tree, (list, tuple)):
        items = [(str(i), x) for i, x in enumerate(tree)]
    else:
        return [prefix or "0"]
    out = []
    for k, x in items:
        out += _nest_paths(x, f"{prefix}/{k}" if prefix else k)
    return out


def _leaf_names(params):
    """Names for each leaf: Keras ``path``, else tf.Variable name without ``:0``, else nest path."""
    paths = _nest_paths(params)
    names = []
    for path, leaf in zip(paths, tf.nest.flatten(params)):
        name = getattr(leaf, "path", None)
        if not isinstance(name, str):
            name = None
            if isinstance(leaf, tf.Variable):
                name = leaf.name
                name = name.removesuffix(":0")
        names.append(name if name else path)
    return names


def masked(inner, mask, passthrough=False):
    """Apply ``inner`` to the masked-in leaves only; masked-out leaves get zero updates.

    Use it to freeze layers (frozen leaves = False). With ``passthrough=True`` the masked-out
    leaves are passed through unchanged instead (optax's ``masked`` semantics), to restrict a
    transformation to some layers: ``masked(adaptive_clip(0.01), lambda name: "head" not in name,
    passthrough=True)`` is AGC without the classifier head, as in the paper.
    ``inner`` sees only the selected leaves, as a list (so a global norm ignores frozen leaves).

    Note: zero updates do not fully freeze a variable under an optimizer with decoupled weight
    decay (AdamW) or momentum from earlier steps; to freeze for sure, leave it out of the variable
    list given to the optimizer.

    Args:
        inner: a GradientTransformation.
        mask: a nest of Python bools with the structure of ``params``, or a callable
            ``mask(name) -> bool`` called once per leaf with the leaf's name (Keras variable
            ``path`` such as ``"sequential/dense/kernel"``, a tf.Variable's name without ``:0``,
            or the nest path such as ``"0"``/``"dense/kernel"`` for plain tensors).
            A callable mask is resolved from ``params`` at ``init`` (and at ``update`` when
            ``params`` is given).
        passthrough: False (masked-out leaves -> zeros) or True (-> unchanged).

    >>> t = masked(clip_by_value(1.0), [True, False])
    >>> g = [tf.constant([5.0]), tf.constant([5.0])]
    >>> u, _ = t.update(g, t.init(g)); [x.numpy().tolist() for x in u]
    [[1.0], [0.0]]
    """
    inner = _as_transformation(inner, "inner")
    if not callable(mask):
        flat_mask = tf.nest.flatten(mask)
        for i, m in enumerate(flat_mask):
            if not isinstance(m, bool):
                raise TypeError(f"mask: leaf {i} is {type(m).__name__}; expected a Python bool "
                                "(or pass a callable mask(name) -> bool)")
    cache = {}

    def resolve(tree, where):
        if callable(mask):
            if tree is None:
                if "flat" not in cache:
                    raise ValueError("mask: a callable mask needs params; call init(params) "
                                     "first or pass params= to update")
                return cache["flat"]
            flat = []
            for name in _leaf_names(tree):
                m = mask(name)
                if not isinstance(m, bool):
                    raise TypeError(f"mask: mask({name!r}) returned {type(m).__name__}; "
                                    "expected bool")
                flat.append(m)
            cache["flat"] = flat
            return flat
        if tree is not None:
            try:
                tf.nest.assert_same_structure(mask, tree, check_types=False)
            except (ValueError, TypeError) as e:
                raise ValueError(f"mask and {where} have different structures: {e}") from None
        return tf.nest.flatten(mask)

    def init(params):
        flat_p = _flatten_checked(params, "params")
        flat_m = resolve(params, "params")
        return MaskedState(inner_state=inner.init([p for p, m in zip(flat_p, flat_m) if m]))

    def update(updates, state, params=None):
        if not isinstance(state, MaskedState):
            raise TypeError("state: expected the MaskedState from masked.init, "
                             f"got {type(state).__name__}")
        flat_u = [_as_tensor(g) for g in _flatten_checked(updates, "updates")]
        flat_m = resolve(params, "params")
        if len(flat_m) != len(flat_u):
            raise ValueError(f"mask has {len(flat_m)} leaves but updates has {len(flat_u)}")
        if params is not None:
            _assert_same_structure(updates, params, "updates", "params")
            sel_p = [p for p, m in zip(tf.nest.flatten(params), flat_m) if m]
        else:
            sel_p = None
        sel_u = [g for g, m in zip(flat_u, flat_m) if m]
        new_sel, new_inner = inner.update(sel_u, state.inner_state, sel_p)
        it = iter(new_sel)
        out = [next(it) if m else (g if passthrough else tf.zeros_like(g))
               for g, m in zip(flat_u, flat_m)]
        return tf.nest.pack_sequence_as(updates, out), MaskedState(inner_state=new_inner)

    return GradientTransformation(init, update)


# --------------------------------------------------------------------------------------------
# GradientStep: transformation + Keras optimizer, state in tf.Variables
# --------------------------------------------------------------------------------------------


def _tf_variable(v):
    if isinstance(v, tf.Variable):
        return v
    value = getattr(v, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(f"variables: {v!r} is neither a tf.Variable nor a Keras variable "
                    "on the TensorFlow backend")


class GradientStep(tf.Module):
    """Apply a :class:`GradientTransformation`, then a Keras 3 optimizer, in one step.

    The transformation state lives in non-trainable ``tf.Variable`` s (``self.state_variables``),
    so ``tf.train.Checkpoint(step=step)`` saves it. ``step(grads)`` works eagerly, inside
    ``tf.function`` and under ``jit_compile=True``::

        grads -> grad_norm = global_norm(grads)
              -> updates, state = transform.update(grads, state, variables)
              -> tf.cond(should_apply(state), optimizer.apply_gradients(updates), no-op)

    so on a step rejected by :func:`apply_if_finite`, or a non-emitting :func:`accumulate` step,
    the optimizer is not called at all (Adam's moments and ``iterations`` do not move).

    Args:
        transform: a GradientTransformation.
        optimizer: a Keras 3 optimizer (built here for ``variables`` if it is not yet).
        variables: list of Keras 3 or ``tf.Variable`` s, e.g. ``model.trainable_variables``.

    Returns from ``step(grads)`` (``grads``: list aligned with ``variables``, no ``None``): a dict of
    scalar tensors ``grad_norm`` (float32, global norm before the transform), ``applied`` (bool),
    ``nonfinite_steps`` (int32, consecutive non-finite steps: from the outermost apply_if_finite
    when there is one, else counted on the incoming gradients) and ``nonfinite_exceeded`` (bool,
    ``nonfinite_steps > max_consecutive_errors``; always False without apply_if_finite).

    >>> import keras
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> step = GradientStep(chain(apply_if_finite(clip_by_global_norm(1.0), 5)),
    ...                     keras.optimizers.Adam(1e-3), model.trainable_variables)
    >>> @tf.function
    ... def train(x, y):
    ...     with tf.GradientTape() as tape:
    ...         loss = tf.reduce_mean(tf.square(model(x) - y))
    ...     return step(tape.gradient(loss, model.trainable_variables))
    >>> bool(train(tf.ones((4, 3)), tf.zeros((4, 2)))["applied"])
    True
    """

    def __init__(self, transform, optimizer, variables, name=None):
        super().__init__(name=name or "gradient_step")
        self._transform = _as_transformation(transform, "transform")
        if not hasattr(optimizer, "apply_gradients"):
            raise TypeError(f"optimizer must be a Keras optimizer, got {type(optimizer).__name__}")
        variables = list(variables)
        if not variables:
            raise ValueError("variables must not be empty")
        for i, v in enumerate(variables):
            _tf_variable(v)
            if not _leaf_dtype(v).is_floating:
                raise TypeError(f"variables[{i}] ({_leaf_names([v])[0]}) has a non-float dtype")
        self._optimizer = optimizer
        self._vars = variables
        self._names = _leaf_names(variables)
        if not getattr(optimizer, "built", True):
            optimizer.build(variables)
        state = self._transform.init(variables)
        flat = tf.nest.flatten(state)
        for leaf in flat:
            if not isinstance(leaf, (tf.Tensor, tf.Variable)) and not hasattr(leaf, "dtype"):
                raise TypeError(f"transform: init returned a non-tensor state leaf {leaf!r}")
        self._structure = tf.nest.map_structure(lambda _: 0, state)
        with self.name_scope:
            self.state_variables = [
                tf.Variable(tf.convert_to_tensor(x), trainable=False, name=f"state_{i}")
                for i, x in enumerate(flat)
            ]
            self._nonfinite = tf.Variable(0, dtype=tf.int32, trainable=False,
                                          name="nonfinite_steps")

    @property
    def transform(self):
        return self._transform

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def state(self):
        """The current transformation state (a nest of tensors read from the variables)."""
        return tf.nest.pack_sequence_as(self._structure,
                                        [v.read_value() for v in self.state_variables])

    def __call__(self, grads):
        return self.step(grads)

    def step(self, grads):
        grads = list(grads) if isinstance(grads, (list, tuple)) else grads
        if not isinstance(grads, list) or len(grads) != len(self._vars):
            n = len(grads) if isinstance(grads, list) else type(grads).__name__
            raise ValueError(f"grads: expected a list of {len(self._vars)} gradients aligned "
                             f"with variables, got {n}")
        for g, name in zip(grads, self._names):
            if g is None:
                raise ValueError(f"grads: the gradient for variable {name!r} is None "
                                 "(the loss does not depend on it)")
        grads = [_as_tensor(g) for g in grads]
        _check_float_leaves(grads, "grads")
        for g, v, name in zip(grads, self._vars, self._names):
            if g.shape.is_fully_defined() and tuple(g.shape) != tuple(v.shape):
                raise ValueError(f"grads: shape {tuple(g.shape)} for variable {name!r} "
                                 f"of shape {tuple(v.shape)}")

        with _shared_norms():
            return self._step(grads)

    def _step(self, grads):
        grad_norm = global_norm(grads)
        old_flat = [v.read_value() for v in self.state_variables]
        old_state = tf.nest.pack_sequence_as(self._structure, old_flat)
        updates, new_state = self._transform.update(grads, old_state, self._vars)
        flat_new = tf.nest.flatten(new_state)
        # leaves passed through unchanged (the very same tensor) need no write
        assigns = [v.assign(tf.cast(x, v.dtype)) for v, x, old
                   in zip(self.state_variables, flat_new, old_flat) if x is not old]
        apply = should_apply(new_state)

        def do_apply():
            self._optimizer.apply_gradients(
                [(tf.cast(u, _leaf_dtype(v)), v) for u, v in zip(updates, self._vars)])
            return tf.constant(True)

        with tf.control_dependencies(assigns):
            static = tf.get_static_value(apply)
            if static is not None and bool(static):  # nothing can reject: no conditional
                applied = do_apply()
            else:
                applied = tf.cond(apply, do_apply, lambda: tf.constant(False))

        found = nonfinite_count(new_state)
        if found is not None:
            count, limit = found
            count = tf.identity(count)
            exceeded = count > limit
        else:
            bad = tf.logical_not(tf.math.is_finite(grad_norm))
            count = self._nonfinite.assign(tf.where(bad, self._nonfinite + 1, 0)).read_value()
            exceeded = tf.constant(False)
        return {"grad_norm": grad_norm, "applied": applied, "nonfinite_steps": count,
                "nonfinite_exceeded": exceeded}

    @property
    def nonfinite_steps(self):
        """int32 scalar: consecutive non-finite steps so far (see the ``step`` stats)."""
        found = nonfinite_count(self.state)
        return tf.identity(found[0]) if found is not None else self._nonfinite.read_value()

    def raise_if_exceeded(self, stats=None):
        """Eagerly raise :class:`NonFiniteGradientError` if the apply_if_finite limit is exceeded.

        Call it outside ``tf.function`` (e.g. after each compiled train step) with the returned
        ``stats`` or with no argument (reads the state variables).
        """
        if stats is not None:
            exceeded = bool(stats["nonfinite_exceeded"])
            count = int(stats["nonfinite_steps"])
        else:
            found = nonfinite_count(self.state)
            if found is None:
                return
            count, limit = int(found[0]), int(found[1])
            exceeded = count > limit
        if exceeded:
            raise NonFiniteGradientError(
                f"gradients were non-finite for {count} consecutive steps, more than "
                "apply_if_finite's max_consecutive_errors; stop training (lower the learning "
                "rate, check the loss for log(0)/division by zero)")
