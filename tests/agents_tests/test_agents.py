"""Unit tests of the agents package: targets, stop-gradient, envs, configs, persistence, faults.

Agents are expensive to trace (~5-10 s each on 2 cores), so tests share module-scoped agents
where the test does not depend on a fresh one.
"""

import json
import os

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from gymnasium.vector import AutoresetMode

import agents
from agents.algorithms.dqn import td_target
from agents.core.returns import bootstrap_values, discounted_returns, gae
from agents.envs import RunningMeanStd, VecEnv

# -- returns and targets ------------------------------------------------------------------


def test_gae_hand_computed_truncation_vs_termination():
    # one env, 3 steps; gamma 0.9, lambda 0.5
    r = tf.constant([[1.0], [2.0], [3.0]])
    v = tf.constant([[0.5], [1.0], [1.5]])
    v_next_obs = tf.constant([[1.0], [4.0], [2.0]])  # V of the obs each step led to
    g, lam = 0.9, 0.5
    # step 1 (index 1) ends the episode: terminated -> bootstrap 0; truncated -> V(final)=4
    for term, boot1 in ((True, 0.0), (False, 4.0)):
        terminated = tf.constant([[False], [term], [False]])
        truncated = tf.constant([[False], [not term], [False]])
        nv = bootstrap_values(v_next_obs, terminated)
        adv, ret = gae(r, v, nv, terminated | truncated, g, lam)
        d2 = 3.0 + g * 2.0 - 1.5
        d1 = 2.0 + g * boot1 - 1.0
        d0 = 1.0 + g * 1.0 - 0.5
        a2 = d2
        a1 = d1  # episode ends at 1: no carry from step 2
        a0 = d0 + g * lam * a1
        np.testing.assert_allclose(adv.numpy().ravel(), [a0, a1, a2], rtol=1e-6)
        np.testing.assert_allclose(ret.numpy().ravel(), np.array([a0, a1, a2]) + [0.5, 1.0, 1.5],
                                   rtol=1e-6)


def test_gae_lambda_one_equals_discounted_returns():
    rng = np.random.default_rng(0)
    r = tf.constant(rng.normal(size=(7, 3)), tf.float32)
    v = tf.constant(rng.normal(size=(7, 3)), tf.float32)
    ends = rng.random((7, 3)) < 0.3
    # consistent data: inside an episode, the next value is the next state's value
    nv = np.where(ends, rng.normal(size=(7, 3)), np.roll(v.numpy(), -1, axis=0))
    nv[-1] = rng.normal(size=3)
    nv = tf.constant(nv, tf.float32)
    _, ret = gae(r, v, nv, ends, 0.97, 1.0)
    mc = discounted_returns(r, nv, ends, 0.97)
    np.testing.assert_allclose(ret.numpy(), mc.numpy(), rtol=1e-5, atol=1e-5)


def test_discounted_returns_hand_computed():
    r = tf.constant([[1.0], [1.0], [1.0], [1.0]])
    ends = tf.constant([[False], [True], [False], [False]])
    nv = tf.constant([[9.0], [5.0], [9.0], [10.0]])  # only ends and the last row are used
    ret = discounted_returns(r, nv, ends, 0.5).numpy().ravel()
    # t3: 1 + .5*10 = 6; t2: 1 + .5*6 = 4; t1 (truncated, V=5): 1 + .5*5 = 3.5; t0: 1+.5*3.5
    np.testing.assert_allclose(ret, [2.75, 3.5, 4.0, 6.0])


def test_td_target_truncation_bootstraps_termination_does_not():
    t = td_target(tf.constant([1.0, 1.0]), tf.constant([10.0, 10.0]),
                  tf.constant([True, False]), 0.9)
    np.testing.assert_allclose(t.numpy(), [1.0, 10.0])


def test_targets_are_stop_gradient():
    v = tf.Variable([[0.5], [1.0]])
    nv = tf.Variable([[1.0], [2.0]])
    with tf.GradientTape(persistent=True) as tape:
        adv, ret = gae(tf.ones([2, 1]), v * 1.0, nv * 1.0, tf.zeros([2, 1], bool), 0.9, 0.9)
        mc = discounted_returns(tf.ones([2, 1]), nv * 1.0, tf.zeros([2, 1], bool), 0.9)
        td = td_target(tf.ones([2]), tf.reshape(nv, [2]) * 1.0, tf.zeros([2], bool), 0.9)
    for out in (adv, ret, mc, td):
        assert tape.gradient(out, [v, nv]) == [None, None]


# -- environments -------------------------------------------------------------------------


def test_next_step_autoreset_is_converted_to_same_step():
    def make(mode):
        return VecEnv(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                                   vector_kwargs={"autoreset_mode": mode}), seed=3)

    same, nxt = make(AutoresetMode.SAME_STEP), make(AutoresetMode.NEXT_STEP)
    assert nxt.mode == AutoresetMode.NEXT_STEP
    o1, o2 = same.reset(), nxt.reset()
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(0)
    n_done = 0
    for _ in range(200):
        a = rng.integers(0, 2, 3)
        s1, s2 = same.step(a), nxt.step(a)
        for x, y in zip(s1, s2):
            np.testing.assert_array_equal(x, y)
        n_done += int(s1[2].sum() + s1[3].sum())
    assert n_done > 3
    assert same.drain_episodes() == nxt.drain_episodes()


def test_final_obs_is_the_observation_before_reset():
    env = agents.make_vec_env("CartPole-v1", 2, seed=0)
    env.reset()
    for _ in range(100):
        obs, _r, term, trunc, fin = env.step(np.zeros(2, int))  # always left: falls fast
        done = term | trunc
        if done.any():
            i = np.nonzero(done)[0][0]
            assert not np.allclose(fin[i], obs[i])
            assert abs(fin[i][2]) > 0.2 or abs(fin[i][0]) > 2.4  # pole angle / cart out of range
            break
        np.testing.assert_array_equal(fin, obs)
    else:
        pytest.fail("no episode ended")


def test_running_mean_std_ignores_nonfinite_rows():
    rms = RunningMeanStd((2,))
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 2))
    bad = np.array([[np.nan, 1.0], [np.inf, 0.0]])
    rms.update(np.concatenate([x, bad]))
    np.testing.assert_allclose(rms.mean.numpy(), x.mean(0), rtol=1e-3)
    np.testing.assert_allclose(rms.var.numpy(), x.var(0), rtol=1e-3)


# -- configuration errors ------------------------------------------------------------------


@pytest.mark.parametrize("cls,kwargs,name", [
    (agents.PPO, {"env": "NoSuchEnv-v0"}, "env"),
    (agents.DQN, {"env": "Pendulum-v1"}, "env"),
    (agents.PPO, {"learning_rate": 0.0}, "learning_rate"),
    (agents.PPO, {"learning_rate": -1e-3}, "learning_rate"),
    (agents.A2C, {"n_steps": 0}, "n_steps"),
    (agents.PPO, {"num_envs": -2}, "num_envs"),
    (agents.PPO, {"n_minibatches": 3}, "n_minibatches"),
    (agents.PPO, {"gamma": 1.5}, "gamma"),
    (agents.DQN, {"buffer_size": 0}, "buffer_size"),
    (agents.DQN, {"exploration_final_eps": 2.0}, "exploration_final_eps"),
    (agents.REINFORCE, {"gae_lambda": 0.9}, "gae_lambda"),
])
def test_bad_config_raises_naming_the_argument(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)


def test_dqn_rejects_box_actions_with_a_clear_message():
    with pytest.raises(ValueError, match="Discrete"):
        agents.DQN(env="Pendulum-v1")


# -- shared agents --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ppo():
    agent = agents.PPO(env="CartPole-v1", seed=0, num_envs=4, n_steps=32, normalize_obs=True)
    agent.learn(256, progress_bar=False)
    return agent


@pytest.fixture(scope="module")
def dqn():
    agent = agents.DQN(env="CartPole-v1", seed=0, learning_starts=64, train_freq=32,
                       gradient_steps=4, batch_size=32, buffer_size=1000,
                       hidden_sizes=(32, 32))
    agent.learn(256, progress_bar=False)
    return agent


def test_bad_learn_and_evaluate_arguments(ppo):
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="total_steps"):
            ppo.learn(bad)
    with pytest.raises(ValueError, match="n_episodes"):
        ppo.evaluate(0)
    with pytest.raises(ValueError, match="obs"):
        ppo.act(np.zeros((2, 5)))


def test_compiled_steps_trace_once(ppo, dqn):
    ppo.learn(256, progress_bar=False)
    dqn.learn(128, progress_bar=False)
    assert ppo.trace_counts == {"rollout": 1, "train": 1}
    assert dqn.trace_counts == {"collect": 1, "record": 1, "train": 1}
    # epsilon decayed linearly to its final value over exploration_fraction of the budget
    assert float(dqn.epsilon.numpy()) == pytest.approx(dqn.config.exploration_final_eps)


def test_dqn_target_update_hard_and_polyak(dqn):
    old = [v.numpy().copy() for v in dqn.q_target.trainable]
    online = [v.numpy().copy() for v in dqn.q.trainable]
    try:
        dqn.config.tau = 0.25
        dqn._update_target()
        for t, o, s in zip(dqn.q_target.trainable, old, online):
            np.testing.assert_allclose(t.numpy(), 0.25 * s + 0.75 * o, rtol=1e-5, atol=1e-6)
        dqn.config.tau = 1.0
        dqn._update_target()
        for t, s in zip(dqn.q_target.trainable, online):
            np.testing.assert_array_equal(t.numpy(), s)
    finally:
        dqn.config.tau = 1.0


def test_ppo_loss_gradient_never_reaches_targets(ppo):
    """Values computed inside the tape only reach the loss through the value head itself."""
    batch = ppo._rollout()
    obs = tf.reshape(batch["obs"], (-1, 4))
    with tf.GradientTape(persistent=True) as tape:
        values = tf.reshape(ppo.model.value(obs), [32, 4])
        fin = tf.reshape(ppo.model.value(tf.reshape(batch["final_obs"], (-1, 4))), [32, 4])
        nv = bootstrap_values(fin, batch["terminated"])
        adv, ret = gae(batch["rewards"], values, nv,
                       batch["terminated"] | batch["truncated"], 0.99, 0.95)
    for target in (nv, adv, ret):
        grads = tape.gradient(target, ppo.model.value_net.trainable_variables)
        assert all(g is None for g in grads)


def test_dqn_gradient_never_reaches_target_network(dqn):
    b = dqn.buffer
    idx = tf.range(16)
    args = [tf.gather(x, idx) for x in (b.obs, b.actions, b.rewards, b.next_obs, b.terminated)]
    with tf.GradientTape() as tape:
        loss, _, _ = dqn.loss(*args)
    grads = tape.gradient(loss, dqn.q_target.trainable + dqn.q.trainable)
    n = len(dqn.q_target.trainable)
    assert all(g is None for g in grads[:n])
    assert all(g is not None for g in grads[n:])
    with tf.GradientTape() as tape:
        target = dqn.td_targets(args[2], args[3], args[4])
    assert all(g is None for g in tape.gradient(target, dqn.q.trainable + dqn.q_target.trainable))


def test_distribution_and_q_values_differentiable_wrt_raw_obs(ppo, dqn):
    obs = tf.constant(np.random.default_rng(0).normal(size=(5, 4)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(obs)
        d = ppo.distribution(obs)
        lp = tf.reduce_sum(d.log_prob(tf.zeros(5, tf.int32)))
        q = tf.reduce_sum(dqn.q_values(obs)[:, 0])
    assert isinstance(d, tfp.distributions.Categorical)
    for out in (lp, q):
        g = tape.gradient(out, obs)
        assert g is not None and g.shape == obs.shape
        assert np.isfinite(g.numpy()).all() and np.abs(g.numpy()).sum() > 0
    # the normalisation is inside: the gradient equals the chain rule through 1/std
    std = np.sqrt(ppo.model.obs_norm.rms.var.numpy() + 1e-8)
    with tf.GradientTape() as tape:
        tape.watch(obs)
        x = ppo.model.obs_norm(obs)
    np.testing.assert_allclose(tape.gradient(x, obs).numpy()[0], 1 / std, rtol=1e-4)


def test_save_load_round_trip_identical_actions(ppo, dqn, tmp_path):
    obs = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    for agent in (ppo, dqn):
        d = tmp_path / agent.algo
        agent.save(d)
        assert {"config.json", "agent.json", "weights"} <= set(os.listdir(d))
        assert not any(name.endswith((".pkl", ".pickle")) for name in os.listdir(d))
        loaded = agents.load(d)
        assert type(loaded) is type(agent)
        assert int(loaded.num_timesteps.numpy()) == int(agent.num_timesteps.numpy())
        np.testing.assert_array_equal(loaded.act(obs, deterministic=True),
                                      agent.act(obs, deterministic=True))
        if agent is ppo:
            np.testing.assert_allclose(loaded.distribution(obs).logits_parameter().numpy(),
                                       agent.distribution(obs).logits_parameter().numpy())
            stats = np.load(d / "normalization.npz")
            np.testing.assert_array_equal(stats["mean"], agent.model.obs_norm.rms.mean.numpy())
        else:
            np.testing.assert_allclose(loaded.q_values(obs).numpy(), agent.q_values(obs).numpy())
    cfg = json.loads((tmp_path / "ppo" / "config.json").read_text())
    assert cfg["env"] == "CartPole-v1" and cfg["normalize_obs"] is True


def test_load_rejects_a_directory_without_an_agent(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        agents.load(tmp_path)


def test_callback_returning_false_stops_and_logs_are_recorded(ppo):
    seen = []

    def cb(agent, logs):
        seen.append(logs)
        return False

    before = int(ppo.num_timesteps.numpy())
    ppo.learn(10_000, callbacks=[cb], progress_bar=False)
    assert len(seen) == 1
    assert int(ppo.num_timesteps.numpy()) == before + 128
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                "grad_norm", "episode_return", "steps_per_second"):
        assert key in seen[0]


# -- continuous actions ----------------------------------------------------------------------


class _RecordActions(gym.Wrapper):
    seen: list = []

    def step(self, action):
        _RecordActions.seen.append(np.array(action))
        return super().step(action)


def test_gaussian_policy_clips_when_stepping_stores_unclipped():
    _RecordActions.seen = []
    agent = agents.PPO(env=lambda: _RecordActions(gym.make("Pendulum-v1")), num_envs=2,
                       n_steps=64, seed=0, log_std_init=1.0, n_epochs=4, target_kl=1e-12)
    agent._reset_env()
    batch = agent._rollout()
    stored = batch["actions"].numpy()
    sent = np.array(_RecordActions.seen)
    assert np.abs(stored).max() > 2.0  # unclipped samples are kept for the update
    assert np.abs(sent).max() <= 2.0  # the env only sees actions within its bounds
    np.testing.assert_allclose(sent.reshape(-1), np.clip(stored, -2, 2).reshape(-1))
    d = agent.distribution(np.zeros((3, 3), np.float32))
    np.testing.assert_allclose(d.stddev().numpy(), np.full((3, 1), np.e), rtol=1e-5)
    assert np.abs(agent.act(np.zeros((3, 3)), deterministic=False)).max() <= 2.0
    assert agent.act(np.zeros(3)).shape == (1,)
    # target-KL early stop: the first epoch moves the policy, the remaining three are skipped
    stats = agent._train(batch)
    assert stats["epochs"].numpy().tolist() == [1.0]  # [S]: one seed is the axis of one
    assert stats["updates_tried"].numpy().tolist() == [4.0]
    assert float(stats["approx_kl"][0]) > 0


# -- faults ----------------------------------------------------------------------------------


class _NaNObs(gym.Wrapper):
    """Returns a NaN observation every ``every`` steps (always when ``every == 1``)."""

    def __init__(self, env, every):
        super().__init__(env)
        self.every, self.t = every, 0

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.t += 1
        if self.t % self.every == 0:
            obs = np.full_like(obs, np.nan)
        return obs, r, term, trunc, info


def _weights(agent):
    return [v.numpy().copy() for v in agent.variables]


def test_nan_observations_are_skipped_counted_then_stop_training(tmp_path):
    agent = agents.A2C(env=lambda: _NaNObs(gym.make("CartPole-v1"), every=1), num_envs=2,
                       n_steps=8, seed=0, max_nonfinite_updates=3,
                       checkpoint_dir=str(tmp_path / "ckpt"))
    w0 = _weights(agent)
    with pytest.raises(agents.NonFiniteTrainingError, match="3 consecutive"):
        agent.learn(10_000, progress_bar=False)
    assert agent.rejected_steps == 3
    for a, b in zip(w0, _weights(agent)):
        np.testing.assert_array_equal(a, b)  # no rejected update touched the weights
    assert np.isfinite(agent.model.obs_norm.rms.mean.numpy()).all()


def test_occasional_nan_observation_skips_only_that_update():
    agent = agents.PPO(env=lambda: _NaNObs(gym.make("CartPole-v1"), every=50), num_envs=2,
                       n_steps=16, n_minibatches=2, n_epochs=1, seed=0)
    agent.learn(32 * 12, progress_bar=False)
    assert 0 < agent.rejected_steps < 24
    assert all(np.isfinite(w).all() for w in _weights(agent))


class _Boom(gym.Wrapper):
    def __init__(self, env, at):
        super().__init__(env)
        self.at, self.t = at, 0

    def step(self, action):
        self.t += 1
        if self.t == self.at:
            raise RuntimeError("simulator exploded")
        return self.env.step(action)


def test_env_exception_saves_checkpoint_then_propagates(tmp_path):
    ckpt = tmp_path / "ckpt"
    agent = agents.A2C(env=lambda: _Boom(gym.make("CartPole-v1"), at=30), num_envs=1,
                       n_steps=8, seed=0, checkpoint_dir=str(ckpt))
    with pytest.raises(RuntimeError, match="simulator exploded"), \
            pytest.warns(UserWarning, match="checkpoint saved"):
        agent.learn(1000, progress_bar=False)
    assert (ckpt / "agent.json").exists()
    meta = json.loads((ckpt / "agent.json").read_text())
    assert meta["num_timesteps"] == 24  # the three updates completed before the failure
    loaded = agents.load(ckpt, env=lambda: gym.make("CartPole-v1"))
    assert int(loaded.num_timesteps.numpy()) == 24


# -- command line ------------------------------------------------------------------------------


def test_cli_train_resume_and_evaluate(tmp_path, capsys):
    from robustgrad.cli import main

    out = tmp_path / "run"
    args = ["train-agent", "--algo", "a2c", "--env", "CartPole-v1", "--steps", "400",
            "--seed", "1", "--out", str(out), "--eval-episodes", "2", "--no-progress"]
    assert main(args) == 0
    for name in ("config.json", "agent.json", "weights", "checkpoint", "logs",
                 "learning_curve.png", "evaluation.json"):
        assert (out / name).exists(), name
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "logs"))
    assert int(agents.load(out).num_timesteps.numpy()) == 400
    assert main(args) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err
    resume = args[:6] + ["800"] + args[7:] + ["--resume"]
    assert main(resume) == 0
    assert "400 -> 800" in capsys.readouterr().out
    loaded = agents.load(out)
    assert int(loaded.num_timesteps.numpy()) == 800
    assert main(["evaluate-agent", "--agent", str(out), "--episodes", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(result["returns"]) == 3 and result["algo"] == "a2c"
    assert main(["train-agent", "--env", "NoSuchEnv-v0", "--out", str(tmp_path / "x")]) == 2
    assert "env" in capsys.readouterr().err


def test_same_seed_same_training():
    runs = []
    for _ in range(2):
        agent = agents.A2C(env="CartPole-v1", num_envs=2, n_steps=8, seed=3)
        agent.learn(64, progress_bar=False)
        runs.append(_weights(agent))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_custom_gradient_transform_chain():
    """``transform=`` replaces the default chain: a chain that zeroes every gradient freezes
    the weights although every step is applied."""
    from robustgrad import transforms

    seen = []
    agent = agents.A2C(env="CartPole-v1", num_envs=2, n_steps=8, seed=0,
                       transform=transforms.chain(
                           transforms.apply_if_finite(transforms.clip_by_value(0.0), 3)))
    w0 = _weights(agent)
    agent.learn(16, progress_bar=False, callbacks=lambda a, logs: seen.append(logs))
    assert seen[0]["grad_norm"] > 0 and seen[0]["updates_applied"] == 1
    for a, b in zip(w0, _weights(agent)):
        np.testing.assert_array_equal(a, b)
