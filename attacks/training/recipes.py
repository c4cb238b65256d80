"""Adversarial-training recipes as data: the published settings per (method, dataset, arch).

``recipes.json`` beside this module holds, like the agents' presets, one entry per published
setting (its name, the method, dataset and architecture it applies to, the settings and their
source), and the per-method defaults used when none applies. :func:`resolve_settings` merges
them in this order: the method's defaults, then the matching recipe, then what the user set
explicitly; every value is recorded with where it came from.

The defaults of ``fast`` follow Wong et al.'s fast-AT MNIST code (Adam, a cyclic learning rate
peaking at 5e-3): with the earlier Adam 1e-3 cosine default, fast-AT on 28x28 MNIST lost 11
points of APGD-CE accuracy to that recipe (see ``docs/benchmarks/training.md``).

>>> [r["name"] for r in list_recipes()][:2]
['wong2020-fast-mnist', 'wong2020-fast-cifar10']
>>> find_recipe("fast", "mnist", "cnn")["name"]
'wong2020-fast-mnist'
>>> find_recipe("fast", "digits", "cnn") is None
True
>>> s = resolve_settings("fast", "mnist", "cnn", {"epochs": 3})
>>> s.values["eps"], s.values["epochs"], s.values["lr"], s.recipe, s.origin["epochs"]
(0.3, 3, 0.005, 'wong2020-fast-mnist', 'user')
>>> resolve_settings("fast", "mnist", "cnn", {}, recipe="none").values["eps"]
0.1
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

__all__ = ["SETTING_KEYS", "ResolvedSettings", "find_recipe", "list_recipes", "method_defaults",
           "resolve_settings"]

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes.json")

#: every key a recipe or a default may set: fields of
#: :class:`attacks.training.config.ClassifierConfig` (train-classifier's flags, underscored; a
#: ``recipes.json`` that spells them as flags, ``"--step-size"``, still loads)
SETTING_KEYS: tuple[str, ...] = (
    "eps", "steps", "step_size", "beta", "epochs", "batch_size", "optimizer", "momentum",
    "weight_decay", "schedule", "warmup", "boundaries", "lr", "label_smoothing", "early_stop",
    "augment", "awp_gamma", "ema", "warmup_epochs", "warmup_delay_epochs", "kappa_final",
    "beta_final", "sigma", "noise_draws")

#: values of the keys a recipe may leave out, when neither the method's defaults nor the user
#: set them
_BASE = {"steps": None, "step_size": None, "beta": 6.0, "momentum": 0.9, "weight_decay": 0.0,
         "warmup": 0.4, "boundaries": [0.5, 0.75], "label_smoothing": 0.0, "early_stop": False,
         "augment": False, "awp_gamma": 0.01, "ema": 0.0, "warmup_epochs": 0.0,
         "warmup_delay_epochs": 0.0, "kappa_final": 0.5, "beta_final": 0.0, "sigma": 0.25,
         "noise_draws": 1}

_TABLE: dict | None = None


def _field_keys(settings: dict) -> dict:
    """``settings`` keyed by :class:`attacks.training.config.ClassifierConfig` fields: a key
    spelt as the flag (``"--step-size"``, ``"step-size"``) is read as its field (``step_size``).

    >>> _field_keys({"--step-size": 0.01, "batch-size": 50, "lr": 1e-4})
    {'step_size': 0.01, 'batch_size': 50, 'lr': 0.0001}
    """
    return {str(k).lstrip("-").replace("-", "_"): v for k, v in settings.items()}


def _table() -> dict:
    global _TABLE
    if _TABLE is None:
        with open(_PATH) as f:
            table = json.load(f)
        table["defaults"] = {m: _field_keys(v) for m, v in table["defaults"].items()}
        for r in table["recipes"]:
            r["settings"] = _field_keys(r["settings"])
        for entry in [*table["defaults"].values(), *(r["settings"] for r in table["recipes"])]:
            unknown = sorted(set(entry) - set(SETTING_KEYS))
            if unknown:
                raise ValueError(f"{_PATH}: unknown setting(s) {unknown}; known: {SETTING_KEYS}")
        _TABLE = table
    return _TABLE


def list_recipes() -> list[dict]:
    """Every recipe: dicts with ``name, method, dataset, arch, source, settings`` (copies)."""
    return [json.loads(json.dumps(r)) for r in _table()["recipes"]]


def method_defaults(method: str) -> dict:
    """The settings of ``method`` when no recipe applies (a copy); ``ValueError`` for an
    unknown method."""
    defaults = _table()["defaults"]
    if method not in defaults:
        raise ValueError(f"method must be one of {tuple(defaults)}, got {method!r}")
    return {**_BASE, **defaults[method]}


def find_recipe(method: str, dataset: str | None, arch: str | None = None) -> dict | None:
    """The recipe for ``(method, dataset, arch)`` (an exact architecture before ``'*'``), or
    None. A dataset given as a file path has no recipe."""
    if not dataset:
        return None
    hits = [r for r in list_recipes() if r["method"] == method and r["dataset"] == dataset
            and r["arch"] in (arch, "*")]
    hits.sort(key=lambda r: r["arch"] == "*")
    return hits[0] if hits else None


@dataclasses.dataclass
class ResolvedSettings:
    """The settings a run uses: ``values`` (every key of :data:`SETTING_KEYS`), ``origin`` (per
    key: ``"default"``, ``"recipe"`` or ``"user"``), the ``recipe`` name (None when no recipe
    applied) and its ``source``."""

    values: dict
    origin: dict
    recipe: str | None
    source: str | None

    def as_record(self) -> dict:
        """A JSON-ready record for the run's ``config.json``."""
        return {"values": self.values, "origin": self.origin, "recipe": self.recipe,
                "source": self.source}


def resolve_settings(method: str, dataset: str | None, arch: str | None,
                     user: dict[str, Any], recipe: str = "auto") -> ResolvedSettings:
    """Merge the method's defaults, the recipe and the ``user``'s explicit settings (keys of
    :data:`SETTING_KEYS` whose value is not None), in that order.

    ``recipe`` is ``"auto"`` (the recipe of ``(method, dataset, arch)`` when one exists),
    ``"none"`` (the method's defaults only) or a recipe's name (``ValueError`` when it does not
    exist or is for another method)."""
    unknown = sorted(set(user) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; known: {', '.join(SETTING_KEYS)}")
    values = method_defaults(method)
    origin = dict.fromkeys(values, "default")
    if recipe == "auto":
        entry = find_recipe(method, dataset, arch)
    elif recipe == "none":
        entry = None
    else:
        names = {r["name"]: r for r in list_recipes()}
        if recipe not in names:
            raise ValueError(f"recipe must be auto, none or one of {', '.join(names)}; "
                             f"got {recipe!r}")
        entry = names[recipe]
        if entry["method"] != method:
            raise ValueError(f"recipe {recipe!r} is for method {entry['method']!r}, not "
                             f"{method!r}")
    if entry is not None:
        values.update(entry["settings"])
        origin.update(dict.fromkeys(entry["settings"], "recipe"))
    for key, value in user.items():
        if value is not None:
            values[key], origin[key] = value, "user"
    return ResolvedSettings(values, origin, None if entry is None else entry["name"],
                            None if entry is None else entry["source"])
