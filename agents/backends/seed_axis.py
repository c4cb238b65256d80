"""The seed axis of the agents: ``S`` seeds' environments as one vector env, and the moves
between an ``S``-seed agent and ``S`` ordinary agents.

An agent built with ``num_seeds=S > 1`` (:class:`agents.PPO`, :class:`agents.A2C`,
:class:`agents.REINFORCE`, :class:`agents.DQN`) is the same code as the one-seed agent with a
leading seed axis on every tensor (:mod:`agents.algorithms.onpolicy`, :mod:`agents.algorithms.dqn`); it steps
the
``S * num_envs`` environments of this module, seed ``s``'s block of ``num_envs`` first reset
from seed ``s`` as it would be alone:

* :class:`SeedGraphEnv` (``backend="graph"``): one compiled batch of ``S * num_envs``
  environments (the dynamics one op per step for all seeds, ``sin``/``cos`` rounded as each
  seed alone rounds them: :func:`rounded_as_alone`); each seed's block keeps its own RNG key
  and draws its resets from it as :class:`GraphBackendEnv` of that seed alone does.
* :class:`SeedVecEnv` (``backend="gymnasium"``): ``S`` ordinary vector envs, each seeded as
  alone, stepped in turn from one ``tf.numpy_function``.

Both report finished episodes with their seed (``drain_seed_episodes``). :func:`export_seed`
writes slice ``s`` of an ``S``-seed agent into an ordinary agent (weights, Adam moments and
count, normalisation statistics, DQN's replay buffer, step counts, history), which then saves,
loads, evaluates and is attacked like any other; :func:`import_seed` is the inverse (resume).

>>> env = SeedGraphEnv("CartPole-v1", 2, seeds=[3, 4])
>>> obs = env.reset()
>>> from agents.backends.graph_backend import GraphBackendEnv
>>> bool((obs[2:] == GraphBackendEnv("CartPole-v1", 2, seed=4).reset()).all())
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from agents.backends.graph_backend import GraphBackendEnv
from agents.core.config import AgentConfig
from agents.envs import VecEnv, make_vec_env
from agents.graph_envs import GraphEnvSpec, GraphEnvState
from agents.graph_envs.classic_control import Elementwise

SIMD_BYTES = 32
"""The width of one SIMD packet of TensorFlow's CPU kernels in its AVX build: 8 float32 or 4
float64 numbers (:func:`rounded_as_alone`)."""


def rounded_as_alone(fn: Callable[[tf.Tensor], tf.Tensor], num_seeds: int
                     ) -> Callable[[tf.Tensor], tf.Tensor]:
    """``fn`` (``tf.sin`` or ``tf.cos``) over ``x``, the ``num_seeds`` seeds' equal blocks one
    after the other, with each element rounded as ``fn`` over its seed's block alone rounds it.

    On CPU, Eigen applies such a function to a tensor's elements in whole SIMD packets
    (:data:`SIMD_BYTES`: a vectorised polynomial, each lane on its own) and to the last
    ``size % packet`` elements one by one (the C library's function); the two round differently
    by an ulp now and then. Alone, a block of ``n`` has its first ``n // packet * packet``
    elements on the packet path and the rest on the scalar path; in one batch of ``S * n`` a
    block's scalar elements would mostly land on the packet path. So: the packet part of every
    block in one op (a multiple of the packet: all lanes), the scalar part in ops of fewer than
    ``packet`` elements (all scalar): for DQN's 1 env per seed and 8 seeds, two ops of 4, where
    each seed alone would be eight ops. Blocks of whole packets (PPO's 8 envs) are one op.

    >>> x = tf.linspace(-3.0, 3.0, 24)  # 8 seeds' blocks of 3
    >>> alone = tf.concat([tf.sin(b) for b in tf.split(x, 8)], 0)
    >>> bool(tf.reduce_all(rounded_as_alone(tf.sin, 8)(x) == alone))
    True
    """
    def apply(x: tf.Tensor) -> tf.Tensor:
        size = x.shape.num_elements()
        if num_seeds == 1 or size is None:
            return fn(x)
        packet = SIMD_BYTES // x.dtype.size
        block = size // num_seeds
        whole = block // packet * packet
        rest = block - whole
        if rest == 0:  # every element on the packet path, as alone
            return fn(x)
        rows = tf.reshape(x, [num_seeds, block])
        scalar = num_seeds * rest
        chunk = max(c for c in range(1, packet) if scalar % c == 0)
        # tf.unstack/tf.stack, not split/concat: Grappler hoists a function out of a concat
        # or split of its results (one op again, on the packet path)
        tails = tf.unstack(tf.reshape(rows[:, whole:], [scalar // chunk, chunk]))
        out = tf.reshape(tf.stack([fn(t) for t in tails]), [num_seeds, rest])
        if whole:
            out = tf.concat([fn(rows[:, :whole]), out], axis=1)
        return tf.reshape(out, tf.shape(x))

    return apply


BATCHED_TASKS = ("CartPole-v1", "MountainCar-v0", "Pendulum-v1")
"""The tasks whose seeds' blocks step in one batch (:class:`SeedGraphEnvSpec`), each tested bit
for bit against the seed alone with blocks of 1, 3 and 9 envs. The others' blocks go through the
dynamics seed by seed unless they are whole SIMD packets (8 float32 envs), as before:
Acrobot-v1 (one batch of blocks of 1, 3 or 9 envs rounds otherwise than each alone, measured;
its products of several factors), MountainCarContinuous-v0 (not tested)."""


def _rank_hidden(x: tf.Tensor) -> tf.Tensor:
    """``x`` as is, with its rank hidden from Grappler (a ``PlaceholderWithDefault`` of unknown
    shape: the value passes, the shape Grappler infers is unknown; the static shape stays for
    Python; XLA compiles it as an identity)."""
    out = tf.raw_ops.PlaceholderWithDefault(input=x, shape=tf.TensorShape(None))
    out.set_shape(x.shape)
    return out


@dataclass(frozen=True)
class SeedGraphEnvSpec(GraphEnvSpec):
    """A :class:`GraphEnvSpec` over ``S`` seeds' blocks of ``envs_per_seed`` environments: the
    state's ``rng`` is ``[S, 2]`` (one key per seed) and a step draws block ``s``'s resets from
    key ``s``, as the spec of one seed's ``envs_per_seed`` environments does alone.

    The dynamics (:meth:`transition`, :meth:`observe_physics`) run on the whole ``S *
    envs_per_seed`` batch, each seed's block rounded as that seed alone rounds it. Two effects of
    the batch are kept out (measured on this machine, TF 2.21, AVX2; a 1-ulp difference in the
    physics grows into different episodes):

    * ``sin`` and ``cos`` round by where an element sits (:func:`rounded_as_alone`); every other
      op of the dynamics rounds each element on its own
      (:class:`agents.graph_envs.classic_control.Elementwise`);
    * Grappler's arithmetic optimizer (MinimizeBroadcasts) regroups a product of a scalar
      constant and two or more tensors by their sizes: on a batch of one environment (every
      factor one number) it keeps the graph's order, on more it pairs the constant with the
      first tensor (CartPole's ``0.05 * theta_dot**2 * sin``: the constant joins
      ``theta_dot**2`` alone, ``sin`` in a batch). With one environment per seed, the results of
      ``sin`` and ``cos`` reach Grappler with a hidden rank, so that it leaves the products
      they enter as written, which is the grouping of one environment alone.

    This holds for the tasks of :data:`BATCHED_TASKS`; the others' blocks go through the
    dynamics seed by seed, with the op shapes of that seed alone, unless they are whole packets.

    Tested bit for bit on CartPole, Acrobot, Pendulum and MountainCar with 1 (3 and 8 seeds),
    3 and 9 envs per seed.
    """

    envs_per_seed: int = 1
    num_seeds: int = 1

    def _by_seed(self) -> bool:
        whole_packets = self.envs_per_seed % (SIMD_BYTES // self.dtype.size) == 0
        return (self.num_seeds > 1 and not whole_packets
                and self.dynamics.env_id not in BATCHED_TASKS)

    def _elementwise(self) -> Elementwise:
        def as_alone(fn):
            batched = rounded_as_alone(fn, self.num_seeds)
            if self.envs_per_seed > 1 or self.num_seeds == 1:
                return batched
            return lambda x: _rank_hidden(batched(x))

        return Elementwise(sin=as_alone(tf.sin), cos=as_alone(tf.cos))

    def _per_seed(self, fn, *batches: tf.Tensor):
        n = self.envs_per_seed
        outs = [fn(*(b[s * n:(s + 1) * n] for b in batches)) for s in range(self.num_seeds)]
        return tf.nest.map_structure(lambda *xs: tf.concat(xs, 0), *outs)

    def transition(self, physics: tf.Tensor, actions: tf.Tensor
                   ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The dynamics of every seed's block as that seed alone applies them (class doc)."""
        if self._by_seed():
            return self._per_seed(self.dynamics.transition, physics, actions)
        return self.dynamics.transition(physics, actions, self._elementwise())

    def observe_physics(self, physics: tf.Tensor) -> tf.Tensor:
        """Every seed's observations as that seed alone computes them (class doc)."""
        if self._by_seed():
            return self._per_seed(self.dynamics.observe, physics)
        return self.dynamics.observe(physics, self._elementwise())

    def draw_resets(self, rng: tf.Tensor, num_envs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(keys [S, 2], reset physics [S * envs_per_seed, k])``, seed by seed."""
        one = GraphEnvSpec(self.dynamics, self.dtype)
        draws = [one.draw_resets(rng[s], self.envs_per_seed) for s in range(int(rng.shape[0]))]
        return tf.stack([k for k, _ in draws]), tf.concat([f for _, f in draws], 0)


class SeedGraphEnv(GraphBackendEnv):
    """``len(seeds) * num_envs`` compiled environments; block ``s`` reset from ``seeds[s]`` and
    stepped with its own key (module doc). ``num_envs`` is per seed; :attr:`num_envs` is the
    total."""

    def __init__(self, env_id: str, num_envs: int, seeds: Sequence[int],
                 episode_capacity: int | None = None):
        self.seeds = [int(s) for s in seeds]
        self.envs_per_seed = int(num_envs)
        super().__init__(env_id, self.envs_per_seed * len(self.seeds), seed=self.seeds[0],
                         episode_capacity=episode_capacity)
        self.spec = SeedGraphEnvSpec(self.spec.dynamics, self.spec.dtype, self.envs_per_seed,
                                     len(self.seeds))
        self.variables = self.variables._replace(rng=tf.Variable(
            tf.zeros([len(self.seeds), 2], tf.int64), trainable=False, name="env_rng"))
        self._ep_seeds = tf.Variable(tf.zeros([self.capacity + 1], tf.int32), trainable=False,
                                     name="episode_seeds")
        self._first_reset = True

    def reset(self, seed: int | None = None) -> np.ndarray | tf.Tensor:
        """Reset each seed's block as :class:`GraphBackendEnv` of that seed alone resets it:
        the first time from its seed, later from its own key; with ``seed``: block ``s`` from
        ``seed + s`` (as :class:`SeedVecEnv`)."""
        one = GraphEnvSpec(self.spec.dynamics, self.spec.dtype)
        if seed is not None:
            starts: list[Any] = [seed + k for k in range(len(self.seeds))]
        elif self._first_reset:
            starts = list(self.seeds)
        else:
            starts = list(tf.unstack(self.variables.rng.read_value()))
        self._first_reset = False
        resets = [one.reset(s, self.envs_per_seed) for s in starts]
        physics, time, episode_return = (tf.concat([r[i] for r in resets], 0) for i in range(3))
        state = GraphEnvState(physics, time, episode_return, tf.stack([r.rng for r in resets]))
        self.write_state(state)
        self._ep_count.assign(0)
        self._seed, self._was_reset = None, True
        self.obs = self._out(self.spec.observe(state))
        return self.obs

    def record_episodes(self, done: tf.Tensor, ended_return: tf.Tensor, ended_length: tf.Tensor
                        ) -> None:
        """As :class:`GraphVecEnv`'s, also recording each episode's seed index."""
        count = self.episode_count()
        super().record_episodes(done, ended_return, ended_length)
        which = tf.broadcast_to(tf.range(self.num_envs) // self.envs_per_seed, tf.shape(done))
        done, which = tf.reshape(done, [-1]), tf.reshape(which, [-1])
        finished = tf.cast(done, tf.int64)
        total = tf.reduce_sum(finished)
        rank = tf.cumsum(finished) - 1
        keep = done & (rank >= total - self.capacity)
        slots = tf.where(keep, (count + rank) % self.capacity, self.capacity)[:, None]
        self._ep_seeds.scatter_nd_update(slots, tf.cast(which, tf.int32))

    def drain_seed_episodes(self) -> list[tuple[int, float, int]]:
        """``(seed index, return, length)`` of the episodes finished since the last drain."""
        count = int(self.episode_count().numpy())
        kept = min(count, self.capacity)
        seeds = self._ep_seeds.numpy()
        order = [(count - kept + i) % self.capacity for i in range(kept)]
        return [(int(seeds[i]), r, n) for i, (r, n) in zip(order, self.drain_episodes())]


class SeedVecEnv:
    """``S`` :class:`agents.envs.VecEnv` side by side, seen as one of ``S * num_envs`` envs
    (``step`` splits the actions by seed and concatenates the results)."""

    def __init__(self, envs: Sequence[Any]):
        self.envs = list(envs)
        first = self.envs[0]
        for name in ("single_observation_space", "single_action_space", "obs_shape", "discrete",
                     "action_low", "action_high"):
            setattr(self, name, getattr(first, name))
        self.envs_per_seed = first.num_envs
        self.num_envs = first.num_envs * len(self.envs)
        self.error: BaseException | None = None
        self.obs: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every seed's env (the first time from its own seed)."""
        self.obs = np.concatenate([e.reset(None if seed is None else seed + k)
                                   for k, e in enumerate(self.envs)])
        return self.obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``obs, reward, terminated, truncated, final_obs`` of all ``S * num_envs`` envs."""
        parts = np.split(np.asarray(actions), len(self.envs))
        outs = []
        for env, a in zip(self.envs, parts):
            try:
                outs.append(env.step(a))
            except BaseException as exc:  # noqa: BLE001 - stored (crash checkpoint), re-raised
                self.error = env.error or exc
                raise
        out = tuple(np.concatenate(x) for x in zip(*outs))
        self.obs = out[0]
        return out

    def drain_seed_episodes(self) -> list[tuple[int, float, int]]:
        """``(seed index, return, length)`` of the episodes finished since the last drain."""
        return [(k, r, n) for k, e in enumerate(self.envs) for r, n in e.drain_episodes()]

    def drain_episodes(self) -> list[tuple[float, int]]:
        """``(return, length)`` of every seed's finished episodes."""
        return [(r, n) for _k, r, n in self.drain_seed_episodes()]

    def close(self) -> None:
        """Close every seed's env."""
        for env in self.envs:
            env.close()


class SeedBlockVecEnv(VecEnv):
    """One gymnasium vector env of ``S * num_envs`` copies as the seed axis' env: block ``s``
    (copies ``s·num_envs`` on) first reset from ``seeds[s]`` as :func:`make_vec_env` of that
    seed alone resets it (copy ``i`` from ``seeds[s] + i``); its finished episodes reported
    with ``s``. What a factory's ``make_seed_vector_env`` builds is stepped this way (the
    adversary MDP of ATLA with a seed axis: one victim call per step for all seeds,
    :mod:`agents.robustness.atla`)."""

    def __init__(self, vec: Any, seeds: Sequence[int]):
        self.seeds = [int(s) for s in seeds]
        if vec.num_envs % len(self.seeds):
            raise ValueError(f"env: make_seed_vector_env built {vec.num_envs} envs for "
                             f"{len(self.seeds)} seeds")
        n = vec.num_envs // len(self.seeds)
        super().__init__(vec, seed=[s + i for s in self.seeds for i in range(n)])
        self.envs_per_seed = n
        self._episode_seeds: list[int] = []

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every copy (the first time each block from its seed; with ``seed``: block
        ``s`` from ``seed + s``, as :class:`SeedVecEnv`)."""
        if seed is not None:  # the seeds of this reset, one per copy
            self._seed = [seed + k + i for k in range(len(self.seeds))
                          for i in range(self.envs_per_seed)]
        return super().reset()

    def step(self, actions: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`VecEnv.step`, noting the seed of each finished episode."""
        out = super().step(actions)
        done = out[2] | out[3]
        self._episode_seeds.extend((np.nonzero(done)[0] // self.envs_per_seed).tolist())
        return out

    def drain_seed_episodes(self) -> list[tuple[int, float, int]]:
        """``(seed index, return, length)`` of the episodes finished since the last drain."""
        which, self._episode_seeds = self._episode_seeds, []
        return [(int(k), r, n) for k, (r, n) in zip(which, super().drain_episodes())]

    def drain_episodes(self) -> list[tuple[float, int]]:
        """``(return, length)`` of every seed's finished episodes."""
        return [(r, n) for _k, r, n in self.drain_seed_episodes()]


def make_seed_env(config: AgentConfig, seeds: Sequence[int]) -> Any:
    """The gymnasium training env of an ``S``-seed agent (``S = len(seeds)``; the backend is
    chosen once, by :func:`agents.backends.factory.make_training_env`); an env factory with a
    ``make_seed_vector_env(num_seeds, num_envs, async_envs)`` builds one vector env of all
    seeds' copies (:class:`SeedBlockVecEnv`)."""
    make_seed_vector = getattr(config.env, "make_seed_vector_env", None)
    if make_seed_vector is not None:
        return SeedBlockVecEnv(make_seed_vector(len(seeds), config.num_envs, config.async_envs),
                               seeds)
    return SeedVecEnv([make_vec_env(config.env, config.num_envs, seed=s,
                                    async_envs=config.async_envs) for s in seeds])


# -- an S-seed agent <-> S ordinary agents --------------------------------------------------------
def _paired_variables(many, one) -> tuple[list[tuple[tf.Variable, tf.Variable]],
                                          list[tuple[tf.Variable, tf.Variable]]]:
    """``(variable [S, ...], variable [...])`` of everything that is per seed, and ``(variable,
    variable)`` of what the seeds share (as each algorithm declares them:
    :meth:`agents.Agent.seed_axis_state`, then its robustness plug-in's own:
    :meth:`agents.core.plugin.RobustnessPlugin.seed_axis_state`)."""
    (per_many, shared_many), (per_one, shared_one) = many.seed_axis_state(), one.seed_axis_state()
    (plug_many, plug_shared_many), (plug_one, plug_shared_one) = (
        many.robustness.seed_axis_state(), one.robustness.seed_axis_state())
    per_many, per_one = per_many + plug_many, per_one + plug_one
    shared_many, shared_one = shared_many + plug_shared_many, shared_one + plug_shared_one
    pairs = list(zip(per_many, per_one))
    for a, b in pairs:
        if tuple(a.shape[1:]) != tuple(b.shape):
            raise ValueError(f"agent: variable {b.name} has shape {tuple(b.shape)}, the seed axis "
                             f"holds {tuple(a.shape[1:])}: the two agents' networks differ")
    return pairs, list(zip(shared_many, shared_one))


def export_seed(agent: Any, index: int) -> Any:
    """Seed ``agent.seeds[index]`` of an ``S``-seed ``agent`` as an ordinary agent (module doc).

    Its own environment was not stepped: it resets before its next ``learn``.
    """
    if not 0 <= index < agent.num_seeds:
        raise ValueError(f"index: must be in [0, {agent.num_seeds}), got {index}")
    cfg = dataclasses.replace(agent.config, seed=agent.seeds[index], num_seeds=1)
    one = type(agent)(cfg)
    pairs, shared = _paired_variables(agent, one)
    for a, b in pairs:
        b.assign(a[index])
    for a, b in shared:
        b.assign(a)
    streams = getattr(agent, "streams", None)
    if streams is not None and streams.axis:  # seed s's random stream goes on as its rng
        one.rng.reset(streams.generators[index].state)
    one.history = list(agent.seed_histories[index])
    one.episode_returns.extend(agent.seed_episode_returns[index])
    one.rejected_steps = agent.seed_rejected_steps[index]
    one.training_failed = agent.training_failed
    return one


def import_seed(agent: Any, index: int, one: Any) -> None:
    """Write the ordinary agent ``one`` into slice ``index`` of the ``S``-seed ``agent``
    (the inverse of :func:`export_seed`; step counts must agree across seeds)."""
    pairs, shared = _paired_variables(agent, one)
    for a, b in pairs:
        a.assign(tf.tensor_scatter_nd_update(a, [[index]], b.read_value()[None]))
    for a, b in shared:
        a.assign(b)
    streams = getattr(agent, "streams", None)
    if streams is not None and streams.axis:
        streams.generators[index].reset(one.rng.state)
    agent.seed_histories[index] = list(one.history)
    agent.seed_episode_returns[index].extend(one.episode_returns)
    agent.seed_rejected_steps[index] = one.rejected_steps


__all__ = ["BATCHED_TASKS", "SIMD_BYTES", "SeedBlockVecEnv", "SeedGraphEnv", "SeedVecEnv", "export_seed",
           "import_seed", "make_seed_env", "rounded_as_alone"]
