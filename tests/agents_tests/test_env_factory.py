"""One env factory (agents.backends.factory.make_training_env) and one declared env interface
(agents.core.collectors.VectorEnv / GraphVectorEnv) for every backend and seed count."""

import numpy as np
import pytest

from agents.backends.factory import make_collector, make_training_env
from agents.backends.graph_backend import GraphBackendEnv
from agents.backends.seed_axis import SeedGraphEnv, SeedVecEnv
from agents.config import PPOConfig
from agents.core.collectors import GraphCollector, GraphVectorEnv, GymnasiumCollector, VectorEnv
from agents.envs import VecEnv


@pytest.mark.parametrize("backend,seeds,cls", [
    ("gymnasium", [3], VecEnv), ("gymnasium", [3, 4], SeedVecEnv),
    ("graph", [3], GraphBackendEnv), ("graph", [3, 4], SeedGraphEnv)])
def test_one_factory_builds_every_training_env_behind_one_interface(backend, seeds, cls):
    cfg = PPOConfig(env="CartPole-v1", num_envs=2, backend=backend, seed=seeds[0])
    env = make_training_env(cfg, seeds)
    try:
        assert type(env) is cls
        assert isinstance(env, VectorEnv)
        assert isinstance(env, GraphVectorEnv) == (backend == "graph")
        assert env.num_envs == 2 * len(seeds)
        obs = np.asarray(env.reset())
        assert obs.shape == (2 * len(seeds), 4)
        out = env.step(np.zeros(env.num_envs, np.int64))
        assert len(out) == 5 and np.asarray(out[0]).shape == obs.shape
    finally:
        env.close()
    collector = make_collector(cfg, seeds)
    assert type(collector) is (GraphCollector if backend == "graph" else GymnasiumCollector)
    collector.close()


@pytest.mark.parametrize("backend", ["gymnasium", "graph"])
def test_each_seeds_block_starts_as_that_seed_alone(backend):
    cfg = PPOConfig(env="CartPole-v1", num_envs=2, backend=backend, seed=5)
    many = make_training_env(cfg, [5, 6])
    alone = [make_training_env(PPOConfig(env="CartPole-v1", num_envs=2, backend=backend, seed=s),
                               [s]) for s in (5, 6)]
    np.testing.assert_array_equal(np.asarray(many.reset()),
                                  np.concatenate([np.asarray(e.reset()) for e in alone]))
    for e in [many, *alone]:
        e.close()


def test_a_non_env_is_not_a_vector_env():
    assert not isinstance(object(), VectorEnv)
