"""The small fixed-weight models the attack, evaluation and training tests share.

Importable from every test directory (pytest puts ``tests/`` on ``sys.path`` for its conftest).
"""

import numpy as np
import tensorflow as tf


class Linear:
    """logits = [x.w, -x.w]: class 0 prefers large x.w. Optimal L∞ step is eps*sign(w)."""

    def __init__(self, w):
        self.w = tf.constant(np.asarray(w, np.float32).reshape(-1, 1))

    def __call__(self, x, training=False):
        s = tf.reshape(x, [tf.shape(x)[0], -1]) @ tf.cast(self.w, x.dtype)
        return tf.concat([s, -s], axis=1)


class SmallNet:
    """A fixed-weight 2-layer MLP on [B, 4, 4, 1] inputs with 5 classes; counts graph traces."""

    def __init__(self, seed=0, classes=5):
        rng = np.random.default_rng(seed)
        self.w1 = tf.constant(rng.normal(0, 1.0, (16, 32)).astype(np.float32))
        self.b1 = tf.constant(rng.normal(0, 0.1, (32,)).astype(np.float32))
        self.w2 = tf.constant(rng.normal(0, 1.0, (32, classes)).astype(np.float32))
        self.traces = 0
        self.training_seen = set()

    def __call__(self, x, training=False):
        if not tf.executing_eagerly():
            self.traces += 1
        self.training_seen.add(training)
        h = tf.reshape(tf.cast(x, tf.float32), [-1, 16]) - 0.5
        h = tf.nn.relu(h @ self.w1 + self.b1)
        return h @ self.w2


def small_batch(n=64, seed=1):
    return np.random.default_rng(seed).uniform(0, 1, (n, 4, 4, 1)).astype(np.float32)




# 32 CartPole-shaped observations the robust-RL tests attack
CARTPOLE_OBS = np.random.default_rng(0).normal(0.0, 0.5, size=(32, 4)).astype(np.float32)


def sharpened_ppo():
    """A fresh CartPole PPO agent whose near-uniform policy head (orthogonal init, gain 0.01) is
    scaled by 300, so KLs between its distributions are well above float32 noise."""
    import agents

    agent = agents.PPO(env="CartPole-v1", seed=0, preset=None, num_envs=2, n_steps=32)
    head = [v for v in agent.model.policy_net.trainable_variables if v.shape == (64, 2)]
    assert len(head) == 1
    head[0].assign(head[0] * 300.0)
    return agent


def assert_kl_beats_random_points(model, obs, obs_adv, eps):
    """An inner maximiser's KL(pi(.|obs) || pi(.|obs_adv)) beats random points of the L-inf ball:
    per row above the mean KL of 20 random points, on >= 75% of rows above their best (10 steps
    of eps/10 from a random start is a heuristic max), and > 3x their mean on average."""
    from agents.robustness import robust

    kl_max = robust.policy_kl(model, obs, obs_adv).numpy()
    rng = np.random.default_rng(1)
    kl_random = np.stack([
        robust.policy_kl(model, obs, obs + rng.uniform(-eps, eps, obs.shape)
                         .astype(np.float32)).numpy() for _ in range(20)])
    assert np.all(kl_max >= kl_random.mean(0))
    assert np.mean(kl_max >= kl_random.max(0)) >= 0.75
    assert kl_max.mean() > 3 * kl_random.mean()


def trained_digits_mlp(epochs: int, n_test: int):
    """A 32-unit MLP trained (seed 0) for ``epochs`` on the embedded digits, with the first
    ``n_test`` test examples and labels: the evaluation tests' small classifier."""
    import keras

    from robustgrad.data import load_digits

    (xtr, ytr), (xte, yte) = load_digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(xtr.shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(xtr, ytr, epochs=epochs, verbose=0)
    return model, xte[:n_test], yte[:n_test]
