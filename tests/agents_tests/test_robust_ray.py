"""robust="adv" with Ray rollout workers: the workers attack what their policy sees with the
learner's current eps of the warm-up schedule (sent with the weights each iteration)."""

import functools
import sys

import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip("ray")

import agents  # noqa: E402
from agents.config import PPOConfig  # noqa: E402

from conftest import recording  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
SHORT_CARTPOLE = functools.partial(gym.make, "CartPole-v1", max_episode_steps=12)


def _config(**kw):
    base = dict(env=SHORT_CARTPOLE, num_envs=2, n_steps=16, n_minibatches=2, n_epochs=2, seed=5,
                robust="adv", robust_attack="random", robust_eps=0.3, robust_eps_warmup=0.75)
    return PPOConfig(**{**base, **kw})


def test_adv_on_one_worker_equals_the_local_adv_agent_exactly(local_ray):
    # eps rises 0 -> 0.3 over 96 of 128 steps: every batch sees another eps
    cfg = _config()
    local, dist = agents.PPO(cfg), agents.PPO(cfg, rollout_workers=1)
    local_batches, dist_batches, eps = [], [], []
    local._rollout = recording(local._rollout, local_batches)
    try:
        dist.rollout_workers.collect = recording(dist.rollout_workers.collect, dist_batches)
        local.learn(128, progress_bar=False)
        dist.learn(128, progress_bar=False,
                   callbacks=lambda a, logs: eps.append(logs["robust_eps"]))
        assert eps == pytest.approx([0.0, 0.1, 0.2, 0.3])
        assert len(local_batches) == len(dist_batches) == 4
        for lb, db in zip(local_batches, dist_batches):
            for key in lb:
                np.testing.assert_array_equal(lb[key], db[key], err_msg=key)
        for lw, dw in zip(local.get_weights(), dist.get_weights()):
            np.testing.assert_array_equal(lw, dw)
    finally:
        dist.close()
        local.close()


@pytest.mark.slow  # two Ray clusters of 2 workers one after the other: minutes on 2 cores
def test_two_workers_perceive_attacked_observations_within_the_current_eps(local_ray):
    # the same agent with and without the attack on 2 workers: the first batch (eps 0) is the
    # same, so is the next batch's first state; what the policy saw of it differs by the
    # attack, within that iteration's eps
    batches = {"adv": [], "clean": []}
    for name, cfg in (("adv", _config()), ("clean", _config(robust=None))):
        agent = agents.PPO(cfg, rollout_workers=2)  # one at a time: Ray has 3 CPUs here
        try:
            agent.rollout_workers.collect = recording(agent.rollout_workers.collect,
                                                       batches[name])
            agent.learn(64, progress_bar=False)
        finally:
            agent.close()
    first_adv, first_clean = batches["adv"][0], batches["clean"][0]
    assert first_adv["obs"].shape == (16, 2, 4)  # num_envs 2 in all: 1 env per worker
    for key in first_adv:
        np.testing.assert_array_equal(first_adv[key], first_clean[key], err_msg=key)
    delta = np.abs(batches["adv"][1]["obs"][0] - batches["clean"][1]["obs"][0])
    assert 0.02 < delta.max() <= 0.2 + 1e-6  # eps of the second iteration: 0.3 * 32 / 48
