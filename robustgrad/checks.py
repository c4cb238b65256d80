"""One family of argument checks for the whole project (core, attacks, agents, CLI), public so that
code built on robustgrad validates its arguments with the same messages.

Every check names the argument, says what was received and what is accepted, and runs before any
work. Messages read ``"{name} must be {what is accepted}, got {received!r}"``.

A wrong value raises :class:`robustgrad.errors.ConfigError` (a ``ValueError``: the user's mistake,
which the command line prints as one line); a wrong *type* raises :class:`ArgumentTypeError`,
which is both a ``TypeError`` and a ``ConfigError``: callers that catch either keep working, and a
user sees one clear message.

>>> positive_int(3, "steps")
3
>>> positive_int(0, "steps")
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: steps must be an int >= 1, got 0
>>> number(0.5, "gamma", minimum=0, maximum=1)
0.5
>>> number(1.5, "gamma", minimum=0, maximum=1, max_inclusive=False)
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: gamma must be a number in [0, 1), got 1.5
>>> norm_name("L_inf"), norm_name(2)
('linf', 'l2')
>>> choice("ppo", "algo", ("ppo", "dqn"))
'ppo'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any, Literal, overload

import numpy as np

from robustgrad.errors import ConfigError

__all__ = [
    "ArgumentTypeError",
    "MAX_AWP_GAMMA",
    "MAX_LEARNING_RATE",
    "MAX_LOSS_WEIGHT",
    "MAX_WEIGHT_DECAY",
    "NORMS",
    "choice",
    "finite_rows",
    "leaf_names",
    "looks_like_probabilities",
    "nonnegative",
    "norm_name",
    "number",
    "positive_int",
    "probability",
    "scalar_output",
]

MAX_LEARNING_RATE = 10.0
"""The largest learning rate a run accepts (``train-classifier --lr``, ``train-agent --lr``,
``ClassifierConfig.lr``, ``AgentConfig.learning_rate``): 10,000x Adam's usual 1e-3 and 100x the
largest SGD rate of a published recipe; beyond it the first steps overflow to NaN."""

MAX_LOSS_WEIGHT = 1e3
"""The largest weight of TRADES' and MART's KL term (``beta``; ``train-classifier --beta``):
published settings are 1-6 against a cross-entropy of order 1, so 1,000, where the KL term
already swamps the loss, refuses only typos (as ``agents``' ``MAX_ROBUST_KAPPA``)."""

MAX_AWP_GAMMA = 1.0
"""The largest AWP weight perturbation (``awp_gamma``, relative to each layer's weights;
``train-classifier --awp-gamma``): published 0.005-0.01; at 1 the perturbation is as large as
the weights themselves."""

MAX_WEIGHT_DECAY = 1.0
"""The largest coupled weight decay (``weight_decay``, added to the gradient;
``train-classifier --weight-decay``): published recipes use 1e-4 to 5e-4; at 1 the decay term is
the weights themselves."""


class ArgumentTypeError(TypeError, ConfigError):
    """An argument of the wrong type. Catchable as ``TypeError`` and as ``ValueError`` (a
    :class:`robustgrad.errors.ConfigError`: the user's mistake).

    >>> try:
    ...     positive_int("3", "steps")
    ... except ValueError as e:  # also a TypeError
    ...     print(type(e).__name__, isinstance(e, TypeError), e)
    ArgumentTypeError True steps must be an int >= 1, got '3'
    """

    __init__ = Exception.__init__  # as ConfigError's: AutoGraph re-raises it as itself


NORMS = ("linf", "l2", "l1")

_NORM_ALIASES = {
    "linf": "linf", "l_inf": "linf", "inf": "linf", "li": "linf", "l∞": "linf",
    "l2": "l2", "2": "l2", "l_2": "l2", "l1": "l1", "1": "l1", "l_1": "l1",
}


def _is_tensor(value) -> bool:
    # duck-typed so that this module imports no TensorFlow (the CLI validates before TF loads)
    return type(value).__module__.startswith(("tensorflow", "keras", "tf_keras"))


def _interval(minimum, maximum, min_inclusive, max_inclusive) -> str:
    if minimum is not None and maximum is not None:
        return (f"in {'[' if min_inclusive else '('}{_fmt(minimum)}, "
                f"{_fmt(maximum)}{']' if max_inclusive else ')'}")
    if minimum is not None:
        return f"{'>=' if min_inclusive else '>'} {_fmt(minimum)}"
    if maximum is not None:
        return f"{'<=' if max_inclusive else '<'} {_fmt(maximum)}"
    return ""


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer() and not math.isinf(v):
        return str(int(v))
    return str(v)


@overload
def positive_int(value: Any, name: str, *, minimum: int | None = 1, maximum: int | None = None,
                 allow_none: Literal[False] = False) -> int: ...
@overload
def positive_int(value: Any, name: str, *, minimum: int | None = 1, maximum: int | None = None,
                 allow_none: bool) -> int | None: ...
def positive_int(value: Any, name: str, *, minimum: int | None = 1, maximum: int | None = None,
                 allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` in ``[minimum, maximum]``.

    Accepts Python and NumPy integers and integral floats such as ``1e5``; refuses ``bool``, other
    floats and strings with :class:`ArgumentTypeError`, and out-of-range values with ``ConfigError``.

    >>> positive_int(1e5, "steps")
    100000
    >>> positive_int(True, "steps")
    Traceback (most recent call last):
    ...
    robustgrad.checks.ArgumentTypeError: steps must be an int >= 1, got True
    """
    if value is None and allow_none:
        return None
    accepted = f"an int {_interval(minimum, maximum, True, True)}".rstrip()
    if isinstance(value, bool) or _is_tensor(value):
        raise ArgumentTypeError(f"{name} must be {accepted}, got {value!r}")
    if isinstance(value, (numbers.Integral, np.integer)):
        v = int(value)
    elif isinstance(value, (numbers.Real, np.floating)) and math.isfinite(value) \
            and float(value).is_integer():
        v = int(float(value))
    else:
        raise ArgumentTypeError(f"{name} must be {accepted}, got {value!r}")
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ConfigError(f"{name} must be {accepted}, got {v}")
    return v


def number(value: Any, name: str, *, minimum: float | None = None, maximum: float | None = None,
           min_inclusive: bool = True, max_inclusive: bool = True, allow_inf: bool = False,
           allow_none: bool = False, allow_tensor: bool = False) -> Any:
    """``value`` as a ``float`` within the given bounds; NaN always refused.

    A scalar NumPy array or eager tensor is read as its number. With ``allow_tensor=True`` a
    symbolic (graph) tensor is returned unchecked, for values the caller's graph checks itself (a
    schedule). Infinity is refused unless ``allow_inf`` (and the bounds allow it).

    >>> number(2, "eps", minimum=0)
    2.0
    >>> number(float("nan"), "eps", minimum=0)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: eps must be a number >= 0, got nan
    """
    if value is None and allow_none:
        return None
    accepted = f"a number {_interval(minimum, maximum, min_inclusive, max_inclusive)}".rstrip()
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be {accepted}, got {value!r}")
    if _is_tensor(value) or isinstance(value, np.ndarray):
        if _is_tensor(value) and not hasattr(value, "numpy"):
            if allow_tensor:
                return value
            raise ArgumentTypeError(f"{name} must be {accepted}, got a symbolic tensor")
        a = np.asarray(value)
        if a.ndim != 0:
            raise ConfigError(f"{name} must be a scalar ({accepted}), got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
            raise ArgumentTypeError(f"{name} must be {accepted}, got dtype {a.dtype}")
        value = a.item()
    if not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ArgumentTypeError(f"{name} must be {accepted}, got {value!r}")
    v = float(value)
    bad = math.isnan(v) or (math.isinf(v) and not allow_inf)
    if minimum is not None:
        bad = bad or v < minimum or (v == minimum and not min_inclusive)
    if maximum is not None:
        bad = bad or v > maximum or (v == maximum and not max_inclusive)
    if bad:
        raise ConfigError(f"{name} must be {accepted}, got {value!r}")
    return v


def nonnegative(value: Any, name: str, **kwargs: Any) -> Any:
    """:func:`number` with ``minimum=0``: a finite number >= 0 (``eps``, a coefficient).

    >>> nonnegative(0, "eps")
    0.0
    >>> nonnegative(-0.1, "eps")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: eps must be a number >= 0, got -0.1
    """
    return number(value, name, minimum=0, **kwargs)


def probability(value: Any, name: str, *, open_low: bool = False, open_high: bool = False) -> float:
    """A number in ``[0, 1]``; ``open_low`` / ``open_high`` exclude an end: ``(0, 1]``, ...

    >>> probability(0.99, "gamma", open_low=True)
    0.99
    """
    return number(value, name, minimum=0, maximum=1, min_inclusive=not open_low,
                  max_inclusive=not open_high)


def choice(value: Any, name: str, choices: Iterable) -> Any:
    """``value`` if it is one of ``choices``; ``ConfigError`` listing them otherwise.

    >>> choice("l2", "norm", ("linf", "l2"))
    'l2'
    >>> choice("l3", "norm", ("linf", "l2"))
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: norm must be one of ('linf', 'l2'), got 'l3'
    """
    choices = tuple(choices)
    if isinstance(value, str) or not isinstance(value, (list, dict, set)):
        try:
            if value in choices:
                return value
        except TypeError:
            pass
    raise ConfigError(f"{name} must be one of {choices}, got {value!r}")


def norm_name(norm: Any, name: str = "norm") -> str:
    """``"linf"``, ``"l2"`` or ``"l1"`` for any accepted spelling; ``ConfigError`` otherwise.

    Accepts the strings ``linf``/``l_inf``/``inf``/``l∞``, ``l2``/``2``, ``l1``/``1`` (any case) and
    the numbers ``np.inf``, ``2`` and ``1``.

    >>> norm_name("L_inf"), norm_name(float("inf")), norm_name("2")
    ('linf', 'linf', 'l2')
    >>> norm_name("l3", "attack_norm")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: attack_norm must be one of 'linf' (np.inf), 'l2' (2) or 'l1' (1); got 'l3'
    """
    if isinstance(norm, str):
        key = norm.strip().lower()
        if key in _NORM_ALIASES:
            return _NORM_ALIASES[key]
    elif isinstance(norm, (numbers.Real, np.integer, np.floating)) and not isinstance(norm, bool):
        f = float(norm)
        if math.isinf(f) and f > 0:
            return "linf"
        if f == 2:
            return "l2"
        if f == 1:
            return "l1"
    raise ConfigError(f"{name} must be one of 'linf' (np.inf), 'l2' (2) or 'l1' (1); got {norm!r}")


def finite_rows(value: Any, name: str, what: str = "row") -> None:
    """Raise :class:`robustgrad.errors.ConfigError` naming ``name`` and the first rows (along the
    first axis; a value of rank 0 or 1 is one row) of ``value`` that hold NaN or inf.

    >>> finite_rows(np.ones((2, 3)), "obs")
    >>> finite_rows([[0.0], [np.nan]], "obs", "observation")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: obs: must be finite; observation(s) [1] of 2 hold NaN or inf
    """
    x = np.asarray(value)
    rows = np.isfinite(x).reshape(len(x) if x.ndim > 1 else 1, -1).all(axis=1)
    if not rows.all():
        bad = np.flatnonzero(~rows)
        raise ConfigError(f"{name}: must be finite; {what}(s) {bad[:5].tolist()}"
                          f"{' ...' if len(bad) > 5 else ''} of {len(rows)} hold NaN or inf")


def looks_like_probabilities(outputs: Any) -> bool:
    """Whether a ``[B, K]`` output (K >= 2) has non-negative rows summing to one (a softmax).

    Attacks and objectives expect logits; gradients through a saturated softmax vanish (gradient
    masking), so callers warn or refuse when this is true.

    >>> looks_like_probabilities([[0.2, 0.8], [0.5, 0.5]]), looks_like_probabilities([[2.0, -1.0]])
    (True, False)
    """
    out = np.asarray(outputs, dtype=np.float64)
    if out.ndim != 2 or out.shape[0] == 0 or out.shape[1] < 2:
        return False
    return bool(np.all(out >= -1e-6) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3))


def scalar_output(value: Any, what: str = "fn", *,
                  hint: str = "reduce it (e.g. tf.reduce_mean) before returning") -> Any:
    """What a user's function returned, as a rank-0 floating tensor; ``what`` names the function.

    Used wherever a loss or an objective must be a scalar (``grad``, ``hvp``, meta-learning and
    hypergradient losses). A non-numeric value raises :class:`ArgumentTypeError`, a non-scalar a
    ``ConfigError`` giving its shape and ``hint``, an integer dtype an :class:`ArgumentTypeError`.
    TensorFlow is imported on the first call only (this module stays importable without it).

    >>> float(scalar_output(2.5, "loss"))
    2.5
    >>> scalar_output([1.0, 2.0], "loss", hint="reduce it")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: loss must return a scalar (shape []), got shape (2,); reduce it
    """
    import tensorflow as tf

    if not tf.is_tensor(value) and not isinstance(
            value, (numbers.Real, np.ndarray, np.number, list, tuple)):
        raise ArgumentTypeError(f"{what} must return a scalar tensor, got {type(value).__name__}")
    value = tf.convert_to_tensor(value)
    if value.shape.rank is None or value.shape.rank != 0:
        raise ConfigError(f"{what} must return a scalar (shape []), got shape {value.shape}; {hint}")
    if not value.dtype.is_floating:
        raise ArgumentTypeError(
            f"{what} must return a floating scalar, got dtype {value.dtype.name}")
    return value


def leaf_names(structure: Any, prefix: str | None = None, *,
               variable_names: bool = False) -> list[str]:
    """A display name for every leaf of a ``tf.nest`` structure, in ``tf.nest.flatten`` order.

    A leaf is named by its nest path (``"a/0"``; dict keys sorted, namedtuple fields by name):
    with ``prefix`` as ``"prefix[a/0]"`` (a bare leaf: ``prefix`` itself), without it as the path
    (a bare leaf: ``"0"``). With ``variable_names=True`` a variable leaf is named instead by its
    Keras 3 ``path`` (``"sequential/dense/kernel"``) or its ``tf.Variable`` name without ``":0"``.
    TensorFlow is imported on the first call only.

    >>> leaf_names({"w": [1.0, 2.0], "b": 3.0})
    ['b', 'w/0', 'w/1']
    >>> leaf_names({"w": 1.0}, "argument 0"), leaf_names(1.0, "argument 1")
    (['argument 0[w]'], ['argument 1'])
    """
    import tensorflow as tf
    from tensorflow.python.util import nest

    names = []
    for path, leaf in nest.flatten_with_joined_string_paths(structure):
        name = None
        if variable_names:
            name = getattr(leaf, "path", None)
            if not isinstance(name, str) or not name:
                name = leaf.name.removesuffix(":0") if isinstance(leaf, tf.Variable) else None
        if not name:
            if prefix is None:
                name = path or "0"
            else:
                name = f"{prefix}[{path}]" if path else prefix
        names.append(name)
    return names
