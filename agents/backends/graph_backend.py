"""The ``backend="graph"`` training environment and the factory of an agent's training env.

:class:`GraphBackendEnv` is :class:`agents.graph_envs.GraphVecEnv` (one class: env state in
variables, same-step autoreset, finished episodes in a ring buffer written inside the graph)
under the name and constructor an agent uses: the agents' compiled rollouts step it with
:meth:`~agents.graph_envs.GraphVecEnv.step_state` (the state in the loop carry, pure
TensorFlow ops: no ``tf.numpy_function``, no Python per step), so the rollout, the targets and
the update of an iteration are one compiled call (with XLA too). Episodes reach the learner's
logs, ``EvalCallback`` and ``history`` through ``drain_episodes`` once per iteration, as with
the gymnasium backend.

>>> env = GraphBackendEnv("CartPole-v1", num_envs=2, seed=0)
>>> env.reset().shape
(2, 4)
>>> step = tf.function(env.step_graph)
>>> for _ in range(30):  # always pushing left ends a CartPole episode in about 10 steps
...     obs, reward, terminated, truncated, final_obs = step(tf.constant([0, 0]))
>>> episodes = env.drain_episodes()
>>> len(episodes) >= 2 and all(ret == length and 8 <= length <= 30 for ret, length in episodes)
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf  # noqa: F401 - used by the doctest above

from agents.graph_envs import GRAPH_ENV_IDS, GraphVecEnv
from robustgrad.checks import choice

if TYPE_CHECKING:
    from agents.core.config import AgentConfig


class GraphBackendEnv(GraphVecEnv):
    """:class:`GraphVecEnv` of ``num_envs`` copies of ``env_id`` for an agent's training
    (float32 physics, NumPy outputs); ``episode_capacity`` as there."""

    def __init__(self, env_id: str, num_envs: int, seed: int | None = 0,
                 episode_capacity: int | None = None):
        choice(env_id, "env", GRAPH_ENV_IDS)
        super().__init__(env_id, num_envs, seed, episode_capacity=episode_capacity)


def episode_capacity(config: AgentConfig, num_seeds: int = 1) -> int | None:
    """The ring buffer of finished episodes an agent's graph env needs between two drains:
    every episode a compiled call can finish (each env at most one per step), ``iterations_per_call
    * n_steps * num_envs * num_seeds``, when that exceeds the env's default (``None``: the default).

    >>> from agents.config import PPOConfig
    >>> cfg = PPOConfig(backend="graph", num_envs=4, n_steps=128, iterations_per_call=8)
    >>> episode_capacity(cfg), episode_capacity(PPOConfig(backend="graph"))
    (4096, None)
    """
    total_envs = config.num_envs * num_seeds
    need = getattr(config, "iterations_per_call", 1) * getattr(config, "n_steps", 1) * total_envs
    return need if need > max(1024, 4 * total_envs) else None


__all__ = ["GraphBackendEnv", "episode_capacity"]
