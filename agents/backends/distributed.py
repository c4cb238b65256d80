"""Rollouts on Ray workers, the learner in TensorFlow (PPO, A2C, REINFORCE; DQN Ape-X style).

``agents.PPO(config, rollout_workers=K)`` splits the agent's ``num_envs`` environments over
``K`` Ray actors (:class:`RolloutWorkers`, the Ray implementation of the collector contract of
:mod:`agents.core.collectors`). Each actor owns a copy of the agent built from the same config with
``num_envs // K`` sub-environments (its own local collector). One collection, the same for
every algorithm:

1. the learner puts its :meth:`agents.Agent.policy_state` (network weights and observation
   statistics, its random stream, the robust schedule's radius) into the object store **once**
   (``ray.put``);
2. every worker loads it (:meth:`~agents.Agent.load_policy_state`) and calls its copy's public
   :meth:`~agents.Agent.collect`, the agent's own compiled collection (same-step autoreset,
   ``final_obs`` for truncation bootstrapping), and returns numpy arrays ``[T, n, ...]``;
3. the learner concatenates the fragments along the env axis (worker ``k`` holds envs
   ``k*n .. (k+1)*n - 1``) and the algorithm goes on as with a local batch: on-policy agents
   run the unchanged ``_train`` (observation statistics are updated there from the full
   batch, as a local agent does: nothing to merge approximately; :func:`merge_moments` is the
   exact parallel merge for statistics kept elsewhere); DQN (Ape-X style collection, Horgan et
   al. 2018, with the local agent's single epsilon schedule: epsilon from the *global* env step
   count, passed to the workers) records the transitions step by step (replay buffer, step
   count, target updates, observation statistics), as after its own collection.

Seeds: worker ``k`` seeds its envs with ``seed + k*n`` (sub-env ``i`` gets ``seed + i``, as
in a local vector env), and samples actions from the learner's random stream with the
Philox key offset by ``k``; the learner's stream goes on where worker 0's ended. With one
worker the collected batches, and so the whole training run, equal the local agent's exactly.
With ``K > 1`` DQN workers, each worker's observation normaliser sees only its own envs within
a phase (the learner's, updated from all of them, is broadcast at the next phase).

Faults: a worker that dies (``ray.kill``, a crashed process) is restarted by Ray
(``max_restarts``) and its fragment is collected again from its rebuilt (reset) env; an
exception raised inside ``env.step`` is re-raised on the learner as the original exception,
with a note naming the worker, after the crash checkpoint a local env error writes (every
env is reset before the next ``learn``).

Ray Core only (actors and the object store): ``pip install 'robustgrad[distributed]'``.
The Ray set-up (argument and address checks, :func:`init_ray`) lives in
``agents/backends/_ray_setup.py`` and is re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from agents.backends._ray_setup import (  # noqa: F401 - re-exported: agents.backends.distributed.init_ray etc.
    INSTALL_HINT,
    _import_ray,
    check_ray_address,
    check_rollout_args,
    init_ray,
)
from agents.core.collectors import Collector
from agents.core.config import AgentConfig
from robustgrad.checks import positive_int

if TYPE_CHECKING:
    from agents.core.base import Agent

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


class _RolloutWorker:
    """One Ray actor: a copy of the agent (its own collector over ``num_envs`` environments) that
    collects through the agent's public :meth:`agents.Agent.collect`."""

    def __init__(self, agent_cls, config, worker_id: int):
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
        """Reset (re-seed) this worker's environments before its next collection."""
        self.reset_next = True

    def collect(self, policy_state: dict, kwargs: dict):
        """One batch of the copy's collection (:meth:`agents.Agent.collect`) with the learner's
        ``policy_state``, sampling from random stream ``worker_id``. Returns the batch as numpy
        arrays, the finished episodes, the collection's wall time and the random stream's end
        state (stream offset removed). An exception of ``env.step`` reaches the learner as
        itself (``agents.core.collectors``)."""
        agent = self.agent
        agent.load_policy_state(policy_state, stream=self.worker_id)
        start = time.perf_counter()
        batch = agent.collect(reset=getattr(self, "reset_next", False), **kwargs)
        seconds = time.perf_counter() - start
        self.reset_next = False
        state = agent.rng.state.numpy().copy()
        state[_KEY_INDEX] -= self.worker_id
        return ({k: np.asarray(v) for k, v in batch.items()}, agent.collector.drain_episodes(),
                seconds, state)

    def close(self) -> None:
        """Close this worker's agent and its envs."""
        self.agent.close()


class RolloutWorkers(Collector):
    """``num_workers`` Ray actors that collect an agent's batches: the Ray implementation of the
    collector contract (:mod:`agents.core.collectors`; ``remote``: the workers' copies collect).

    Built by ``Agent(..., rollout_workers=K, ray_address=..., num_cpus=...)``; see the
    module docstring. ``agent.config.num_envs`` must be a multiple of ``K``. Each actor
    reserves one CPU (``cpus_per_worker``); a local Ray instance gets
    ``num_cpus`` CPUs (default: ``K``). ``max_restarts``: how often Ray restarts a dead
    worker before the iteration fails.
    """

    remote = True
    check_args = staticmethod(check_rollout_args)  # what Agent(rollout_workers=...) checks first

    def __init__(self, agent: Agent, num_workers: int, address: str | None = None,
                 num_cpus: int | None = None, max_restarts: int = 3,
                 cpus_per_worker: float = 1.0, startup_timeout: float = 300.0):
        num_workers = positive_int(num_workers, "rollout_workers")
        num_cpus = positive_int(num_cpus, "num_cpus", allow_none=True)
        max_restarts = positive_int(max_restarts, "max_restarts", minimum=0)
        if getattr(type(agent), "rollout_workers_cls", None) is not type(self):
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
        super().__init__(agent.env)  # the learner's own env: spaces, first observations
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
        for k in range(num_workers):
            wcfg: AgentConfig
            if agent.value_based:  # DQN
                # a DQN worker only collects: its replay buffer is never written, keep it minimal
                dqn: Any = cfg  # a DQNConfig (the algorithms wing, above this one)
                wcfg = dataclasses.replace(dqn, num_envs=n, seed=cfg.seed + k * n,
                                           checkpoint_dir=None, checkpoint_every=0,
                                           buffer_size=dqn.batch_size)
            else:
                wcfg = dataclasses.replace(cfg, num_envs=n, seed=cfg.seed + k * n,
                                           checkpoint_dir=None, checkpoint_every=0)
            self.actors.append(actor_cls.remote(type(agent), wcfg, k))
        self._get([a.ready.remote() for a in self.actors], startup_timeout, "start")

    def _get(self, refs, timeout, what):
        ray = _import_ray()
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"rollout workers did not {what} within {timeout:g} s") from None

    def reset(self) -> np.ndarray:
        """Reset the learner's env (its first observations are returned) and, before their
        next collection, every worker's (after a crash or a fresh ``learn``)."""
        self._run_all(lambda a: a.reset.remote())
        return self.env.reset()

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
                if getattr(cause, "raised_in_env_step", False):
                    # the learner's own path for env errors: crash checkpoint, envs reset
                    # before the next learn, the original exception re-raised
                    self.error = cause
                raise cause from None
        return out

    def collect(self, rollout: Callable[..., dict] | None = None, **kwargs) -> dict:
        """One synchronous collection on all workers: the learner's :meth:`Agent.policy_state`
        goes into the object store once, every worker runs its copy's ``collect(**kwargs)``
        (``rollout``, the learner's own compiled collection, is not run here), and the
        fragments are concatenated along the env axis (axis 1; per-step fields such as DQN's
        ``epsilon [T]`` are worker 0's). The learner's random stream goes on where worker 0's
        ended. Returns the batch as tensors ``[T, num_envs, ...]``."""
        ray = _import_ray()
        agent = self.agent
        state = ray.put(agent.policy_state())  # once per iteration, read by every worker
        start = time.perf_counter()
        results = self._run_all(lambda a: a.collect.remote(state, kwargs))
        wall = time.perf_counter() - start
        agent.rng.reset(results[0][3])
        horizon = next(iter(results[0][0].values())).shape[0]
        self._set_logs(results, wall, horizon)
        return {key: tf.convert_to_tensor(
                    np.concatenate([r[0][key] for r in results], axis=1)
                    if np.ndim(value) >= 2 else value)
                for key, value in results[0][0].items()}

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
        """Stop the worker actors (Ray itself keeps running; ``ray.shutdown()`` stops it; the
        learner's env is closed by the agent)."""
        ray = _import_ray()
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
