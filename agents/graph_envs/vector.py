"""A stateful env with :class:`agents.envs.VecEnv`'s interface over a compiled env.

:class:`GraphVecEnv` keeps the :class:`~agents.graph_envs.core.GraphEnvState` of ``num_envs``
compiled environments in ``tf.Variable`` objects (:attr:`GraphVecEnv.variables`) and the
``(return, length)`` of finished episodes in a ring buffer of variables, written inside the
graph and emptied from Python by :meth:`~GraphVecEnv.drain_episodes`. It offers what the
agents read from a ``VecEnv``: ``num_envs``, ``single_observation_space``,
``single_action_space``, ``obs_shape``, ``discrete``, ``action_low``/``action_high``, ``obs``,
``error``, ``reset``, ``step`` (eager: NumPy in, NumPy out, validated actions, one compiled
call, optionally ``jit_compile=True``; ``as_numpy=False`` returns tensors), ``drain_episodes``
and ``close``.

Compiled code (an agent's rollout) steps the same state in one of two ways:

* :meth:`~GraphVecEnv.step_graph` ``(actions)``: reads the variables, steps, assigns them and
  records the episodes that ended (simple; a few variable reads and writes per step);
* the carry form, cheaper inside a loop: ``state = env.state`` once, then
  ``state, out, ended = env.step_state(state, actions)`` per step (pure, no variable access),
  and after the loop ``env.write_state(state)`` and ``env.record_episodes(done, *ended)`` once
  for the whole ``[T, N]`` block (same episodes, same order as stepping with ``step_graph``).

The env state is not part of an agent's checkpoint: a loaded or resumed agent resets its
environments from ``config.seed`` before training again, as with the gymnasium backend.

>>> env = GraphVecEnv("MountainCar-v0", num_envs=2, seed=0)
>>> obs = env.reset()
>>> obs.shape, obs.dtype.name, bool(((-0.6 <= obs[:, 0]) & (obs[:, 0] < -0.4)).all())
((2, 2), 'float32', True)
>>> obs, reward, terminated, truncated, final_obs = env.step(np.array([2, 0]))
>>> reward.tolist(), terminated.tolist(), truncated.tolist()
([-1.0, -1.0], [False, False], [False, False])
>>> cartpole = GraphVecEnv("CartPole-v1", num_envs=2, seed=0)
>>> _ = cartpole.reset()
>>> @tf.function
... def always_left(steps):  # the carry form: state in the loop, one write at the end
...     state = cartpole.state
...     done, ret, length = (tf.TensorArray(d, size=steps) for d in (tf.bool, tf.float32, tf.int32))
...     for t in tf.range(steps):
...         state, out, ended = cartpole.step_state(state, tf.zeros([2], tf.int32))
...         done, ret, length = (done.write(t, out[2] | out[3]), ret.write(t, ended[0]),
...                              length.write(t, ended[1]))
...     cartpole.write_state(state)
...     cartpole.record_episodes(done.stack(), ret.stack(), length.stack())
>>> always_left(tf.constant(30))  # pushing left ends an episode in about 10 steps
>>> episodes = cartpole.drain_episodes()
>>> len(episodes) >= 2 and all(ret == length and 8 <= length <= 30 for ret, length in episodes)
True
>>> cartpole.drain_episodes()
[]
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.graph_envs.core import GraphEnvSpec, GraphEnvState, graph_env
from robustgrad.checks import positive_int


class GraphVecEnv:
    """``num_envs`` copies of a compiled task seen as a :class:`agents.envs.VecEnv` (module doc).

    ``env``: a gymnasium id with a compiled implementation or a :class:`GraphEnvSpec`;
    ``seed``: the first :meth:`reset` uses it (``None``: a random seed); later resets without
    a seed continue the RNG stream of the state, as ``VecEnv`` does. ``dtype``: the physics
    dtype; episode returns are accumulated in it. ``jit_compile``: XLA for the eager
    :meth:`step`. ``as_numpy=False``: :meth:`reset` and :meth:`step` return tensors.
    ``episode_capacity``: how many finished episodes the ring buffer holds between two
    :meth:`drain_episodes` (the oldest are overwritten beyond it; default
    ``max(1024, 4 * num_envs)``).

    The state lives in :attr:`variables`, a :class:`GraphEnvState` of ``tf.Variable``: code
    compiled elsewhere can read them (:attr:`state`), call ``spec.step`` or :meth:`step_state`
    and assign the result back (:meth:`write_state`), sharing one state with this env.
    """

    def __init__(self, env: str | GraphEnvSpec, num_envs: int, seed: int | None = 0, *,
                 dtype: str = "float32", jit_compile: bool = False, as_numpy: bool = True,
                 episode_capacity: int | None = None):
        self.spec = env if isinstance(env, GraphEnvSpec) else graph_env(env, dtype)
        self.num_envs = positive_int(num_envs, "num_envs")
        if seed is not None:
            positive_int(seed, "seed", minimum=0)
        self.capacity = positive_int(episode_capacity or max(1024, 4 * self.num_envs),
                                     "episode_capacity")
        self.single_observation_space = self.spec.observation_space
        self.single_action_space = self.spec.action_space
        self.obs_shape = tuple(self.single_observation_space.shape)
        self.discrete = self.spec.discrete
        space = self.single_action_space
        if isinstance(space, gym.spaces.Discrete):  # self.discrete
            self.action_low = self.action_high = None
        else:
            self.action_low = np.asarray(space.low, np.float32)
            self.action_high = np.asarray(space.high, np.float32)
        self.as_numpy = bool(as_numpy)
        self._seed = seed
        self._was_reset = False
        initial = self.spec.reset(0, self.num_envs)  # replaced by the first reset()
        self.variables = GraphEnvState(*(tf.Variable(value, trainable=False, name=f"env_{name}")
                                         for name, value in initial._asdict().items()))
        # slot `capacity` is a sink for the environments that did not finish an episode
        self._ep_returns = tf.Variable(tf.zeros([self.capacity + 1], self.spec.dtype),
                                       trainable=False, name="episode_returns")
        self._ep_lengths = tf.Variable(tf.zeros([self.capacity + 1], tf.int32), trainable=False,
                                       name="episode_lengths")
        self._ep_count = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                     name="episode_count")
        self._step = tf.function(self.step_graph, jit_compile=bool(jit_compile))
        self.obs: Any = None
        self.error: BaseException | None = None  # the compiled env does not raise mid-step

    # -- state ------------------------------------------------------------------------------
    @property
    def state(self) -> GraphEnvState:
        """The current state as tensors read from :attr:`variables`."""
        return GraphEnvState(*(v.read_value() for v in self.variables))

    def write_state(self, state: GraphEnvState) -> None:
        """Assign ``state`` (e.g. the carry of a compiled loop) to :attr:`variables`."""
        for variable, value in zip(self.variables, state):
            variable.assign(value)

    def reset(self, seed: int | None = None) -> np.ndarray | tf.Tensor:
        """Reset every environment (and forget unread episodes); returns ``[num_envs,
        *obs_shape]`` float32 observations."""
        if seed is None:
            seed = self._seed if self._seed is not None or not self._was_reset \
                else self.variables.rng.read_value()
        if seed is None:  # no seed ever given: draw one like gymnasium's unseeded reset
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._seed = None
        state = self.spec.reset(seed, self.num_envs)
        self.write_state(state)
        self._ep_count.assign(0)
        self._was_reset = True
        self.obs = self._out(self.spec.observe(state))
        return self.obs

    # -- stepping in the graph -----------------------------------------------------------------
    def step_state(self, state: GraphEnvState, actions: tf.Tensor) -> tuple:
        """One pure step of all environments from ``state`` (no variable access).

        ``actions``: ``[N]`` int32 (discrete) or ``[N, 1]`` float32 (already within the
        action bounds). Returns ``(new_state, (obs, reward, terminated, truncated, final_obs),
        (ended_return, ended_length))``: ``spec.step``'s outputs with same-step autoreset and,
        per environment, the return (physics dtype) and length ``[N]`` int32 that its episode
        has if it ended on this step (meaningful where ``terminated | truncated``).
        """
        new_state, obs, reward, terminated, truncated, final_obs = self.spec.step(state, actions)
        ended_return = state.episode_return + tf.cast(reward, state.episode_return.dtype)
        return (new_state, (obs, reward, terminated, truncated, final_obs),
                (ended_return, state.time + 1))

    def record_episodes(self, done: tf.Tensor, ended_return: tf.Tensor, ended_length: tf.Tensor
                        ) -> None:
        """Write the episodes that ended into the ring buffer (inside the graph).

        ``done``, ``ended_return``, ``ended_length``: ``[..., N]`` (one step, or a ``[T, N]``
        block in time order); episodes are kept in row-major order (time, then environment),
        the latest ``capacity`` of them.
        """
        done = tf.reshape(done, [-1])
        ended_return = tf.reshape(tf.cast(ended_return, self._ep_returns.dtype), [-1])
        ended_length = tf.reshape(ended_length, [-1])
        finished = tf.cast(done, tf.int64)
        total = tf.reduce_sum(finished)
        rank = tf.cumsum(finished) - 1  # order of the finished ones
        keep = done & (rank >= total - self.capacity)  # more than capacity in one block: the last
        count = self._ep_count.read_value()
        slots = tf.where(keep, (count + rank) % self.capacity, self.capacity)[:, None]
        self._ep_returns.scatter_nd_update(slots, ended_return)
        self._ep_lengths.scatter_nd_update(slots, ended_length)
        self._ep_count.assign_add(total)

    def episode_count(self) -> tf.Tensor:
        """Episodes finished since the last drain (or reset), int64 scalar; readable inside a
        ``tf.function`` (the ring buffer keeps the latest ``capacity`` of them)."""
        return self._ep_count.read_value()

    def step_graph(self, actions: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """One step of all environments in TensorFlow ops, reading and assigning
        :attr:`variables` and recording the episodes that ended (call it inside
        ``tf.function``). Returns ``obs [N, *obs_shape], reward [N] float32, terminated [N]
        bool, truncated [N] bool, final_obs [N, *obs_shape]``."""
        new_state, out, ended = self.step_state(self.state, actions)
        self.write_state(new_state)
        self.record_episodes(out[2] | out[3], *ended)
        return out

    # -- the eager VecEnv interface ------------------------------------------------------------
    def _out(self, x):
        return x.numpy() if self.as_numpy else x

    def _check_actions(self, actions):
        a = np.asarray(actions)
        n = self.num_envs
        space = self.single_action_space
        if isinstance(space, gym.spaces.Discrete):  # self.discrete
            count = int(space.n)
            if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= count:
                raise ValueError(f"actions must be {n} integers in [0, {count}), got {a!r}")
            return tf.constant(a, tf.int32)
        if a.shape not in ((n,), (n, 1)) or not np.issubdtype(a.dtype, np.number):
            raise ValueError(f"actions must be numbers of shape ({n}, 1), got {a!r}")
        return tf.constant(a.reshape(n, 1), tf.float32)

    def step(self, actions: np.ndarray | tf.Tensor) -> tuple[np.ndarray, ...]:
        """Step all environments; returns ``obs, reward, terminated, truncated, final_obs``."""
        if not self._was_reset:
            raise ValueError("step() called before reset()")
        actions = self._check_actions(actions)
        try:
            out = self._step(actions)
        except BaseException as exc:  # noqa: BLE001 - stored, then re-raised unchanged
            self.error = exc
            raise
        out = tuple(self._out(x) for x in out)
        self.obs = out[0]
        return out

    def drain_episodes(self) -> list[tuple[float, int]]:
        """The ``(return, length)`` of the episodes finished since the last drain, in order."""
        count = int(self._ep_count.numpy())
        if count == 0:
            return []
        kept = min(count, self.capacity)
        order = [(count - kept + i) % self.capacity for i in range(kept)]
        returns, lengths = self._ep_returns.numpy(), self._ep_lengths.numpy()
        self._ep_count.assign(0)
        return [(float(returns[i]), int(lengths[i])) for i in order]

    def close(self) -> None:
        """Nothing to release (kept for the ``VecEnv`` interface)."""


def make_graph_vec_env(env: str, num_envs: int, seed: int | None = 0, **kwargs) -> GraphVecEnv:
    """:class:`GraphVecEnv` of ``num_envs`` copies of ``env``, ``make_vec_env``'s counterpart.

    >>> make_graph_vec_env("Pendulum-v1", 3).reset().shape
    (3, 3)
    """
    return GraphVecEnv(env, num_envs, seed, **kwargs)


__all__ = ["GraphVecEnv", "make_graph_vec_env"]
