"""Rollouts on Ray workers, the learner in TensorFlow (PPO, A2C, REINFORCE; DQN Ape-X style).

``agents.PPO(config, rollout_workers=K)`` splits the agent's ``num_envs`` environments over
``K`` Ray actors (:class:`RolloutWorkers`). Each actor owns a vector env of
``num_envs // K`` sub-environments and a CPU copy of the policy, built from the same
config. One iteration:

1. the learner puts its policy (:meth:`agents.Agent.get_weights`: network weights and
   observation statistics) into the object store **once** (``ray.put``);
2. every worker loads those weights and runs the agent's own compiled rollout
   (``OnPolicyAgent._rollout``: same-step autoreset, ``final_obs`` for truncation
   bootstrapping) for ``n_steps`` and returns numpy arrays of shape ``[n_steps, n, ...]``;
3. the learner concatenates the fragments along the env axis (worker ``k`` holds envs
   ``k*n .. (k+1)*n - 1``) and runs the unchanged ``_train`` on the ``[n_steps, num_envs]``
   batch; observation statistics are updated there from the full batch, exactly as a
   local agent does (so there is nothing to merge approximately; :func:`merge_moments`
   is the exact parallel merge for statistics kept elsewhere).

Seeds: worker ``k`` seeds its envs with ``seed + k*n`` (sub-env ``i`` gets ``seed + i``, as
in a local vector env), and samples actions from the learner's random stream with the
Philox key offset by ``k``. With one worker the collected batches, and so the whole
training run, equal the local agent's exactly.

DQN (Ape-X style collection, Horgan et al. 2018, with the local agent's single epsilon
schedule): once per training phase the learner puts its Q-network into the object store;
every worker runs ``train_freq`` epsilon-greedy steps of its envs (``DQN._collect_step``,
epsilon from the *global* env step count ``steps_done + t * num_envs`` and the global
``num_timesteps``, as a local agent computes it) and returns the transitions ``[train_freq,
n, ...]`` with ``final_obs`` as the next observation (truncated episodes bootstrap,
terminated ones do not). The learner concatenates them on the env axis and records them
step by step (``DQN._record_step``: replay buffer, step count, target updates, observation
statistics) exactly as its own collection loop does, then runs the unchanged gradient steps.
Its random stream continues where worker 0's ended. With one worker the replay buffer, the
weights and the returns equal the local agent's exactly. With ``K > 1`` workers, each
worker's observation normaliser sees only its own envs within a phase (the learner's,
updated from all of them, is broadcast at the next phase).

Faults: a worker that dies (``ray.kill``, a crashed process) is restarted by Ray
(``max_restarts``) and its fragment is collected again from its rebuilt (reset) env; an
exception raised inside ``env.step`` is re-raised on the learner as the original exception,
with a note naming the worker, after the crash checkpoint a local env error writes (every
env is reset before the next ``learn``).

Ray Core only (actors and the object store): ``pip install 'robustgrad[distributed]'``.
The Ray set-up (argument and address checks, :func:`init_ray`) lives in
``agents/_ray_setup.py`` and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from agents._ray_setup import (  # noqa: F401 - re-exported: agents.distributed.init_ray etc.
    INSTALL_HINT,
    _import_ray,
    check_ray_address,
    check_rollout_args,
    init_ray,
)
from robustgrad._checks import positive_int

if TYPE_CHECKING:
    from agents.base import Agent

_KEY_INDEX = -1  # Philox state is [counter, counter, key]


def merge_moments(parts: Iterable[tuple]) -> tuple[np.ndarray, np.ndarray, float]:
    """Exact parallel merge of ``(mean, var, count)`` triples (Chan, Golub & LeVeque 1979).

    ``mean``/``var`` are arrays of one shape (population variance), ``count`` a number.
    Returns the mean, variance and count of the union of the samples.

    >>> import numpy as np
    >>> a, b = np.array([[0.0], [2.0]]), np.array([[4.0]])
    >>> m, v, n = merge_moments([(a.mean(0), a.var(0), 2), (b.mean(0), b.var(0), 1)])
    >>> float(m[0]), float(v[0]), n
    (2.0, 2.6666666666666665, 3)
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must be a non-empty sequence of (mean, var, count), got []")
    mean, var, count = (np.asarray(parts[0][0], np.float64), np.asarray(parts[0][1], np.float64),
                        parts[0][2])
    for m, v, n in parts[1:]:
        m, v = np.asarray(m, np.float64), np.asarray(v, np.float64)
        tot = count + n
        delta = m - mean
        mean = mean + delta * (n / tot)
        var = (var * count + v * n + np.square(delta) * (count * n / tot)) / tot
        count = tot
    return mean, var, count


_TRANSITIONS = (("obs", "float32"), ("actions", "int32"), ("rewards", "float32"),
                ("final_obs", "float32"), ("terminated", "bool"))


def _dqn_worker_collect(agent, n_steps, steps_done, explore_steps, timesteps, total_envs):
    """A rollout worker's DQN collection (compiled): ``n_steps`` of ``agent._collect_step``
    with the global epsilon schedule, the transitions stacked as ``[n_steps, n, ...]``.
    The worker's own observation statistics are updated after each step, as the local
    loop does, so that its greedy actions see what the local agent's would."""
    import tensorflow as tf

    arrays = [tf.TensorArray(dtype, size=n_steps) for _name, dtype in _TRANSITIONS]
    obs = agent._obs.read_value()
    eps = tf.constant(1.0)
    for t in tf.range(n_steps):
        done = tf.cast(steps_done, tf.float32) + tf.cast(t * total_envs, tf.float32)
        now = timesteps + tf.cast(t * total_envs, tf.int64)
        eps = agent._collect_epsilon(done, now, explore_steps)
        a, nobs, r, term, fin = agent._collect_step(obs, eps)
        arrays = [ta.write(t, x) for ta, x in zip(arrays, (obs, a, r, fin, term))]
        agent.q.obs_norm.update(obs)
        obs = nobs
    agent._obs.assign(obs)
    return {name: ta.stack() for (name, _dtype), ta in zip(_TRANSITIONS, arrays)}, eps


def _dqn_record(agent, obs, actions, rewards, final_obs, terminated):
    """The learner records ``[n_steps, num_envs, ...]`` transitions one step at a time
    (``DQN._record_step``), in the order of its own collection loop."""
    import tensorflow as tf

    for t in tf.range(tf.shape(actions)[0]):
        agent._record_step(obs[t], actions[t], rewards[t], final_obs[t], terminated[t])


class _RolloutWorker:
    """One Ray actor: a vector env of ``num_envs`` sub-environments and a CPU policy copy."""

    def __init__(self, agent_cls, config, worker_id: int):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self.worker_id = worker_id
        self.agent = agent_cls(config)  # its env is reset (seeded) by the first collect

    def ready(self) -> int:
        """This worker's id, once its agent is built."""
        return self.worker_id

    def info(self) -> dict:
        """``worker_id``, process id and Ray node id of this actor."""
        import ray

        return {"worker_id": self.worker_id, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def reset(self) -> None:
        """Reset (re-seed) this worker's vector env."""
        self.agent._reset_env()

    def _prepare(self, weights, rng_state) -> None:
        """Reset the env if needed, load ``weights``, and sample from ``rng_state`` with the
        Philox key offset by the worker id."""
        agent = self.agent
        if not agent._env_ready:
            agent._reset_env()
        agent.set_weights(weights)
        state = np.array(rng_state, np.int64)
        state[_KEY_INDEX] += self.worker_id
        agent.rng.reset(state)

    def _run(self, fn):
        """``fn()`` and its wall time; an exception raised inside ``env.step`` is re-raised
        as itself (not TF's wrapper around it)."""
        agent = self.agent
        start = time.perf_counter()
        try:
            out = fn()
        except Exception:
            err = agent.env.error
            if err is None:
                raise
            agent.env.error = None
            agent._env_ready = False
            err._raised_in_env_step = True  # pickled with the exception (its __dict__)
            raise err from None
        return out, time.perf_counter() - start

    def collect(self, weights, rng_state, robust_eps: float | None = None):
        """Load ``weights``, sample with ``rng_state`` (key offset by the worker id), and run
        one compiled rollout; returns the batch as numpy arrays, finished episodes and the
        rollout's wall time. ``robust_eps``: the learner's current eps of ``robust="adv"``'s
        warm-up schedule, which the rollout's attack (``_perceived``) reads."""
        self._prepare(weights, rng_state)
        if robust_eps is not None:
            self.agent.robust_schedule.eps.assign(robust_eps)
        batch, seconds = self._run(self.agent._rollout)
        return ({k: v.numpy() for k, v in batch.items()}, self.agent.env.drain_episodes(),
                seconds)

    def collect_transitions(self, weights, rng_state, n_steps: int, steps_done: int,
                            explore_steps: float, timesteps: int, total_envs: int):
        """DQN: ``n_steps`` epsilon-greedy steps of this worker's envs with the learner's
        Q-network; epsilon follows the global step count (``steps_done``, ``timesteps``
        advance by ``total_envs`` per step). Returns the transitions as numpy arrays
        ``[n_steps, n, ...]``, finished episodes, wall time, the random stream's end state
        (key offset removed) and the last epsilon."""
        import tensorflow as tf

        self._prepare(weights, rng_state)
        agent = self.agent
        if getattr(self, "_dqn_collect", None) is None:
            self._dqn_collect = tf.function(
                lambda *args: _dqn_worker_collect(agent, *args))
        args = (tf.constant(n_steps), tf.constant(steps_done, tf.int64),
                tf.constant(explore_steps, tf.float32), tf.constant(timesteps, tf.int64),
                tf.constant(total_envs))
        (batch, eps), seconds = self._run(lambda: self._dqn_collect(*args))
        state = agent.rng.state.numpy().copy()
        state[_KEY_INDEX] -= self.worker_id
        return ({k: v.numpy() for k, v in batch.items()}, agent.env.drain_episodes(), seconds,
                state, float(eps.numpy()))

    def close(self) -> None:
        """Close this worker's agent and its envs."""
        self.agent.close()


class RolloutWorkers:
    """``num_workers`` Ray actors that collect an on-policy agent's rollouts, or a DQN's
    transitions (:meth:`collect_transitions`).

    Built by ``Agent(..., rollout_workers=K, ray_address=..., num_cpus=...)``; see the
    module docstring. ``agent.config.num_envs`` must be a multiple of ``K``. Each actor
    reserves one CPU (``cpus_per_worker``); a local Ray instance gets
    ``num_cpus`` CPUs (default: ``K``). ``max_restarts``: how often Ray restarts a dead
    worker before the iteration fails.
    """

    def __init__(self, agent: Agent, num_workers: int, address: str | None = None,
                 num_cpus: int | None = None, max_restarts: int = 3,
                 cpus_per_worker: float = 1.0, startup_timeout: float = 300.0):
        from agents.dqn import DQN
        from agents.onpolicy import OnPolicyAgent

        num_workers = positive_int(num_workers, "rollout_workers")
        num_cpus = positive_int(num_cpus, "num_cpus", allow_none=True)
        max_restarts = positive_int(max_restarts, "max_restarts", minimum=0)
        if not isinstance(agent, (OnPolicyAgent, DQN)):
            raise ValueError(f"rollout_workers: PPO, A2C, REINFORCE and DQN collect on Ray "
                             f"workers, got {type(agent).__name__}")
        cfg = agent.config
        if cfg.num_envs % num_workers:
            raise ValueError(f"rollout_workers must divide num_envs ({cfg.num_envs}) so that "
                             f"every worker steps the same number of envs, got {num_workers}")
        ray = _import_ray()
        if callable(cfg.env):
            try:
                ray.cloudpickle.dumps(cfg.env)
            except Exception as exc:  # noqa: BLE001 - any pickling failure means the same
                raise ValueError(f"env: the env factory cannot be serialised to a rollout worker "
                                 f"({type(exc).__name__}: {exc}); define it at module level "
                                 "or make it picklable") from None
        init_ray(address, num_cpus if num_cpus is not None else
                 max(num_workers, int(np.ceil(num_workers * cpus_per_worker))))
        have = ray.cluster_resources().get("CPU", 0)
        if have < num_workers * cpus_per_worker:
            raise ValueError(f"rollout_workers: {num_workers} workers need "
                             f"{num_workers * cpus_per_worker:g} CPUs, the Ray cluster has {have:g}")
        self.agent = agent
        self.num_workers = num_workers
        self.max_restarts = max_restarts
        self.startup_timeout = startup_timeout
        self.envs_per_worker = n = cfg.num_envs // num_workers
        self.restarts = 0
        self.logs: dict[str, float] = {}
        self._episodes: list[tuple[float, int]] = []
        actor_cls = ray.remote(num_cpus=cpus_per_worker, max_restarts=max_restarts,
                               max_task_retries=0)(_RolloutWorker)
        self.actors = []
        # a DQN worker only collects: its replay buffer is never written, keep it minimal
        small = {"buffer_size": cfg.batch_size} if isinstance(agent, DQN) else {}
        self._record = None
        for k in range(num_workers):
            wcfg = dataclasses.replace(cfg, num_envs=n, seed=cfg.seed + k * n,
                                       checkpoint_dir=None, checkpoint_every=0,
                                       **small)
            self.actors.append(actor_cls.remote(type(agent), wcfg, k))
        self._get([a.ready.remote() for a in self.actors], startup_timeout, "start")

    def _get(self, refs, timeout, what):
        ray = _import_ray()
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"rollout workers did not {what} within {timeout:g} s") from None

    def reset(self) -> None:
        """Reset every worker's env (after a crash or a fresh ``learn``)."""
        self._run_all(lambda a: a.reset.remote())

    def _run_all(self, submit):
        """``submit(actor)`` on every worker; a worker that died is waited for (Ray restarts
        it) and its call submitted again, up to ``max_restarts`` times in all; an exception
        raised inside a worker is re-raised as the original exception, naming the worker."""
        ray = _import_ray()
        refs = [submit(a) for a in self.actors]
        out = [None] * len(refs)
        pending = dict(enumerate(refs))
        died: set[int] = set()
        deadline = None
        while pending:
            k, ref = next(iter(pending.items()))
            try:
                out[k] = ray.get(ref)
                del pending[k]
            except ray.exceptions.RayActorError as exc:  # died, or restarting (unavailable)
                if k not in died:
                    died.add(k)
                    self.restarts += 1
                if self.restarts > self.max_restarts:
                    raise RuntimeError(f"rollout worker {k} died and the restart budget "
                                       f"(max_restarts={self.max_restarts}) is spent: {exc}") \
                        from None
                deadline = deadline or time.monotonic() + self.startup_timeout
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rollout worker {k} was not restarted within "
                                       f"{self.startup_timeout:g} s: {exc}") from None
                if isinstance(exc, ray.exceptions.ActorUnavailableError):
                    time.sleep(0.5)  # Ray is restarting it; ask again shortly
                pending[k] = submit(self.actors[k])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                if hasattr(cause, "add_note"):
                    cause.add_note(f"raised on rollout worker {k} of {self.num_workers}")
                if getattr(cause, "_raised_in_env_step", False) and self.agent.env.error is None:
                    # the learner's own path for env errors: crash checkpoint, envs reset
                    # before the next learn, the original exception re-raised
                    self.agent.env.error = cause
                raise cause from None
        return out

    def collect(self) -> dict:
        """One synchronous rollout on all workers; returns the learner's batch (tensors of
        shape ``[n_steps, num_envs, ...]``, as ``OnPolicyAgent._rollout`` returns)."""
        import tensorflow as tf

        ray = _import_ray()
        agent = self.agent
        n_steps = agent.config.n_steps
        state = agent.rng.state.numpy().copy()
        agent.rng.make_seeds(n_steps)  # the learner's stream advances as a local rollout's
        weights = ray.put(agent.get_weights())  # once per iteration, read by every worker
        start = time.perf_counter()
        schedule = getattr(agent, "robust_schedule", None)
        robust_eps = (float(schedule.eps.numpy()) if schedule is not None
                      and agent.config.robust == "adv" else None)
        results = self._run_all(lambda a: a.collect.remote(weights, state, robust_eps))
        wall = time.perf_counter() - start
        self._set_logs(results, wall, n_steps)
        return {key: tf.convert_to_tensor(np.concatenate([r[0][key] for r in results], axis=1))
                for key in results[0][0]}

    def collect_transitions(self, steps_done: int, explore_steps: float) -> None:
        """DQN: one collection phase (``train_freq`` steps of every env) on all workers,
        recorded into the learner's replay buffer; sets ``agent.epsilon`` and ``logs``.

        ``steps_done``: env steps of this ``learn`` budget so far; ``explore_steps``: the
        length of the epsilon decay (see ``DQN._train_iteration``)."""
        import tensorflow as tf

        ray = _import_ray()
        agent = self.agent
        cfg = agent.config
        state = agent.rng.state.numpy().copy()
        weights = ray.put(agent.get_weights())  # once per phase, read by every worker
        timesteps = int(agent.num_timesteps.numpy())
        start = time.perf_counter()
        results = self._run_all(lambda a: a.collect_transitions.remote(
            weights, state, cfg.train_freq, int(steps_done), float(explore_steps), timesteps,
            cfg.num_envs))
        wall = time.perf_counter() - start
        batch = {key: np.concatenate([r[0][key] for r in results], axis=1)
                 for key, _dtype in _TRANSITIONS}
        if self._record is None:
            self._record = tf.function(lambda *b: _dqn_record(agent, *b))
        self._record(*(tf.convert_to_tensor(batch[key]) for key, _dtype in _TRANSITIONS))
        agent.rng.reset(results[0][3])  # the learner's stream goes on where worker 0's ended
        agent.epsilon.assign(results[0][4])
        self._set_logs(results, wall, cfg.train_freq)

    def _set_logs(self, results, wall: float, n_steps: int) -> None:
        steps = n_steps * self.envs_per_worker
        logs = {"rollout_seconds": wall, "rollout_restarts": float(self.restarts)}
        for k, r in enumerate(results):
            self._episodes.extend(r[1])
            logs[f"worker_{k}_steps_per_second"] = steps / max(r[2], 1e-9)
        # what Ray costs on top of the slowest worker's own rollout (put, calls, transfer)
        logs["rollout_overhead_seconds"] = max(wall - max(r[2] for r in results), 0.0)
        self.logs = logs

    def drain_episodes(self) -> list[tuple[float, int]]:
        """The ``(return, length)`` of episodes finished on the workers since the last call."""
        out, self._episodes = self._episodes, []
        return out

    def close(self) -> None:
        """Stop the worker actors (Ray itself keeps running; ``ray.shutdown()`` stops it)."""
        ray = _import_ray()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
