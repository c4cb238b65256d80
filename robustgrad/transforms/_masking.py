"""Restricting a transformation to some leaves: :func:`masked` (freezing, per-layer rules).

>>> import tensorflow as tf
>>> from robustgrad.transforms import clip_by_value
>>> t = masked(clip_by_value(1.0), {"body": False, "head": True}, passthrough=True)
>>> g = {"body": tf.constant([5.0]), "head": tf.constant([5.0])}
>>> u, _ = t.update(g, t.init(g)); {k: v.numpy().tolist() for k, v in u.items()}
{'body': [5.0], 'head': [1.0]}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import leaf_names
from robustgrad.transforms._base import (
    GradientTransformation,
    _as_tensor,
    _as_transformation,
    _assert_same_structure,
    _check_state,
    _flatten_checked,
)

__all__ = ["MaskedState", "masked"]


class MaskedState(NamedTuple):
    """State of :func:`masked`: the inner state over the masked-in leaves (a list)."""

    inner_state: Any


def masked(inner: GradientTransformation, mask: Any | Callable[[str], bool],
           passthrough: bool = False) -> GradientTransformation:
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

    >>> from robustgrad.transforms import clip_by_value
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
    cache: dict[str, Any] = {}

    def resolve(tree, where):
        if callable(mask):
            if tree is None:
                if "flat" not in cache:
                    raise ValueError("mask: a callable mask needs params; call init(params) "
                                     "first or pass params= to update")
                return cache["flat"]
            flat = []
            for name in leaf_names(tree, variable_names=True):
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
        _check_state(state, MaskedState, "masked")
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
