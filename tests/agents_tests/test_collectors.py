"""The collector contract (agents/core/collectors.py): the algorithms ask their collector, seeded runs
are unchanged by it, malformed batches are refused at the first batch naming the field, and Ray
workers use only the agent's public collection."""

import ast
import pathlib

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.core.collectors import (
    BATCH_FIELDS,
    Collector,
    GraphCollector,
    GymnasiumCollector,
    check_batch,
)

# Recorded on the tree before the collector contract (commit ee9338f, this machine): the same
# seeded runs must give the same learning curve and weights (bit for bit there; the weights are
# compared to 1e-6 relative, 1e-8 absolute here: another CPU's float order moves a weight of 6e-5
# by 1e-9).
BEFORE = {
    "ppo_graph": ([22.444444444444443, 25.733333333333334, 23.55],
                  [-0.0040818676352500916, -0.00012320578389335424, 6.154112634249032e-05,
                   -0.003718404797837138], 9.17612175465663),
    "ppo_gymnasium": ([20.4, 22.2, 23.6],
                      [-0.003218327881768346, -0.0009867462795227766, -7.429665129166096e-05,
                       -0.0035825662780553102], 774.1030383658976),
    "dqn_graph": ([18.0, 14.588235294117647, 9.6, 9.5, 9.6, 9.15],
                  [-0.017681390047073364, -0.0005212454707361758, -0.042036790400743484,
                   -0.00944455061107874], 1888.2941457020597),
}
PPO_RUN = dict(env="CartPole-v1", seed=3, num_envs=4, n_steps=64, n_epochs=2, n_minibatches=2)
DQN_RUN = dict(env="CartPole-v1", seed=4, num_envs=2, train_freq=64, learning_starts=128,
               batch_size=32, buffer_size=2000, gradient_steps=8, normalize_obs=True,
               target_update_interval=100)
RUNS = {"ppo_graph": (agents.PPO, dict(PPO_RUN, backend="graph")),
        "ppo_gymnasium": (agents.PPO, dict(PPO_RUN, normalize_obs=True)),
        "dqn_graph": (agents.DQN, dict(DQN_RUN, backend="graph"))}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_seeded_runs_are_those_of_the_tree_before_the_contract(name):
    cls, kw = RUNS[name]
    agent = cls(preset=None, **kw)
    agent.learn(768, progress_bar=False)
    returns, last, total = BEFORE[name]
    assert [h["episode_return"] for h in agent.history] == returns
    net = agent.model.policy_net if cls is agents.PPO else agent.q.net
    np.testing.assert_allclose(np.ravel(net.weights_[-1].numpy())[:4], last, rtol=1e-6,
                               atol=1e-8)
    got = sum(np.sum(np.asarray(w, np.float64)) for w in agent.get_weights())
    np.testing.assert_allclose(got, total, rtol=1e-6)
    fused = kw.get("backend") == "graph"
    assert isinstance(agent.collector, GraphCollector if fused else GymnasiumCollector)
    assert agent.collector.fused is fused and not agent.collector.remote


def test_both_local_collectors_give_the_same_batch_for_the_same_policy():
    # the graph CartPole and gymnasium's reset differently, but a batch has one layout; every
    # transition's final_obs is the next obs except where an episode ended (same-step autoreset)
    batches = {}
    for backend in ("gymnasium", "graph"):
        agent = agents.PPO(env="CartPole-v1", n_steps=40, num_envs=3, seed=0, preset=None,
                           backend=backend)
        batch = {k: v.numpy() for k, v in agent.collect().items()}
        check_batch(batch, 40, (3,), (4,), discrete=True)
        ends = batch["terminated"][:-1] | batch["truncated"][:-1]
        same = np.all(batch["final_obs"][:-1] == batch["obs"][1:], axis=-1)
        assert ends.any() and np.array_equal(same, ~ends)
        assert len(agent.collector.drain_episodes()) == int(ends.sum() + (
            batch["terminated"][-1] | batch["truncated"][-1]).sum())
        batches[backend] = batch
    for key in BATCH_FIELDS:
        assert batches["graph"][key].shape == batches["gymnasium"][key].shape, key
        assert batches["graph"][key].dtype == batches["gymnasium"][key].dtype, key


class _Broken(GymnasiumCollector):
    """The gymnasium collector with one field of its batches replaced."""

    def __init__(self, inner, field, make):
        super().__init__(inner.env)
        self.field, self.make, self.calls = field, make, 0

    def collect(self, rollout, **kwargs):
        self.calls += 1
        batch = dict(super().collect(rollout, **kwargs))
        batch[self.field] = self.make(batch[self.field])
        return batch


@pytest.mark.parametrize("algo, field, make, message", [
    ("ppo", "rewards", lambda x: tf.cast(x, tf.float64),
     r"batch field 'rewards': expected float32 of shape \(8, 2\), got float64 of shape \(8, 2\)"),
    ("ppo", "actions", lambda x: x[:, :1],
     r"batch field 'actions': expected int32 of shape \(8, 2\), got int32 of shape \(8, 1\)"),
    ("ppo", "obs", lambda x: tf.tensor_scatter_nd_update(x, [[0, 1, 2]], [np.nan]),
     r"batch field 'obs': the first observations must be finite; environment\(s\) \[1\] of 2 "
     r"hold NaN or inf"),
    ("dqn", "terminated", lambda x: tf.cast(x, tf.float32),
     r"batch field 'terminated': expected bool of shape \(8, 2\), got float32"),
    ("dqn", "final_obs", lambda x: x[..., :3],
     r"batch field 'final_obs': expected float32 of shape \(8, 2, 4\), got float32 of shape "
     r"\(8, 2, 3\)"),
])
def test_a_malformed_batch_is_refused_at_the_first_batch_naming_the_field(algo, field, make,
                                                                          message):
    kw = dict(env="CartPole-v1", num_envs=2, seed=0, preset=None)
    agent = (agents.PPO(n_steps=8, **kw) if algo == "ppo" else
             agents.DQN(train_freq=8, learning_starts=10_000, **kw))
    agent.collector = _Broken(agent.collector, field, make)
    w0 = agent.get_weights()
    with pytest.raises(ValueError, match=message):
        agent.learn(64, progress_bar=False)
    assert agent.collector.calls == 1 and int(agent.num_updates.numpy()) == 0
    for a, b in zip(w0, agent.get_weights()):
        np.testing.assert_array_equal(a, b)  # nothing learned from it


def test_the_batch_is_checked_once_not_in_the_hot_loop(monkeypatch):
    import agents.core.base as base  # the agent's collect() checks, with collectors.check_batch

    calls = []
    monkeypatch.setattr(base, "check_batch", lambda *a, **k: calls.append(1))
    agent = agents.A2C(env="CartPole-v1", n_steps=8, num_envs=2, seed=0, preset=None)
    agent.learn(16 * 5, progress_bar=False)
    assert int(agent.num_updates.numpy()) == 5
    assert len(calls) == 2  # the first observations at reset, then the first batch


class _NaNReset(gym.Wrapper):
    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return np.full_like(obs, np.nan), info


def test_nan_first_observations_are_refused_before_any_update():
    agent = agents.A2C(env=lambda: _NaNReset(gym.make("CartPole-v1")), n_steps=8, num_envs=2,
                       seed=0, preset=None)
    with pytest.raises(ValueError, match=r"batch field 'obs': the first observations must be "
                                         r"finite; environment\(s\) \[0, 1\] of 2"):
        agent.learn(64, progress_bar=False)
    assert int(agent.num_timesteps.numpy()) == 0


def test_a_remote_collector_has_no_traceable_step():
    class Remote(Collector):
        remote = True

        def collect(self, rollout, **kwargs):
            return {}

    env = agents.make_vec_env("CartPole-v1", 2)
    try:
        c = Remote(env)
        with pytest.raises(NotImplementedError, match="Remote steps its environments elsewhere"):
            c.begin(4)
        assert (c.num_envs, c.obs_shape, c.discrete, c.obs_dtype) == (2, (4,), True, tf.float32)
    finally:
        env.close()


def test_ray_workers_touch_no_private_member_of_the_agent():
    # the workers drive their copy through Agent.collect / load_policy_state / collector only
    source = pathlib.Path(agents.__file__).parent / "backends" / "distributed.py"
    tree = ast.parse(source.read_text())
    private = sorted({f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "agent" and node.attr.startswith("_")})
    assert private == []
