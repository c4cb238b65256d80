"""Tuned presets of the agents: the table ``agents/presets.json`` and the names in it.

``agents/presets.json`` maps ``"<algo>-<env id>"`` to an entry whose ``config`` holds config
fields. This module reads the table and names entries (:func:`load_presets`,
:func:`preset_for`, :func:`get_preset`, :data:`AUTO`) and builds a config of a given class from a
preset and overrides (:func:`make_config`); the config module does not import it.

>>> preset_for("dqn", "CartPole-v1")
'dqn-CartPole-v1'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from agents.core.config import AgentConfig
from agents.core.plugin import RobustMethod
from robustgrad.errors import ConfigError

_log = logging.getLogger("agents")

PRESETS_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "presets.json")  # agents/presets.json
"""The presets shipped with the package: ``{"<algo>-<env id>": {"config": {...}, ...}}``."""

_presets_cache: dict | None = None


def load_presets() -> dict:
    """Every shipped preset by name, as read from :data:`PRESETS_FILE` (a fresh copy).

    An entry holds ``config`` (config fields), and optionally ``learn`` (training options
    the CLI applies: ``eval_every``, ``keep_best``), ``steps``, ``target``, ``zoo`` and
    ``source``.

    >>> presets = load_presets()
    >>> presets["ppo-CartPole-v1"]["config"]["n_steps"]
    32
    """
    global _presets_cache
    if _presets_cache is None:
        with open(PRESETS_FILE, encoding="utf-8") as f:
            data = json.load(f)
        _presets_cache = {k: v for k, v in data.items() if not k.startswith("_")}
    return json.loads(json.dumps(_presets_cache))


def preset_for(algo: str, env: Any) -> str | None:
    """The name of the shipped preset for ``algo`` on the gymnasium id ``env`` (``None`` when
    there is none, or when ``env`` is a factory).

    >>> preset_for("ppo", "CartPole-v1"), preset_for("reinforce", "CartPole-v1")
    ('ppo-CartPole-v1', None)
    """
    if not isinstance(env, str):
        return None
    name = f"{algo}-{env}"
    return name if name in load_presets() else None


def get_preset(name: str, algo: str | None = None) -> dict:
    """The preset entry called ``name``; ``ValueError`` naming ``preset`` if there is no such
    preset or it belongs to another algorithm than ``algo``.

    >>> get_preset("dqn-MountainCar-v0")["config"]["train_freq"]
    16
    >>> get_preset("ppo-Nowhere-v0")
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: preset must be one of 'a2c-CartPole-v1', 'dqn-CartPole-v1', \
'dqn-MountainCar-v0', \
'ppo-Acrobot-v1', 'ppo-CartPole-v1', 'ppo-MountainCarContinuous-v0', 'ppo-Pendulum-v1' or None, \
got 'ppo-Nowhere-v0'
    """
    presets = load_presets()
    if not isinstance(name, str) or name not in presets:
        names = ", ".join(repr(n) for n in sorted(presets))
        raise ConfigError(f"preset must be one of {names} or None, got {name!r}")
    if algo is not None and not name.startswith(f"{algo}-"):
        raise ConfigError(f"preset must be a preset of {algo} (e.g. {algo}-<env id>), got "
                         f"{name!r}")
    return presets[name]


AUTO = "auto"
"""``preset=AUTO`` (the default of the agents): the shipped preset for (algorithm, env) when
there is one, plain defaults otherwise."""


def make_config(config_cls: type[AgentConfig], algo: str, preset: str | None = AUTO,
                **overrides: Any) -> AgentConfig:
    """A ``config_cls`` built from a preset and ``overrides`` (which win over the preset).

    ``preset``: :data:`AUTO` (the preset for ``algo`` on ``overrides["env"]``, or on the
    default env, when one exists; :mod:`agents.core.presets`), a preset name, or
    ``None``/``"none"`` (dataclass defaults only). The config records the preset name in
    ``preset``. Unknown fields raise ``ValueError`` naming them.

    >>> from agents.config import PPOConfig
    >>> make_config(PPOConfig, "ppo", env="CartPole-v1", seed=3).preset
    'ppo-CartPole-v1'
    >>> make_config(PPOConfig, "ppo", preset=None, env="CartPole-v1").n_steps
    128
    >>> make_config(PPOConfig, "ppo", env="CartPole-v1", n_steps=64).n_steps
    64
    """
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a field of {config_cls.__name__}; fields: "
                         f"{', '.join(sorted(fields))}")
    if "preset" in overrides:
        raise ConfigError("preset is chosen with the preset= argument, not as an override")
    env = overrides.get("env", config_cls.env)
    if preset == AUTO:
        name = preset_for(algo, env)
    elif preset is None or (isinstance(preset, str) and preset.lower() == "none"):
        name = None
    else:
        name = preset
    values = {}
    if name is not None:
        values.update(get_preset(name, algo)["config"])
        bad = sorted(set(values) - fields)
        if bad:  # a broken presets.json
            raise ConfigError(f"preset {name!r}: {bad[0]} is not a field of "
                             f"{config_cls.__name__}")
        _log.info("%s: using preset %r (%s)", config_cls.__name__, name,
                  ", ".join(f"{k}={v!r}" for k, v in values.items()))
    if isinstance(overrides.get("robust"), RobustMethod):  # the typed config wins over the preset
        for field in overrides["robust"].fields():
            values.pop(field, None)
    values.update(overrides)
    return config_cls(**values, preset=name)
