"""Which built-in training method reads which option: one table for the library and the
command line.

Most of :class:`~attacks.training.AdversarialTrainer`'s options configure some methods only
(``awp_gamma`` the weight perturbation of ``"awp"``, ``sigma`` the smoothing noise of
``"smoothadv"``, ...); any other method would train and ignore them. The table
(``method_options.json`` beside this module, :data:`CONFIG_OPTIONS`) maps each such option, by
its :class:`~attacks.training.ClassifierConfig` field name (``train-classifier``'s flag,
underscored), to the methods that read it:

* ``steps``: every method that crafts by iterating, not ``"fast"`` (one FGSM step);
* ``step_size``, ``craft_training``: the methods that craft an attack per batch, but ``"free"``
  crafts inside its own training-mode update (so not ``craft_training``);
* ``adv_ratio``: the methods whose loss mixes in the clean loss;
* ``no_random_start`` (the trainer's ``random_start=False``): ``"free"`` always starts at a
  random point and ``"trades"`` near ``x``;
* ``no_guard``: ``"fast"``'s catastrophic-overfitting guard (a run setting, not the trainer's).

:func:`check_applicable` refuses a non-default value of an option the method does not read
(``ConfigError`` naming the option, the method and the methods it configures), before any work;
the trainer (:data:`TRAINER_OPTIONS`, its keyword names) and ``ClassifierConfig`` call it, and
``train-classifier`` reads the same JSON file before TensorFlow loads (its ``METHOD_FLAGS``).
A method registered with :func:`~attacks.training.register_method` is not in the table: it may
read any option. This module imports no TensorFlow.

>>> CONFIG_OPTIONS["awp_gamma"], TRAINER_OPTIONS["random_start"]
(('awp',), ('madry', 'fast', 'mart', 'awp'))
>>> try:
...     check_applicable("madry", {"awp_gamma": 0.05}, {"awp_gamma": (0.01,)}, TRAINER_OPTIONS)
... except ValueError as e:
...     print(e)
awp_gamma=0.05: configures method awp only, and method 'madry' ignores it (leave it at its default 0.01)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from robustgrad.errors import ConfigError

__all__ = ["CONFIG_OPTIONS", "PATH", "TRAINER_OPTIONS", "check_applicable"]

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "method_options.json")
"""The table's file (the command line reads it without importing this package)."""

with open(PATH, encoding="utf-8") as _f:
    _TABLE = json.load(_f)["options"]

CONFIG_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {name: tuple(methods) for name, methods in _TABLE.items()})
"""``ClassifierConfig`` field -> the built-in methods that read it, in the order the command
line checks its flags."""

_TRAINER_NAMES = {"no_random_start": "random_start"}  # the trainer's keyword, when it differs
TRAINER_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {_TRAINER_NAMES.get(name, name): methods for name, methods in CONFIG_OPTIONS.items()
     if name != "no_guard"})  # the guard is a callback of the run, not a trainer option
"""``AdversarialTrainer`` keyword -> the built-in methods that read it."""


def check_applicable(method: str, values: Mapping[str, Any],
                     defaults: Mapping[str, Iterable[Any]],
                     table: Mapping[str, tuple[str, ...]] = CONFIG_OPTIONS) -> None:
    """Refuse the first option of ``table`` in ``values`` that ``method`` does not read and
    whose value is not one of its ``defaults`` (option -> the values that leave it unset):
    ``ConfigError`` naming the option, ``method`` and the methods it configures. ``method``
    is a built-in one (a registered method may read every option: do not call this for it)."""
    for name, uses in table.items():
        if name not in values or method in uses:
            continue
        value, accepted = values[name], tuple(defaults.get(name, (None,)))
        if any(value is a or (type(value) is not bool and value == a) for a in accepted):
            continue
        leave = "unset" if accepted[0] is None else f"at its default {accepted[0]!r}"
        raise ConfigError(f"{name}={value!r}: configures method {'|'.join(uses)} only, and "
                          f"method {method!r} ignores it (leave it {leave})")
