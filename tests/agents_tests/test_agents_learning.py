"""Real, short learning runs: every algorithm must beat a random CartPole policy (~22).

Deterministic evaluation over 10 episodes after a small budget; seeds are fixed so the
runs are reproducible on one machine. The full figures are in ``benchmarks/agents.py``.
"""

import pytest

import agents

RANDOM_CARTPOLE = 22.0


@pytest.mark.parametrize("cls,steps,kwargs,threshold", [
    (agents.PPO, 20_480, {}, 150.0),
    (agents.A2C, 30_000, {}, 150.0),
    (agents.REINFORCE, 30_000, {"n_steps": 64, "learning_rate": 2e-3}, 100.0),
    (agents.DQN, 15_000, {"hidden_sizes": (64, 64), "learning_starts": 500,
                          "exploration_fraction": 0.2}, 60.0),
], ids=["ppo", "a2c", "reinforce", "dqn"])
def test_learns_cartpole(cls, steps, kwargs, threshold):
    # the plain config defaults (the tuned presets are covered by test_agents_presets.py)
    agent = cls(env="CartPole-v1", seed=0, preset=None, **kwargs)
    agent.learn(steps, progress_bar=False)
    result = agent.evaluate(10)
    assert result["mean_return"] >= threshold > 2.5 * RANDOM_CARTPOLE, result


@pytest.mark.slow
def test_ppo_cartpole_100k_solves():
    agent = agents.PPO(env="CartPole-v1", seed=0)  # the ppo-CartPole-v1 preset
    assert agent.config.preset == "ppo-CartPole-v1"
    agent.learn(100_000, progress_bar=False)
    assert agent.evaluate(20)["mean_return"] >= 475


@pytest.mark.slow
def test_ppo_acrobot_normalized_learns():
    # observation + reward normalisation (the ppo-Acrobot-v1 preset): observation
    # normalisation alone used to stall (see the README)
    agent = agents.PPO(env="Acrobot-v1", seed=0)
    assert agent.config.normalize_obs and agent.config.normalize_reward
    agent.learn(150_000, progress_bar=False)
    assert agent.evaluate(20)["mean_return"] >= -100


@pytest.mark.slow
def test_ppo_pendulum_learns():
    agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=4, n_steps=512, gamma=0.9,
                       gae_lambda=0.95, n_epochs=10, n_minibatches=16, learning_rate=1e-3,
                       ent_coef=0.0, normalize_obs=True, normalize_reward=True)
    agent.learn(100_000, progress_bar=False)
    assert agent.evaluate(10)["mean_return"] >= -400
