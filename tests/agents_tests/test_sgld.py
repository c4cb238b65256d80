"""SA-PPO's SGLD inner maximiser (agents.robustness.observation_attacks.sgld_mad_attack,
robust_method="sgld"):
the schedule against a reference loop, the ball, eps 0, seeds, strength against random noise,
config and CLI checks, and a short SA-PPO (SGLD) run that learns."""

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.config import DQNConfig, PPOConfig
from agents.robustness import observation_attacks as oa
from agents.robustness import robust
from robustgrad import cli

from small_models import CARTPOLE_OBS, assert_kl_beats_random_points, sharpened_ppo

OBS = CARTPOLE_OBS


@pytest.fixture(scope="module")
def ppo():
    return sharpened_ppo()


def _reference_sgld(agent, obs, eps, steps, temperature, seed):
    """SA-PPO's SGLD written out with a tape (raw units: CartPole's PPO does not normalise)."""
    step = eps / steps
    base = oa.step_seed(seed, 0)
    u = tf.constant(obs)
    clean = tf.nn.log_softmax(agent.model.policy_net(u))
    ua = u + step * tf.sign(tf.random.stateless_normal(u.shape, seed=oa.step_seed(base, 0)))
    for i in range(steps):
        with tf.GradientTape() as tape:
            tape.watch(ua)
            logp = tf.nn.log_softmax(agent.model.policy_net(ua))
            kl = tf.reduce_sum(tf.exp(clean) * (clean - logp))
        g = tape.gradient(kl, ua)
        z = tf.random.stateless_normal(u.shape, seed=oa.step_seed(base, i + 1))
        z = z * np.sqrt(2.0 * step * temperature) / (i + 2)
        ua = tf.clip_by_value(ua + step * tf.sign(g + z), u - eps, u + eps)
    return ua.numpy()


@pytest.mark.parametrize("temperature", [oa.SGLD_TEMPERATURE, 1.0])
def test_sgld_follows_sa_ppos_schedule(ppo, temperature):
    # temperature 1: the noise (~0.1 / (i + 2)) is comparable to the gradient and flips signs
    got = oa.sgld_mad_attack(ppo, OBS, eps=0.2, steps=5, temperature=temperature, seed=3).numpy()
    want = _reference_sgld(ppo, OBS, 0.2, 5, temperature, 3)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_sgld_noise_changes_the_path(ppo):
    cold = oa.sgld_mad_attack(ppo, OBS, eps=0.2, temperature=0.0, seed=3).numpy()
    hot = oa.sgld_mad_attack(ppo, OBS, eps=0.2, temperature=1.0, seed=3).numpy()
    assert np.mean(np.abs(cold - hot) > 1e-6) > 0.05


def test_sgld_regularizer_is_zero_at_eps_zero(ppo):
    obs_adv = robust.sa_observations(ppo, OBS, tf.constant(0.0), 10, tf.constant([1, 2]), "sgld")
    np.testing.assert_array_equal(obs_adv.numpy(), OBS)
    assert float(robust.sa_policy_regularizer(ppo, OBS, obs_adv)) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_sgld_stays_in_the_ball_and_is_finite(ppo, norm):
    eps = 0.15
    adv = oa.sgld_mad_attack(ppo, OBS, eps=eps, norm=norm, seed=0).numpy()
    assert adv.shape == OBS.shape and adv.dtype == np.float32 and np.all(np.isfinite(adv))
    size = np.abs(adv - OBS).max(-1) if norm == "linf" else np.linalg.norm(adv - OBS, axis=-1)
    assert size.max() <= eps + 1e-6 and size.max() > 0.5 * eps


def test_sgld_is_seeded(ppo):
    a = robust.sa_observations(ppo, OBS, tf.constant(0.2), 10, tf.constant([7, 8]), "sgld")
    b = robust.sa_observations(ppo, OBS, tf.constant(0.2), 10, tf.constant([7, 8]), "sgld")
    c = robust.sa_observations(ppo, OBS, tf.constant(0.2), 10, tf.constant([7, 9]), "sgld")
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())


def test_sgld_raises_the_kl_above_random_noise(ppo):
    eps = 0.2
    obs_adv = robust.sa_observations(ppo, OBS, tf.constant(eps), 10, tf.constant([3, 4]), "sgld")
    assert_kl_beats_random_points(ppo.model, OBS, obs_adv, eps)


def test_sgld_on_a_gaussian_policy():
    agent = agents.PPO(env="Pendulum-v1", seed=0, preset=None, num_envs=1, n_steps=32)
    head = [v for v in agent.model.policy_net.trainable_variables if v.shape == (64, 1)]
    head[0].assign(head[0] * 300.0)
    obs = np.random.default_rng(2).uniform(-1, 1, size=(16, 3)).astype(np.float32)
    adv = robust.sa_observations(agent, obs, tf.constant(0.1), 10, tf.constant([1, 1]), "sgld")
    assert np.abs(adv.numpy() - obs).max() <= 0.1 + 1e-6
    kl = robust.policy_kl(agent.model, obs, adv).numpy()
    noise = np.random.default_rng(3).uniform(-0.1, 0.1, obs.shape).astype(np.float32)
    kl_random = robust.policy_kl(agent.model, obs, obs + noise).numpy()
    assert np.all(np.isfinite(kl)) and kl.mean() > 3 * kl_random.mean()


def test_sgld_bad_arguments(ppo):
    with pytest.raises(ValueError, match="temperature must be a number >= 0, got -1"):
        oa.sgld_mad_attack(ppo, OBS, eps=0.1, temperature=-1)
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        oa.sgld_mad_attack(ppo, OBS, eps=0.1, steps=0)
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        oa.sgld_mad_attack(ppo, OBS, eps=-0.1)


# -- config and CLI -------------------------------------------------------------------------
def test_robust_method_config():
    assert PPOConfig().robust_method == "pgd"
    with pytest.raises(ValueError, match=r"robust_method must be one of \('pgd', 'sgld', "
                                         r"'convex'\), got 'fgsm'"):
        PPOConfig(robust="sa", robust_method="fgsm")
    with pytest.raises(ValueError, match="^robust_method: SA-DQN bounds the greedy action's "
                                         "margin by PGD or by the convex relaxation; 'pgd' or "
                                         "'convex', got 'sgld'$"):
        DQNConfig(robust="sa", robust_method="sgld")


@pytest.mark.parametrize("argv,message", [
    (["--robust-method", "sgld"],
     "--robust-method: a robust-training setting, read only with --robust sa|atla-sa|wocar"),
    (["--robust", "sa", "--robust-method", "langevin"], "--robust-method must be one of"),
])
def test_cli_robust_method_refused_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["train-agent", *argv, "--steps", "100", "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_sa_ppo_sgld_still_learns_cartpole(tmp_path):
    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, robust="sa", robust_eps=0.05,
                       robust_kappa=0.1, robust_method="sgld")
    kls = []
    agent.learn(20_480, progress_bar=False, callbacks=lambda a, logs: kls.append(logs["sa_kl"]))
    assert agent.trace_counts["train"] == 1
    assert kls[-1] > 0.0 and np.all(np.isfinite(kls))
    assert agent.evaluate(10)["mean_return"] >= 150.0
    agent.save(str(tmp_path / "a"))
    assert agents.load(str(tmp_path / "a")).config.robust_method == "sgld"
