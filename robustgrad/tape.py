"""Function transforms over ``tf.GradientTape`` and control of what a tape records.

JAX-style ``grad``/``value_and_grad`` over Python callables taking and returning tensors or
``tf.nest`` structures, ``input_gradient`` for classifiers, and the tape-control helpers:
``stop_gradient`` over structures, ``unrecorded`` (pause recording), ``watched`` (what a tape
watches) and ``check_connected`` (name every unconnected source instead of returning ``None``).

Every function here works eagerly and inside ``tf.function``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from robustgrad._checks import leaf_names, looks_like_probabilities, scalar_output

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
    """``fn``'s return value as a floating scalar tensor (:func:`robustgrad._checks.scalar_output`
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

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True):
        super().__init__(persistent=persistent, watch_accessed_variables=watch_accessed_variables)
        self._watched_tensors: list = []

    def watch(self, tensor):
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
        args = list(args)
        names, sources = [], []
        for n in nums:
            struct = tf.nest.map_structure(
                lambda leaf, _n=n: _as_source(leaf, f"argument {_n}"), args[n]
            )
            args[n] = struct
            sources.append(struct)
            names.extend(leaf_names(struct, f"argument {n}"))
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(tf.nest.flatten(sources))
            out = fn(*args, **kwargs)
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


# --------------------------------------------------------------------------- input gradient


def _warn_if_probabilities(logits) -> None:
    """The attacks' softmax warning, for the same model (eager values only)."""
    if isinstance(logits, tf.Tensor) and hasattr(logits, "numpy") and \
            looks_like_probabilities(logits.numpy()):
        warnings.warn(
            "model outputs look like probabilities (non-negative rows summing to 1). Attacks and "
            "objectives expect logits: gradients through a saturated softmax vanish and make a "
            "model look robust (gradient masking). Remove the final softmax.",
            UserWarning, stacklevel=3)


def _check_targets(y, logits) -> None:
    """Labels ``[B]`` in ``[0, C)`` or targets ``[B, C]`` matching the logits, as a ValueError
    naming ``y`` with the numbers (never a TensorFlow op error)."""
    yt = tf.convert_to_tensor(y)
    b, c = logits.shape[0], logits.shape[-1] if logits.shape.rank else None
    if yt.dtype.is_integer:
        if yt.shape.rank != 1:
            raise ValueError(f"y must be int labels of shape [B] or targets [B, C], got integer "
                             f"shape {yt.shape}")
        if b is not None and yt.shape[0] is not None and yt.shape[0] != b:
            raise ValueError(f"y has {yt.shape[0]} labels but x has {b} examples")
        if c is not None and hasattr(yt, "numpy") and yt.shape[0]:
            lo, hi = int(tf.reduce_min(yt)), int(tf.reduce_max(yt))
            if lo < 0 or hi >= c:
                raise ValueError(f"y has labels outside [0, {c}) (min {lo}, max {hi}); the "
                                 f"model has {c} outputs")
    elif yt.dtype.is_floating:
        if yt.shape.rank != 2 or (yt.shape.is_fully_defined() and logits.shape.is_fully_defined()
                                  and yt.shape != logits.shape):
            raise ValueError(f"y: float targets must have the logits' shape {logits.shape}, got "
                             f"{yt.shape}")
    else:
        raise ValueError(f"y must be int labels [B] or float targets [B, C], got dtype "
                         f"{yt.dtype.name}")


def _per_example_loss(loss, logits, y):
    logits = tf.cast(logits, tf.float32)
    if callable(loss):
        out = tf.convert_to_tensor(loss(logits, y))
        if out.shape.rank not in (0, 1):
            raise ValueError(
                f"loss callable must return per-example losses of shape [batch] or a scalar, "
                f"got shape {out.shape}"
            )
        return tf.cast(out, tf.float32)
    y = tf.convert_to_tensor(y)
    if loss == "crossentropy":
        if y.dtype.is_integer:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(y, tf.int64), logits=logits)
        return tf.nn.softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.float32), logits=logits)
    if loss == "margin":  # Carlini-Wagner margin: max_{j != y} z_j - z_y
        if not y.dtype.is_integer:
            y = tf.argmax(y, axis=-1)
        onehot = tf.one_hot(y, tf.shape(logits)[-1], dtype=tf.float32)
        z_y = tf.reduce_sum(onehot * logits, axis=-1)
        other = tf.reduce_max(logits - 1e9 * onehot, axis=-1)
        return other - z_y
    raise ValueError(
        f"loss must be 'crossentropy', 'margin' or a callable(logits, y), got {loss!r}"
    )


def input_gradient(
    model: Callable, x: Any, y: Any, loss: str | Callable = "crossentropy",
    training: bool = False,
) -> tf.Tensor:
    """Gradient of a classification loss with respect to the model's input.

    The per-example losses are summed before differentiating, so row ``i`` of the result is
    the gradient of example ``i``'s own loss (examples do not interact in inference mode).
    The loss is computed in float32 and the gradient returned in float32 even when the model
    runs under a ``mixed_float16`` policy, so attacks never step along rounded float16 signs.

    Args:
      model: any callable ``model(x, training=False) -> logits`` of shape ``[B, C]`` (a Keras
        model is one). Logits, not probabilities.
      x: float tensor ``[B, ...]``; not modified.
      y: int labels ``[B]`` or one-hot/probability targets ``[B, C]``.
      loss: ``"crossentropy"`` (default), ``"margin"`` (Carlini-Wagner ``max_{j≠y} z_j − z_y``)
        or a callable ``loss(logits, y) -> [B]``.
      training: the mode the model runs in (inference by default).

    Returns:
      float32 tensor with the shape of ``x``.

    Raises:
      TypeError: ``x`` is not floating point.
      ValueError: the model's output does not depend on ``x``, or ``loss`` is unknown.

    Example:
      >>> import keras
      >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
      >>> g = input_gradient(model, tf.ones([2, 4]), tf.constant([0, 2]))
      >>> g.shape, g.dtype.name
      (TensorShape([2, 4]), 'float32')
    """
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    if not (callable(loss) or loss in ("crossentropy", "margin")):
        raise ValueError(
            f"loss must be 'crossentropy', 'margin' or a callable(logits, y), got {loss!r}"
        )
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"x must be a floating tensor, got dtype {x.dtype.name}")
    x32 = tf.cast(x, tf.float32)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(x32)
        logits = model(x32, training=training)
        if not isinstance(logits, (tf.Tensor, tf.Variable)):
            raise TypeError(f"model must return one tensor of logits [B, C], got "
                            f"{type(logits).__name__} (pick one output of a dict/tuple model)")
        if not callable(loss):
            _check_targets(y, logits)
        _warn_if_probabilities(logits)
        value = tf.reduce_sum(_per_example_loss(loss, logits, y))
    g = tape.gradient(value, x32)
    if g is None:
        raise ValueError(
            "the model's output does not depend on x: its input gradient would be None. "
            "Check that the model uses its input through differentiable ops."
        )
    return tf.cast(g, tf.float32)

