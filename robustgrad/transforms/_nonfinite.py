"""Non-finite guards: :func:`zero_nonfinite`, :func:`apply_if_finite` and their read-outs.

One vocabulary across the core: a step is *non-finite* when any gradient element is NaN or
+-Inf; :func:`apply_if_finite` counts consecutive non-finite steps (``nonfinite_count``) against
its limit ``max_nonfinite_steps``, and :meth:`GradientStep.raise_if_exceeded` raises
:class:`~robustgrad.errors.NonFiniteGradientError` (a :class:`~robustgrad.errors.NonFiniteError`)
beyond it.

>>> import tensorflow as tf
>>> bool(all_finite([tf.constant([1.0]), tf.constant([float("inf")])]))
False
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import positive_int
from robustgrad.errors import NonFiniteGradientError
from robustgrad.transforms._base import (
    EmptyState,  # noqa: F401  (the doctests' state)
    GradientTransformation,
    _as_tensor,
    _as_transformation,
    _check_state,
    _flatten_checked,
    _stateless,
    _walk_states,
    global_norm,
)

__all__ = [
    "ApplyIfFiniteState",
    "NonFiniteGradientError",
    "all_finite",
    "apply_if_finite",
    "nonfinite_count",
    "zero_nonfinite",
]

_LIMIT_NAME = "max_nonfinite_steps (formerly max_consecutive_errors)"


def _deprecated(old, new):
    warnings.warn(f"ApplyIfFiniteState.{old} is deprecated; read {new}", DeprecationWarning,
                  stacklevel=3)


class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite`.

    nonfinite_count: int32 scalar, consecutive non-finite steps (0 after a finite step).
    last_finite: bool scalar, whether the last step was accepted (finite).
    total_nonfinite: int32 scalar, non-finite steps since init.
    max_nonfinite_steps: int32 scalar, the configured limit (constant; kept so that consumers
        such as :class:`GradientStep` can report when it is exceeded).
    inner_state: the wrapped transformation's state (untouched on a rejected step).

    The names of the first version, ``notfinite_count``, ``total_notfinite`` and
    ``max_consecutive_errors``, are still readable (with a ``DeprecationWarning``).
    """

    nonfinite_count: Any
    last_finite: Any
    total_nonfinite: Any
    max_nonfinite_steps: Any
    inner_state: Any

    @property
    def notfinite_count(self) -> Any:
        """Deprecated name of ``nonfinite_count``."""
        _deprecated("notfinite_count", "nonfinite_count")
        return self.nonfinite_count

    @property
    def total_notfinite(self) -> Any:
        """Deprecated name of ``total_nonfinite``."""
        _deprecated("total_notfinite", "total_nonfinite")
        return self.total_nonfinite

    @property
    def max_consecutive_errors(self) -> Any:
        """Deprecated name of ``max_nonfinite_steps``."""
        _deprecated("max_consecutive_errors", "max_nonfinite_steps")
        return self.max_nonfinite_steps


def all_finite(tree: Any) -> tf.Tensor:
    """Bool scalar: every element of every leaf is finite (no NaN, no +-Inf)."""
    flat = [_as_tensor(x) for x in tf.nest.flatten(tree)]
    if not flat:
        return tf.constant(True)
    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(x)) for x in flat]))


def nonfinite_count(state: Any) -> tuple[tf.Tensor, tf.Tensor] | None:
    """``(count, limit)`` from the outermost :func:`apply_if_finite` in ``state``, else None.

    count: int32 consecutive non-finite steps; limit: its ``max_nonfinite_steps``.

    >>> t = apply_if_finite(zero_nonfinite(), max_nonfinite_steps=3)
    >>> [int(x) for x in nonfinite_count((EmptyState(), t.init([tf.zeros(1)])))]
    [0, 3]
    """
    for s in _walk_states(state, ApplyIfFiniteState):
        return s.nonfinite_count, s.max_nonfinite_steps
    return None


def zero_nonfinite() -> GradientTransformation:
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


def apply_if_finite(inner: GradientTransformation, max_nonfinite_steps: int | None = None, *,
                    max_consecutive_errors: int | None = None) -> GradientTransformation:
    """Apply ``inner`` only when every incoming gradient element is finite.

    The check is ``is_finite(global_norm(updates))`` (float32), so a step whose squared norm
    overflows float32 (elements beyond ~1e19) also counts as non-finite. On a non-finite step the
    updates are zeros, ``inner``'s state is left as it was, the consecutive count
    ``nonfinite_count`` grows by one and ``last_finite`` is False (so :class:`GradientStep` does
    not call the optimizer at all). A finite step resets the count.

    Unlike optax, updates are *never* applied while non-finite, even after
    ``max_nonfinite_steps``: no error can be raised inside a compiled graph, so the count and the
    limit are exposed instead (``GradientStep`` reports ``nonfinite_steps`` and
    ``nonfinite_exceeded``; :meth:`GradientStep.raise_if_exceeded` raises eagerly) for the
    trainer to stop on.

    Args:
        inner: the GradientTransformation to guard.
        max_nonfinite_steps: int >= 0, consecutive non-finite steps tolerated (default 10).
        max_consecutive_errors: deprecated name of ``max_nonfinite_steps`` (optax's), still
            accepted with a ``DeprecationWarning``.

    >>> from robustgrad.transforms import clip_by_global_norm
    >>> t = apply_if_finite(clip_by_global_norm(1.0), max_nonfinite_steps=2)
    >>> s = t.init([tf.zeros(2)])
    >>> u, s = t.update([tf.constant([float("nan"), 1.0])], s)
    >>> u[0].numpy().tolist(), int(s.nonfinite_count), bool(s.last_finite)
    ([0.0, 0.0], 1, False)
    """
    inner = _as_transformation(inner, "inner")
    if max_consecutive_errors is not None:
        if max_nonfinite_steps is not None:
            raise TypeError("apply_if_finite: pass max_nonfinite_steps only "
                            "(max_consecutive_errors is its deprecated name)")
        warnings.warn("apply_if_finite(max_consecutive_errors=) is deprecated; use "
                      "max_nonfinite_steps=", DeprecationWarning, stacklevel=2)
        max_nonfinite_steps = max_consecutive_errors
    if max_nonfinite_steps is None:
        max_nonfinite_steps = 10
    limit = positive_int(max_nonfinite_steps, _LIMIT_NAME, minimum=0)

    def init(params):
        return ApplyIfFiniteState(
            nonfinite_count=tf.constant(0, tf.int32),
            last_finite=tf.constant(True),
            total_nonfinite=tf.constant(0, tf.int32),
            max_nonfinite_steps=tf.constant(limit, tf.int32),
            inner_state=inner.init(params),
        )

    def update(updates, state, params=None):
        _check_state(state, ApplyIfFiniteState, "apply_if_finite")
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
            nonfinite_count=(state.nonfinite_count + bad) * bad,
            last_finite=finite,
            total_nonfinite=state.total_nonfinite + bad,
            max_nonfinite_steps=tf.convert_to_tensor(state.max_nonfinite_steps),
            inner_state=new_inner,
        )

    return GradientTransformation(init, update)
