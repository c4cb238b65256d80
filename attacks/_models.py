"""Calling models: the ``training`` keyword when a model takes it, weak references so that no
cache keeps a model alive, one output of a multi-output model, and the checks of a model's
output and of classification data against the model, before any work.

>>> import tensorflow as tf
>>> def logits(x):  # a plain callable without a ``training`` keyword
...     return x[:, :2] * 2.0
>>> call_model(logits, tf.ones((1, 3)), training=False).numpy().tolist()
[[2.0, 2.0]]
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from robustgrad.checks import ArgumentTypeError

from . import _validate

__all__ = ["SelectedOutput", "call_model", "check_classification_data", "check_model_output",
           "declared_input_shape", "select_output", "weak_caller"]


_ACCEPTS_TRAINING: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _accepts_training(model) -> bool:
    try:
        return _ACCEPTS_TRAINING[model]
    except (KeyError, TypeError):
        pass
    ok = True
    is_layer = isinstance(model, keras.layers.Layer)  # takes training= in __call__
    if not is_layer:
        try:
            params = inspect.signature(model).parameters.values()
            ok = any(p.name == "training" or p.kind == p.VAR_KEYWORD for p in params)
        except (TypeError, ValueError):
            ok = True
    try:
        _ACCEPTS_TRAINING[model] = ok
    except TypeError:
        pass
    return ok


def weak_caller(fn: Callable, training: Any = None) -> Callable:
    """``f(x)`` calling ``fn`` (``call_model(fn, x, training)`` unless ``training`` is None)
    through a weak reference, so a cached compiled loop does not keep the model alive."""
    accepts = _accepts_training(fn) if training is not None else False
    ref: Callable[[], Any]
    try:
        ref = weakref.WeakMethod(fn) if inspect.ismethod(fn) else weakref.ref(fn)
    except TypeError:
        def strong():
            return fn
        ref = strong

    def f(x):
        m = ref()
        if m is None:  # pragma: no cover - the cache entry dies with the model
            raise RuntimeError("the model of this compiled attack was garbage-collected")
        if training is None:
            return m(x)
        return m(x, training=training) if accepts else m(x)

    return f


class SelectedOutput:
    """``model(x)[key]``: one tensor of logits out of a model whose output is a dict (``key`` a
    dict key) or a tuple/list (``key`` an index), for the attacks, which need one logits tensor.

    Keep the object and pass it to every call (compiled attacks are cached per model object).

    >>> import tensorflow as tf
    >>> two_heads = lambda x: {"logits": 2.0 * x, "features": x}
    >>> logits = select_output(two_heads, "logits")
    >>> logits(tf.ones([1, 3])).numpy().tolist()
    [[2.0, 2.0, 2.0]]
    >>> select_output(two_heads, "nope")(tf.ones([1, 3]))
    Traceback (most recent call last):
    ...
    KeyError: "output_key 'nope' is not one of the model's outputs ['features', 'logits']"
    """

    def __init__(self, model: Any, key: Any) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise TypeError(f"output_key must be a dict key (str) or a tuple index (int), "
                            f"got {key!r}")
        self.model = model
        self.key = key

    def __call__(self, x: Any, training: Any = False) -> tf.Tensor:
        out = call_model(self.model, x, training)
        if isinstance(out, dict):
            if self.key not in out:
                raise KeyError(f"output_key {self.key!r} is not one of the model's outputs "
                               f"{sorted(map(str, out))}")
        elif isinstance(out, (tuple, list)):
            if not isinstance(self.key, int) or not -len(out) <= self.key < len(out):
                raise KeyError(f"output_key {self.key!r} is not an index of the model's "
                               f"{len(out)} outputs")
        else:
            raise TypeError(f"output_key {self.key!r} given but the model returns one "
                            f"{type(out).__name__}; attack the model itself")
        return out[self.key]

    def __repr__(self) -> str:
        return f"select_output({self.model!r}, {self.key!r})"


def select_output(model: Any, output_key: Any) -> SelectedOutput:
    """The model ``x -> model(x)[output_key]`` to attack a dict/tuple-output model (see
    :class:`SelectedOutput`)."""
    return SelectedOutput(model, output_key)


def check_model_output(out: Any, who: str = "model") -> Any:
    """Refuse a model output that is not one tensor of logits, in one short line: a dict or
    tuple output names ``select_output``, anything else its type (never a tensor dump)."""
    if isinstance(out, dict):
        keys = ", ".join(repr(k) for k in list(out)[:8])
        raise TypeError(f"{who} returns a dict (keys {keys}), not one tensor of logits; attack "
                        f"attacks.select_output({who}, KEY)")
    if isinstance(out, (tuple, list)):
        raise TypeError(f"{who} returns a {type(out).__name__} of {len(out)} outputs, not one "
                        f"tensor of logits; attack attacks.select_output({who}, INDEX)")
    if not isinstance(out, (tf.Tensor, tf.Variable, np.ndarray)) and not hasattr(out, "dtype"):
        raise TypeError(f"{who} must return a floating tensor of logits, got "
                        f"{type(out).__name__}")
    return out


def declared_input_shape(model: Any) -> tuple | None:
    """The per-example input shape a Keras model declares (``None`` dims unknown), or None."""
    try:
        inputs = getattr(model, "inputs", None)
    except (AttributeError, ValueError):  # a subclassed model that was never called
        return None
    if not inputs or len(inputs) != 1:
        return None
    shape = getattr(inputs[0], "shape", None)
    return None if shape is None else tuple(shape)[1:]


def check_classification_data(model: Any, x: Any, y: Any, *, x_name: str = "x",
                              y_name: str = "y", model_name: str | None = None,
                              training: Any = False, finite: bool = True) -> int:
    """Check ``(x, y)`` against ``model`` before any work; returns the number of classes.

    ``x`` floating ``[N, ...]`` whose example shape matches the model's declared input, ``y``
    int labels ``[N]`` in ``[0, C)`` where ``C`` is the width of the model's logits (one
    forward pass on the first example). Every error is one line with the numbers.
    ``finite=False`` lets NaN/inf inputs through (a trainer's non-finite guard handles them).
    ``model_name`` (e.g. ``"--model"``) starts the errors that are the model's, not the data's
    (a 1-logit output, logits of another rank).

    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    >>> check_classification_data(model, np.zeros((2, 4), "float32"), [0, 2])
    3
    >>> check_classification_data(model, np.zeros((2, 5), "float32"), [0, 2])
    Traceback (most recent call last):
    ...
    ValueError: x: examples of shape (5,) but the model takes inputs of shape (4,)
    >>> check_classification_data(model, np.zeros((2, 4), "float32"), [0, 3])
    Traceback (most recent call last):
    ...
    ValueError: y has labels outside [0, 3) (min 0, max 3); the model has 3 outputs
    """
    if finite:
        xt = _validate.check_x(x, x_name)
    else:
        xt = tf.convert_to_tensor(x)
        if not xt.dtype.is_floating or xt.shape.rank is None or xt.shape.rank < 2:
            raise ArgumentTypeError(f"{x_name} must be a floating-point array [N, ...], got "
                                    f"dtype {xt.dtype.name} and shape {xt.shape}")
    expected = declared_input_shape(model)
    got = tuple(xt.shape[1:])
    if expected is not None and (len(expected) != len(got) or any(
            e is not None and e != g for e, g in zip(expected, got))):
        shown = tuple(e if e is not None else "?" for e in expected)
        fix = ""
        if None not in expected and None not in got and math.prod(expected) == math.prod(got):
            fix = (f"; both hold {math.prod(got)} values per example: reshape the data to "
                   f"[N, {', '.join(str(e) for e in expected)}] (x.reshape(len(x), "
                   f"{', '.join(str(e) for e in expected)}))")
        raise ValueError(f"{x_name}: examples of shape {got} but the model takes inputs of "
                         f"shape {shown}".replace("'?'", "?") + fix)
    n = xt.shape[0]
    try:
        _validate.check_labels(y, n, None, name=y_name)  # dtype, rank, count before the forward pass
    except TypeError as exc:  # a label error is a ValueError too (naming the argument)
        raise ArgumentTypeError(str(exc)) from None
    if not n:
        return 0
    out = check_model_output(call_model(model, xt[:1], training))
    out = tf.convert_to_tensor(out)
    who = f"{model_name}: " if model_name else ""
    if out.shape.rank != 2:
        raise ValueError(f"{who}model must return logits of shape [N, C], got shape {out.shape} "
                         f"for one example")
    num_classes = int(out.shape[-1])
    if num_classes < 2:  # the cross-entropy of one logit is 0: nothing to attack, certify, learn
        raise ValueError(f"{who}model returns {num_classes} logit per example; a classifier needs "
                         f"one logit per class (>= 2; for a binary task return 2 logits, "
                         f"e.g. [0, z] for a sigmoid's z)")
    _validate.check_labels(y, n, num_classes, name=y_name)
    return num_classes


def call_model(model: Any, x: Any, training: Any = False) -> tf.Tensor:
    """``model(x, training=training)``, or ``model(x)`` for a callable without ``training``."""
    if _accepts_training(model):
        return model(x, training=training)
    return model(x)
