"""Hopper-v5 (MuJoCo, the ``mujoco`` extra) through the robust-RL path of issue 10 §4: PPO with
normalised observations, ``evaluate_under_attack`` with every attack at eps 0.075 in normalised
units (the SA-PPO paper's Hopper budget), and SA-PPO with the PGD and the SGLD inner maximiser.

Slow (a few thousand training steps per agent) and skipped without ``mujoco``; run with
``.venv/bin/python -m pytest tests/agents_tests/test_mujoco_pilot.py -m slow -q``.
"""

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("mujoco")

import agents  # noqa: E402
from agents.robustness import robust  # noqa: E402
from agents.robustness.observation_attacks import ATTACK_NAMES, ObservationAttack  # noqa: E402

pytestmark = pytest.mark.slow

EPS = 0.075
PPO_KW = dict(env="Hopper-v5", seed=0, normalize_obs=True, normalize_reward=True, num_envs=2,
              n_steps=256, n_minibatches=4, n_epochs=4, learning_rate=3e-4, ent_coef=0.0)
TOL = EPS * (1 + 1e-4) + 1e-6  # float32 rounding of the projection


@pytest.fixture(scope="module")
def ppo():
    agent = agents.PPO(**PPO_KW)
    agent.learn(8192, progress_bar=False)
    return agent


@pytest.fixture(scope="module")
def hopper_obs(ppo):
    """Raw observations ``[64, 11]`` of the trained agent's own clean episodes."""
    env = agents.make_vec_env("Hopper-v5", 4, seed=3)
    try:
        obs, rows = env.reset(), []
        for _ in range(16):
            rows.append(obs)
            obs = env.step(ppo.act(obs, deterministic=True))[0]
    finally:
        env.close()
    return np.concatenate(rows).astype(np.float32)


def _std(agent):
    rms = agent._obs_rms()
    return np.sqrt(rms.var.numpy() + rms.epsilon).astype(np.float32)


def test_hopper_spaces_and_normaliser(ppo):
    assert tuple(ppo.obs_shape) == (11,)
    assert not ppo.discrete
    assert ppo.env.single_action_space.shape == (3,)
    std = _std(ppo)
    # the running statistics moved off their initial ones (var 1) during training
    assert std.shape == (11,) and np.all(np.isfinite(std)) and not np.allclose(std, 1.0, atol=1e-2)


def test_a_few_thousand_steps_of_ppo_move_the_policy(ppo, hopper_obs):
    # not judged by return: at this budget the deterministic policy of the fresh network
    # (mean action ~0: the hopper stands, collecting the healthy bonus, for ~250 steps) scored
    # ~255, more than the early, falling gaits PPO finds first (~45 after 8192 steps)
    fresh = agents.PPO(**PPO_KW)
    moved = np.abs(ppo.act(hopper_obs, deterministic=True)
                   - fresh.act(hopper_obs, deterministic=True)).mean()
    assert moved > 0.05, moved
    assert all(np.all(np.isfinite(w)) for w in ppo.get_weights())


def test_every_attack_stays_in_the_normalised_ball(ppo):
    report = agents.evaluate_under_attack(ppo, ATTACK_NAMES, [EPS], n_episodes=2, seed=1,
                                          rs_steps=1000, progress=False)
    assert report.units == "normalised"
    assert {r["attack"] for r in report.rows} == set(ATTACK_NAMES)
    for r in report.rows:
        assert 0.0 < r["max_perturbation"] <= TOL, r
        if r["attack"] != "random":  # the gradient attacks end on the ball's surface
            assert r["max_perturbation"] >= 0.99 * EPS, r
        assert np.isfinite(r["mean"]) and len(r["returns"]) == 2
    worst = report.worst_case[0]
    assert np.isclose(worst["eps"], EPS)
    assert worst["mean"] <= min(r["mean"] for r in report.rows) + 1e-9


def test_perturbations_are_in_standard_deviations_of_the_normaliser(ppo, hopper_obs):
    std = _std(ppo)
    clean = ppo.act(hopper_obs, deterministic=True)
    shifts = {}
    for name in ("random", "mad"):
        adv = ObservationAttack(ppo, name, EPS)(hopper_obs, seed=7).numpy()
        delta = np.abs(adv - hopper_obs)
        assert float((delta / std).max()) <= TOL, name
        # raw units: each dimension moves by up to eps times its own std, not eps
        assert np.all(delta.max(0) <= EPS * std * (1 + 1e-4) + 1e-6), name
        shifts[name] = float(np.mean(np.sum(np.square(
            ppo.act(adv, deterministic=True) - clean), -1)))
    assert shifts["mad"] > 2.0 * shifts["random"], shifts


@pytest.mark.parametrize("method", ["pgd", "sgld"])
def test_sa_ppo_trains_on_hopper(method, hopper_obs):
    logs = []
    agent = agents.PPO(**PPO_KW, robust="sa", robust_eps=EPS, robust_kappa=0.1,
                       robust_method=method, robust_eps_warmup=0.0)
    agent.learn(2048, callbacks=lambda a, entry: logs.append(dict(entry)), progress_bar=False)
    assert logs and all(np.isclose(e["robust_eps"], EPS) for e in logs)
    kls = [float(e["sa_kl"]) for e in logs]
    assert all(np.isfinite(kls)) and max(kls) > 0.0, kls
    assert all(np.all(np.isfinite(w)) for w in agent.get_weights())
    # the inner maximiser stays in the normalised ball and beats random points of it
    obs = tf.constant(hopper_obs)
    adv = robust.sa_observations(agent, obs, tf.constant(EPS), 10, tf.constant([1, 2]),
                                 method=method).numpy()
    assert float((np.abs(adv - hopper_obs) / _std(agent)).max()) <= TOL
    kl_max = float(tf.reduce_mean(robust.policy_kl(agent.model, obs, adv)))
    rand = ObservationAttack(agent, "random", EPS)(hopper_obs, seed=3)
    kl_rand = float(tf.reduce_mean(robust.policy_kl(agent.model, obs, rand)))
    assert kl_max > 2.0 * kl_rand > 0.0, (kl_max, kl_rand)
