"""The training-method registry: method names to :class:`~attacks.training.TrainingMethod`
objects.

:class:`~attacks.training.AdversarialTrainer` looks its ``method`` up here
(:func:`get_method`). The built-in methods (:mod:`attacks.training.methods`,
:mod:`~attacks.training.certified`, :mod:`~attacks.training.noise`,
:mod:`~attacks.training.smoothadv`) are registered when this module is imported, in the order
the documentation and the CLI list them (:data:`METHODS`); the method modules do not import
this one, so there is no import cycle. A method of your own -- a ``TrainingMethod`` subclass
written against the public :class:`~attacks.training.StepContext` -- joins with
:func:`register_method` and leaves with :func:`unregister_method`; the built-ins cannot be
replaced or removed. A trainer saved with a custom method loads once that method is registered
again.

>>> METHODS
('madry', 'trades', 'fast', 'free', 'mart', 'awp', 'ibp', 'crown-ibp', 'clean', 'gaussian', 'smoothadv')
>>> DEFAULT_STEPS["madry"], get_method("fast").default_step_size(0.1, 1), CERTIFIED_METHODS
(10, 0.125, ('ibp', 'crown-ibp'))
>>> class Noisy(TrainingMethod):            # cross-entropy on x + eps * uniform noise
...     name = "uniform-noise"
...     def craft(self, ctx, x, y, *, eps, step_size, steps, seed):
...         return x + eps * tf.random.stateless_uniform(tf.shape(x), seed, -1.0, 1.0)
>>> register_method(Noisy()).name, get_method("uniform-noise").adversarial
('uniform-noise', True)
>>> unregister_method("uniform-noise")
>>> "uniform-noise" in registered_methods()
False
"""

from __future__ import annotations

import tensorflow as tf  # noqa: F401  (the doctest's custom method uses it)

from robustgrad.checks import choice

from .certified import CrownIbp, Ibp
from .methods import Awp, Clean, Fast, Free, Madry, Mart, Trades, TrainingMethod
from .noise import Gaussian
from .smoothadv import SmoothAdv

__all__ = ["CERTIFIED_METHODS", "DEFAULT_STEPS", "METHODS", "get_method", "register_method",
           "registered_methods", "unregister_method"]

_BUILTIN: tuple[TrainingMethod, ...] = (Madry(), Trades(), Fast(), Free(), Mart(), Awp(), Ibp(),
                                        CrownIbp(), Clean(), Gaussian(), SmoothAdv())
_REGISTRY: dict[str, TrainingMethod] = {m.name: m for m in _BUILTIN}

#: the built-in method names, in the order the documentation and the CLI list them
METHODS: tuple[str, ...] = tuple(_REGISTRY)

#: the built-in certified-training methods (their loss bounds the model; the model must be
#: supported by :mod:`robustgrad.bounds`)
CERTIFIED_METHODS: tuple[str, ...] = tuple(n for n, m in _REGISTRY.items() if m.certified)

#: default number of crafting steps per built-in method (PGD steps for madry/trades, replays
#: for free)
DEFAULT_STEPS: dict[str, int] = {name: m.default_steps for name, m in _REGISTRY.items()}


def registered_methods() -> tuple[str, ...]:
    """The names :func:`get_method` accepts: the built-ins, then the custom ones in
    registration order."""
    return tuple(_REGISTRY)


def get_method(name: str) -> TrainingMethod:
    """The method object registered as ``name``; ``ConfigError`` (a ``ValueError``) naming
    the choices otherwise."""
    return _REGISTRY[choice(name, "method", registered_methods())]


def register_method(method: TrainingMethod, *, replace: bool = False) -> TrainingMethod:
    """Make ``method`` (an instance of a :class:`~attacks.training.TrainingMethod` subclass
    with a non-empty ``name``) available to ``AdversarialTrainer(method=name)``; returns it.

    ``TypeError`` for anything else; ``ValueError`` when the name is taken (by a built-in
    always; by a custom method unless ``replace=True``)."""
    if not isinstance(method, TrainingMethod):
        raise TypeError(f"method must be a TrainingMethod instance; got {type(method).__name__}")
    name = method.name
    if not isinstance(name, str) or not name:
        raise ValueError(f"method.name must be a non-empty string; got {name!r}")
    if name in METHODS:
        raise ValueError(f"method name {name!r} is a built-in method's; choose another name")
    if name in _REGISTRY and not replace:
        raise ValueError(f"method {name!r} is already registered; pass replace=True to "
                         "replace it")
    _REGISTRY[name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove the custom method registered as ``name`` (``ValueError`` for a built-in or an
    unknown name)."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is built in and cannot be unregistered")
    if name not in _REGISTRY:
        raise ValueError(f"no custom method {name!r} is registered; registered: "
                         f"{registered_methods()[len(METHODS):]}")
    del _REGISTRY[name]
