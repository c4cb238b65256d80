"""A training run's settings across a resume: what a saved run resolved, and what a resumed run
uses (the library side of ``train-classifier --resume``).

A run records in its ``config.json`` the flags it was given (``None`` for a setting left to the
method's defaults or the recipe) and, under ``"resolved"``, the values it resolved
(:meth:`attacks.training.recipes.ResolvedSettings.as_record`). :class:`SavedRun` reads that
record once; a resumed run keeps its settings: every setting not given again takes the saved
value (:meth:`SavedRun.inherited`), the comparison with the new command line is between values,
not between "given" and "not given" (:meth:`SavedRun.compared`), and
:func:`resolve_run_settings` resolves the settings as the first run did (method defaults <
recipe < explicit settings), the saved values winning over anything not given explicitly. Runs
written before recipes were recorded resolve with the defaults of that version (:data:`LEGACY`).

>>> saved = SavedRun.of({"eps": None, "epochs": 3, "resolved": {"values": {"eps": 0.1}}})
>>> saved.compared(["eps", "epochs"])
{'eps': 0.1, 'epochs': 3, 'resolved': {'values': {'eps': 0.1}}}
>>> saved.inherited({"eps": None, "epochs": 5})
{'eps': 0.1, 'epochs': 5}
>>> resolve_run_settings("madry", "digits", "cnn", {"eps": None}, saved=saved).values["eps"]
0.1
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .recipes import ResolvedSettings, resolve_settings

__all__ = ["LEGACY", "SavedRun", "resolve_run_settings"]

#: what runs written before recipes used for the settings they did not record
LEGACY = {"optimizer": "adam", "schedule": "cosine", "recipe": "none"}


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A saved run's ``config`` (its ``config.json``), the ``values`` it resolved (``{}`` when it
    recorded none) and whether it is ``legacy`` (written before runs recorded their resolved
    settings)."""

    config: dict
    values: dict
    legacy: bool

    @classmethod
    def of(cls, config: dict) -> SavedRun:
        """Read the ``"resolved"`` record of a saved ``config`` (once)."""
        resolved = config.get("resolved")
        values = resolved.get("values", {}) if isinstance(resolved, dict) else {}
        return cls(dict(config), dict(values), not isinstance(resolved, dict))

    def compared(self, keys: Any) -> dict:
        """The saved configuration with each of ``keys`` the run left unset (``None``) replaced
        by the value it resolved: what a resumed command line is compared with."""
        view = dict(self.config)
        for key in keys:
            if view.get(key) is None and self.values.get(key) is not None:
                view[key] = self.values[key]
        return view

    def inherited(self, given: dict) -> dict:
        """``given`` (setting -> value or ``None``; ``recipe`` may be among them) with each
        ``None`` replaced by the saved run's value (the one it resolved, for a setting it left
        unset); keys with nothing to inherit are left out when ``None``."""
        saved, out = self.compared(given), {}
        for key, value in given.items():
            if value is None and saved.get(key) is not None:
                value = saved[key]
            if value is not None:
                out[key] = value
        return out


def resolve_run_settings(method: str, dataset: str | None, arch: str | None,
                         user: dict[str, Any], *, recipe: str | None = "auto",
                         saved: SavedRun | None = None,
                         certified: bool = False) -> ResolvedSettings:
    """The settings of a run: :func:`attacks.training.recipes.resolve_settings` over the
    method's defaults, the ``recipe`` (``"auto"`` when ``None``) and ``user`` (explicit
    settings; ``None`` values are not given). A resumed run (``saved``) keeps the values it
    resolved for every setting not in ``user``; a legacy one resolves with :data:`LEGACY`.
    ``certified`` (IBP, CROWN-IBP) ramps eps over the first half of the run unless a recipe or
    the user set ``warmup_epochs``. Raises ``ValueError`` for an unknown recipe."""
    user = dict(user)
    recipe = recipe or "auto"
    if saved is not None and saved.legacy:
        recipe = LEGACY["recipe"]
        for key in ("optimizer", "schedule"):
            if user.get(key) is None:
                user[key] = LEGACY[key]
    settings = resolve_settings(method, dataset, arch, user, recipe=recipe)
    for key, value in (saved.values if saved is not None else {}).items():
        if settings.origin.get(key) != "user" and key in settings.values:
            settings.values[key] = value
    if certified and settings.origin.get("warmup_epochs") == "default":
        settings.values["warmup_epochs"] = settings.values["epochs"] / 2
    return settings
