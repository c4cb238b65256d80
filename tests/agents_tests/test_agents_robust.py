"""State-adversarial training (agents.robustness.robust): SA-PPO/SA-A2C's KL regulariser, SA-DQN's hinge,
adversarial observation training, their config fields, CLI flags and one-trace updates."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.config import A2CConfig, DQNConfig, PPOConfig, REINFORCEConfig
from agents.robustness import robust
from robustgrad import cli

from small_models import CARTPOLE_OBS, assert_kl_beats_random_points, sharpened_ppo

OBS = CARTPOLE_OBS


@pytest.fixture(scope="module")
def ppo():
    return sharpened_ppo()


def test_sa_regularizer_is_zero_at_eps_zero(ppo):
    obs_adv = robust.sa_observations(ppo, OBS, tf.constant(0.0), 10, tf.constant([1, 2]))
    np.testing.assert_array_equal(obs_adv.numpy(), OBS)
    assert float(robust.sa_policy_regularizer(ppo, OBS, obs_adv)) == pytest.approx(0.0, abs=1e-7)


def test_no_gradient_reaches_the_clean_distribution(ppo):
    obs = tf.constant(OBS)
    obs_adv = tf.constant(OBS + 0.05)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([obs, obs_adv])
        kl = tf.reduce_mean(robust.policy_kl(ppo.model, obs, obs_adv))
        # the same KL written out with the clean side *not* stopped
        p = tf.nn.log_softmax(ppo.model.policy_net(obs))
        q = tf.nn.log_softmax(ppo.model.policy_net(obs_adv))
        kl_open = tf.reduce_mean(tf.reduce_sum(tf.exp(p) * (p - q), -1))
        # with the clean side stopped, KL's parameter gradient is cross-entropy's
        cross_entropy = -tf.reduce_mean(tf.reduce_sum(tf.stop_gradient(tf.exp(p)) * q, -1))
    assert float(kl) == pytest.approx(float(kl_open), rel=1e-5) and float(kl) > 0
    assert tape.gradient(kl, obs) is None
    assert tape.gradient(kl_open, obs) is not None
    assert float(tf.reduce_max(tf.abs(tape.gradient(kl, obs_adv)))) > 0
    variables = ppo.model.policy_net.trainable_variables
    for g, g_ce in zip(tape.gradient(kl, variables), tape.gradient(cross_entropy, variables)):
        np.testing.assert_allclose(g.numpy(), g_ce.numpy(), rtol=1e-4, atol=1e-7)


def test_inner_max_beats_random_points_of_the_ball(ppo):
    eps = 0.2
    obs_adv = robust.sa_observations(ppo, OBS, tf.constant(eps), 10, tf.constant([3, 4]))
    assert float(np.abs(obs_adv.numpy() - OBS).max()) <= eps + 1e-6
    assert_kl_beats_random_points(ppo.model, OBS, obs_adv, eps)


def test_schedule_ramps_eps_and_kappa():
    s = robust.RobustSchedule(eps=0.2, kappa=1.0, warmup=0.5)
    assert float(s.eps) == 0.0 and float(s.kappa) == 0.0
    s.update(250, 1000)
    assert float(s.eps) == pytest.approx(0.1) and float(s.kappa) == pytest.approx(0.5)
    s.update(600, 1000)
    assert float(s.eps) == pytest.approx(0.2) and float(s.kappa) == pytest.approx(1.0)
    full = robust.RobustSchedule(eps=0.2, kappa=1.0, warmup=0.0)
    assert float(full.eps) == pytest.approx(0.2)


@pytest.mark.parametrize("cls", [agents.PPO, agents.A2C], ids=["ppo", "a2c"])
def test_sa_update_is_one_trace_and_logs_the_schedule(cls):
    agent = cls(env="CartPole-v1", seed=0, preset=None, num_envs=2, n_steps=16, robust="sa",
                robust_eps=0.1, robust_kappa=0.5, robust_eps_warmup=0.5)
    agent.learn(128, progress_bar=False)
    assert agent.trace_counts["train"] == 1 and agent.trace_counts["rollout"] == 1
    # the last of four iterations started at 96 of 128 steps: past the 64-step warm-up
    assert float(agent.robust_schedule.eps) == pytest.approx(0.1)
    assert float(agent.robust_schedule.kappa) == pytest.approx(0.5)


def test_sa_ppo_still_learns_cartpole():
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, robust="sa", robust_eps=0.05,
                       robust_kappa=0.1)
    agent.learn(20_480, progress_bar=False)
    assert agent.trace_counts["train"] == 1
    assert agent.evaluate(10)["mean_return"] >= 150.0


def test_adv_rollout_acts_on_attacked_observations():
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, num_envs=2, n_steps=16,
                       robust="adv", robust_attack="random", robust_eps=0.3,
                       robust_eps_warmup=0.0)
    obs = tf.constant(OBS[:2])
    seen = agent.robustness.perceive(obs, tf.constant([5, 6])).numpy()
    delta = np.abs(seen - OBS[:2])
    assert delta.max() <= 0.3 + 1e-6 and delta.max() > 0.05
    nan_obs = tf.constant([[np.nan, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], tf.float32)
    seen = agent.robustness.perceive(nan_obs, tf.constant([5, 6])).numpy()
    assert np.isnan(seen[0, 0]) and np.all(np.isfinite(seen[1]))  # the guard still sees NaN
    agent.learn(64, progress_bar=False)
    assert agent.trace_counts["rollout"] == 1


# -- SA-DQN --------------------------------------------------------------------------------
def test_q_margin_hinge_values():
    q = tf.constant([[1.0, 3.0, 2.0], [0.0, 0.5, 4.0], [2.0, 2.0, -1.0]])
    greedy = tf.constant([1, 0, 0])
    # max over the other actions minus Q of a*, floored at -margin
    np.testing.assert_allclose(robust.q_margin_hinge(q, greedy, 1.0).numpy(), [-1.0, 4.0, 0.0])
    np.testing.assert_allclose(robust.q_margin_hinge(q, greedy, 0.5).numpy(), [-0.5, 4.0, 0.0])


class _LinearQAgent:
    """A hand-made DQN-like agent: ``Q(s) = s @ W`` (2 actions, 3-D observations)."""

    discrete = True
    obs_shape = (3,)

    def __init__(self, w):
        self.w = tf.Variable(w, dtype=tf.float32)
        self.env = type("E", (), {"single_observation_space": gym.spaces.Box(
            -np.inf, np.inf, (3,), np.float32)})()

    def policy_surface(self):
        return agents.PolicySurface("q_values", lambda x: x @ self.w, obs_shape=self.obs_shape)


def test_sa_dqn_hinge_on_a_linear_q():
    w = np.array([[1.0, -1.0], [0.5, 0.5], [-2.0, 1.0]], np.float32)
    agent = _LinearQAgent(w)
    obs = np.array([[0.3, 0.0, -0.1], [-0.2, 1.0, 0.2]], np.float32)
    eps = 0.05
    obs_adv, greedy = robust.sa_dqn_observations(agent, obs, tf.constant(eps), 10,
                                                 tf.constant([7, 8]))
    np.testing.assert_array_equal(greedy.numpy(), (obs @ w).argmax(-1))
    assert float(np.abs(obs_adv.numpy() - obs).max()) <= eps + 1e-6
    q_clean, q_adv = obs @ w, obs_adv.numpy() @ w
    g = greedy.numpy()
    rows = np.arange(2)
    margin_clean = q_clean[rows, 1 - g] - q_clean[rows, g]
    margin_adv = q_adv[rows, 1 - g] - q_adv[rows, g]
    # the best margin in the ball, analytically: eps * ||w_other - w_star||_1 more than clean
    d = (w[:, 1 - g] - w[:, g]).T
    margin_best = margin_clean + eps * np.abs(d).sum(-1)
    assert np.all(margin_adv >= margin_clean + 1e-4) and np.all(margin_adv <= margin_best + 1e-5)
    hinge = robust.attacked_q_margin(agent, obs_adv, greedy, margin=1.0)
    assert float(hinge) == pytest.approx(float(np.maximum(margin_adv, -1.0).mean()), rel=1e-5)
    with tf.GradientTape() as tape:
        hinge = robust.attacked_q_margin(agent, obs_adv, greedy, margin=1.0)
    grad = tape.gradient(hinge, agent.w).numpy()
    expected = np.zeros_like(w)  # d/dW of mean(max(margin, -1)); both rows are above -1
    for i in rows:
        if margin_adv[i] > -1.0:
            expected[:, 1 - g[i]] += obs_adv.numpy()[i] / 2
            expected[:, g[i]] -= obs_adv.numpy()[i] / 2
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["sa", "adv"])
def test_dqn_robust_update_is_one_trace(mode):
    agent = agents.DQN(env="CartPole-v1", seed=0, preset=None, learning_starts=64, batch_size=32,
                       train_freq=32, gradient_steps=4, hidden_sizes=(32, 32), robust=mode,
                       robust_eps=0.05, robust_eps_warmup=0.0)
    agent.learn(256, progress_bar=False)
    assert agent.trace_counts["train"] == 1 and int(agent.grad_steps.numpy()) > 4


# -- config, persistence, bad input ---------------------------------------------------------
def test_robust_config_is_saved_and_loaded(tmp_path):
    agent = agents.A2C(env="CartPole-v1", seed=0, preset=None, num_envs=2, robust="sa",
                       robust_eps=0.07, robust_kappa=0.3)
    agent.learn(20, progress_bar=False)
    agent.save(str(tmp_path / "a"))
    loaded = agents.load(str(tmp_path / "a"))
    assert (loaded.config.robust, loaded.config.robust_eps, loaded.config.robust_kappa) == \
        ("sa", 0.07, 0.3)
    assert float(loaded.robust_schedule.eps) == 0.0  # set again from the next learn budget


@pytest.mark.parametrize("cls,kwargs,message", [
    (PPOConfig, {"robust": "pgd"},
     "robust must be one of ('sa', 'adv', 'atla', 'atla-sa', 'wocar'), got 'pgd'"),
    (A2CConfig, {"robust_eps": -0.1}, "robust_eps must be a number >= 0, got -0.1"),
    (DQNConfig, {"robust_steps": 0}, "robust_steps must be an int in [1, 100000], got 0"),
    (PPOConfig, {"robust_eps_warmup": 1.5}, "robust_eps_warmup"),
    (PPOConfig, {"robust_attack": "rs"}, "robust_attack must be one of"),
    (REINFORCEConfig, {"robust": "sa"}, "robust: REINFORCE has no robust variant"),
])
def test_bad_robust_config(cls, kwargs, message):
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("argv,message", [
    (["--algo", "reinforce", "--robust", "sa"], "--robust: reinforce has no robust variant"),
    (["--eps", "0.1"], "--eps: a robust-training setting, read only with --robust "
                       "sa|adv|atla|atla-sa|wocar"),
    (["--robust", "sa", "--eps", "-1"], "--eps must be a number >= 0, got -1.0"),
    (["--robust", "sa", "--robust-steps", "0"], "--robust-steps must be an int in [1, 100000], got 0"),
    (["--robust", "adv", "--robust-attack", "rs"], "--robust-attack must be one of"),
])
def test_cli_robust_flags_refused_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["train-agent", *argv, "--steps", "100", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


