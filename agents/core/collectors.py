"""One collector contract for every backend: where an agent's experience comes from.

An algorithm (:mod:`agents.algorithms.onpolicy`, :mod:`agents.algorithms.dqn`) never asks which backend it
runs on; it
asks its :class:`Collector` (DESIGN.md section 8, the ``env`` of PureJaxRL's ``make_train`` and
Acme's actors). A collector declares

* the spaces: ``num_envs``, ``obs_shape``, ``obs_dtype`` (float32), ``single_observation_space``,
  ``single_action_space``, ``discrete``, ``action_low``/``action_high``;
* ``reset() -> obs [num_envs, *obs_shape] float32``;
* ``collect(rollout, **kwargs) -> batch``: one batch of experience with the agent's current
  policy. ``rollout`` is the agent's compiled collection, which steps this collector through its
  traceable step (below); a local collector runs it here, :class:`agents.backends.distributed.RolloutWorkers`
  (Ray actors) runs the same function of the workers' copies, each through their own
  collector's public ``collect`` (``Agent.collect``);
* ``drain_episodes() -> [(return, length), ...]``: the episodes finished since the last drain
  (``drain_seed_episodes() -> [(seed index, return, length), ...]`` with a seed axis);
* the traceable step, used inside the agent's ``tf.function``: ``carry = begin(horizon)``, then
  per step ``carry, (obs, reward, terminated, truncated, final_obs) = step(carry, actions, t)``,
  then ``end(carry)``. :class:`GymnasiumCollector` steps a :class:`agents.envs.VecEnv` through
  ``tf.numpy_function``; :class:`GraphCollector` steps environments written in TensorFlow ops
  (:mod:`agents.graph_envs`), the env state in the loop's carry, so that ``fused`` is true: the
  collection, the targets and the update of an iteration compile into one call (XLA too);
* ``fused`` (the step is pure TensorFlow: collection and update may be one compiled call) and
  ``remote`` (the policy that collected is a copy elsewhere: the agent's own per-step state,
  such as observation statistics, was not touched by the collection);
* ``error``: the exception an environment raised inside ``step`` (for the crash checkpoint).

A batch (:data:`BATCH_FIELDS`) is a dict of time-major tensors ``[T, *lead, N, ...]`` (``T``
steps, ``lead`` = ``(S,)`` with a seed axis of ``S`` seeds, else ``()``; ``N`` environments per
seed): ``obs`` and ``final_obs`` float32 ``[..., *obs_shape]`` (``final_obs``: the observation a
transition led to, the last one of an episode where it ended: same-step autoreset), ``actions``
int32 (discrete) or float32 ``[..., action_dim]``, ``rewards`` float32, ``terminated`` and
``truncated`` bool. Extra fields (DQN's per-step ``epsilon [T]``) may follow.

The first batch an agent receives is checked once, eagerly (:func:`check_batch`): a field with the
wrong shape or dtype, or first observations holding NaN or inf, is a ``ValueError`` naming the
field. Later NaN observations are an environment's glitch, left to the non-finite guard (the
update that sees one is rejected and counted, as before). The agent builds its collector from its
config (:func:`agents.backends.factory.make_collector`); passing a collector object of one's own is not
offered: the
agent's checkpoint, its Ray workers and the fused graph iteration depend on building it.

>>> import agents
>>> agent = agents.PPO(env="CartPole-v1", n_steps=8, num_envs=2, preset=None)
>>> batch = agent.collect()
>>> {k: tuple(v.shape) for k, v in batch.items()}["obs"], agent.collector.fused
((8, 2, 4), False)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf

from agents.envs import graph_env_step

BATCH_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "final_obs")
"""The fields every batch holds (module doc for shapes and dtypes)."""


def _field_spec(name: str, lead: tuple, obs_shape: tuple, discrete: bool,
                action_dim: int | None) -> tuple[tuple, tf.DType]:
    if name in ("obs", "final_obs"):
        return lead + tuple(obs_shape), tf.float32
    if name == "actions":
        return (lead, tf.int32) if discrete else (lead + (action_dim,), tf.float32)
    return lead, tf.bool if name in ("terminated", "truncated") else tf.float32


def check_batch(batch: Mapping[str, Any], horizon: int, lead: Sequence[int], obs_shape: Sequence[int],
                discrete: bool, action_dim: int | None = None,
                fields: Sequence[str] = BATCH_FIELDS) -> None:
    """Raise ``ValueError`` naming the field if ``batch`` is not a batch of ``horizon`` steps of
    environments ``lead`` (e.g. ``(num_envs,)``, or ``(S, num_envs)``) with observations of
    ``obs_shape`` and discrete (int32 ``[T, *lead]``) or continuous (float32 ``[T, *lead,
    action_dim]``) actions. Eagerly, the first observations ``obs[0]`` must be finite too (inside a
    ``tf.function`` only the static shapes and dtypes are checked). ``fields``: the fields to
    check (default: all of :data:`BATCH_FIELDS`).

    >>> ok = {"obs": np.zeros((2, 3, 4), np.float32), "final_obs": np.zeros((2, 3, 4), np.float32),
    ...       "actions": np.zeros((2, 3), np.int32), "rewards": np.zeros((2, 3), np.float32),
    ...       "terminated": np.zeros((2, 3), bool), "truncated": np.zeros((2, 3), bool)}
    >>> check_batch(ok, 2, (3,), (4,), discrete=True)
    >>> check_batch(dict(ok, rewards=np.zeros((2, 3), np.float64)), 2, (3,), (4,), True)
    Traceback (most recent call last):
    ...
    ValueError: batch field 'rewards': expected float32 of shape (2, 3), got float64 of shape (2, 3)
    """
    lead = (int(horizon),) + tuple(int(n) for n in lead)
    for name in fields:
        if name not in batch:
            raise ValueError(f"batch field {name!r}: missing (a batch holds {', '.join(BATCH_FIELDS)};"
                             f" got {', '.join(sorted(batch))})")
        shape, dtype = _field_spec(name, lead, tuple(obs_shape), discrete, action_dim)
        value = batch[name]
        got_dtype = tf.as_dtype(value.dtype)
        got_shape = tuple(value.shape)
        if got_dtype != dtype or got_shape != shape:
            raise ValueError(f"batch field {name!r}: expected {dtype.name} of shape {shape}, got "
                             f"{got_dtype.name} of shape {got_shape}")
    if tf.executing_eagerly():
        first = np.asarray(batch["obs"][0]).reshape(int(np.prod(lead[1:])), -1)
        bad = np.flatnonzero(~np.isfinite(first).all(axis=1))
        if bad.size:
            raise ValueError(f"batch field 'obs': the first observations must be finite; "
                             f"environment(s) {bad[:5].tolist()}{' ...' if bad.size > 5 else ''} "
                             f"of {first.shape[0]} hold NaN or inf")


@runtime_checkable
class VectorEnv(Protocol):
    """The one interface every training vector env implements (SB3's ``VecEnv`` contract, as
    this package's envs spell it): what a :class:`Collector` reads from its env.

    ``num_envs`` (all seeds' copies: ``S * N`` on the seed axis), the per-copy
    ``single_observation_space`` / ``single_action_space`` and ``obs_shape``, ``discrete``,
    ``action_low`` / ``action_high`` (float32 bounds of a continuous action, else None);
    ``obs`` (the last observations) and ``error`` (an exception ``step`` raised, or None);
    ``reset(seed=None) -> obs [num_envs, *obs_shape]``; ``step(actions) -> (obs, reward,
    terminated, truncated, final_obs)`` (same-step autoreset); ``drain_episodes() ->
    [(return, length), ...]``; ``close()``. Implemented by :class:`agents.envs.VecEnv`,
    :class:`agents.graph_envs.GraphVecEnv` (and the graph backend's), and the seed axis'
    :class:`~agents.backends.seed_axis.SeedVecEnv` / ``SeedBlockVecEnv`` / ``SeedGraphEnv``;
    :func:`agents.backends.factory.make_training_env` is the one place that picks among them.
    """

    num_envs: int
    single_observation_space: Any
    single_action_space: Any
    obs_shape: tuple
    discrete: bool
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    obs: Any
    error: BaseException | None

    def reset(self, seed: int | None = None) -> Any:
        """Reset every copy (seeded when ``seed`` is given); the observations
        ``[num_envs, *obs_shape]``."""

    def step(self, actions: Any) -> tuple:
        """One step of every copy with ``actions [num_envs, ...]``: ``(obs, reward, terminated,
        truncated, final_obs)``, a finished copy reset in the same step."""

    def drain_episodes(self) -> list[tuple[float, int]]:
        """The ``(return, length)`` of each episode finished since the last call, then forget
        them."""

    def close(self) -> None:
        """Release the copies (processes, files); the env is unusable afterwards."""


@runtime_checkable
class GraphVectorEnv(VectorEnv, Protocol):
    """A :class:`VectorEnv` in TensorFlow ops (``backend="graph"``), stepped by
    :class:`GraphCollector` inside the agent's compiled call: ``spec`` (its ``dtype``), ``state``
    (the env state read from its variables), ``write_state(state)``, ``step_state(state,
    actions) -> (state, (obs, reward, terminated, truncated, final_obs), (ended_return,
    ended_length))`` and ``record_episodes(done, ended_return, ended_length)``."""

    spec: Any

    @property
    def state(self) -> Any:
        """The env state (a structure of tensors) read from its variables."""

    def write_state(self, state: Any) -> None:
        """Assign ``state`` (as :attr:`state` returns it) to the env's variables."""

    def step_state(self, state: Any, actions: Any) -> tuple:
        """A pure step: ``(state, (obs, reward, terminated, truncated, final_obs),
        (ended_return, ended_length))``, traceable inside a compiled call."""

    def record_episodes(self, done: Any, ended_return: Any, ended_length: Any) -> None:
        """Append the episodes that ended (``done [num_envs]`` bool) to the ring buffer that
        :meth:`drain_episodes` reads."""


class Collector(abc.ABC):
    """The collector contract (module doc). Subclasses wrap an environment or remote workers."""

    fused: bool = False
    """The traceable step is pure TensorFlow ops: collection and update may be one compiled call."""
    remote: bool = False
    """The policy that collects is a copy elsewhere (the agent's own per-step state is untouched)."""
    # copied from the env in __init__ (with the spaces and action bounds)
    num_envs: int
    obs_shape: tuple[int, ...]
    discrete: bool

    def __init__(self, env: Any):
        self.env = env
        self.error: BaseException | None = None
        for name in ("num_envs", "obs_shape", "single_observation_space", "single_action_space",
                     "discrete", "action_low", "action_high"):
            setattr(self, name, getattr(env, name))
        self.obs_dtype = tf.float32

    @property
    def obs(self) -> Any:
        """The latest observations ``[num_envs, *obs_shape]``."""
        return self.env.obs

    def reset(self) -> np.ndarray:
        """Reset every environment (the first time from the config's seed); returns the first
        observations ``[num_envs, *obs_shape]`` float32."""
        return self.env.reset()

    @abc.abstractmethod
    def collect(self, rollout: Callable[..., dict], **kwargs) -> dict:
        """One batch (module doc): ``rollout(**kwargs)`` on this collector."""

    def drain_episodes(self) -> list[tuple[float, int]]:
        """``(return, length)`` of the episodes finished since the last call."""
        return self.env.drain_episodes()

    def drain_seed_episodes(self) -> list[tuple[int, float, int]]:
        """``(seed index, return, length)`` of the episodes finished since the last call."""
        if hasattr(self.env, "drain_seed_episodes"):
            return self.env.drain_seed_episodes()
        return [(0, r, n) for r, n in self.drain_episodes()]

    # -- the traceable step (inside the agent's tf.function) ---------------------------------
    def begin(self, horizon: int | tf.Tensor) -> Any:
        """The loop carry of a collection of ``horizon`` steps (read once, in the graph)."""
        raise NotImplementedError(f"{type(self).__name__} steps its environments elsewhere; "
                                  "it has no traceable step")

    def step(self, carry: Any, actions: tf.Tensor, t: tf.Tensor) -> tuple[Any, tuple]:
        """Step ``t`` of the collection: ``carry, (obs, reward, terminated, truncated,
        final_obs)`` (``[num_envs, ...]``; ``actions`` ``[num_envs]`` int32 or ``[num_envs, d]``
        float32 within the bounds)."""
        raise NotImplementedError(f"{type(self).__name__} has no traceable step")

    def end(self, carry: Any) -> None:
        """Write back what the loop carried (env state, finished episodes)."""
        return None

    def close(self) -> None:
        """Close the environments."""
        self.env.close()


class _LocalCollector(Collector):
    """Environments in this process: ``collect`` runs the agent's compiled ``rollout`` here and
    re-raises an exception of ``env.step`` as itself (not TensorFlow's wrapper), in ``error``."""

    def collect(self, rollout: Callable[..., dict], **kwargs) -> dict:
        try:
            return rollout(**kwargs)
        except Exception:
            err = getattr(self.env, "error", None)
            if err is None:
                raise
            self.env.error = None
            self.error = err
            err.raised_in_env_step = True  # travels with the exception (pickled by Ray)
            raise err from None


class GymnasiumCollector(_LocalCollector):
    """A :class:`agents.envs.VecEnv` (or the seed axis' ``SeedVecEnv``) stepped from the compiled
    collection through ``tf.numpy_function`` (same-step autoreset, ``final_obs``)."""

    def begin(self, horizon: int | tf.Tensor) -> tf.Tensor:
        return tf.constant(0)  # the env's state lives in Python

    def step(self, carry: Any, actions: tf.Tensor, t: tf.Tensor) -> tuple[Any, tuple]:
        return carry, graph_env_step(self.env.step, actions, self.num_envs, self.obs_shape)


class GraphCollector(_LocalCollector):
    """Environments in TensorFlow ops (:class:`agents.backends.graph_backend.GraphBackendEnv`, or the seed
    axis' ``SeedGraphEnv``): the env state is the loop's carry (read and written once per
    collection), the finished episodes are recorded once after the loop; ``fused``."""

    fused = True

    def begin(self, horizon: int | tf.Tensor) -> tuple:
        env, n = self.env, self.num_envs
        ended = tuple(tf.TensorArray(dtype, size=horizon, element_shape=(n,))
                      for dtype in (tf.bool, env.spec.dtype, tf.int32))
        return env.state, ended

    def step(self, carry: Any, actions: tf.Tensor, t: tf.Tensor) -> tuple[Any, tuple]:
        state, (done, ret, length) = carry
        state, out, (ended_return, ended_length) = self.env.step_state(state, actions)
        ended = (done.write(t, out[2] | out[3]), ret.write(t, ended_return),
                 length.write(t, ended_length))
        return (state, ended), out

    def end(self, carry: Any) -> None:
        state, ended = carry
        self.env.write_state(state)
        self.env.record_episodes(*(ta.stack() for ta in ended))

    def episode_count(self) -> tf.Tensor:
        """Episodes finished since the last drain, int64 scalar, read in the graph (several
        iterations per compiled call attribute each iteration's episodes with it)."""
        return self.env.episode_count()


class RolloutWorkersClass(Protocol):
    """What the core needs of an algorithm's ``rollout_workers_cls``
    (:class:`agents.backends.distributed.RolloutWorkers`): its arguments checked before any work,
    and the collector it builds for an agent (:class:`agents.Agent`)."""

    def check_args(self, rollout_workers: int, ray_address: str | None = None,
                   num_cpus: int | None = None) -> object:
        """Refuse bad distributed arguments (``ValueError`` naming them) before any work."""

    def __call__(self, agent: Any, num_workers: int, address: str | None = None,
                 num_cpus: int | None = None) -> Collector:
        """The workers of ``agent``: the collector it collects through from then on."""


__all__ = ["BATCH_FIELDS", "Collector", "GraphCollector", "GraphVectorEnv", "RolloutWorkersClass",
           "GymnasiumCollector", "VectorEnv",
           "check_batch"]
