"""The agents' optimizer is the core's ``transforms.adam`` (fused kernel) behind the guard:
same results as the previous version's hand-written Adam, and its saved agents still load."""

import os

import numpy as np
import pytest
import tensorflow as tf

import agents
from robustgrad import transforms

DATA = os.path.join(os.path.dirname(__file__), "data", "saved_v2")


def _summary(agent):
    return [float(np.sum(w.astype(np.float64))) for w in agent.get_weights()]


# Recorded on main at 2c7f888 (agents/_fused_adam.py's FusedAdam), before the optimizer became a
# transforms chain: the sums of every weight array after a short run with a fixed seed.
REFERENCE = {
    "ppo": [0.0001, 0.0, 4.0, -0.002180428695282899, 0.0, -1.7834792602807283,
            -0.016098720188892912, -0.008923197747208178, 0.0014951212797313929,
            -1.640225013718009, -0.6093292743898928],
    "ppo_graph": [0.0001, 0.0, 4.0, 0.00767075369367376, 0.0, -1.63651814032346,
                  -0.009808020869968459, -0.0029818175826221704, 0.0015021392609924078,
                  -4.5918186120688915, -0.48893669294193387],
    "dqn": [-0.0781456958502531, 0.045051977038383484, -4.515834000543691, -2.1517675815848634,
            0.0001, 0.0, 4.0, -0.0752614876255393, 0.042090870440006256, -4.5232054750667885,
            -2.1886651688837446],
}


def _ppo(seed, backend):
    return agents.PPO(env="CartPole-v1", seed=seed, num_envs=2, n_steps=16, n_minibatches=2,
                      n_epochs=2, hidden_sizes=(16,), preset=None, backend=backend)


@pytest.mark.parametrize("name", ["ppo", "ppo_graph", "dqn"])
def test_same_results_as_the_previous_adam(name):
    if name == "dqn":
        agent = agents.DQN(env="CartPole-v1", seed=5, learning_starts=32, train_freq=16,
                           gradient_steps=4, batch_size=16, buffer_size=200, hidden_sizes=(16,),
                           preset=None)
        agent.learn(96, progress_bar=False)
    else:
        agent = _ppo(3 if name == "ppo" else 4, "graph" if name == "ppo_graph" else "gymnasium")
        agent.learn(64, progress_bar=False)
    np.testing.assert_allclose(_summary(agent), REFERENCE[name], rtol=1e-5, atol=1e-6)
    assert agent.gradient_step._fused is not None  # the fused kernel path
    assert isinstance(agent.gradient_step.optimizer, transforms.GradientTransformation)


@pytest.mark.parametrize("algo,steps", [("ppo", 8), ("dqn", 20)])
def test_agents_saved_by_the_previous_version_load_with_their_adam_state(algo, steps):
    """``data/saved_v2`` was written by ``Agent.save`` at 2c7f888 (FusedAdam: optimizer/m, v,
    iterations int64, learning_rate); every value must land in the new chain's state."""
    path = os.path.join(DATA, algo)
    agent = agents.load(path)
    reader = tf.train.load_checkpoint(os.path.join(path, "weights", "ckpt"))
    state = agent.gradient_step.optimizer_state[0]
    assert int(state.count) == steps == reader.get_tensor(
        "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE")
    for i, (m, v) in enumerate(zip(state.mu, state.nu)):
        np.testing.assert_array_equal(
            m.numpy(), reader.get_tensor(f"optimizer/m/{i}/.ATTRIBUTES/VARIABLE_VALUE"))
        np.testing.assert_array_equal(
            v.numpy(), reader.get_tensor(f"optimizer/v/{i}/.ATTRIBUTES/VARIABLE_VALUE"))
    assert np.abs(np.concatenate([x.numpy().ravel() for x in state.nu])).sum() > 0
    agent.learn(64 if algo == "ppo" else 32, progress_bar=False)  # training continues from it
    assert int(agent.gradient_step.optimizer_state[0].count) > steps


def test_rejected_update_leaves_adam_untouched():
    agent = _ppo(0, "gymnasium")
    agent.learn(32, progress_bar=False)
    before = [x.numpy().copy() for x in tf.nest.flatten(agent.gradient_step.optimizer_state)]
    weights = agent.get_weights()
    stats = agent.gradient_step.step([tf.fill(v.shape, np.nan) for v in agent.variables])
    assert not bool(stats["applied"])
    for a, b in zip(before, tf.nest.flatten(agent.gradient_step.optimizer_state)):
        np.testing.assert_array_equal(a, b.numpy())
    for a, b in zip(weights, agent.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_save_load_round_trip_keeps_the_adam_state(tmp_path):
    agent = _ppo(1, "gymnasium")
    agent.learn(32, progress_bar=False)
    agent.save(str(tmp_path / "a"))
    loaded = agents.load(str(tmp_path / "a"))
    for a, b in zip(tf.nest.flatten(agent.gradient_step.optimizer_state),
                    tf.nest.flatten(loaded.gradient_step.optimizer_state)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
