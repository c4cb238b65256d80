"""agents.graph_envs: the compiled classic-control tasks against gymnasium, step by step."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from agents.graph_envs import GRAPH_ENV_IDS, GraphEnvState, GraphVecEnv, graph_env

IDS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0")

# rows that reach the interesting cases within a few steps: near the goal / pole falling (1)
# and, for the mountain cars, hitting the left wall (3); row 2 starts 3 steps before the time limit
NEAR_END = {
    "CartPole-v1": [0.0, 0.0, 0.2, 1.0],
    "Acrobot-v1": [2.5, 0.0, 0.0, 0.0],
    "MountainCar-v0": [0.49, 0.05],
    "MountainCarContinuous-v0": [0.44, 0.05],
    "Pendulum-v1": [3.0, 7.5],
}
AT_WALL = {"MountainCar-v0": [-1.18, -0.06], "MountainCarContinuous-v0": [-1.18, -0.06]}

# reset distributions of gymnasium 1.x: per physics column (low, high)
RESET_BOUNDS = {
    "CartPole-v1": [(-0.05, 0.05)] * 4,
    "Acrobot-v1": [(-0.1, 0.1)] * 4,
    "MountainCar-v0": [(-0.6, -0.4), (0.0, 0.0)],
    "MountainCarContinuous-v0": [(-0.6, -0.4), (0.0, 0.0)],
    "Pendulum-v1": [(-np.pi, np.pi), (-1.0, 1.0)],
}


def _random_actions(spec, rng, n):
    if spec.discrete:
        return rng.integers(0, spec.action_space.n, size=n).astype(np.int32)
    high = float(spec.action_space.high[0])
    return rng.uniform(-1.5 * high, 1.5 * high, size=(n, 1)).astype(np.float32)  # exercises clipping


def _gym_step(env, physics, time, action, discrete):
    """One gymnasium step from the given physical state and elapsed-step count."""
    state = np.asarray(physics, np.float64)
    env.unwrapped.state = state.astype(np.float32) if env.spec.id == "Acrobot-v1" else state
    env.unwrapped.steps_beyond_terminated = None  # CartPole: a fresh step, not one past the end
    env._elapsed_steps = int(time)
    return env.step(int(action) if discrete else np.asarray(action, np.float32))


def _in_reset_bounds(env_id, physics, tol=1e-6):
    for column, (low, high) in enumerate(RESET_BOUNDS[env_id]):
        values = physics[:, column]
        if not ((values >= low - tol) & (values <= high + tol)).all():
            return False
    return True


def test_ids_spaces_and_time_limits_are_gymnasium_s():
    assert GRAPH_ENV_IDS == IDS
    for env_id in IDS:
        spec, env = graph_env(env_id), gym.make(env_id)
        assert spec.observation_space == env.observation_space, env_id
        assert spec.action_space == env.action_space, env_id
        assert spec.max_episode_steps == gym.spec(env_id).max_episode_steps, env_id
        env.close()
    assert [graph_env(i).max_episode_steps for i in IDS] == [500, 500, 200, 200, 999]


def test_bad_arguments_raise_value_errors_naming_them():
    with pytest.raises(ValueError, match=r"env_id must be one of \('CartPole-v1', 'Acrobot-v1', "
                                         r"'MountainCar-v0', 'Pendulum-v1', 'MountainCarContinuous-v0'\), "
                                         r"got 'Hopper-v5'"):
        graph_env("Hopper-v5")
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float64'\), got 'float16'"):
        graph_env("CartPole-v1", dtype="float16")
    spec = graph_env("CartPole-v1")
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        spec.reset(0, 0)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        spec.reset(-1, 2)
    with pytest.raises(ValueError, match=r"seed must be a scalar or a \[2\] key, got shape \(3,\)"):
        spec.reset(tf.constant([1, 2, 3]), 2)
    env = GraphVecEnv("CartPole-v1", 2)
    with pytest.raises(ValueError, match=r"step\(\) called before reset\(\)"):
        env.step(np.array([0, 1]))
    env.reset()
    with pytest.raises(ValueError, match=r"actions must be 2 integers in \[0, 2\), got array\(\[0, 2\]\)"):
        env.step(np.array([0, 2]))
    with pytest.raises(ValueError, match=r"actions must be 2 integers in \[0, 2\)"):
        env.step(np.array([0.0, 1.0]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("env_id", IDS)
def test_steps_match_gymnasium_across_episode_boundaries(env_id, dtype):
    n, steps = 4, 40
    spec = graph_env(env_id, dtype)
    limit = spec.max_episode_steps
    state = spec.reset(seed=3, num_envs=n)
    physics = state.physics.numpy().copy()
    physics[1] = NEAR_END[env_id]
    if env_id in AT_WALL:
        physics[3] = AT_WALL[env_id]
    state = state._replace(physics=tf.constant(physics, spec.dtype),
                           time=tf.constant([0, 0, limit - 3, 5], tf.int32))
    step = tf.function(spec.step)
    env = gym.make(env_id, disable_env_checker=True)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == "float64" else dict(rtol=1e-5, atol=2e-5)
    returns = np.zeros(n)  # gymnasium's undiscounted return of each slot's running episode
    seen = {"terminated": 0, "truncated": 0, "wall": 0}
    for _ in range(steps):
        actions = _random_actions(spec, rng, n)
        before = state
        state, obs, reward, terminated, truncated, final_obs = step(state, tf.constant(actions))
        assert obs.dtype == final_obs.dtype == reward.dtype == tf.float32
        for i in range(n):
            g_obs, g_reward, g_term, g_trunc, _ = _gym_step(
                env, before.physics[i].numpy(), before.time[i], actions[i], spec.discrete)
            np.testing.assert_allclose(final_obs[i].numpy(), g_obs, **tol)
            np.testing.assert_allclose(reward[i].numpy(), g_reward, **tol)
            assert bool(terminated[i]) == g_term and bool(truncated[i]) == g_trunc, (env_id, i)
            returns[i] += g_reward
            if g_term or g_trunc:  # same-step autoreset: a fresh episode, its first observation
                np.testing.assert_allclose(float(before.episode_return[i]) + float(reward[i]), returns[i],
                                           rtol=1e-5)
                returns[i] = 0.0
                assert int(state.time[i]) == 0 and float(state.episode_return[i]) == 0.0
                assert _in_reset_bounds(env_id, state.physics[i : i + 1].numpy())
                assert not np.allclose(obs[i].numpy(), final_obs[i].numpy())
            else:
                assert int(state.time[i]) == int(before.time[i]) + 1
                np.testing.assert_array_equal(obs[i].numpy(), final_obs[i].numpy())
            seen["terminated"] += g_term
            seen["truncated"] += g_trunc
            if env_id in AT_WALL and g_obs[0] == np.float32(-1.2):
                seen["wall"] += 1
                assert g_obs[1] == 0.0 and final_obs[i, 1] == 0.0
        np.testing.assert_array_equal(obs.numpy(), spec.observe(state).numpy())
    env.close()
    assert seen["truncated"] >= 1, seen
    if env_id != "Pendulum-v1":
        assert seen["terminated"] >= 1, seen
    if env_id in AT_WALL:
        assert seen["wall"] >= 1, seen


@pytest.mark.parametrize("env_id", IDS)
def test_reset_distribution_within_gymnasium_bounds(env_id):
    spec = graph_env(env_id)
    physics = spec.reset(seed=7, num_envs=4000).physics.numpy()
    assert _in_reset_bounds(env_id, physics)
    for column, (low, high) in enumerate(RESET_BOUNDS[env_id]):
        values = physics[:, column]
        width = high - low
        if width == 0:
            assert (values == low).all()
            continue
        # uniform: both ends reached within 1% of the width, mean and std of U(low, high)
        assert values.min() < low + 0.01 * width and values.max() > high - 0.01 * width
        assert abs(values.mean() - (low + high) / 2) < 0.02 * width
        assert abs(values.std() - width / np.sqrt(12)) < 0.02 * width
    obs = spec.observe(spec.reset(seed=7, num_envs=4000)).numpy()
    assert spec.observation_space.contains(obs[0]) and np.isfinite(obs).all()


@functools.cache
def _rollout_fn(env_id, jit_compile=False, tag=""):
    """A compiled rollout of ``steps`` random-action steps (shared by the tests: traced once)."""
    spec = graph_env(env_id)
    traces = []

    @tf.function(jit_compile=jit_compile)
    def rollout(state, key, steps):
        traces.append(1)
        n = tf.shape(state.time)[0]
        total, dones = tf.zeros([n]), tf.zeros([n], tf.int32)
        obs = spec.observe(state)
        for t in tf.range(steps):
            k = tf.random.experimental.stateless_fold_in(key, t, alg="philox")
            # integer draws: the float ones differ under XLA (see classic_control.uniform01)
            if spec.discrete:
                a = tf.random.stateless_uniform([n], k, 0, spec.action_space.n, tf.int32, alg="philox")
            else:
                a = tf.random.stateless_uniform([n, 1], k, 0, 2001, tf.int32, alg="philox")
                a = tf.cast(a, tf.float32) / 1000.0 - 1.0
            state, obs, r, term, trunc, _ = spec.step(state, a)
            total += r
            dones += tf.cast(term | trunc, tf.int32)
        return state, obs, total, dones

    return spec, rollout, traces


def test_a_single_env_keeps_its_static_shape_in_a_compiled_loop():
    spec, rollout, _ = _rollout_fn("Pendulum-v1", tag="N=1")  # its own function: N is static
    state, obs, total, dones = rollout(spec.reset(0, 1), tf.constant([0, 1], tf.int64), tf.constant(201))
    assert state.physics.shape == (1, 2) and obs.shape == (1, 3) and int(dones[0]) == 1


def test_rollout_is_a_pure_function_of_seed_and_actions():
    spec, rollout, _ = _rollout_fn("CartPole-v1")
    key, steps = tf.constant([5, 6], tf.int64), tf.constant(200)
    a = rollout(spec.reset(0, 16), key, steps)
    b = rollout(spec.reset(0, 16), key, steps)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert int(tf.reduce_sum(a[3])) >= 16  # random CartPole episodes end within 200 steps
    c = rollout(spec.reset(1, 16), key, steps)
    assert not np.array_equal(a[0].physics.numpy(), c[0].physics.numpy())
    # the key advances: the reset states drawn after episodes end differ from the first ones
    first = spec.reset(0, 16)
    assert not np.array_equal(first.rng.numpy(), a[0].rng.numpy())
    # an integer tensor seed and a continued key are accepted
    np.testing.assert_array_equal(spec.reset(tf.constant(0), 16).physics.numpy(), first.physics.numpy())
    assert not np.array_equal(spec.reset(first.rng, 16).physics.numpy(), first.physics.numpy())


_SLOW_XLA = pytest.mark.slow  # each XLA compile takes seconds; one discrete, one Box task by default


@pytest.mark.parametrize("env_id", [
    "CartPole-v1", "Pendulum-v1", pytest.param("Acrobot-v1", marks=_SLOW_XLA),
    pytest.param("MountainCar-v0", marks=_SLOW_XLA),
    pytest.param("MountainCarContinuous-v0", marks=_SLOW_XLA)])
def test_compiled_rollout_traces_once_and_xla_agrees(env_id):
    spec, rollout, traces = _rollout_fn(env_id)
    _, xla_rollout, xla_traces = _rollout_fn(env_id, jit_compile=True)
    key = tf.constant([1, 2], tf.int64)
    # 250 steps: past Pendulum's time limit. Acrobot is chaotic: XLA's fused float32 arithmetic
    # rounds differently and the difference grows over hundreds of steps, so 30 steps there.
    long = 30 if env_id == "Acrobot-v1" else 250
    for seed, steps in ((0, 30), (1, long)):
        state = spec.reset(seed, 16)
        plain = rollout(state, key, tf.constant(steps))
        fused = xla_rollout(state, key, tf.constant(steps))
        np.testing.assert_allclose(fused[1].numpy(), plain[1].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(fused[2].numpy(), plain[2].numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(fused[3].numpy(), plain[3].numpy())
        np.testing.assert_array_equal(fused[0].time.numpy(), plain[0].time.numpy())
    assert len(traces) == 1 and len(xla_traces) == 1
    assert isinstance(plain[0], GraphEnvState)
    if env_id in ("CartPole-v1", "Pendulum-v1"):
        assert int(tf.reduce_sum(plain[3])) >= 16  # episodes ended and were reset inside the loop


def test_graph_vec_env_records_episodes_like_vec_env():
    env = GraphVecEnv("CartPole-v1", num_envs=3, seed=0)
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32 and env.obs_shape == (4,)
    assert env.discrete and env.action_low is None
    rng = np.random.default_rng(0)
    lengths, steps, ended = np.zeros(3, int), 0, []
    while len(ended) < 6:
        obs, reward, terminated, truncated, final_obs = env.step(rng.integers(0, 2, 3))
        steps += 1
        lengths += 1
        done = terminated | truncated
        assert reward.tolist() == [1.0, 1.0, 1.0]
        for i in np.nonzero(done)[0]:
            ended.append(int(lengths[i]))
            assert not np.array_equal(obs[i], final_obs[i])
            assert abs(final_obs[i, 0]) > 2.4 or abs(final_obs[i, 2]) > 12 * 2 * np.pi / 360
            assert (np.abs(obs[i]) <= 0.05).all()
        lengths[done] = 0
        np.testing.assert_array_equal(obs[~done], final_obs[~done])
    episodes = env.drain_episodes()
    assert [length for _, length in episodes] == ended  # in order of ending, slot order within a step
    assert [ret for ret, _ in episodes] == [float(length) for length in ended]
    assert env.drain_episodes() == []
    # reset(seed) replays the first reset; reset() continues the stream
    again = GraphVecEnv("CartPole-v1", num_envs=3, seed=0)
    first = again.reset()
    np.testing.assert_array_equal(again.reset(seed=0), first)
    assert not np.array_equal(again.reset(), first)
    env.close()


def test_graph_vec_env_continuous_and_tensor_outputs():
    env = GraphVecEnv("Pendulum-v1", num_envs=2, seed=1, as_numpy=False, jit_compile=True)
    obs = env.reset()
    assert isinstance(obs, tf.Tensor) and obs.shape == (2, 3)
    np.testing.assert_array_equal(env.action_low, [-2.0]) and np.testing.assert_array_equal(
        env.action_high, [2.0])
    for t in range(200):
        obs, reward, terminated, truncated, final_obs = env.step(np.full((2, 1), 0.5, np.float32))
        assert isinstance(reward, tf.Tensor)
        assert bool(truncated.numpy().all()) == (t == 199) and not terminated.numpy().any()
    episodes = env.drain_episodes()
    assert [length for _, length in episodes] == [200, 200]
    assert all(-200 * (np.pi ** 2 + 0.1 * 64 + 0.004) <= ret < 0 for ret, _ in episodes)
    with pytest.raises(ValueError, match=r"actions must be numbers of shape \(2, 1\)"):
        env.step(np.zeros((2, 2)))


def test_graph_vec_env_state_lives_in_variables_shared_with_compiled_code():
    env = GraphVecEnv("Acrobot-v1", num_envs=2, seed=0)
    env.reset()
    start = env.state

    @tf.function
    def external_step(actions):  # what an agent's compiled rollout does
        state = GraphEnvState(*(v.read_value() for v in env.variables))
        state, obs, *_ = env.spec.step(state, actions)
        for variable, value in zip(env.variables, state):
            variable.assign(value)
        return obs

    obs = external_step(tf.constant([0, 2]))
    after_external, expected, *_ = env.spec.step(start, tf.constant([0, 2]))
    # compiled and eager arithmetic may differ in the last bit
    np.testing.assert_allclose(obs.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)
    assert env.state.time.numpy().tolist() == [1, 1]
    obs, *_ = env.step(np.array([1, 1]))
    np.testing.assert_allclose(obs, env.spec.step(after_external, tf.constant([1, 1]))[1].numpy(),
                               rtol=1e-6, atol=1e-7)
    assert env.state.time.numpy().tolist() == [2, 2]
    assert all(isinstance(v, tf.Variable) and not v.trainable for v in env.variables)
