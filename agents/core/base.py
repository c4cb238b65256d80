"""The agent life cycle shared by every algorithm: build, learn, act, evaluate, save, load.

An algorithm subclass provides ``_build()`` (networks, optimiser, compiled functions),
``_train_iteration(budget_left, total)`` (collect + update, returns logs and the number of
environment steps taken), ``_collection(**kwargs)`` (its compiled collection over the
collector's traceable step), ``_act_graph(obs, deterministic)`` and the set of modules
that make up its checkpoint, and the backends wing it runs on: ``make_collector(config, seeds)``
(:func:`agents.backends.factory.make_collector`) and ``rollout_workers_cls`` (Ray). Where
experience comes from is the agent's collector (the contract: :mod:`agents.core.collectors`;
the agent's side of it, ``collect``, ``policy_state`` and the weights a copy collects with, is
here);
robust training is the agent's plug-in ``robustness`` (:mod:`agents.core.plugin`), whose phase
runs between iterations; ``learn``'s callbacks, checkpoints and interrupts are its driver's
(:mod:`agents.core.driver`); loading is :mod:`agents.core._loading`.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from agents.core._step import AdamSlots, SeedAxisAdamStep
from agents.core.callbacks import Callback
from agents.core.collectors import Collector, RolloutWorkersClass, VectorEnv, check_batch
from agents.core.compiled import own_function
from agents.core.config import AgentConfig, check_seeds
from agents.core.driver import LearnDriver
from agents.core.persistence import (
    agent_meta,
    read_metadata,
    restore_weights,
    save_crash_checkpoint,
    saved_node,
    write_agent,
    write_seed_axis,
)
from agents.core.plugin import RobustnessPlugin, robustness_for
from agents.core.policy import PolicySurface
from agents.core.presets import AUTO, make_config
from agents.core.weights import assign_weights, load_policy_state, policy_state, read_weights
from agents.envs import evaluate_episodes
from robustgrad.checks import finite_rows
from robustgrad.errors import ConfigError, NonFiniteError
from robustgrad.transforms import GradientStep, GradientTransformation, SeedAxisStep

if TYPE_CHECKING:
    from typing_extensions import Self

_PLUGIN_NODE = "robustness"
"""The checkpoint node of the robustness plug-in's own state (:meth:`Agent._checkpoint`)."""


def _compact(seeds: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (how seed lists are printed).

    >>> _compact([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
    """
    parts: list[str] = []
    seeds = list(seeds)
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


class NonFiniteTrainingError(NonFiniteError, RuntimeError):
    """Training stopped: too many consecutive updates were rejected as non-finite.

    A :class:`robustgrad.NonFiniteError` (the project's one non-finite error family) and, as
    before, a ``RuntimeError``. The limit is ``max_nonfinite_updates``: it counts whole updates in
    which every gradient step was rejected (a PPO update is many gradient steps), not gradient
    steps, so it keeps its own name beside the transforms' ``max_nonfinite_steps``."""


class Agent:
    """Base class; see :class:`agents.PPO` and friends."""

    algo: str = ""
    config_cls: type[AgentConfig] = AgentConfig
    rollout_workers: Collector | None = None  # RolloutWorkers when rollouts run on Ray
    # the backends wing, given by the algorithm (the core imports none of it): the factory of
    # the agent's collector from its config and seeds (agents.backends.factory.make_collector) and the
    # class of its Ray rollout workers (agents.backends.distributed.RolloutWorkers; None: no Ray)
    make_collector: Callable[[AgentConfig, list[int]], Collector] | None = None
    rollout_workers_cls: RolloutWorkersClass | None = None
    value_based = False  # True: the agent learns Q-values (DQN), else a policy
    collector: Collector  # where experience comes from (agents.core.collectors)
    env: VectorEnv  # the collector's environments
    crash_checkpoint: str  # where the last environment crash was saved
    robustness: RobustnessPlugin  # robust training (agents.core.plugin), from config.robust
    config: AgentConfig  # an algorithm re-declares it with its own config class
    gradient_step: GradientStep | SeedAxisStep  # built by the algorithm's _build, with
    optimizer: AdamSlots | SeedAxisAdamStep  # the Adam state it checkpoints as "optimizer"

    def __init__(self, config: AgentConfig | None = None, *,
                 transform: GradientTransformation | None = None,
                 preset: str | None = AUTO, rollout_workers: int | None = None,
                 ray_address: str | None = None, num_cpus: int | None = None,
                 seeds: Sequence[int] | None = None, **overrides):
        # preset: "auto" (the shipped preset for (algo, env) if any), a name, or None
        # rollout_workers: collect on that many Ray actors (agents/backends/distributed.py), on the
        # cluster at ray_address ("auto" or HOST:PORT) or a local Ray with num_cpus CPUs
        if rollout_workers is not None:
            if self.rollout_workers_cls is None:
                raise ValueError(f"rollout_workers: PPO, A2C, REINFORCE and DQN collect on Ray "
                                 f"workers, got {type(self).__name__}")
            self.rollout_workers_cls.check_args(rollout_workers, ray_address, num_cpus)
        if config is None:
            config = make_config(self.config_cls, self.algo, preset, **overrides)
        elif preset != AUTO:
            raise ValueError("preset must be left out when a config is given (the config "
                             "already holds every value)")
        elif overrides:
            config = self.config_cls.from_dict({**config.to_dict(), **overrides},
                                               env=overrides.get("env", config.env))
        if not isinstance(config, self.config_cls):
            raise ValueError(f"config: expected {self.config_cls.__name__}, got "
                             f"{type(config).__name__}")
        self.config = config
        self.transform = transform
        if rollout_workers is not None and config.backend == "graph":
            raise ConfigError("rollout_workers: the graph backend steps its environments inside "
                             "the compiled iteration; use backend='gymnasium' with Ray workers")
        self.seeds = self._seed_list(config, seeds, transform, rollout_workers)
        self.num_seeds = len(self.seeds)
        # where experience comes from (agents.core.collectors); self.env: its environments
        make_collector = type(self).make_collector
        if make_collector is None:
            raise NotImplementedError(f"{type(self).__name__} declares no make_collector")
        self.collector = make_collector(config, self.seeds)
        self.env = self.collector.env
        self._check_spaces(self.env)
        self.obs_shape = self.env.obs_shape
        self.discrete = self.env.discrete
        self.num_timesteps = tf.Variable(0, dtype=tf.int64, trainable=False, name="timesteps")
        self.num_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.rng = tf.random.Generator.from_seed(
            config.seed if self.num_seeds == 1
            else int(np.random.SeedSequence(self.seeds).generate_state(1)[0]))
        self._act_rng = tf.random.Generator.from_seed(config.seed + 7919)
        self.rejected_steps = 0  # gradient steps rejected by the non-finite guard
        self.training_failed = False  # set while learn() runs; stays True if it raised
        self.history: list[dict] = []  # one entry per update: steps, episode_return, ...
        self.episode_returns: collections.deque[float] = collections.deque(maxlen=20)
        # the seed axis (num_seeds > 1): the same bookkeeping for each seed
        self.seed_histories: list[list[dict]] = [[] for _ in self.seeds]
        self.seed_episode_returns: list[collections.deque[float]] = [
            collections.deque(maxlen=20) for _ in self.seeds]
        self.seed_rejected_steps = [0] * self.num_seeds
        # finished episodes of a call's iterations, one list each, drained by _record_update
        self._queued_episodes: list[list[tuple[int, float, int]]] = []
        self._env_ready = False
        self._batch_checked = False  # the first batch from the collector is checked once
        self._build()
        self.robustness = robustness_for(self)  # after the networks it reads
        self._act_fn = tf.function(own_function(self._act_graph), reduce_retracing=True)
        if rollout_workers is not None and self.rollout_workers_cls is not None:
            self.rollout_workers = self.rollout_workers_cls(self, rollout_workers, ray_address,
                                                            num_cpus)
            self.collector = self.rollout_workers

    @staticmethod
    def _seed_list(config, seeds, transform, rollout_workers) -> list[int]:
        """The seeds of the agent: ``[config.seed]``, or with ``num_seeds = S > 1`` (on-policy
        configs) ``seeds`` or ``config.seed, config.seed + 1, ...``; what ``S > 1`` cannot do is
        refused here, before any work."""
        n = getattr(config, "num_seeds", 1)
        if seeds is None:
            seeds = [config.seed + i for i in range(n)]
        else:
            seeds = check_seeds(seeds)
            if len(seeds) != n or seeds[0] != config.seed:
                raise ValueError(f"seeds: must hold config.num_seeds = {n} seeds starting with "
                                 f"config.seed = {config.seed}, got {seeds}")
        if len(seeds) > 1 and transform is not None:
            raise ValueError("transform: a custom gradient transformation acts on one seed's "
                             "gradients; with num_seeds > 1 each seed is clipped, guarded and "
                             "stepped by the built-in per-seed Adam (use num_seeds=1)")
        if len(seeds) > 1 and rollout_workers is not None:
            raise ValueError("rollout_workers: Ray workers collect for one seed; use "
                             "num_seeds=1 with rollout_workers")
        return list(seeds)

    def _one_seed(self, what: str) -> None:
        """Refuse ``what`` on an agent of several seeds (it acts for one policy)."""
        if self.num_seeds > 1:
            raise ValueError(f"{what}: this agent holds {self.num_seeds} seeds "
                             f"({_compact(self.seeds)}); agent.export(s) gives seed s as an "
                             "ordinary agent")

    def draw_seed(self, rng: tf.random.Generator | None = None) -> tf.Tensor:
        """A fresh stateless seed (shape [2], int32) drawn from ``rng`` (default: the training
        stream ``rng``): how the agent's parts (its robustness plug-in's inner searches) draw
        from the agent's stream without reaching into it."""
        return tf.cast((rng or self.rng).make_seeds(1)[:, 0], tf.int32)

    _seed = draw_seed  # the algorithms' own spelling inside their class

    # -- hooks -------------------------------------------------------------------------------
    def _check_spaces(self, env):
        pass

    def _build(self):
        raise NotImplementedError

    def _train_iteration(self, steps_done: int, total: int) -> tuple[dict, int]:
        raise NotImplementedError

    def _train_call(self, steps_done: int, total: int, until: int, failures: list[int]
                    ) -> list[tuple[dict, int]]:
        """The iterations of one call to the algorithm, in order, as ``[(logs, env steps),
        ...]``. ``until``: env steps after which the call must end (what is left of the budget, or
        of the way to the next checkpoint); ``failures``: consecutive fully rejected updates per
        seed so far. Default: one iteration (``_train_iteration``); an algorithm that runs several
        per compiled call (:mod:`agents.algorithms.onpolicy`) sets each iteration's ``logs["steps"]`` and
        queues each one's finished episodes in ``_queued_episodes``. The robustness plug-in's
        phase (:mod:`agents.core.plugin`) runs before each iteration."""
        extra = self.robustness.before_iteration(steps_done, total)
        logs, n = self._train_iteration(steps_done, total)
        self.robustness.after_iteration(logs, extra)
        return [(logs, n)]

    @property
    def robust_schedule(self) -> Any:
        """The eps/kappa schedule of robust training (:class:`agents.robustness.robust.RobustSchedule`), or
        ``None`` (``robust=None``)."""
        return self.robustness.schedule

    def _act_graph(self, obs, deterministic):
        raise NotImplementedError

    def _checkpoint_modules(self) -> dict:
        raise NotImplementedError

    def seed_axis_state(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """``(per seed, shared)``: the variables that carry the seed axis (``[S, ...]`` with
        ``num_seeds = S > 1``) and those all seeds share: what :meth:`export` and
        :meth:`import_seed` move between an ``S``-seed agent and an ordinary one."""
        raise NotImplementedError(f"{type(self).__name__} declares no seed_axis_state()")

    def _obs_rms(self):
        """The observation normaliser (``None`` when disabled)."""
        return None

    def policy_surface(self) -> PolicySurface:
        """The policy as observation attacks and certification see it, an
        :class:`agents.PolicySurface` (every algorithm declares its own)."""
        raise NotImplementedError(f"{type(self).__name__} declares no policy_surface()")

    def seed_axis_surface(self) -> PolicySurface:
        """The policies of all ``S`` seeds of an agent with a seed axis (``num_seeds > 1``) as
        one :class:`agents.PolicySurface` with ``num_seeds = S`` (observations ``[S, B, d]``,
        each seed's through its own network and normaliser): what robust training on the axis
        attacks. An algorithm with a seed axis declares it."""
        raise NotImplementedError(f"{type(self).__name__} declares no seed_axis_surface()")

    def _model_variables(self) -> list:
        """The variables that decide how the agent acts: network weights and observation
        statistics (not the optimiser, replay buffer or RNG)."""
        raise NotImplementedError

    # -- weights (the policy as arrays; what a copy of the agent, a Ray worker, collects with:
    # agents.core.weights) --------------------------------------------------------------------
    def get_weights(self) -> list[np.ndarray]:
        """Copies of the network weights and observation statistics, as numpy arrays: the
        policy, not the training state (:func:`agents.core.weights.read_weights`)."""
        return read_weights(self._model_variables())

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Restore weights returned by :meth:`get_weights` (shapes checked first)."""
        assign_weights(self._model_variables(), weights)

    # -- collection (the collector contract: agents.core.collectors) --------------------------
    def _reset_env(self):
        obs = self.collector.reset()
        lead = (self.collector.num_envs,)
        check_batch({"obs": np.asarray(obs)[None]}, 1, lead, self.obs_shape, self.discrete,
                    fields=("obs",))
        self._env_ready = True
        self._on_env_reset(obs)

    def _on_env_reset(self, obs):
        pass

    def _collection(self, *args: Any, **kwargs: Any) -> dict:
        """The compiled collection of one batch over ``self.collector``'s traceable step (its
        keyword arguments are the algorithm's own)."""
        raise NotImplementedError

    def _batch_shape(self, kwargs: dict) -> tuple[int, tuple[int, ...]]:
        """``(T, lead)`` of a batch collected with ``kwargs`` (see :func:`check_batch`)."""
        raise NotImplementedError

    def collect(self, policy_state: dict | None = None, reset: bool = False, **kwargs) -> dict:
        """One batch of experience from this agent's collector (:mod:`agents.core.collectors`) with
        its current policy, or with ``policy_state`` (from :meth:`policy_state`) loaded first.
        ``reset``: reset the environments first (they are reset anyway before the first batch
        and after an environment error). ``kwargs``: the algorithm's collection arguments (DQN:
        ``n_steps``, ``steps_done``, ``explore_steps``, ``timesteps``, ``total_envs``). The
        first batch is checked (:func:`agents.core.collectors.check_batch`). Ray rollout workers call
        this on their copy of the agent."""
        if policy_state is not None:
            self.load_policy_state(policy_state)
        if reset or not self._env_ready:
            self._reset_env()
        try:
            batch = self.collector.collect(self._collection, **kwargs)
        except Exception:
            if self.collector.error is not None:
                self._env_ready = False  # an env raised: its state is unknown
            raise
        if not self._batch_checked:
            action_dim = None if self.discrete else int(self.env.single_action_space.shape[0])
            horizon, lead = self._batch_shape(kwargs)
            check_batch(batch, horizon, lead, self.obs_shape, self.discrete, action_dim)
            self._batch_checked = True
        return batch

    def policy_state(self) -> dict:
        """What a copy of this agent needs to collect as it would
        (:func:`agents.core.weights.policy_state`)."""
        return policy_state(self.get_weights(), self.rng, getattr(self, "robust_schedule", None))

    def load_policy_state(self, state: dict, stream: int = 0) -> None:
        """Load a :meth:`policy_state`; ``stream``: rollout worker ``k`` samples from stream
        ``k`` (:func:`agents.core.weights.load_policy_state`)."""
        load_policy_state(state, stream, self.set_weights, self.rng,
                          getattr(self, "robust_schedule", None))

    # -- learning ----------------------------------------------------------------------------
    def learn(self, total_steps: int,
              callbacks: Callback | Callable | Iterable[Callback | Callable] | None = None,
              progress_bar: bool = True, schedule_start: int = 0,
              handle_interrupts: bool = True) -> Agent:
        """Train for ``total_steps`` more environment steps (rounded up to whole updates).

        Schedules (learning-rate annealing, DQN's epsilon) run over this call's budget;
        ``schedule_start`` says that many steps of a longer schedule were already done
        (``--resume`` uses it so a resumed run continues the schedule where it stopped).

        ``callbacks``: :class:`agents.core.callbacks.Callback` objects or callables
        ``fn(agent, logs)``; returning ``False`` stops training. Raises
        :class:`NonFiniteTrainingError` after ``max_nonfinite_updates`` consecutive fully
        rejected updates (the weights are untouched by rejected updates).

        An exception in ``env.step`` saves a checkpoint (``checkpoint_dir``, or a temporary
        directory) first. ``handle_interrupts``: a SIGINT (Ctrl-C) or SIGTERM stops training
        after the current update, writes a checkpoint and raises
        :class:`robustgrad.interrupts.TrainingInterrupted`. The loop is here; callbacks, the
        progress bar, checkpoints and interrupts (and what ``iterations_per_call > 1`` changes
        of them) are the learn driver's, :class:`agents.core.driver.LearnDriver`.
        """
        run = LearnDriver(self, total_steps, callbacks, progress_bar, schedule_start,
                          handle_interrupts)
        run.start()
        if not self._env_ready:
            self._reset_env()
        failures = [0] * self.num_seeds  # consecutive fully rejected updates, per seed
        with run:
            while run.done < run.total_steps:
                try:  # collect and update: one call to the algorithm
                    results = self._train_call(run.done + run.schedule_start,
                                               run.total_steps + run.schedule_start,
                                               run.until(), failures)
                except Exception:
                    err, self.collector.error = self.collector.error, None
                    if err is None:
                        raise
                    # the environment's own exception (agents.core.collectors re-raises it)
                    self._save_crash_checkpoint(err)
                    raise err from None
                for logs, steps in results:  # log
                    if "steps" not in logs:
                        logs["steps"] = int(self.num_timesteps.numpy())
                    logs["steps_per_second"] = run.advance(steps)
                    failures = self._record_update(logs, failures)
                if len(results) > 1:
                    logs["iterations"] = len(results)
                if run.after_call(logs):  # callbacks, checkpoint, interrupt: stop?
                    break
        return self

    def _record_update(self, logs: dict, failures: list[int]) -> list[int]:
        """The bookkeeping of one update, for each seed: finished episodes, ``history``,
        rejected gradient steps and the non-finite stop (``failures``: consecutive fully
        rejected updates per seed). Fills ``logs["episode_return"]`` and
        ``logs["rejected_gradient_steps"]`` (with several seeds: their mean and sum, and each
        seed's under ``"episode_return_per_seed"``); returns the new ``failures``."""
        many = self.num_seeds > 1  # one seed: the agent's own lists are its seed's
        drained = (self._queued_episodes.pop(0) if self._queued_episodes
                   else self.collector.drain_seed_episodes())
        returns = self.seed_episode_returns if many else [self.episode_returns]
        histories = self.seed_histories if many else [self.history]
        for k, ret, _length in drained:
            returns[k].append(ret)
        per_seed = logs.get("per_seed") or {k: [logs.get(k, 0.0)] for k in ("updates_tried",
                                                                          "updates_applied")}
        failures = list(failures)
        for k in range(self.num_seeds):
            value = float(np.mean(returns[k])) if returns[k] else float("nan")
            histories[k].append({"steps": logs["steps"], "episode_return": value})
            tried, applied = per_seed["updates_tried"][k], per_seed["updates_applied"][k]
            self.seed_rejected_steps[k] += int(round(tried - applied))
            self.rejected_steps += int(round(tried - applied))
            failures[k] = failures[k] + 1 if tried > 0 and applied == 0 else 0
            if failures[k] >= self.config.max_nonfinite_updates:
                which = f"seed {self.seeds[k]}: " if many else ""
                count = self.seed_rejected_steps[k] if many else self.rejected_steps
                raise NonFiniteTrainingError(
                    f"{which}training stopped after {failures[k]} consecutive updates with "
                    "non-finite gradients (NaN/inf in observations, rewards or the "
                    f"loss); {count} gradient steps were rejected in "
                    "total and none of them was applied to the weights")
        logs["rejected_gradient_steps"] = self.rejected_steps
        values = [h[-1]["episode_return"] for h in histories]
        finite = [v for v in values if v == v]  # the mean of the seeds that finished episodes
        logs["episode_return"] = float(np.mean(finite)) if finite else float("nan")
        if many:
            logs["episode_return_per_seed"] = values
            self.history.append({"steps": logs["steps"], "episode_return": logs["episode_return"],
                                 "episode_return_per_seed": values})
        self.robustness.record(logs)
        return failures

    # -- acting -------------------------------------------------------------------------------
    def _as_batch(self, obs):
        obs = np.asarray(obs, np.float32)
        single = obs.shape == self.obs_shape
        if single:
            obs = obs[None]
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(f"obs: expected shape (batch, {', '.join(map(str, self.obs_shape))})"
                             f" or {self.obs_shape}, got {obs.shape}")
        finite_rows(obs, "obs", "observation")  # NaN/inf: an action outside the space, silently
        return obs, single

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (or a single one), ready for ``env.step``."""
        self._one_seed("act")
        obs, single = self._as_batch(obs)
        a = self._act_fn(tf.constant(obs), bool(deterministic)).numpy()
        return a[0] if single else a

    def evaluate(self, n_episodes: int = 10, deterministic: bool = True, seed: int | None = None,
                 num_envs: int | None = None) -> dict:
        """Run ``n_episodes`` full episodes on a fresh vector env (same id, own seed).

        Episodes are split evenly over the sub-environments (as Stable-Baselines3 does)
        so that short episodes are not over-represented. Returns ``mean_return``,
        ``std_return``, ``returns`` and ``lengths``.
        """
        self._one_seed("evaluate")
        return evaluate_episodes(lambda obs: self.act(obs, deterministic=deterministic),
                                 self.config.env, n_episodes, num_envs,
                                 self.config.seed + 10_000 if seed is None else seed)

    # -- persistence ---------------------------------------------------------------------------
    def _checkpoint(self, robustness: bool = True) -> tf.train.Checkpoint:
        """The agent's checkpoint: step counts, random streams, the algorithm's modules and,
        unless ``robustness`` is false, the robustness plug-in's own state under
        ``robustness/`` (:meth:`agents.core.plugin.RobustnessPlugin.checkpoint_modules`; no
        node when it has none, so the agents of every other method write what they wrote)."""
        modules = dict(self._checkpoint_modules())
        plugin = self.robustness.checkpoint_modules() if robustness else {}
        if plugin:
            modules[_PLUGIN_NODE] = tf.train.Checkpoint(**plugin)
        return tf.train.Checkpoint(num_timesteps=self.num_timesteps,
                                   num_updates=self.num_updates, rng=self.rng,
                                   act_rng=self._act_rng, **modules)

    def save(self, directory: str) -> str:
        """Write the agent to ``directory``: ``config.json``, ``agent.json`` (algorithm,
        steps, learning curve), ``weights/`` (a TF checkpoint of every variable: networks,
        optimiser, guard, normalisation, RNG) and ``normalization.npz`` (the observation
        statistics as plain arrays). No pickle. Crash-safe: a kill at any moment leaves the
        previous or the new version complete (see :mod:`agents.core.persistence`).

        An agent of several seeds writes ``seed_<s>/`` (each an ordinary saved agent, written
        as it is exported) and ``seeds.json`` naming them; :func:`load` brings it back whole."""
        directory = os.fspath(directory)
        if self.num_seeds > 1:
            return write_seed_axis(directory, self.algo, self.seeds, self.export,
                                   int(self.num_timesteps.numpy()), self.history)
        rms = self._obs_rms()
        return write_agent(directory, self._checkpoint(), self.config.to_dict(), agent_meta(
            self.algo, int(self.num_timesteps.numpy()), self.config.env, self.history),
            rms.numpy_state() if rms is not None else None)

    def export(self, index: int) -> Agent:
        """Seed ``self.seeds[index]`` of an agent of several seeds as an ordinary agent (its
        weights, optimiser state, statistics, step counts and history)."""
        raise ValueError(f"export: {self.algo} has no seed axis")

    def import_seed(self, index: int, one: Self) -> None:
        """The inverse of :meth:`export`: ``one`` (an ordinary agent of seed
        ``self.seeds[index]``) becomes slice ``index`` of this agent of several seeds."""
        raise ValueError(f"import_seed: {self.algo} has no seed axis")

    def restore(self, directory: str) -> None:
        """Read the weights, step counts and history saved in ``directory`` by :meth:`save`
        into this agent (built with the same config; :func:`agents.load` builds it and calls
        this)."""
        meta, _ = read_metadata(directory)
        if meta["algo"] != self.algo:
            raise ValueError(f"directory: {directory!r} holds a {meta['algo']!r} agent, not "
                             f"{self.algo!r}")
        # a checkpoint written before the plug-in kept its state (WocaR's worst-attack critic
        # until 2026-12-04) has no robustness/ node: it loads, and that state starts fresh
        restore_weights(self._checkpoint(robustness=saved_node(directory, _PLUGIN_NODE)), directory,
                        f"this {self.algo} agent (hidden_sizes="
                        f"{getattr(self.config, 'hidden_sizes', None)})")
        self.history = list(meta.get("history", []))
        self._after_restore()

    def _after_restore(self):
        pass

    def _save_crash_checkpoint(self, exc):
        path = save_crash_checkpoint(self.save, self.config.checkpoint_dir, self.algo, exc)
        if path is not None:
            self._env_ready = False  # the env is in an unknown state; reset before learning again
            self.crash_checkpoint = path

    def close(self) -> None:
        """Close the training environment (subprocesses of ``async_envs``) and stop the
        rollout workers, if any."""
        self.env.close()
        if self.rollout_workers is not None:
            self.rollout_workers.close()

    def __repr__(self):
        env = self.config.env if isinstance(self.config.env, str) else "<factory>"
        # AutoGraph may format the agent while tracing: no .numpy() there
        steps = int(self.num_timesteps.numpy()) if tf.executing_eagerly() else "?"
        preset = f", preset={self.config.preset!r}" if self.config.preset else ""
        return f"{type(self).__name__}(env={env!r}, steps={steps}{preset})"
