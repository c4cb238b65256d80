"""Where an agent's experience comes from, decided once from its config: :func:`make_collector`.

The backends wing of :mod:`agents` (above the core, below the algorithms): the gymnasium vector
envs (:mod:`agents.envs`), the compiled environments (:mod:`agents.backends.graph_backend`), the seed
axis' environments (:mod:`agents.backends.seed_axis`) and Ray workers (:mod:`agents.backends.distributed`).
The
core's :class:`agents.Agent` does not import them: an algorithm gives it this factory (its
``make_collector`` class attribute) and its Ray workers (``rollout_workers_cls``).

>>> from agents.core.config import PPOConfig
>>> make_collector(PPOConfig(env="CartPole-v1", num_envs=2, backend="graph"), [0]).fused
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.backends.graph_backend import episode_capacity, make_training_env
from agents.backends.seed_axis import SeedGraphEnv, make_seed_env
from agents.core.collectors import Collector, GraphCollector, GymnasiumCollector

__all__ = ["make_collector"]


def make_collector(config: Any, seeds: Sequence[int]) -> Collector:
    """The local collector of an agent's ``config``: :class:`GraphCollector` for
    ``backend="graph"``, :class:`GymnasiumCollector` otherwise; with several ``seeds`` (the seed
    axis) over ``len(seeds) * num_envs`` environments."""
    graph = getattr(config, "backend", "gymnasium") == "graph"
    if len(seeds) > 1 and graph:
        env = SeedGraphEnv(config.env, config.num_envs, seeds,
                           episode_capacity=episode_capacity(config, len(seeds)))
    elif len(seeds) > 1:
        env = make_seed_env(config, seeds)
    else:
        env = make_training_env(config)
    return GraphCollector(env) if graph else GymnasiumCollector(env)
