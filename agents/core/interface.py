"""What the parts around an agent see of it: the :class:`AgentInterface` protocol.

The learn driver's callbacks (:mod:`agents.core.callbacks`), the robustness plug-in
(:mod:`agents.core.plugin`) and the loader (:mod:`agents.core._loading`) serve an agent without
being part of it: they read its config, seeds and history, draw from its random stream, ask for
its declared policy surface, evaluate, save, restore and hand weights over. This module declares
that much, and only that much, of :class:`agents.Agent`, so those modules depend on this leaf and
not on the agent class that imports them (the import graph of :mod:`agents` has no cycle, type
imports counted). :class:`agents.Agent` satisfies it; so would a third-party agent.

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, preset=None)
>>> isinstance(agent, AgentInterface), agent.draw_seed().shape.as_list()
(True, [2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf

from agents.core.policy import PolicySurface

__all__ = ["AgentInterface"]


@runtime_checkable
class AgentInterface(Protocol):
    """An agent as its callbacks, its robustness plug-in and the loader see it (module doc).

    Class side (what the loader's table reads): ``algo`` (the algorithm's name in saved files)
    and ``config_cls`` (its config dataclass)."""

    algo: str
    config_cls: Any
    config: Any
    """The agent's :class:`agents.core.config.AgentConfig` (typed ``Any`` here: the config module
    validates ``robust`` against the plug-in table, which is below it)."""
    seeds: list[int]
    num_seeds: int
    value_based: bool
    num_timesteps: tf.Variable
    history: list[dict]
    seed_histories: list[list[dict]]
    training_failed: bool
    rollout_workers: Any

    def draw_seed(self, rng: tf.random.Generator | None = None) -> tf.Tensor:
        """A fresh stateless seed ``[2]`` int32 from ``rng`` (default: the training stream)."""
        ...

    def policy_surface(self) -> PolicySurface:
        """The policy as attacks and certification see it (one seed)."""
        ...

    def seed_axis_surface(self) -> PolicySurface:
        """The policies of all seeds on the seed axis (``num_seeds > 1``)."""
        ...

    def evaluate(self, n_episodes: int = 10, deterministic: bool = True, seed: int | None = None,
                 num_envs: int | None = None) -> dict:
        """Mean return of full episodes on a fresh env."""
        ...

    def save(self, directory: str) -> str:
        """Write the agent to ``directory``."""
        ...

    def restore(self, directory: str) -> None:
        """Read the weights and history saved in ``directory`` into this agent."""
        ...

    def get_weights(self) -> list[np.ndarray]:
        """The variables that decide how the agent acts, as arrays."""
        ...

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """The inverse of :meth:`get_weights`."""
        ...

    def import_seed(self, index: int, one: Any) -> None:
        """Make the one-seed agent ``one`` slice ``index`` of this agent's seed axis."""
        ...

    def close(self) -> None:
        """Close the agent's environments and workers."""
        ...
