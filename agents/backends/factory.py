"""Where an agent's experience comes from, decided once from its config: :func:`make_training_env`
(the one place that reads ``backend``) and :func:`make_collector` (its collector).

The backends wing of :mod:`agents` (above the core, below the algorithms): the gymnasium vector
envs (:mod:`agents.envs`), the compiled environments (:mod:`agents.backends.graph_backend`), the seed
axis' environments (:mod:`agents.backends.seed_axis`) and Ray workers (:mod:`agents.backends.distributed`).
The
core's :class:`agents.Agent` does not import them: an algorithm gives it this factory (its
``make_collector`` class attribute) and its Ray workers (``rollout_workers_cls``).

>>> from agents.config import PPOConfig
>>> make_collector(PPOConfig(env="CartPole-v1", num_envs=2, backend="graph"), [0]).fused
True
>>> make_training_env(PPOConfig(env="CartPole-v1", num_envs=2), [0, 1]).num_envs
4
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.backends.graph_backend import GraphBackendEnv, episode_capacity
from agents.backends.seed_axis import SeedGraphEnv, make_seed_env
from agents.core.collectors import (
    Collector,
    GraphCollector,
    GraphVectorEnv,
    GymnasiumCollector,
    VectorEnv,
)
from agents.core.config import AgentConfig
from agents.envs import make_vec_env

__all__ = ["is_graph_backend", "make_collector", "make_training_env"]


def is_graph_backend(config: AgentConfig) -> bool:
    """Whether ``config`` trains on environments in TensorFlow ops (``backend="graph"``)."""
    return getattr(config, "backend", "gymnasium") == "graph"


def make_training_env(config: AgentConfig, seeds: Sequence[int]) -> VectorEnv:
    """The training vector env of an agent's ``config`` for ``seeds`` (one seed, or ``S`` on the
    seed axis: ``S * num_envs`` copies, seed ``s``'s block seeded as that seed alone).

    ``backend="graph"``: :class:`GraphBackendEnv` (one seed) or :class:`SeedGraphEnv`, both
    :class:`GraphVectorEnv`; otherwise :func:`agents.envs.make_vec_env` (one seed) or the seed
    axis' gymnasium envs (:func:`agents.backends.seed_axis.make_seed_env`). Every result is a
    :class:`VectorEnv`.
    """
    seeds = list(seeds)
    if is_graph_backend(config):
        capacity = episode_capacity(config, len(seeds))
        env: VectorEnv = (
            GraphBackendEnv(config.env, config.num_envs, seed=seeds[0], episode_capacity=capacity)
            if len(seeds) == 1 else
            SeedGraphEnv(config.env, config.num_envs, seeds, episode_capacity=capacity))
    elif len(seeds) == 1:
        env = make_vec_env(config.env, config.num_envs, seed=seeds[0],
                           async_envs=config.async_envs)
    else:
        env = make_seed_env(config, seeds)
    return env


def make_collector(config: AgentConfig, seeds: Sequence[int]) -> Collector:
    """The local collector of an agent's ``config``: :class:`GraphCollector` for
    ``backend="graph"``, :class:`GymnasiumCollector` otherwise; with several ``seeds`` (the seed
    axis) over ``len(seeds) * num_envs`` environments."""
    env = make_training_env(config, seeds)
    if isinstance(env, GraphVectorEnv) and is_graph_backend(config):
        return GraphCollector(env)
    return GymnasiumCollector(env)
