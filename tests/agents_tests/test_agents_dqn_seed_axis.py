"""DQN on the seed axis (``num_seeds=S``): one code path for any S.

With ``S = 1`` the DQN must be the DQN of before (weights, target network, Adam moments, replay
buffer and priorities after a short seeded run; the run of commit ee9338f, before the seed axis,
as float fingerprints, tests/fingerprints.py: recorded on the CI machine from a tree whose bytes
there are those of the commit that had pinned it as SHA-256 digests written on another machine).
With ``S > 1`` each seed's slice must start as that seed alone and, fed the same minibatch, update
as that seed alone (TD loss, gradient norm, weights, Adam count, priorities, target network); each
seed samples its own transitions; a non-finite seed is rejected alone. Configs are small: traces
are expensive on 2 shared cores.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.core._step import SeedAxisAdamStep, make_adam_step
from agents.core.buffers import ReplayBuffer
from robustgrad.cli import main

from fingerprints import assert_same_fingerprint, fingerprint

SMALL = dict(env="CartPole-v1", num_envs=2, preset=None, learning_starts=32, train_freq=8,
             gradient_steps=4, batch_size=16, buffer_size=128, target_update_interval=20,
             hidden_sizes=(16,), normalize_obs=True)


def _fingerprint(agent):
    return fingerprint(agent.get_weights() + [v.numpy() for v in agent.q_target.trainable] + [
        agent.buffer.priority.numpy(), agent.buffer.obs.numpy(), agent.optimizer.m[0].numpy()])


@pytest.mark.parametrize("backend,prioritized,before", [
    ("graph", False, [199.51454382206396, 433.5379311623197, 144.50781794785652, 0.0]),
    ("graph", True, [342.22706430542496, 613.0082543352145, 169.94430057219944, 0.0]),
    ("gymnasium", False, [210.48386973851538, 473.2149125458629, 132.05910734435972, 0.0]),
    ("gymnasium", True, [345.80425852762914, 610.6037024870118, 166.95493602168173, 0.0])])
def test_one_seed_is_the_dqn_before_the_seed_axis(backend, prioritized, before):
    agent = agents.DQN(backend=backend, prioritized_replay=prioritized, seed=3, **SMALL)
    agent.learn(160, progress_bar=False)
    assert_same_fingerprint(_fingerprint(agent), before, "weights, target, buffer, moments")


def _fill(agent, n_steps):
    """``n_steps`` epsilon-greedy steps of every env into the replay buffer (the public
    ``collect``, then the learner's record)."""
    batch = agent.collect(**dict(agent._collection_args(0, 100.0), n_steps=n_steps))
    agent._record(batch, False)


def _copy_seed_state(many, s, one):
    """Seed ``s``'s observation statistics and replay buffer into ``one`` (by hand, not by
    export: the test must not lean on the code it checks)."""
    for a, b in zip(many.q.obs_norm.rms.variables, one.q.obs_norm.rms.variables):
        b.assign(a[s])
    buf, own = many.buffer, one.buffer
    for name in ("obs", "next_obs", "actions", "rewards", "terminated", "priority"):
        getattr(own, name).assign(getattr(buf, name)[s])
    own.max_priority.assign(buf.max_priority[s])
    own.size.assign(buf.size)
    own.pos.assign(buf.pos)


@pytest.mark.parametrize("overrides", [dict(), dict(prioritized_replay=True, double_dqn=False,
                                                    tau=0.5)])
def test_each_seeds_slice_updates_as_that_seed_alone(overrides):
    kw = {**SMALL, "backend": "graph", **overrides}
    many = agents.DQN(num_seeds=2, seed=4, **kw)
    alone = [agents.DQN(seed=s, **kw) for s in (4, 5)]
    for s, one in enumerate(alone):  # initial online and target networks: slice s is seed s's
        for x, y in zip(many.get_weights(), one.get_weights()):
            np.testing.assert_array_equal(x[s], y)
    _fill(many, 24)
    assert int(many.buffer.size.numpy()) == 48 and int(many.num_timesteps.numpy()) == 48
    idx, weights = many._sample(tf.constant(0.5))
    batch = many.buffer.gather(idx)
    stats, td = many._gradient_step(batch, weights)
    if many.config.prioritized_replay:
        many._update_priorities(idx, td)
    many._update_target()
    for s, one in enumerate(alone):
        _copy_seed_state(many, s, one)
        own, own_td = one._gradient_step({k: v[s] for k, v in batch.items()},
                                         None if weights is None else weights[s])
        if one.config.prioritized_replay:
            one._update_priorities(idx[s], own_td)
        one._update_target()
        for key in ("loss", "q_mean", "grad_norm", "updates_applied"):
            np.testing.assert_allclose(stats[key][s].numpy(), own[key].numpy(), rtol=2e-5,
                                       err_msg=key)
        np.testing.assert_allclose(td[s].numpy(), own_td.numpy(), rtol=1e-5, atol=1e-6)
        for x, y in zip(many.get_weights(), one.get_weights()):  # weights and obs statistics
            np.testing.assert_allclose(x[s], y, rtol=1e-5, atol=1e-6)
        for x, y in zip(many.q_target.trainable, one.q_target.trainable):
            np.testing.assert_allclose(x.numpy()[s], y.numpy(), rtol=1e-5, atol=1e-6)
        assert int(many.optimizer.iterations[s]) == int(one.optimizer.iterations.numpy()) == 1
        np.testing.assert_allclose(many.buffer.priority.numpy()[s], one.buffer.priority.numpy(),
                                   rtol=1e-5)


@pytest.mark.parametrize("prioritized", [False, True])
def test_each_seed_samples_its_own_transitions(prioritized):
    buf = ReplayBuffer(8, (1,), num_envs=2, prioritized=prioritized, num_seeds=3)
    for _ in range(4):  # seed s's envs (block s of 6) observe s
        buf.add(tf.constant([[0.0], [0.0], [1.0], [1.0], [2.0], [2.0]]), tf.zeros([6], tf.int32),
                tf.zeros([6]), tf.zeros([6, 1]), tf.zeros([6], tf.bool))
    if prioritized:  # seed 0 can draw slot 3 only, seed 1 slot 5, seed 2 slots 1 and 6
        prio = np.zeros((3, 8), np.float32)
        prio[0, 3], prio[1, 5], prio[2, [1, 6]] = 1.0, 2.0, 1.0
        buf.priority.assign(prio)
    idx, weights = buf.sample(tf.random.Generator.from_seed(1), 64, beta=1.0)
    assert idx.shape == (3, 64)
    np.testing.assert_array_equal(buf.gather(idx)["obs"][..., 0].numpy(),
                                  np.repeat([[0.0], [1.0], [2.0]], 64, axis=1))
    if prioritized:
        assert set(idx[0].numpy()) == {3} and set(idx[1].numpy()) == {5}
        assert set(idx[2].numpy()) == {1, 6} and abs(np.mean(idx[2].numpy() == 1) - 0.5) < 0.02
        np.testing.assert_allclose(weights.numpy(), 1.0)  # equal probabilities within a seed
        buf.update_priorities(idx, tf.fill([3, 64], 3.0), alpha=1.0, eps=0.0)
        np.testing.assert_allclose(buf.max_priority.numpy(), [3.0, 3.0, 3.0])
        assert buf.priority.numpy()[1, 3] == 0.0  # seed 1's slot 3 was not drawn: untouched
    else:
        assert weights is None and 0 <= idx.numpy().min() and idx.numpy().max() < 8


def test_the_seed_axis_buffer_gathers_the_same_rows_under_xla():
    bufs = [ReplayBuffer(8, (2,), num_envs=1, num_seeds=2, jit_compile=j) for j in (False, True)]
    obs = tf.reshape(tf.range(32, dtype=tf.float32), [8, 2, 2])
    for buf in bufs:
        for t in range(4):
            buf.add(obs[t], tf.constant([t, -t]), tf.zeros([2]), obs[t + 4], tf.zeros([2]))
    idx = tf.constant([[3, 0, 1], [2, 2, 0]], tf.int64)
    plain = tf.function(bufs[0].gather)(idx)
    xla = tf.function(bufs[1].gather, jit_compile=True)(idx)
    for key in plain:
        np.testing.assert_array_equal(plain[key].numpy(), xla[key].numpy())
    assert plain["actions"].numpy().tolist() == [[3, 0, 1], [-2, -2, 0]]


def test_seed_axis_adam_matches_separate_adams_through_a_rejected_step():
    # steps 1 and 3 take the fused path (every seed steps, equal counts); step 2 rejects seed 1
    # (non-finite), so step 3 runs the masked per-seed path (counts 3 and 2)
    init = np.array([[1.0, -2.0, 0.5], [0.3, 0.2, -0.1]], np.float32)
    grads = [np.array([[3.0, 4.0, 0.0], [0.1, -0.2, 0.3]], np.float32),
             np.array([[0.5, 0.5, -1.0], [np.nan, 0.0, 0.0]], np.float32),
             np.array([[-1.0, 2.0, 0.2], [2.0, 2.0, -9.0]], np.float32)]
    v = tf.Variable(init)
    step = SeedAxisAdamStep([v], 0.1, max_grad_norm=1.0)
    alone = [tf.Variable(init[s]) for s in (0, 1)]
    steps = [make_adam_step([a], 0.1, max_grad_norm=1.0)[0] for a in alone]
    for g in grads:
        out = step.step([tf.constant(g)])
        for s in (0, 1):
            own = steps[s].step([tf.constant(g[s])])
            assert bool(out["applied"][s]) == bool(own["applied"])
        # float32 round-off of two formulas (kernel and masked ops): ~1e-6 on steps of ~0.1;
        # a wrong bias correction or clip scale is off by 1e-3 or more
        np.testing.assert_allclose(v.numpy(), np.stack([a.numpy() for a in alone]), rtol=0,
                                   atol=5e-6)
    assert step.iterations.numpy().tolist() == [3, 2]


def test_a_nonfinite_seed_is_rejected_alone_and_the_other_steps():
    many = agents.DQN(num_seeds=2, seed=0, backend="graph", **SMALL)
    _fill(many, 16)
    idx, _ = many._sample(tf.constant(0.5))
    batch = dict(many.buffer.gather(idx))
    obs = batch["obs"].numpy()
    obs[1, 3, 0] = np.nan  # seed 1, row 3
    batch["obs"] = tf.constant(obs)
    before = many.get_weights()
    stats, _ = many._gradient_step(batch, None)
    assert stats["updates_applied"].numpy().tolist() == [1.0, 0.0]
    after = many.get_weights()
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(before, after))  # seed 1 untouched
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(before, after))  # seed 0 stepped
    assert many.optimizer.iterations.numpy().tolist() == [1, 0]


def test_exported_seeds_save_load_evaluate_certify_and_are_attacked(tmp_path):
    many = agents.DQN(num_seeds=2, seed=6, backend="gymnasium", **SMALL)
    many.learn(96, progress_bar=False)
    assert len(many.seed_histories[0]) == len(many.seed_histories[1]) == 6
    for call in (lambda: many.q_values(np.zeros((1, 4))), lambda: many.policy_surface(),
                 lambda: many.evaluate(1)):
        with pytest.raises(ValueError, match=r"this agent holds 2 seeds \(6-7\); "
                                             r"agent.export\(s\) gives seed s"):
            call()
    one = many.export(1)
    assert (one.config.seed, one.num_seeds, int(one.num_timesteps.numpy())) == (7, 1, 96)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(one.q_values(obs).numpy(),
                               many.q(tf.stack([tf.zeros([5, 4]), obs]))[1].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(one.buffer.obs.numpy(), many.buffer.obs.numpy()[1])
    from agents.robustness.certify import certified_actions
    assert certified_actions(one, obs, 0.0).numpy().all()  # eps 0: every unique greedy action
    adv = agents.attack_observations(one, obs, "mad", eps=0.1, seed=0)
    std = np.sqrt(one.q.obs_norm.rms.var.numpy() + 1e-8)  # eps in the seed's own std units
    np.testing.assert_array_equal(std, np.sqrt(many.q.obs_norm.rms.var.numpy()[1] + 1e-8))
    assert (np.abs(adv.numpy() - obs) <= 0.1 * std + 1e-5).all()
    assert np.abs(adv.numpy() - obs).max() > 0.05 * std.min()  # it moved the observations
    many.save(tmp_path / "many")
    assert sorted(os.listdir(tmp_path / "many")) == ["seed_6", "seed_7", "seeds.json"]
    loaded = agents.load(tmp_path / "many" / "seed_7")
    assert loaded.evaluate(2, seed=3)["returns"] == one.evaluate(2, seed=3)["returns"]
    back = agents.load(tmp_path / "many")  # resume: both seeds as one agent, buffer included
    assert back.seeds == [6, 7] and int(back.num_timesteps.numpy()) == 96
    for x, y in zip(back.get_weights(), many.get_weights()):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(back.buffer.obs.numpy(), many.buffer.obs.numpy())
    back.learn(16, progress_bar=False)
    assert int(back.num_timesteps.numpy()) == 112


def test_train_many_trains_dqn_seeds_on_the_seed_axis():
    cfg = agents.DQNConfig(**{k: v for k, v in SMALL.items() if k != "preset"}, backend="graph")
    trained = agents.train_many(cfg, seeds=[2, 5], steps=64)
    assert [(a.config.seed, a.num_seeds, int(a.num_timesteps.numpy())) for a in trained] == [
        (2, 1, 64), (5, 1, 64)]
    assert any(not np.array_equal(x, y) for x, y in zip(trained[0].get_weights(),
                                                        trained[1].get_weights()))


def test_an_interrupt_saves_every_dqn_seed_and_the_checkpoint_resumes(tmp_path):
    import signal

    from robustgrad.interrupts import TrainingInterrupted

    ckpt = str(tmp_path / "ckpt")
    agent = agents.DQN(num_seeds=2, seed=0, backend="graph", checkpoint_dir=ckpt, **SMALL)

    def interrupt(agent, logs):
        if logs["steps"] == 48:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted, match=f"at step 48; checkpoint saved to {ckpt}"):
        agent.learn(160, callbacks=[interrupt], progress_bar=False)
    resumed = agents.load(ckpt)
    assert resumed.seeds == [0, 1] and int(resumed.num_timesteps.numpy()) == 48
    assert int(resumed.buffer.size.numpy()) == 48  # the replay buffers came back too
    np.testing.assert_array_equal(resumed.buffer.actions.numpy(), agent.buffer.actions.numpy())
    resumed.learn(112, progress_bar=False, schedule_start=48)
    assert int(resumed.num_timesteps.numpy()) == 160


def test_seed_axis_dqn_learns_cartpole_quickly():
    agent = agents.DQN(env="CartPole-v1", backend="graph", seed=0, num_seeds=2, train_freq=64,
                       gradient_steps=32, hidden_sizes=(64, 64))  # the preset, smaller
    agent.learn(6_000, progress_bar=False)  # measured: seeds 0, 1 ~85, ~92 (2, 3: ~107, ~114)
    assert agent.trace_counts["iteration"] == 1
    for returns in agent.seed_episode_returns:
        assert np.mean(returns) > 60  # random policy ~22


def test_seed_axis_dqn_bad_input_is_refused_before_work():
    with pytest.raises(ValueError, match="num_seeds must be an int >= 1, got 0"):
        agents.DQN(num_seeds=0, **SMALL)
    with pytest.raises(ValueError, match="rollout_workers: Ray workers collect for one seed"):
        agents.DQN(num_seeds=2, rollout_workers=2, **SMALL)


def test_cli_dqn_seeds_train_on_the_seed_axis(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train-agent", "--algo", "dqn", "--backend", "graph", "--seeds", "0-1",
                 "--steps", "96", "--preset", "none", "--num-envs", "2", "--set",
                 "learning_starts=32", "--set", "train_freq=8", "--set", "gradient_steps=2",
                 "--set", "batch_size=16", "--set", "buffer_size=128", "--set",
                 "hidden_sizes=[16]", "--eval-episodes", "1", "--no-progress",
                 "--out", str(out)]) == 0
    assert "in groups of up to 32 seeds with a seed axis" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["design"] == "one program per group of seeds (seed axis)"
    for s in (0, 1):
        loaded = agents.load(out / f"seed_{s}")
        assert loaded.algo == "dqn" and loaded.config.seed == s and loaded.num_seeds == 1
        assert int(loaded.num_timesteps.numpy()) == 96
