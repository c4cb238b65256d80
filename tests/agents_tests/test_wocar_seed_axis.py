"""WocaR on the seed axis (``num_seeds=S > 1`` with ``robust="wocar"``): PPO on discrete and Box
actions, and DQN.

Each seed's slice must do what the same seed does alone: the same initial worst-attack networks,
and, fed the same batch with each seed's random stream where the seed alone has it, the same
update (policy and worst-attack networks, their Adam counts, the logged ``wocar_*`` values). The
S-seed update runs its matmuls batched, which may round a last bit otherwise than one seed's
(agents.core.networks), so values are compared with the tolerances of the other methods' seed-axis
tests (tests/agents_tests/test_agents_seed_axis.py, test_agents_dqn_seed_axis.py), and the
integer and boolean results (Adam counts, admissible sets) exactly.

The smoothness term's search (PPO) is one engine call for all seeds, its random start one draw
(as SA's on the axis): the whole-update comparison runs with ``robust_kappa=0`` (the term weighs
nothing; the search still draws, so each seed's stream moves as alone), and the term itself is
compared per seed on the same inputs. Configs are small: traces are expensive on 2 shared cores.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.robustness import wocar
from agents.robustness.wocar_box import admissible_box
from robustgrad.cli import main

PPO_SMALL = dict(backend="graph", num_envs=2, n_steps=16, n_minibatches=2, n_epochs=2,
                 preset=None, robust="wocar", robust_eps=0.2, wocar_warmup=0.0,
                 wocar_q_epochs=2, wocar_q_minibatches=2, normalize_obs=True)

DQN_SMALL = dict(env="CartPole-v1", backend="graph", num_envs=2, preset=None, learning_starts=32,
                 train_freq=8, gradient_steps=4, batch_size=16, buffer_size=128,
                 target_update_interval=20, hidden_sizes=(16,), normalize_obs=True,
                 robust="wocar", robust_eps=0.1, wocar_warmup=0.0, wocar_q_every=1)

STATS = ("wocar_q_loss", "wocar_worst_q", "wocar_admissible")


def _seed_slices(many, batch, s):
    """Seed ``s``'s columns of a rollout ``[T, S * N, ...]`` (the collector's layout)."""
    return {k: tf.reshape(v, (v.shape[0], many.num_seeds, -1) + tuple(v.shape[2:]))[:, s]
            for k, v in batch.items()}


def _networks(agent):
    plugin = agent.robustness
    return list(plugin.critic.trainable_variables) + list(plugin.target.trainable_variables)


def _assert_initial_networks_are_each_seeds(many, alone):
    for s, one in enumerate(alone):
        for x, y in zip(_networks(many), _networks(one)):
            np.testing.assert_array_equal(x.numpy()[s], y.numpy())


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_each_seeds_slice_updates_as_that_seed_alone(env):
    kw = {**PPO_SMALL, "env": env, "robust_kappa": 0.0}
    many = agents.PPO(num_seeds=2, seed=4, **kw)
    alone = [agents.PPO(seed=s, **kw) for s in (4, 5)]
    assert type(many.robustness) is (wocar.WocaRPlugin if env == "CartPole-v1"
                                     else wocar.WocaRBoxPlugin)
    _assert_initial_networks_are_each_seeds(many, alone)
    assert _networks(many)[0].shape[0] == 2 and not np.array_equal(
        many.robustness.critic.weights_[0].numpy()[0], many.robustness.critic.weights_[0].numpy()[1])
    many._reset_env()
    batch = many._rollout()
    for g, s in zip(many.streams.generators, many.seeds):  # as the seeds alone: no rollout drawn
        g.reset_from_seed(s)
    stats = many._train(batch)
    for s, one in enumerate(alone):
        one._reset_env()
        own = one._train(_seed_slices(many, batch, s))
        for key in ("policy_loss", "value_loss", "entropy", "grad_norm", "approx_kl"):
            np.testing.assert_allclose(stats[key][s].numpy(), own[key].numpy(), rtol=2e-3,
                                       atol=1e-6, err_msg=key)
        for x, y in zip(many.get_weights(), one.get_weights()):
            np.testing.assert_allclose(x[s], y, rtol=1e-4, atol=1e-6)
        for x, y in zip(_networks(many), _networks(one)):  # 4 critic steps, 4 Polyak steps
            np.testing.assert_allclose(x.numpy()[s], y.numpy(), rtol=1e-4, atol=1e-6)
        opt = many.robustness.critic_optimizer
        assert int(opt.iterations[s]) == int(one.robustness.critic_optimizer.iterations) == 4
        for key in STATS:
            np.testing.assert_allclose(many.robustness._stats[key].numpy()[s],
                                       one.robustness._stats[key].numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=key)
        # the critic moved away from its start: the comparison above compares an update
        start = agents.PPO(seed=one.config.seed, **kw)
        assert not np.allclose(one.robustness.critic.weights_[0].numpy(),
                               start.robustness.critic.weights_[0].numpy())


def _pair(env, **overrides):
    """An S = 2 WocaR agent whose seeds have different observation statistics (so different
    units of eps) and a policy head scaled up (so the admissible sets are not all or one), and
    its two seeds exported as ordinary agents (worst-attack networks included)."""
    many = agents.PPO(num_seeds=2, seed=4, **{**PPO_SMALL, "env": env, "n_steps": 8,
                                              "robust_kappa": 0.5, **overrides})
    rms = many._obs_rms()
    d = rms.mean.shape[-1]
    rms.mean.assign(np.stack([np.linspace(-0.3, 0.3, d), np.linspace(0.5, -0.5, d)]))
    rms.var.assign(np.stack([np.linspace(0.5, 2.0, d), np.linspace(3.0, 0.2, d)]))
    head = many.model.policy_net.weights_[-1]
    head.assign(head * 100.0)
    return many, [many.export(s) for s in range(2)]


def _obs(shape, seed=0):
    return tf.constant(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def test_export_carries_each_seeds_worst_attack_networks_and_adam():
    many, alone = _pair("CartPole-v1")
    critic = many.robustness.critic.weights_[0]
    critic.assign(critic + tf.constant([[[1.0]], [[2.0]]]))  # each seed's own
    many.robustness.critic_optimizer.iterations.assign([3, 7])
    for s in range(2):
        one = many.export(s)
        for x, y in zip(_networks(many), _networks(one)):
            np.testing.assert_array_equal(x.numpy()[s], y.numpy())
        assert int(one.robustness.critic_optimizer.iterations) == [3, 7][s]
        one.robustness.critic.weights_[0].assign_add(tf.ones_like(
            one.robustness.critic.weights_[0]))
        many.import_seed(s, one)
        np.testing.assert_array_equal(critic.numpy()[s],
                                      one.robustness.critic.weights_[0].numpy())


@pytest.mark.parametrize("bound", ["ibp", "crown-ibp"])
def test_each_seeds_admissible_actions_are_its_own(bound):
    many, alone = _pair("CartPole-v1")
    obs = _obs([2, 64, 4])
    adm = wocar.admissible_actions(many.robustness.surface, obs, 0.02, bound).numpy()
    assert adm.shape == (2, 64, 2)
    for s, one in enumerate(alone):
        own = wocar.admissible_actions(one.robustness.surface, obs[s], 0.02, bound).numpy()
        np.testing.assert_array_equal(adm[s], own)
        assert 0 < (adm[s].sum(-1) == 2).sum() < 64  # some states admit both actions, not all


def test_each_seeds_admissible_box_is_its_own():
    many, alone = _pair("Pendulum-v1")
    obs = _obs([2, 16, 3])
    lower, upper = admissible_box(many.robustness.surface, obs, 0.1, "crown-ibp")
    assert lower.shape == (2, 16, 1)
    for s, one in enumerate(alone):
        own_lower, own_upper = admissible_box(one.robustness.surface, obs[s], 0.1, "crown-ibp")
        np.testing.assert_allclose(lower[s], own_lower, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(upper[s], own_upper, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_each_seeds_importance_and_smoothness_term_are_its_own(env):
    many, alone = _pair(env)
    plugin = many.robustness
    d = many.obs_shape[0]
    obs = _obs([2, 12, d])
    inputs = plugin.rollout_regularizer_inputs(obs)
    if env == "CartPole-v1":
        inputs = plugin._network_inputs(inputs)
    importance = inputs[-1].numpy()
    weighted, term = plugin.regularizer(obs, inputs)
    assert term.shape == (2,) and importance.shape == (2, 12)
    for s, one in enumerate(alone):
        mine = tuple(x[s] for x in inputs)  # the same s_hat for both (the search draws once)
        own_weighted, own_term = one.robustness.regularizer(obs[s], mine)
        # batched matmuls (the seed-axis policy) may round a last bit otherwise: rtol 1e-4, as
        # SA's convex term in test_robust_seed_axis.py
        np.testing.assert_allclose(term[s], own_term, rtol=1e-4)
        np.testing.assert_allclose(weighted[s], own_weighted, rtol=1e-4)
        # ω(s): the spread of seed s's own worst-attack values, mean 1 over its own rows
        if env == "CartPole-v1":
            own = wocar.state_importance(one.robustness.worst_q(obs[s])).numpy()
        else:  # the box searches are deterministic
            own = one.robustness.rollout_regularizer_inputs(obs[s])[-1].numpy()
        np.testing.assert_allclose(importance[s], own, rtol=1e-4, atol=1e-6)
        assert importance[s].mean() == pytest.approx(1.0, rel=1e-5)
        assert importance[s].std() > 0.01  # not all ones: the rows differ
        assert float(own_term) > 0.0


def test_the_dqn_term_and_scale_are_each_seeds():
    q = tf.constant([[[1.0, 2.0], [0.0, 4.0]], [[10.0, 0.0], [3.0, 3.0]]])  # [S, B, A]
    target = tf.constant([[1.0, 5.0], [40.0, 60.0]])
    np.testing.assert_array_equal(wocar.q_scale(target).numpy(), [3.0, 50.0])
    lb, ub = q - 1.0, q + 2.0
    actions = tf.constant([[0, 1], [1, 0]])
    both = wocar.worst_case_bound_loss(lb, ub, q, actions, target, 1.0, wocar.q_scale(target))
    for s in range(2):
        own = wocar.worst_case_bound_loss(lb[s], ub[s], q[s], actions[s], target[s], 1.0,
                                          wocar.q_scale(target[s]))
        np.testing.assert_array_equal(both[s].numpy(), own.numpy())
    np.testing.assert_array_equal(wocar.state_importance(q)[1].numpy(),
                                  wocar.state_importance(q[1]).numpy())  # [10, 0] -> [2, 0]
    assert wocar.state_importance(q)[1].numpy().tolist() == [2.0, 0.0]


def _copy_obs_statistics(many, s, one):
    for a, b in zip(many.q.obs_norm.rms.variables, one.q.obs_norm.rms.variables):
        b.assign(a[s])


def test_each_dqn_seeds_slice_updates_as_that_seed_alone():
    many = agents.DQN(num_seeds=2, seed=4, **DQN_SMALL)
    alone = [agents.DQN(seed=s, **DQN_SMALL) for s in (4, 5)]
    _assert_initial_networks_are_each_seeds(many, alone)
    batch = many.collect(**dict(many._collection_args(0, 100.0), n_steps=24))
    many._record(batch, False)
    batches = []
    for _ in range(3):  # three worst-attack steps (q_every=1), Polyak after each
        idx, _weights = many._sample(tf.constant(0.5))
        batches.append(many.buffer.gather(idx))
        stats, _td = many._gradient_step(batches[-1], None)
    assert float(many.robustness.schedule.eps) == pytest.approx(0.1)  # full strength
    for s, one in enumerate(alone):
        _copy_obs_statistics(many, s, one)
        for b in batches:
            own, _td = one._gradient_step({k: v[s:s + 1] for k, v in b.items()}, None)
        for key in ("loss", "q_mean", "grad_norm"):
            np.testing.assert_allclose(stats[key][s].numpy(), own[key].numpy()[0], rtol=2e-5,
                                       err_msg=key)
        for x, y in zip(many.get_weights(), one.get_weights()):
            np.testing.assert_allclose(x[s], y, rtol=1e-5, atol=1e-6)
        for x, y in zip(_networks(many), _networks(one)):
            np.testing.assert_allclose(x.numpy()[s], y.numpy(), rtol=1e-5, atol=1e-6)
        assert int(many.robustness.critic_optimizer.iterations[s]) == 3
        assert int(one.robustness.critic_optimizer.iterations) == 3
        for key in STATS + ("wocar_bound_loss", "wocar_td_loss", "wocar_width", "wocar_scale"):
            np.testing.assert_allclose(many.robustness._stats[key].numpy()[s],
                                       one.robustness._stats[key].numpy(), rtol=2e-5, atol=1e-6,
                                       err_msg=key)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_short_run_logs_each_seed_saves_and_resumes(algo, tmp_path):
    if algo == "ppo":
        many = agents.PPO(num_seeds=2, seed=0, env="CartPole-v1", **PPO_SMALL)
        steps = 64
    else:
        many = agents.DQN(num_seeds=2, seed=0, **DQN_SMALL)
        steps = 96
    many.learn(steps, progress_bar=False)
    entry, seeds = many.history[-1], [h[-1] for h in many.seed_histories]
    for key in STATS:
        values = [h[key] for h in seeds]
        assert entry[key] == pytest.approx(np.mean(values)) and np.isfinite(values).all()
    many.save(tmp_path / "many")
    for s in range(2):
        one = agents.load(tmp_path / "many" / f"seed_{s}")
        assert (one.num_seeds, one.config.robust) == (1, "wocar")
        for x, y in zip(_networks(many), _networks(one)):
            np.testing.assert_array_equal(x.numpy()[s], y.numpy())
    back = agents.load(tmp_path / "many")
    assert back.seeds == [0, 1]
    for x, y in zip(_networks(many), _networks(back)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    np.testing.assert_array_equal(back.robustness.critic_optimizer.iterations.numpy(),
                                  many.robustness.critic_optimizer.iterations.numpy())
    for x, y in zip(back.robustness.critic_optimizer.m, many.robustness.critic_optimizer.m):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    before = back.robustness.critic_optimizer.iterations.numpy().copy()
    back.learn(steps // 2, progress_bar=False, schedule_start=steps)
    assert (back.robustness.critic_optimizer.iterations.numpy() > before).all()


def test_cli_trains_wocar_seeds_on_the_seed_axis(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train-agent", "--algo", "ppo", "--backend", "graph", "--seeds", "0,1",
                 "--steps", "32", "--preset", "none", "--num-envs", "2", "--set", "n_steps=8",
                 "--set", "n_minibatches=1", "--robust", "wocar", "--eps", "0.05",
                 "--eval-episodes", "0", "--no-progress", "--out", str(out)]) == 0
    assert "in groups of up to 32 seeds with a seed axis" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["design"] == "one program per group of seeds (seed axis)"
    critics = []
    for s in (0, 1):
        loaded = agents.load(out / f"seed_{s}")
        assert (loaded.config.seed, loaded.num_seeds, loaded.config.robust,
                loaded.config.robust_eps) == (s, 1, "wocar", 0.05)
        assert int(loaded.robustness.critic_optimizer.iterations) > 0  # its critic trained
        critics.append(loaded.robustness.critic.weights_[0].numpy())
    assert critics[0].shape == (4, 64) and not np.array_equal(*critics)
