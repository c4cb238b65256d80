"""Function transforms over ``tf.GradientTape`` and control of what a tape records.

JAX-style ``grad``/``value_and_grad`` over Python callables taking and returning tensors or
``tf.nest`` structures, ``input_gradient`` for classifiers, and the tape-control helpers:
``stop_gradient`` over structures, ``unrecorded`` (pause recording), ``watched`` (what a tape
watches) and ``check_connected`` (name every unconnected source instead of returning ``None``).

Every function here works eagerly and inside ``tf.function``. ``input_gradient`` lives in
:mod:`robustgrad.input_gradients` and is re-exported here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad.checks import leaf_names, scalar_output
from robustgrad.input_gradients import input_gradient  # noqa: F401 - re-exported

__all__ = [
    "Tape",
    "WatchReport",
    "check_connected",
    "grad",
    "input_gradient",
    "stop_gradient",
    "unrecorded",
    "value_and_grad",
    "watched",
]


# --------------------------------------------------------------------------- helpers


def _is_variable(x) -> bool:
    return isinstance(x, tf.Variable) or (
        hasattr(x, "value") and isinstance(getattr(x, "value", None), tf.Variable)
    )


def _underlying(x):
    """A Keras 3 variable's ``tf.Variable`` (``tape.watch`` rejects the Keras wrapper)."""
    if not isinstance(x, tf.Variable) and isinstance(getattr(x, "value", None), tf.Variable):
        return x.value
    return x


def _name_of(x, fallback: str) -> str:
    if _is_variable(x):
        return str(getattr(x, "path", None) or getattr(x, "name", None) or fallback)
    return fallback


def _as_source(x, what: str):
    """Convert one leaf of a differentiation source to a float tensor or variable."""
    if _is_variable(x):
        v = _underlying(x)
        if not v.dtype.is_floating and not v.dtype.is_complex:
            raise TypeError(f"{what} must have a floating dtype, got {v.dtype.name}")
        return v
    t = tf.convert_to_tensor(x)
    if not t.dtype.is_floating and not t.dtype.is_complex:
        raise TypeError(
            f"{what} must have a floating dtype to be differentiated, got {t.dtype.name}; "
            "cast it with tf.cast(x, tf.float32)"
        )
    return t


def _normalise_argnums(argnums) -> tuple[tuple[int, ...], bool]:
    if isinstance(argnums, bool) or not isinstance(argnums, (int, tuple, list)):
        raise TypeError(f"argnums must be an int or a tuple of ints, got {argnums!r}")
    if isinstance(argnums, int):
        return (argnums,), False
    if not argnums or not all(isinstance(a, int) and not isinstance(a, bool) for a in argnums):
        raise TypeError(f"argnums must be an int or a non-empty tuple of ints, got {argnums!r}")
    if len(set(argnums)) != len(argnums):
        raise ValueError(f"argnums must not repeat an index, got {argnums!r}")
    return tuple(argnums), True


_SCALAR_HINT = "reduce it (e.g. tf.reduce_mean) or use vjp/jacobian for non-scalar outputs"


def _check_scalar(value, what: str = "fn"):
    """``fn``'s return value as a floating scalar tensor (:func:`robustgrad.checks.scalar_output`
    with the hint that fits a derivative transform)."""
    return scalar_output(value, what, hint=_SCALAR_HINT)


def check_connected(grads: Any, sources: Any, names: Sequence[str] | None = None, *,
                    what: str = "fn") -> Any:
    """Raise ``ValueError`` naming every source whose gradient is ``None``.

    Args:
      grads: a structure of gradients (as returned by ``tape.gradient``), possibly holding ``None``.
      sources: the matching structure of sources (tensors or variables).
      names: optional flat list of names, one per leaf of ``sources``; defaults to variable
        names/paths, or the leaf's position.
      what: the name of the differentiated quantity, used in the message.

    Returns:
      ``grads`` unchanged when every gradient exists.

    Example:
      >>> x, y = tf.constant(1.0), tf.constant(2.0)
      >>> with tf.GradientTape() as t:
      ...     t.watch([x, y]); z = 3.0 * x
      >>> check_connected(t.gradient(z, [x, y]), [x, y], names=["x", "y"])
      Traceback (most recent call last):
      ...
      ValueError: fn does not depend on y: ...
    """
    flat_g = tf.nest.flatten(grads, expand_composites=False) if grads is not None else [None]
    flat_s = tf.nest.flatten(sources)
    if names is None:
        names = [_name_of(s, f"source {i}") for i, s in enumerate(flat_s)]
    if len(flat_g) != len(flat_s):
        # `tape.gradient` keeps None leaves, so a mismatch means bad structures.
        raise ValueError(
            f"grads has {len(flat_g)} leaves but sources has {len(flat_s)}; they must match"
        )
    missing = [n for n, g in zip(names, flat_g) if g is None]
    if missing:
        raise ValueError(
            f"{what} does not depend on {', '.join(missing)}: the gradient would be None "
            "(unconnected). Check that the value is computed from it through differentiable ops "
            "(no .numpy(), tf.cast to an integer, argmax or stop_gradient on the path)."
        )
    return grads


def stop_gradient(structure: Any) -> Any:
    """``tf.stop_gradient`` over every tensor or variable of a ``tf.nest`` structure.

    Non-tensor leaves (Python numbers, strings, ``None``) are returned unchanged.

    Example:
      >>> targets = stop_gradient({"returns": tf.ones([3]), "adv": tf.zeros([3])})
    """

    def _stop(x):
        if tf.is_tensor(x) or _is_variable(x):
            return tf.stop_gradient(_underlying(x))
        return x

    return tf.nest.map_structure(_stop, structure)


@contextlib.contextmanager
def unrecorded(*tapes: tf.GradientTape) -> Iterator[None]:
    """Pause recording on every given tape (``tape.stop_recording()`` on each).

    Operations run inside the block are invisible to those tapes, so no gradient flows through
    them: the way to compute a target, a statistic or a log value inside a tape's scope.

    Example:
      >>> x = tf.constant(2.0)
      >>> with tf.GradientTape() as tape:
      ...     tape.watch(x)
      ...     with unrecorded(tape):
      ...         scale = x * x          # not recorded: treated as a constant
      ...     y = scale * x
      >>> float(tape.gradient(y, x))     # d(scale*x)/dx with scale fixed = 4
      4.0
    """
    for t in tapes:
        if not isinstance(t, tf.GradientTape):
            raise TypeError(f"unrecorded() takes tf.GradientTape objects, got {type(t).__name__}")
    with contextlib.ExitStack() as stack:
        for t in tapes:
            stack.enter_context(t.stop_recording())
        yield


class Tape(tf.GradientTape):
    """A ``tf.GradientTape`` that also remembers the tensors it was asked to watch.

    Plain tapes only report watched *variables*; with this one :func:`watched` reports the
    watched tensors as well. Behaves exactly like ``tf.GradientTape`` otherwise, and accepts
    Keras 3 variables in ``watch`` (it watches their underlying ``tf.Variable``).
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        super().__init__(persistent=persistent, watch_accessed_variables=watch_accessed_variables)
        self._watched_tensors: list = []

    def watch(self, tensor: Any) -> None:
        """Watch ``tensor`` (a tensor, variable or structure of them) and remember its tensors."""
        flat = [_underlying(t) for t in tf.nest.flatten(tensor)]
        for t in flat:
            if tf.is_tensor(t) and not isinstance(t, tf.Variable):
                self._watched_tensors.append(t)
        super().watch(flat)


class WatchReport(NamedTuple):
    """What a tape watches: variable names, the variables, and the watched tensors.

    ``tensors`` is ``None`` for a plain ``tf.GradientTape`` (which does not expose them); use
    :class:`Tape` to have them recorded.
    """

    variable_names: tuple
    variables: tuple
    tensors: tuple | None

    def __str__(self) -> str:
        lines = [f"{len(self.variables)} watched variable(s):"]
        for n, v in zip(self.variable_names, self.variables):
            lines.append(f"  {n}  shape={tuple(v.shape)} dtype={v.dtype.name}")
        if self.tensors is None:
            lines.append("watched tensors: not recorded (use robustgrad.Tape)")
        else:
            lines.append(f"{len(self.tensors)} watched tensor(s):")
            for t in self.tensors:
                lines.append(f"  shape={tuple(t.shape)} dtype={t.dtype.name}")
        return "\n".join(lines)


def watched(tape: tf.GradientTape) -> WatchReport:
    """Report what ``tape`` watches (variables, and tensors for a :class:`Tape`).

    Example:
      >>> v = tf.Variable(1.0, name="w")
      >>> with Tape() as t:
      ...     x = tf.constant(3.0); t.watch(x); y = v * x
      >>> rep = watched(t)
      >>> rep.variable_names, len(rep.tensors)
      (('w:0',), 1)
    """
    if not isinstance(tape, tf.GradientTape):
        raise TypeError(f"tape must be a tf.GradientTape, got {type(tape).__name__}")
    variables = tuple(tape.watched_variables())
    names = tuple(getattr(v, "name", f"variable {i}") for i, v in enumerate(variables))
    tensors = tuple(tape._watched_tensors) if isinstance(tape, Tape) else None
    return WatchReport(names, variables, tensors)


# --------------------------------------------------------------------------- grad transforms


def value_and_grad(
    fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
    allow_unconnected: bool = False,
) -> Callable:
    """Transform ``fn`` into a function returning its value and gradient (like ``jax.value_and_grad``).

    Args:
      fn: a callable returning a scalar floating tensor (or ``(scalar, aux)`` when ``has_aux``).
        Its positional arguments may be tensors, variables or ``tf.nest`` structures of them.
      argnums: which positional argument(s) to differentiate; an int, or a tuple of ints
        (then the gradient is a tuple, one structure per argument).
      has_aux: ``fn`` returns ``(value, aux)``; ``aux`` is passed through untouched.
      allow_unconnected: return zeros for sources ``fn`` does not depend on instead of raising.

    Returns:
      ``g(*args, **kwargs) -> (value, grads)`` or ``((value, aux), grads)``; ``grads`` has the
      structure of ``args[argnums]`` and each leaf's dtype and shape.

    Raises:
      ValueError: ``fn`` returns a non-scalar, or does not depend on a differentiated argument
        (the message names it).
      TypeError: a differentiated argument is not floating point.

    Example:
      >>> f = lambda w, x: tf.reduce_sum(w * x) ** 2
      >>> value, g = value_and_grad(f)(tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]))
      >>> float(value), g.numpy().tolist()          # 2 * 11 * x
      (121.0, [66.0, 88.0])
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    nums, as_tuple = _normalise_argnums(argnums)

    def wrapped(*args, **kwargs):
        for n in nums:
            if n >= len(args) or n < -len(args):
                raise ValueError(
                    f"argnums={argnums!r} is out of range for {len(args)} positional argument(s)"
                )
        call_args = list(args)
        names: list[str] = []
        sources = []
        for n in nums:
            struct = tf.nest.map_structure(
                lambda leaf, _n=n: _as_source(leaf, f"argument {_n}"), call_args[n]
            )
            call_args[n] = struct
            sources.append(struct)
            names.extend(leaf_names(struct, f"argument {n}"))
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(tf.nest.flatten(sources))
            out = fn(*call_args, **kwargs)
        if has_aux:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise ValueError("fn was declared has_aux=True, so it must return (value, aux)")
            value, aux = out
        else:
            value, aux = out, None
        value = _check_scalar(value)
        grads = tape.gradient(
            value, sources,
            unconnected_gradients=(
                tf.UnconnectedGradients.ZERO if allow_unconnected else tf.UnconnectedGradients.NONE
            ),
        )
        check_connected(grads, sources, names)
        grads = tuple(grads) if as_tuple else grads[0]
        return ((value, aux), grads) if has_aux else (value, grads)

    wrapped.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'fn')}"
    wrapped.__doc__ = f"Value and gradient of {getattr(fn, '__name__', 'fn')}."
    return wrapped


def grad(
    fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
    allow_unconnected: bool = False,
) -> Callable:
    """Transform scalar ``fn`` into a function returning its gradient (like ``jax.grad``).

    Same arguments as :func:`value_and_grad`; returns ``grads`` or ``(grads, aux)``.

    Example:
      >>> df = grad(lambda x: tf.reduce_sum(x ** 3))
      >>> df(tf.constant([1.0, 2.0])).numpy().tolist()
      [3.0, 12.0]
    """
    vg = value_and_grad(fn, argnums, has_aux, allow_unconnected)

    def wrapped(*args, **kwargs):
        out, g = vg(*args, **kwargs)
        return (g, out[1]) if has_aux else g

    wrapped.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return wrapped
