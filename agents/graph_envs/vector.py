"""A stateful adapter with :class:`agents.envs.VecEnv`'s interface over a compiled env.

:class:`GraphVecEnv` keeps a :class:`~agents.graph_envs.core.GraphEnvState` and steps it with
one compiled call (``tf.function``, optionally ``jit_compile=True``) per ``step``. It offers what
the agents read from a ``VecEnv``: ``num_envs``, ``single_observation_space``,
``single_action_space``, ``obs_shape``, ``discrete``, ``action_low``/``action_high``, ``obs``,
``episodes`` (finished ``(return, length)`` pairs, drained by the owner), ``error``, ``reset``,
``step``, ``drain_episodes`` and ``close``. ``as_numpy=False`` returns tensors instead of
NumPy arrays.

>>> env = GraphVecEnv("MountainCar-v0", num_envs=2, seed=0)
>>> obs = env.reset()
>>> obs.shape, obs.dtype.name, bool(((-0.6 <= obs[:, 0]) & (obs[:, 0] < -0.4)).all())
((2, 2), 'float32', True)
>>> obs, reward, terminated, truncated, final_obs = env.step(np.array([2, 0]))
>>> reward.tolist(), terminated.tolist(), truncated.tolist()
([-1.0, -1.0], [False, False], [False, False])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from agents.graph_envs.core import GraphEnvSpec, GraphEnvState, graph_env
from robustgrad._checks import positive_int


class GraphVecEnv:
    """``num_envs`` copies of a compiled task seen as a :class:`agents.envs.VecEnv` (module doc).

    The first :meth:`reset` uses ``seed``; later resets without a seed continue the RNG stream
    of the state, as ``VecEnv`` does. Episode returns are accumulated in the physics dtype.

    The state lives in :attr:`variables`, a :class:`GraphEnvState` of ``tf.Variable`` created by
    the first reset: code compiled elsewhere (an agent's rollout) can read them, call
    ``spec.step`` and assign the result back, sharing one state with this adapter; ``state``
    reads their current values.
    """

    def __init__(self, env: str | GraphEnvSpec, num_envs: int, seed: int | None = 0, *,
                 dtype: str = "float32", jit_compile: bool = False, as_numpy: bool = True):
        self.spec = env if isinstance(env, GraphEnvSpec) else graph_env(env, dtype)
        self.num_envs = positive_int(num_envs, "num_envs")
        if seed is not None:
            positive_int(seed, "seed", minimum=0)
        self.single_observation_space = self.spec.observation_space
        self.single_action_space = self.spec.action_space
        self.obs_shape = tuple(self.single_observation_space.shape)
        self.discrete = self.spec.discrete
        space = self.single_action_space
        if self.discrete:
            self.action_low = self.action_high = None
        else:
            self.action_low = np.asarray(space.low, np.float32)
            self.action_high = np.asarray(space.high, np.float32)
        self.as_numpy = bool(as_numpy)
        self._seed = seed
        self._step = tf.function(self._step_variables, jit_compile=bool(jit_compile))
        self.variables: GraphEnvState | None = None
        self.obs: Any = None
        self.episodes: list[tuple[float, int]] = []
        self.error: BaseException | None = None

    @property
    def state(self) -> GraphEnvState | None:
        """The current state (tensors read from :attr:`variables`), ``None`` before a reset."""
        if self.variables is None:
            return None
        return GraphEnvState(*(v.read_value() for v in self.variables))

    def _assign(self, state: GraphEnvState) -> None:
        for variable, value in zip(self.variables, state):
            variable.assign(value)

    def _step_variables(self, actions):
        state = GraphEnvState(*(v.read_value() for v in self.variables))
        new_state, obs, reward, terminated, truncated, final_obs = self.spec.step(state, actions)
        self._assign(new_state)
        ended_return = state.episode_return + tf.cast(reward, state.episode_return.dtype)
        return obs, reward, terminated, truncated, final_obs, ended_return, state.time + 1

    def _out(self, x):
        return x.numpy() if self.as_numpy else x

    def reset(self, seed: int | None = None):
        """Reset every environment; returns ``[num_envs, *obs_shape]`` float32 observations."""
        if seed is None:
            seed = self._seed if self._seed is not None or self.state is None else self.state.rng
        if seed is None:  # no seed ever given: draw one like gymnasium's unseeded reset
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._seed = None
        state = self.spec.reset(seed, self.num_envs)
        if self.variables is None:
            self.variables = GraphEnvState(*(tf.Variable(value, trainable=False, name=f"env_{name}")
                                             for name, value in state._asdict().items()))
        else:
            self._assign(state)
        self.obs = self._out(self.spec.observe(state))
        return self.obs

    def _check_actions(self, actions):
        a = np.asarray(actions)
        n = self.num_envs
        if self.discrete:
            count = int(self.single_action_space.n)
            if a.shape != (n,) or not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= count:
                raise ValueError(f"actions must be {n} integers in [0, {count}), got {a!r}")
            return tf.constant(a, tf.int32)
        if a.shape not in ((n,), (n, 1)) or not np.issubdtype(a.dtype, np.number):
            raise ValueError(f"actions must be numbers of shape ({n}, 1), got {a!r}")
        return tf.constant(a.reshape(n, 1), tf.float32)

    def step(self, actions):
        """Step all environments; returns ``obs, reward, terminated, truncated, final_obs``."""
        if self.variables is None:
            raise ValueError("step() called before reset()")
        actions = self._check_actions(actions)
        try:
            (obs, reward, terminated, truncated, final_obs, ended_return,
             ended_length) = self._step(actions)
        except BaseException as exc:  # noqa: BLE001 - stored, then re-raised unchanged
            self.error = exc
            raise
        done = (terminated | truncated).numpy()
        if done.any():
            returns, lengths = ended_return.numpy(), ended_length.numpy()
            self.episodes.extend((float(returns[i]), int(lengths[i])) for i in np.nonzero(done)[0])
        self.obs = self._out(obs)
        return self.obs, self._out(reward), self._out(terminated), self._out(truncated), self._out(final_obs)

    def drain_episodes(self) -> list[tuple[float, int]]:
        out, self.episodes = self.episodes, []
        return out

    def close(self) -> None:
        """Nothing to release (kept for the ``VecEnv`` interface)."""


def make_graph_vec_env(env: str, num_envs: int, seed: int | None = 0, **kwargs) -> GraphVecEnv:
    """:class:`GraphVecEnv` of ``num_envs`` copies of ``env``, ``make_vec_env``'s counterpart."""
    return GraphVecEnv(env, num_envs, seed, **kwargs)


__all__ = ["GraphVecEnv", "make_graph_vec_env"]
