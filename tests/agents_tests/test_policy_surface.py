"""The policy surface agents declare (agents.core.policy) and the algorithm registry
(agents.algorithms.registry)."""

import re

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.core.policy import PolicySurface, surface_of
from agents.robustness.observation_attacks import mad_attack

OBS = np.random.default_rng(0).normal(0.0, 0.5, size=(8, 4)).astype(np.float32)


def _normalised(agent, var, mean):
    rms = agent.policy_surface()._rms
    rms.var.assign(np.asarray(var) - rms.epsilon)
    rms.mean.assign(np.asarray(mean))
    return agent


@pytest.fixture(scope="module")
def ppo():
    return _normalised(agents.PPO(env="CartPole-v1", seed=1, num_envs=1, n_steps=32,
                                  normalize_obs=True, preset=None),
                       [0.25, 4.0, 0.0025, 16.0], [0.1, -0.2, 0.0, 0.3])


@pytest.fixture(scope="module")
def pendulum():
    return agents.PPO(env="Pendulum-v1", seed=0, num_envs=1, n_steps=32, preset=None,
                      log_std_init=-0.5)


@pytest.fixture(scope="module")
def dqn():
    return _normalised(agents.DQN(env="CartPole-v1", seed=0, preset=None, hidden_sizes=(16, 16),
                                  normalize_obs=True),
                       [0.5, 2.0, 0.1, 3.0], [0.0, 0.1, -0.1, 0.2])


def _central_differences(f, x, h=1e-2):
    """``d f(x)[b, k] / d x[b, i]`` by central differences in float64 around ``x [B, d]``."""
    x = x.astype(np.float64)
    cols = []
    for i in range(x.shape[1]):
        e = np.zeros_like(x)
        e[:, i] = h
        cols.append((f(x + e) - f(x - e)) / (2 * h))
    return np.stack(cols, axis=-1)  # [B, k, d]


def _surface_jacobian(surface, x):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = surface.outputs(x)
    return tape.batch_jacobian(out, x).numpy()


def test_discrete_surface_is_the_agents_distribution(ppo):
    s = ppo.policy_surface()
    assert (s.kind, s.discrete, s.normalized, s.has_critic) == ("logits", True, True, True)
    d = ppo.distribution(OBS)
    np.testing.assert_allclose(tf.nn.log_softmax(s.outputs(OBS)).numpy(),
                               tf.nn.log_softmax(d.logits_parameter()).numpy(), atol=1e-6)
    actions = np.array([0, 1] * 4)
    np.testing.assert_allclose(s.distribution(OBS).log_prob(actions).numpy(),
                               d.log_prob(actions).numpy(), atol=1e-6)
    np.testing.assert_array_equal(s.deterministic_actions(OBS).numpy(),
                                  ppo.act(OBS, deterministic=True))
    np.testing.assert_allclose(s.value(OBS).numpy(), ppo.value(OBS).numpy(), atol=1e-6)


def test_surface_gradient_matches_finite_differences_of_the_agent(ppo):
    # the surface's derivative w.r.t. the raw observation (through the normaliser) agrees with
    # central differences of the agent's own logits
    s = ppo.policy_surface()
    x = OBS[:4] * 0.5  # inside the normaliser's clip range
    numeric = _central_differences(
        lambda z: tf.nn.log_softmax(ppo.distribution(z.astype(np.float32)).logits_parameter())
        .numpy().astype(np.float64), x, h=1e-2)
    with tf.GradientTape() as tape:
        xt = tf.constant(x)
        tape.watch(xt)
        out = tf.nn.log_softmax(s.outputs(xt))
    analytic = tape.batch_jacobian(out, xt).numpy()
    assert np.abs(analytic).max() > 1e-3  # not a vacuous comparison
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-4)


def test_gaussian_surface_mean_std_and_bounds(pendulum):
    s = pendulum.policy_surface()
    assert (s.kind, s.discrete, s.normalized) == ("gaussian_mean", False, False)
    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    d = pendulum.distribution(obs)
    np.testing.assert_allclose(s.outputs(obs).numpy(), d.mean().numpy(), atol=1e-6)
    np.testing.assert_allclose(s.std().numpy(), np.exp(-0.5) * np.ones(1), rtol=1e-6)
    np.testing.assert_allclose(s.distribution(obs).log_prob(d.mean()).numpy(),
                               d.log_prob(d.mean()).numpy(), atol=1e-5)
    np.testing.assert_array_equal(s.action_low, [-2.0])
    np.testing.assert_array_equal(s.action_high, [2.0])
    np.testing.assert_allclose(s.deterministic_actions(obs).numpy(),
                               pendulum.act(obs, deterministic=True), atol=1e-6)
    w = s.inverse_two_variance(6).numpy()
    np.testing.assert_allclose(w, np.full((6, 1), 0.5 * np.exp(1.0)), rtol=1e-6)
    analytic = _surface_jacobian(s, obs)
    numeric = _central_differences(lambda z: pendulum.distribution(z.astype(np.float32)).mean()
                                   .numpy().astype(np.float64), obs)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=2e-4)


def test_dqn_surface_is_its_q_values(dqn):
    s = dqn.policy_surface()
    assert (s.kind, s.discrete, s.normalized, s.has_critic, s.value) == (
        "q_values", True, True, True, None)
    np.testing.assert_allclose(s.outputs(OBS).numpy(), dqn.q_values(OBS).numpy(), atol=1e-6)
    np.testing.assert_array_equal(s.deterministic_actions(OBS).numpy(),
                                  dqn.act(OBS, deterministic=True))


@pytest.mark.parametrize("name", ["ppo", "dqn", "pendulum"])
def test_layers_reproduce_the_network(name, request):
    # what certification bounds: the declared affine layers and activation are the network
    agent = request.getfixturevalue(name)
    s = agent.policy_surface()
    x = s.normalize(np.random.default_rng(2).normal(size=(5,) + s.obs_shape).astype(np.float32))
    act = {"tanh": tf.tanh, "relu": tf.nn.relu}[s.activation]
    h = x
    for i, (w, b) in enumerate(s.layers):
        h = h @ w + b
        if i < len(s.layers) - 1:
            h = act(h)
    np.testing.assert_allclose(h.numpy(), s.network(x).numpy(), atol=1e-6)


def test_scale_and_normaliser_round_trip(ppo):
    s = ppo.policy_surface()
    mean, std, clip = s.obs_statistics()
    np.testing.assert_allclose(std.numpy(), [0.5, 2.0, 0.05, 4.0], rtol=1e-6)
    np.testing.assert_allclose(s.obs_scale().numpy(), std.numpy())
    np.testing.assert_allclose(mean.numpy(), [0.1, -0.2, 0.0, 0.3], rtol=1e-6)
    obs = mean.numpy() + 3.0 * std.numpy() * OBS  # a few std from the mean: inside the clip
    x = s.normalize(obs).numpy()
    assert np.abs(x).max() < clip
    np.testing.assert_allclose(x, 3.0 * OBS, atol=1e-5)
    np.testing.assert_allclose(x * std.numpy() + mean.numpy(), obs, atol=1e-5)
    # the input box is the image of the raw box: samples map inside it, corners onto it
    lo, hi = obs - 0.1 * std.numpy(), obs + 0.1 * std.numpy()
    xlo, xhi = (t.numpy() for t in s.input_box(tf.constant(lo), tf.constant(hi)))
    np.testing.assert_allclose(xhi - xlo, np.full_like(xlo, 0.2), atol=1e-5)  # 0.1 std each way
    u = np.random.default_rng(3).uniform(size=(200,) + OBS.shape).astype(np.float32)
    inner = s.normalize((lo + u * (hi - lo)).reshape(-1, 4)).numpy().reshape(u.shape)
    assert np.all(inner >= xlo - 1e-6) and np.all(inner <= xhi + 1e-6)
    # outside the clip range the box is clipped like the observations
    far = np.full((1, 4), 1e3, np.float32)
    assert np.all(s.input_box(tf.constant(far), tf.constant(far * 2))[0].numpy() == clip)


def test_raw_units_without_a_normaliser(pendulum):
    s = pendulum.policy_surface()
    assert s.obs_statistics() is None
    np.testing.assert_array_equal(s.obs_scale().numpy(), np.ones(3, np.float32))


def test_no_trained_critic_declares_none():
    agent = agents.REINFORCE(env="CartPole-v1", seed=0, num_envs=1, n_steps=32, vf_coef=0.0,
                             preset=None)
    s = agent.policy_surface()
    assert s.value is None and not s.has_critic


class _NoSurface:
    discrete = True
    obs_shape = (4,)


def test_a_victim_without_a_surface_is_named():
    msg = ("agent: _NoSurface has no policy_surface() method; attacks and certification need "
           "one returning an agents.PolicySurface (the policy's outputs of the normalised "
           "observation, the normaliser, the critic, the action bounds)")
    with pytest.raises(TypeError, match="^" + re.escape(msg) + "$"):
        mad_attack(_NoSurface(), OBS, eps=0.1)
    with pytest.raises(TypeError, match=r"must return an agents.PolicySurface, got dict"):
        surface_of(type("Odd", (), {"policy_surface": lambda self: {}})())


def test_a_hand_made_surface_is_attacked_like_an_agent():
    # a linear "DQN" declared only by its surface: the mad attack moves the softmax(Q) policy
    w = tf.constant([[1.0, -1.0], [0.5, 0.5], [-2.0, 1.0], [0.0, 0.3]])
    class Victim:
        env = type("E", (), {"single_observation_space": gym.spaces.Box(-1, 1, (4,))})()

        def policy_surface(self):
            return PolicySurface("q_values", lambda x: x @ w, obs_shape=(4,))

    victim = Victim()
    adv = mad_attack(victim, OBS, eps=0.1, seed=0).numpy()
    assert np.abs(adv - OBS).max() <= 0.1 + 1e-6
    kl = tf.reduce_sum(tf.nn.softmax(OBS @ w) * (tf.nn.log_softmax(OBS @ w)
                                                 - tf.nn.log_softmax(adv @ w)), -1).numpy()
    assert np.all(kl > 1e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "probs"}, "kind must be one of logits, gaussian_mean, q_values, got 'probs'"),
    ({"kind": "gaussian_mean"}, "log_std must be given for kind='gaussian_mean' and only for it"),
    ({"layers": []}, "activation must be one of tanh, relu when layers are given, got None"),
])
def test_surface_arguments_are_checked(kwargs, message):
    args = {"kind": "logits", "network": tf.identity, "obs_shape": (2,), **kwargs}
    kind, net = args.pop("kind"), args.pop("network")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        PolicySurface(kind, net, **args)


# -- the registry ---------------------------------------------------------------------------
def test_registry_is_the_one_table():
    from robustgrad.commands import train_agent

    assert agents.ALGORITHM_NAMES == train_agent.ALGOS == ("ppo", "a2c", "reinforce", "dqn")
    assert {n: c.algo for n, c in agents.ALGORITHMS.items()} == {n: n for n in agents.ALGORITHMS}
    assert agents.algorithm("a2c") is agents.A2C
    with pytest.raises(ValueError, match=r"^--algo must be one of 'ppo', 'a2c', 'reinforce', "
                                         r"'dqn', got 'sac'$"):
        agents.algorithm("sac", "--algo")
    with pytest.raises(TypeError):
        agents.ALGORITHMS["sac"] = agents.PPO  # read-only
