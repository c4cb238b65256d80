"""Loading a saved agent: :func:`load` (re-exported as ``agents.load``).

A directory written by :meth:`agents.Agent.save` holds one agent (``config.json``, ``agent.json``,
``weights/``), or an agent of several seeds (``seeds.json`` naming ``seed_<s>/``, each an ordinary
saved agent), which comes back whole. Moved out of ``agents/core/base.py`` (one concept per module).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agents.core.interface import AgentInterface
from agents.core.persistence import (
    SEEDS_FILE,
    _read_json,
    check_config_matches,
    check_saved_env,
    loaded_checkpoint_dir,
    read_metadata,
)

_TABLE: dict[str, type[AgentInterface]] = {}
ALGORITHM_TABLE: Mapping[str, type[AgentInterface]] = MappingProxyType(_TABLE)
"""``name -> agent class`` that :func:`load` reads (read-only), filled by the algorithms wing
above this module (:mod:`agents.algorithms.registry` calls :func:`register_algorithms` when it is imported,
which ``import agents`` does): the core loads an agent of any algorithm without importing one."""


def register_algorithms(*classes: type[AgentInterface]) -> None:
    """Enter agent classes in :data:`ALGORITHM_TABLE` under their ``algo`` (a name taken by
    another class is a ``ValueError``)."""
    for cls in classes:
        if _TABLE.get(cls.algo, cls) is not cls:
            raise ValueError(f"algo: {cls.algo!r} is already {_TABLE[cls.algo].__name__}")
        _TABLE[cls.algo] = cls


def _check_config_matches(cls, cfg: dict, directory: str,
                          algorithms: Mapping[str, type[AgentInterface]], env: Any) -> None:
    """Refuse a ``config.json`` of another algorithm, or naming a module as its env, unless
    ``env`` is given (``agents.core.persistence``)."""
    fields = {a: {f.name for f in dataclasses.fields(c.config_cls)} for a, c in algorithms.items()}
    check_config_matches(directory, cls.algo, cfg, fields)
    check_saved_env(cfg, directory, env)


def load(directory: str, env: Any = None, *, rollout_workers: int | None = None,
         ray_address: str | None = None, num_cpus: int | None = None, **overrides) -> Any:
    """Load an agent saved by :meth:`Agent.save` (or a checkpoint directory).

    ``env``: the env factory, required when the agent was trained on one. ``overrides``
    replace config fields (e.g. ``num_envs``, ``checkpoint_dir``) before the agent is built.
    A ``checkpoint_dir`` saved in ``config.json`` is relative to ``directory`` and must stay
    inside it (``ValueError`` otherwise, unless ``checkpoint_dir=`` is passed): a loaded file
    never chooses where the program writes.
    ``rollout_workers``, ``ray_address``, ``num_cpus``: as for the agent's constructor
    (resume a run on Ray workers).

    Returns the :class:`agents.Agent` of the saved algorithm (typed ``Any``: this module sits
    below the agent class, and sees agents through :class:`agents.core.interface.AgentInterface`).
    """
    algorithms = ALGORITHM_TABLE
    directory = os.fspath(directory)
    if os.path.exists(os.path.join(directory, SEEDS_FILE)):
        if rollout_workers is not None:
            raise ValueError("rollout_workers: Ray workers collect for one seed; "
                             f"{directory} holds an agent of several seeds")
        return _load_seeds(directory, env, algorithms, overrides)
    meta, cfg = read_metadata(directory)
    cls: Any = algorithms.get(meta.get("algo", ""))  # an Agent class (the core sees its interface)
    if cls is None:
        raise ValueError(f"directory: unknown algorithm {meta.get('algo')!r} in {directory}")
    _check_config_matches(cls, cfg, directory, algorithms, env)
    if "checkpoint_dir" not in overrides:  # the file never chooses a place outside itself
        cfg["checkpoint_dir"] = loaded_checkpoint_dir(cfg.get("checkpoint_dir"), directory)
    cfg.update(overrides)
    config = cls.config_cls.from_dict(cfg, env=env)
    agent = cls(config, rollout_workers=rollout_workers, ray_address=ray_address,
                num_cpus=num_cpus)
    agent.restore(directory)
    return agent


def _load_seeds(directory: str, env: Any, algorithms: Mapping[str, type[AgentInterface]],
                overrides: dict) -> AgentInterface:
    """An agent of several seeds saved by :meth:`Agent.save` (``seeds.json`` + ``seed_<s>/``)."""
    info = _read_json(os.path.join(directory, SEEDS_FILE))
    seeds = info.get("seeds")
    cls: Any = algorithms.get(info.get("algo", ""))  # an Agent class
    if cls is None or not isinstance(seeds, list) or len(seeds) < 2:
        raise ValueError(f"directory: {os.path.join(directory, SEEDS_FILE)} must name an "
                         f"algorithm and at least two seeds, got {json.dumps(info)[:200]}")
    ones = [load(os.path.join(directory, f"seed_{int(s)}"), env, **overrides) for s in seeds]
    try:
        # seeds.json is written by an agent with a seed axis: its config has num_seeds
        one_config: Any = ones[0].config  # an OnPolicyConfig or a DQNConfig (algorithms wing)
        config = dataclasses.replace(one_config, num_seeds=len(seeds))
        many = cls(config, seeds=[int(s) for s in seeds])
        for k, one in enumerate(ones):
            many.import_seed(k, one)
    finally:
        for one in ones:
            one.close()
    many.history = list(info.get("history", []))
    return many
