"""Every count of an agent's config that sizes memory or time has an upper bound, checked by the
library before anything is built (issue 36): a ConfigError naming the field and the range."""

import re

import pytest

import agents
from robustgrad.errors import ConfigError


def _refused(message, make):
    with pytest.raises(ConfigError, match=rf"^{re.escape(message)}$"):
        make()


@pytest.mark.parametrize("cls", [agents.PPOConfig, agents.A2CConfig, agents.REINFORCEConfig,
                                 agents.DQNConfig])
def test_num_envs_and_hidden_sizes_are_bounded_for_every_agent(cls):


    _refused(f"num_envs must be an int in [1, 65536], got {10**6}",
             lambda: cls(num_envs=10**6, preset=None))
    _refused("num_envs must be an int in [1, 1024] with async_envs=True (one subprocess per "
             "environment), got 2000", lambda: cls(num_envs=2000, async_envs=True, preset=None))
    _refused("hidden_sizes must be an int in [1, 65536], got 100000000",
             lambda: cls(hidden_sizes=(64, 10**8), preset=None))


def test_an_on_policy_rollout_is_bounded_by_its_transitions():
    _refused(f"n_steps must be an int in [1, 16777216], got {10**9}",
             lambda: agents.PPOConfig(n_steps=10**9, n_minibatches=1, preset=None))
    _refused("n_steps * num_envs * num_seeds must be at most 16777216 (transitions one rollout "
             "keeps in memory), got 65536 * 512 * 1 = 33554432",
             lambda: agents.PPOConfig(n_steps=65536, num_envs=512, n_minibatches=1))
    _refused("n_steps * num_envs * num_seeds must be at most 16777216 (transitions one rollout "
             "keeps in memory), got 8192 * 512 * 8 = 33554432",
             lambda: agents.A2CConfig(n_steps=8192, num_envs=512, num_seeds=8))
    # the largest rollout is accepted
    assert agents.A2CConfig(n_steps=32768, num_envs=512).n_steps == 32768


@pytest.mark.parametrize("make, message", [
    (lambda: agents.PPOConfig(n_epochs=10**9), "n_epochs must be an int in [1, 100000], got "
                                               "1000000000"),
    (lambda: agents.PPOConfig(robust="sa", robust_steps=10**7),
     "robust_steps must be an int in [1, 100000], got 10000000"),
    (lambda: agents.DQNConfig(gradient_steps=10**6),
     "gradient_steps must be an int in [1, 100000], got 1000000"),
])
def test_repetitions_per_update_are_bounded(make, message):
    _refused(message, make)


def test_the_learn_budget_is_bounded_before_any_work():
    agent = agents.PPO(env="CartPole-v1", n_steps=8, num_envs=2, n_minibatches=1, preset=None)
    for learn in (agent.learn, lambda steps: agents.train_many(agent.config, [0, 1], steps)):
        _refused(f"{'total_steps' if learn == agent.learn else 'steps'} must be an int in "
                 f"[1, 10000000000], got {10**15}", lambda: learn(10**15))
    assert int(agent.num_timesteps.numpy()) == 0
    with pytest.raises(ConfigError, match=r"^total_steps must be an int in \[1, 10000000000\], "
                                          r"got 0$"):
        agent.learn(0)
