"""The ``backend="graph"`` training environment: a compiled env whose state lives in variables.

:class:`GraphBackendEnv` keeps the :class:`~agents.graph_envs.GraphEnvState` of ``num_envs``
compiled environments (:mod:`agents.graph_envs`) in ``tf.Variable`` objects, so an agent's
compiled rollout steps it directly with :meth:`GraphBackendEnv.step_graph` (pure TensorFlow ops:
no ``tf.numpy_function``, no Python per step) and the rollout, the targets and the update of an
iteration are one compiled call (with XLA too). Finished episodes are written, inside the graph,
to a ring buffer of ``(return, length)`` pairs that :meth:`drain_episodes` empties from Python
once per iteration, so the learner's logs, ``EvalCallback`` and ``history`` work as with the
gymnasium backend. It offers the rest of :class:`agents.envs.VecEnv`'s interface (``reset``,
an eager ``step``, ``obs``, spaces, ``error``, ``close``).

The env state is not part of an agent's checkpoint: a loaded or resumed agent resets its
environments from ``config.seed`` before training again, as the gymnasium backend does.

>>> env = GraphBackendEnv("CartPole-v1", num_envs=2, seed=0)
>>> env.reset().shape
(2, 4)
>>> step = tf.function(env.step_graph)
>>> for _ in range(30):  # always pushing left ends a CartPole episode in about 10 steps
...     obs, reward, terminated, truncated, final_obs = step(tf.constant([0, 0]))
>>> episodes = env.drain_episodes()
>>> len(episodes) >= 2 and all(ret == length and 8 <= length <= 30 for ret, length in episodes)
True
>>> env.drain_episodes()
[]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from agents.envs import make_vec_env
from agents.graph_envs import GRAPH_ENV_IDS, GraphEnvState, graph_env
from robustgrad._checks import choice, positive_int


class GraphBackendEnv:
    """``num_envs`` compiled copies of ``env_id`` with the state in variables (module doc).

    ``seed``: the first :meth:`reset` uses it; later resets without a seed continue the RNG
    stream of the state (as :class:`agents.envs.VecEnv`). ``episode_capacity``: how many
    finished episodes the ring buffer holds between two :meth:`drain_episodes` (the oldest are
    overwritten beyond it; default ``max(1024, 4 * num_envs)``).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int | None = 0,
                 episode_capacity: int | None = None):
        choice(env_id, "env", GRAPH_ENV_IDS)
        self.spec = graph_env(env_id)
        self.num_envs = positive_int(num_envs, "num_envs")
        if seed is not None:
            positive_int(seed, "seed", minimum=0)
        self.single_observation_space = self.spec.observation_space
        self.single_action_space = self.spec.action_space
        self.obs_shape = tuple(self.single_observation_space.shape)
        self.discrete = self.spec.discrete
        if self.discrete:
            self.action_low = self.action_high = None
        else:
            self.action_low = np.asarray(self.single_action_space.low, np.float32)
            self.action_high = np.asarray(self.single_action_space.high, np.float32)
        self.capacity = positive_int(episode_capacity or max(1024, 4 * self.num_envs),
                                     "episode_capacity")
        self._seed = seed
        initial = self.spec.reset(0, self.num_envs)
        self.variables = GraphEnvState(*(
            tf.Variable(value, trainable=False, name=f"env_{name}")
            for name, value in initial._asdict().items()))
        # slot `capacity` is a sink for the environments that did not finish an episode
        self._ep_returns = tf.Variable(tf.zeros([self.capacity + 1]), trainable=False,
                                       name="episode_returns")
        self._ep_lengths = tf.Variable(tf.zeros([self.capacity + 1], tf.int32), trainable=False,
                                       name="episode_lengths")
        self._ep_count = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                     name="episode_count")
        self._eager_step = None
        self.obs: Any = None
        self.error: BaseException | None = None  # the compiled env does not raise mid-step
        self.episodes: list[tuple[float, int]] = []

    # -- state ----------------------------------------------------------------------------
    @property
    def state(self) -> GraphEnvState:
        """The current state as tensors."""
        return GraphEnvState(*(v.read_value() for v in self.variables))

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every environment; returns ``[num_envs, *obs_shape]`` float32 observations."""
        if seed is None:
            seed = self._seed if self._seed is not None else self.variables.rng.read_value()
        self._seed = None
        state = self.spec.reset(seed, self.num_envs)
        for variable, value in zip(self.variables, state):
            variable.assign(value)
        self._ep_count.assign(0)
        self.episodes = []
        self.obs = self.spec.observe(state).numpy()
        return self.obs

    # -- stepping ---------------------------------------------------------------------------
    def step_graph(self, actions) -> tuple[tf.Tensor, ...]:
        """One step of all environments in TensorFlow ops (call it inside ``tf.function``).

        ``actions``: ``[N]`` int32 (discrete) or ``[N, 1]`` float32 (already clipped to the
        action bounds). Returns ``obs [N, *obs_shape], reward [N] float32, terminated [N] bool,
        truncated [N] bool, final_obs [N, *obs_shape]`` with same-step autoreset, assigns the
        new state and records the episodes that ended.
        """
        state = self.state
        new_state, obs, reward, terminated, truncated, final_obs = self.spec.step(state, actions)
        for variable, value in zip(self.variables, new_state):
            variable.assign(value)
        done = terminated | truncated
        ended_return = tf.cast(state.episode_return, tf.float32) + reward
        ended_length = state.time + 1
        count = self._ep_count.read_value()
        rank = tf.cumsum(tf.cast(done, tf.int64)) - 1  # order of the finished ones
        slots = tf.where(done, (count + rank) % self.capacity, self.capacity)[:, None]
        self._ep_returns.scatter_nd_update(slots, ended_return)
        self._ep_lengths.scatter_nd_update(slots, ended_length)
        self._ep_count.assign_add(tf.reduce_sum(tf.cast(done, tf.int64)))
        return obs, reward, terminated, truncated, final_obs

    def step(self, actions):
        """Eager step (NumPy in, NumPy out), for code that drives the env from Python."""
        if self._eager_step is None:
            self._eager_step = tf.function(self.step_graph)
        dtype = tf.int32 if self.discrete else tf.float32
        actions = tf.constant(np.asarray(actions).reshape((self.num_envs, -1) if not
                                                          self.discrete else (self.num_envs,)),
                              dtype)
        out = [t.numpy() for t in self._eager_step(actions)]
        self.obs = out[0]
        return tuple(out)

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


def make_training_env(config) -> Any:
    """The training vector env of an agent's ``config``: :class:`GraphBackendEnv` for
    ``backend="graph"``, :func:`agents.envs.make_vec_env` otherwise."""
    if getattr(config, "backend", "gymnasium") == "graph":
        return GraphBackendEnv(config.env, config.num_envs, seed=config.seed)
    return make_vec_env(config.env, config.num_envs, seed=config.seed,
                        async_envs=config.async_envs)


__all__ = ["GraphBackendEnv", "make_training_env"]
