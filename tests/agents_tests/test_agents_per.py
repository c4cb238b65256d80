"""Prioritised experience replay in DQN: sampling frequencies, importance weights,
priority updates (NaN included), new transitions at the top priority, XLA, bad config."""

import numpy as np
import pytest
import tensorflow as tf

import agents


def _dqn(**kwargs):
    base = dict(env="CartPole-v1", seed=0, learning_starts=32, train_freq=32, gradient_steps=4,
                batch_size=64, buffer_size=200, hidden_sizes=(16, 16), prioritized_replay=True)
    return agents.DQN(**{**base, **kwargs})


@pytest.fixture(scope="module")
def dqn():
    return _dqn()


def test_sampling_frequencies_and_importance_weights(dqn):
    size = 10
    prio = np.zeros(200, np.float32)
    prio[:size] = np.arange(1, size + 1, dtype=np.float32)  # P(i) = (i+1) / 55
    prio[size:20] = 7.0  # slots past `size` must never be drawn even if non-zero
    dqn.buffer.priority.assign(prio)
    dqn.buffer.size.assign(size)
    beta = 0.7
    counts = np.zeros(200)
    sample = tf.function(dqn._sample)
    for _ in range(300):
        idx, w = sample(tf.constant(beta))
        assert idx.shape == w.shape == (1, dqn.config.batch_size)  # the seed axis of one
        idx, w = idx.numpy()[0], w.numpy()[0]
        assert idx.min() >= 0 and idx.max() < size
        p = prio[idx] / prio[:size].sum()
        expected_w = (size * p) ** -beta
        np.testing.assert_allclose(w, expected_w / expected_w.max(), rtol=1e-5)
        counts += np.bincount(idx, minlength=200)
    freq = counts[:size] / counts.sum()
    target = prio[:size] / prio[:size].sum()
    # 19,200 draws (stratified): each frequency within 15% of P(i)
    np.testing.assert_allclose(freq, target, rtol=0.15)


def test_priority_update_nonfinite_gets_zero_and_max_tracks(dqn):
    dqn.buffer.priority.assign(np.ones(200, np.float32))
    dqn.buffer.max_priority.assign(1.0)
    td = tf.constant([0.5, -3.0, np.nan, 100.0])
    dqn._update_priorities(tf.constant([1, 2, 3, 4], tf.int64), td)
    cfg = dqn.config
    got = dqn.buffer.priority.numpy()
    want = (np.abs([0.5, -3.0]) + cfg.priority_eps) ** cfg.priority_alpha
    np.testing.assert_allclose(got[1:3], want, rtol=1e-6)
    assert got[3] == 0.0  # the NaN transition is never drawn again
    np.testing.assert_allclose(dqn.buffer.max_priority.numpy(),
                               (100.0 + cfg.priority_eps) ** cfg.priority_alpha, rtol=1e-6)
    assert got[0] == 1.0 and got[5] == 1.0  # others untouched


def test_new_transitions_enter_at_the_top_priority():
    agent = _dqn(buffer_size=500)
    agent.learn(64, progress_bar=False)  # 32 random steps, then updates start
    prio = agent.buffer.priority.numpy()
    n = int(agent.buffer.size.numpy())
    assert n == 64 and np.all(prio[n:] == 0) and np.all(prio[:n] > 0)
    top = float(agent.buffer.max_priority.numpy())
    assert top > 1.0  # raised by the TD errors of the first updates
    # collection only (no update afterwards, which would re-prioritise what it draws)
    batch = agent.collect(**dict(agent._collection_args(64, 1.0), n_steps=32))
    agent._record(batch, False)
    np.testing.assert_allclose(agent.buffer.priority.numpy()[64:96], top, rtol=1e-6)


def test_weighted_loss_equals_weighted_mean_of_huber(dqn):
    b = 8
    obs = tf.random.stateless_normal([b, 4], [1, 2])
    args = (obs, tf.zeros([b], tf.int32), tf.ones([b]), obs + 0.1, tf.zeros([b]))
    w = tf.linspace(0.1, 1.0, b)
    loss, _q, td = dqn.loss(*args, w)
    a = tf.abs(td)
    huber = tf.where(a <= 1.0, 0.5 * td ** 2, a - 0.5)
    np.testing.assert_allclose(loss.numpy(), tf.reduce_mean(w * huber).numpy(), rtol=1e-6)
    plain, _, _ = dqn.loss(*args)
    np.testing.assert_allclose(plain.numpy(), tf.reduce_mean(huber).numpy(), rtol=1e-6)


def test_prioritized_update_compiles_with_xla():
    agent = _dqn(jit_compile=True)
    agent.learn(96, progress_bar=False)
    assert agent.trace_counts["train"] == 1
    assert np.isfinite(agent.buffer.priority.numpy()).all()


@pytest.mark.parametrize("field, value, match", [
    ("priority_alpha", 1.5, r"^priority_alpha must be a number in \[0, 1\], got 1.5$"),
    ("priority_beta", -0.1, r"^priority_beta must be a number in \[0, 1\], got -0.1$"),
    ("priority_eps", 0.0, r"^priority_eps must be a number > 0, got 0.0$"),
])
def test_bad_priority_config(field, value, match):
    with pytest.raises(ValueError, match=match):
        agents.DQNConfig(**{field: value})
