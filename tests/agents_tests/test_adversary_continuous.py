"""Learned adversaries and ATLA on a Gaussian victim with normalised observations (Pendulum):
the adversary's eps is in the victim's standard deviations, its unit follows the victim's
normaliser, PA-AD's director acts in the victim's action space."""

import numpy as np
import pytest

import agents
from agents.robustness.adversary import train_adversary, victim_surface


@pytest.fixture(scope="module")
def pendulum():
    """A briefly trained Pendulum PPO whose normaliser has moved away from std 1."""
    agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=2, n_steps=64, normalize_obs=True)
    agent.learn(256, progress_bar=False)
    std = agent.policy_surface().obs_scale().numpy()
    assert np.abs(std - 1).max() > 0.05
    return agent


def test_victim_unit_is_cached_until_refresh():
    agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=2, n_steps=32, normalize_obs=True)
    surface = victim_surface(agent)
    before = surface.units.copy()
    agent.learn(64, progress_bar=False)
    now = agent.policy_surface().obs_scale().numpy()
    assert np.abs(now - before).max() > 1e-3  # the normaliser moved
    np.testing.assert_array_equal(surface.units, before)
    surface.refresh()
    np.testing.assert_allclose(surface.units, now, rtol=1e-6)


def test_optimal_adversary_on_a_gaussian_victim_stays_in_std_units(pendulum):
    eps = 0.2
    adv = train_adversary(pendulum, eps=eps, steps=64, eval_every=64, eval_episodes=1,
                          ppo={"num_envs": 2, "n_steps": 32}, progress=False)
    obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    obs_in = obs.copy()
    seen, norms, a_adv, a_clean = adv.step(obs)
    np.testing.assert_array_equal(obs, obs_in)
    std = pendulum.policy_surface().obs_scale().numpy()
    delta = np.abs(seen - obs) / std  # the radius in the victim's standard deviations
    assert 0 < delta.max() <= eps * (1 + 1e-5)
    np.testing.assert_allclose(norms, delta.max(-1), rtol=1e-5)
    assert a_adv.shape == a_clean.shape == (16, 1)
    assert np.all(np.abs(a_adv) <= 2.0)  # Pendulum's action bounds
    np.testing.assert_allclose(a_adv, pendulum.policy_surface().deterministic_actions(seen),
                               rtol=1e-5, atol=1e-6)


def test_paad_director_acts_in_the_victims_action_space(pendulum):
    adv = train_adversary(pendulum, eps=0.2, steps=64, kind="paad", eval_every=64,
                          eval_episodes=1, ppo={"num_envs": 2, "n_steps": 32}, progress=False)
    assert adv.agent.env.single_action_space.shape == (1,)
    obs = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    seen, norms, a_adv, _ = adv.step(obs)
    assert seen.shape == (4, 3) and norms.max() <= 0.2 * (1 + 1e-5)
    assert a_adv.shape == (4, 1)


def test_atla_adversary_follows_the_agents_normaliser():
    """Each adversary phase perturbs in the agent's current standard deviations."""
    agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=2, n_steps=32, normalize_obs=True,
                       robust="atla", robust_eps=0.2, robust_eps_warmup=0.0)
    agent.learn(64, progress_bar=False)
    first = agent.robustness.victim.units.copy()
    now = agent.policy_surface().obs_scale().numpy()
    assert np.abs(now - first).max() > 1e-3  # the last agent update moved the normaliser
    agent.robustness.adversary_phase()
    np.testing.assert_allclose(agent.robustness.victim.units, now, rtol=1e-6)


def test_the_random_policy_baseline_repeats_on_a_continuous_space():
    """The random-action baseline of the normalised score is seeded on Box action spaces too
    (it drew from the action space's own unseeded generator: two evaluations with the same
    seed gave -1130.7 and -1202.4 on a Pendulum agent)."""
    import agents
    from agents.robustness.attack_evaluation import _run_episodes

    agent = agents.PPO(env="Pendulum-v1", seed=0, num_envs=1, n_steps=32)
    runs = [_run_episodes(agent, 2, 2, seed=3, random_actions=True)["returns"] for _ in range(2)]
    other = _run_episodes(agent, 2, 2, seed=4, random_actions=True)["returns"]
    assert runs[0] == runs[1]
    assert other != runs[0]
