"""The per-seed Adam of the seed axis after a rejection or a target_kl stop.

A seed whose update is rejected by the non-finite guard, or frozen by PPO's ``target_kl``, must
keep its weights, Adam moments and step count exactly, while the other seeds step; its next
step is then the step that seed takes alone (bias corrections from its own count).
"""

import numpy as np
import tensorflow as tf

import agents

SMALL = dict(env="CartPole-v1", backend="graph", num_envs=2, n_steps=8, n_minibatches=1,
             preset=None)


def _state(agent, s=None):
    """Weights, Adam moments and count (of seed ``s`` with the seed axis)."""
    opt = agent.optimizer
    arrays = [v.numpy() for v in agent.variables + opt.m + opt.v] + [opt.iterations.numpy()]
    return arrays if s is None else [a[s] for a in arrays]


def _update_inputs(agent, seed):
    """A PPO update's inputs ``[2, B, ...]``: seed 0's advantages are all zero (with no entropy
    bonus its policy gets no gradient, so its approximate KL stays 0), seed 1's are not."""
    rng = np.random.default_rng(seed)
    b = agent.config.n_steps * agent.config.num_envs
    obs = tf.constant(rng.normal(size=[2, b, 4]).astype(np.float32))
    actions = tf.constant(rng.integers(0, 2, size=[2, b]).astype(np.int32))
    logp_old = agent.model.distribution(obs).log_prob(actions)
    adv = rng.normal(size=[2, b]).astype(np.float32)
    adv[0] = 0.0
    returns = tf.constant(rng.normal(size=[2, b]).astype(np.float32))
    return obs, actions, logp_old, tf.constant(adv), returns, agent.model.value(obs)


def test_a_seed_frozen_by_target_kl_keeps_its_adam_state_while_the_other_steps():
    frozen = agents.PPO(num_seeds=2, seed=2, n_epochs=4, target_kl=1e-9, ent_coef=0.0, **SMALL)
    two_epochs = agents.PPO(num_seeds=2, seed=2, n_epochs=2, ent_coef=0.0, **SMALL)
    inputs = _update_inputs(frozen, 0)
    stats = tf.function(frozen._update)(*inputs)
    tf.function(two_epochs._update)(*inputs)
    # epoch 1's KL is 0 (ratio 1 before the first step); seed 1's epoch-2 KL exceeds 1e-9 and
    # freezes it for epochs 3-4; seed 0's policy has no gradient (KL 0): it runs all 4 epochs
    assert stats["epochs"].numpy().tolist() == [4.0, 2.0]
    assert frozen.optimizer.iterations.numpy().tolist() == [4, 2]
    for a, b in zip(_state(frozen, 1), _state(two_epochs, 1)):  # as if it stopped at 2 epochs
        np.testing.assert_array_equal(a, b)
    moved = [not np.array_equal(a, b) for a, b in zip(_state(frozen, 0), _state(two_epochs, 0))]
    assert any(moved)  # seed 0 took two more steps (its value network and moments moved)


def test_a_rejected_seed_keeps_its_adam_state_and_then_steps_as_alone():
    many = agents.PPO(num_seeds=2, seed=0, n_epochs=1, **SMALL)
    many._reset_env()
    one = many.export(1)  # seed 1 before any update
    batch = dict(many._rollout())
    obs = batch["obs"].numpy()
    obs[3, 1 * 2 + 0, 2] = np.nan  # step 3, seed 1, env 0 (envs [S * N], N = 2)
    batch["obs"] = tf.constant(obs)
    before = _state(many)
    stats = many._train(batch)
    assert stats["updates_applied"].numpy().tolist() == [1.0, 0.0]
    assert many.optimizer.iterations.numpy().tolist() == [1, 0]
    for a, b in zip(_state(many, 1), _state(one)):  # weights, m, v and count untouched
        np.testing.assert_array_equal(a, b)
    assert all(not np.array_equal(a[0], b[0]) for a, b in zip(_state(many), before))
    # the next (finite) update: seed 1's first Adam step (count 1) while seed 0 takes its second
    # (the counts differ: the masked path), equal to seed 1 stepping alone on its slice
    batch = many._rollout()
    many._train(batch)
    one._train({k: tf.reshape(v, (v.shape[0], 2, -1) + tuple(v.shape[2:]))[:, 1]  # seed 1's envs
                for k, v in batch.items()})
    assert many.optimizer.iterations.numpy().tolist() == [2, 1]
    for a, b in zip(_state(many, 1), _state(one)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
