"""The functional core: ``spec = graph_env(id)``, ``state = spec.reset(seed, n)``, ``spec.step``.

A :class:`GraphEnvState` holds everything that changes, as tensors: the physical state of each
of the ``N`` environments, the step count since its last reset (for the time limit), the return
of its running episode and one stateless RNG key shared by the batch. ``spec.step`` is a pure
function of ``(state, actions)``: it compiles inside ``tf.function`` (with ``jit_compile=True``
too) and two calls with equal arguments give equal results.

``step`` follows the same-step autoreset contract of :class:`agents.envs.VecEnv`: where an
episode ended (``terminated | truncated``) the returned ``obs`` and state are already those of a
fresh reset, and ``final_obs`` is the observation the transition really led to (``obs``
elsewhere). Truncation is gymnasium's ``TimeLimit``: ``truncated`` is true on the step that brings
the count to ``max_episode_steps``, also when that step terminates.

Each step splits the key: one half becomes the next key, the other draws reset states for all
``N`` environments, used only where an episode ended. Reset states come from the same
distributions as gymnasium 1.x but not from the same random numbers.

>>> spec = graph_env("CartPole-v1")
>>> state = spec.reset(seed=0, num_envs=3)
>>> state, obs, reward, terminated, truncated, final_obs = spec.step(state, tf.constant([0, 1, 0]))
>>> obs.shape.as_list(), reward.numpy().tolist(), state.time.numpy().tolist()
([3, 4], [1.0, 1.0, 1.0], [1, 1, 1])
>>> graph_env("Hopper-v5")
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: env_id must be one of ('CartPole-v1', 'Acrobot-v1', 'MountainCar-v0', \
'Pendulum-v1', 'MountainCarContinuous-v0'), got 'Hopper-v5'
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.graph_envs.classic_control import DYNAMICS, RNG_ALG, Dynamics
from robustgrad.checks import ArgumentTypeError, choice, positive_int

GRAPH_ENV_IDS: tuple[str, ...] = tuple(DYNAMICS)
"""The gymnasium ids that have a compiled implementation."""

_DTYPES = ("float32", "float64")


class GraphEnvState(NamedTuple):
    """The state of ``N`` compiled environments (a ``tf.nest`` structure of tensors).

    * ``physics``: ``[N, k]`` float32/float64, the task's physical state (gymnasium's
      ``unwrapped.state``: CartPole ``[x, x_dot, theta, theta_dot]``, Acrobot
      ``[theta1, theta2, dtheta1, dtheta2]``, MountainCar ``[position, velocity]``, Pendulum
      ``[theta, theta_dot]``);
    * ``time``: ``[N]`` int32, steps since the last reset;
    * ``episode_return``: ``[N]`` (physics dtype), the undiscounted return so far;
    * ``rng``: ``[2]`` int64, the key for the next reset draws.
    """

    physics: tf.Tensor
    time: tf.Tensor
    episode_return: tf.Tensor
    rng: tf.Tensor


def _split(key):
    new_key, sub = tf.unstack(tf.random.experimental.stateless_split(key, num=2, alg=RNG_ALG))
    return new_key, sub


def _key(seed: Any) -> tf.Tensor:
    """A ``[2]`` int64 key from an int >= 0, an integer scalar tensor or a ``[2]`` key."""
    if isinstance(seed, (tf.Tensor, tf.Variable, np.ndarray)):
        if not (seed.dtype.is_integer if isinstance(seed, (tf.Tensor, tf.Variable))
                else np.issubdtype(seed.dtype, np.integer)):
            raise ArgumentTypeError(f"seed must be an int >= 0 or an integer tensor, got dtype {seed.dtype}")
        seed = tf.cast(seed, tf.int64)
        if seed.shape.rank == 0:
            return tf.stack([seed, tf.zeros_like(seed)])
        if seed.shape.as_list() == [2]:
            return seed
        raise ValueError(f"seed must be a scalar or a [2] key, got shape {seed.shape}")
    seed = positive_int(seed, "seed", minimum=0)
    return tf.constant([seed, 0], tf.int64)


@dataclasses.dataclass(frozen=True)
class GraphEnvSpec:
    """A task compiled into the graph: spaces, time limit and the pure ``reset``/``step``.

    Built by :func:`graph_env`. ``dtype`` is the dtype of the physics (float64 reproduces
    gymnasium's arithmetic; float32 is the faster default); observations and rewards returned
    by ``step`` are float32 like gymnasium's, whatever the physics dtype.
    """

    dynamics: Dynamics
    dtype: tf.DType = tf.float32

    @property
    def env_id(self) -> str:
        """The gymnasium id this task reproduces (``"CartPole-v1"``, ...)."""
        return self.dynamics.env_id

    @property
    def observation_space(self) -> gym.spaces.Box:
        """The gymnasium observation space of one environment."""
        return self.dynamics.observation_space

    @property
    def action_space(self) -> gym.spaces.Discrete | gym.spaces.Box:
        """The gymnasium action space of one environment (``Discrete`` or ``Box``)."""
        return self.dynamics.action_space

    @property
    def max_episode_steps(self) -> int:
        """The time limit: an episode is truncated after this many steps."""
        return self.dynamics.max_episode_steps

    @property
    def discrete(self) -> bool:
        """Whether the actions are discrete (a ``Discrete`` action space)."""
        return isinstance(self.dynamics.action_space, gym.spaces.Discrete)

    def reset(self, seed: Any, num_envs: int) -> GraphEnvState:
        """A fresh state of ``num_envs`` environments drawn from the reset distribution.

        ``seed``: an int >= 0, an integer scalar tensor, or a ``[2]`` int64 key (such as
        ``state.rng``, to continue a stream). ``num_envs`` is a Python int.
        """
        n = positive_int(num_envs, "num_envs")
        key, sub = _split(_key(seed))
        physics = self.dynamics.sample(sub, tf.constant(n), self.dtype)
        return GraphEnvState(physics=physics, time=tf.zeros([n], tf.int32),
                             episode_return=tf.zeros([n], self.dtype), rng=key)

    def observe(self, state: GraphEnvState) -> tf.Tensor:
        """``[N, obs_dim]`` float32 observations of ``state``."""
        return self.observe_physics(state.physics)

    def draw_resets(self, rng: tf.Tensor, num_envs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(next key, reset physics [num_envs, k])``: the draws of one step from the key
        ``rng`` (split: one half the next key, the other the reset states). A subclass may draw
        otherwise (the seed axis: each seed's block from its own key,
        :class:`agents.backends.seed_axis.SeedGraphEnv`)."""
        key, sub = _split(rng)
        return key, self.dynamics.sample(sub, num_envs, self.dtype)

    def transition(self, physics: tf.Tensor, actions: tf.Tensor
                   ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(next physics, reward, terminated)`` of the dynamics over the batch ``physics [N,
        k]``. A subclass may apply them otherwise (the seed axis: block by block when its
        blocks would round differently in one batch, :class:`agents.backends.seed_axis.SeedGraphEnv`)."""
        return self.dynamics.transition(physics, actions)

    def observe_physics(self, physics: tf.Tensor) -> tf.Tensor:
        """``[N, obs_dim]`` float32 observations of ``physics [N, k]`` (a hook like
        :meth:`transition`)."""
        return self.dynamics.observe(physics)

    def step(self, state: GraphEnvState, actions: tf.Tensor
             ) -> tuple[GraphEnvState, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """One step of all environments with same-step autoreset.

        ``actions``: ``[N]`` integers (discrete tasks) or ``[N, 1]`` / ``[N]`` floats (Box tasks).
        Returns ``(state, obs, reward, terminated, truncated, final_obs)``: the next state,
        ``[N, obs_dim]`` float32 observations (reset ones where an episode ended), ``[N]`` float32
        rewards, ``[N]`` bool flags and ``[N, obs_dim]`` float32 final observations.
        """
        d = self.dynamics
        batch = state.time.shape[0]  # static when known: the outputs keep a static N
        actions = tf.reshape(tf.convert_to_tensor(actions), [-1 if batch is None else batch])
        if not self.discrete:
            actions = tf.cast(actions, self.dtype)
        physics, reward, terminated = self.transition(state.physics, actions)
        time = state.time + 1
        truncated = time >= d.max_episode_steps
        done = terminated | truncated
        final_obs = self.observe_physics(physics)
        key, fresh = self.draw_resets(state.rng, tf.shape(time)[0])
        fresh.set_shape(physics.shape)  # keeps N static (a tf.while_loop needs a fixed shape for N = 1)
        physics = tf.where(done[:, None], fresh, physics)
        obs = tf.where(done[:, None], self.observe_physics(fresh), final_obs)
        episode_return = tf.where(done, tf.zeros_like(reward), state.episode_return + reward)
        new_state = GraphEnvState(physics=physics, time=tf.where(done, 0, time),
                                  episode_return=episode_return, rng=key)
        return new_state, obs, tf.cast(reward, tf.float32), terminated, truncated, final_obs


def graph_env(env_id: str, dtype: str | tf.DType = "float32") -> GraphEnvSpec:
    """The compiled version of the gymnasium task ``env_id`` (one of :data:`GRAPH_ENV_IDS`).

    ``dtype``: ``"float32"`` (default) or ``"float64"`` physics.
    """
    choice(env_id, "env_id", GRAPH_ENV_IDS)
    name = tf.as_dtype(dtype).name if isinstance(dtype, tf.DType) else dtype
    choice(name, "dtype", _DTYPES)
    return GraphEnvSpec(dynamics=DYNAMICS[env_id], dtype=tf.as_dtype(name))
