"""On-policy actor-critic machinery shared by REINFORCE, A2C and PPO.

Two compiled functions per iteration, each traced once; one, ``_iteration()``, when the
collector is ``fused`` (:mod:`agents.core.collectors`: ``backend="graph"``, the environment is
TensorFlow ops stepped inside the rollout). The algorithm asks its collector, never the backend:

* ``_rollout()``: ``n_steps`` steps of the collector's environments in one ``tf.function``
  loop through the collector's traceable step (``tf.numpy_function`` around a gymnasium env,
  or the env's own ops). The policy samples in the graph; the whole rollout is one graph call
  (no per-step Python beyond a gymnasium env itself). Ray workers run the same rollout of their
  copy of the agent (``Agent.collect``).
* ``_train(batch)``: values, bootstrap values of final observations, targets (GAE or
  Monte-Carlo, under ``tf.stop_gradient``), then the algorithm's ``_update``.

Observation statistics are frozen during a rollout and its update (so PPO's ratio starts
at exactly 1) and updated afterwards, skipping non-finite rows.

The seed axis (``num_seeds=S > 1``, DESIGN.md section 8, PureJaxRL's ``vmap`` over seeds written
as batched ops): the same functions with a leading ``[S, ...]`` on every tensor. Networks are
stacked (:class:`ActorCritic` with a list of seeds), the environments are
``S * num_envs`` (:mod:`agents.backends.seed_axis`), losses are reduced per seed and summed (seed ``s``'s
loss depends only on slice ``s``, so the gradient of the sum is the stack of per-seed
gradients), clipping, the non-finite guard and Adam act per seed
(:class:`agents.core._step.SeedAxisAdamStep`), observation and reward statistics are per seed, and
PPO's ``target_kl`` freezes the seeds that stop early (a mask, as the attack engine freezes
examples); every random draw (actions, minibatch order) is made from each seed's own stream as
that seed alone makes it (:mod:`agents.core.streams`). One seed is the axis of one (PureJaxRL's
``vmap`` of one): the same code with ``S = 1``, its variables, Adam and statistics those of an
ordinary agent (the checkpoints of before), each axis op the plain op on ``x[0]``. Layouts: the
collector's batch ``[T, S * N, ...]``, the rollout's state and the returns' scans ``[T, S, N]``,
update batches ``[S, T * N, ...]``.

Several iterations per call (``iterations_per_call = K > 1``, graph backend): the same
iteration looped in one compiled call, :class:`agents.algorithms._iterations.IterationLoop`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.algorithms._iterations import IterationLoop, check_iterations_per_call
from agents.backends.distributed import RolloutWorkers
from agents.backends.factory import make_collector
from agents.backends.seed_axis import export_seed, import_seed
from agents.core import _sums
from agents.core._step import make_seed_axis_step, step_on_axis
from agents.core.base import Agent
from agents.core.collectors import GraphCollector, check_batch
from agents.core.compiled import own_function
from agents.core.config import AgentConfig
from agents.core.limits import MAX_ROLLOUT_TRANSITIONS, check_rollout_size
from agents.core.networks import MLP, ObsNormalizer, ReturnNormalizer, layer_seed, seed_list
from agents.core.plugin import on_policy_saved_fields, on_seed_axis
from agents.core.policy import PolicySurface, actor_critic_surface
from agents.core.returns import bootstrap_values, discounted_returns, gae
from agents.core.schedules import linear
from agents.core.streams import SeedStreams, stateless_per_seed
from robustgrad.checks import finite_rows, nonnegative, number, positive_int, probability

if TYPE_CHECKING:
    from typing_extensions import Self

tfd = tfp.distributions


def _normalize(x):
    """Standardise ``x [..., B]`` along its last axis (per seed with the seed axis)."""
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=x.shape.rank > 1)
    return (x - mean) / (tf.sqrt(var) + 1e-8)


def _mean(x):
    """The mean of ``x [..., B]`` over its last axis: a scalar, or ``[S]`` per seed."""
    return tf.reduce_mean(x, axis=-1)


def _shifted(seed: int | Sequence[int], k: int) -> int | list[int]:
    """``seed + k`` for an int, or for every seed of a list."""
    seeds = seed_list(seed)
    return cast(int, seed) + k if seeds is None else [s + k for s in seeds]


class ActorCritic(tf.Module):
    """Separate policy and value networks over a shared observation normaliser: the model of
    REINFORCE, A2C and PPO (CleanRL's ``Agent``, PureJaxRL's ``ActorCritic``), built from the
    layers of :mod:`agents.core.networks`.

    Discrete actions: ``Categorical(logits)``. Continuous actions: a diagonal Normal
    (``Independent(Normal(mean, exp(log_std)), 1)``) whose ``log_std`` is a
    state-independent variable. ``seed``: an int, or a list of ``S`` seeds for ``S`` stacked
    actor-critics (observations ``[S, B, ...]``, distributions of batch shape ``[S, B]``).

    >>> ac = ActorCritic((4,), 2, True, seed=[0, 1])
    >>> ac.distribution(tf.zeros([2, 3, 4])).batch_shape.as_list(), ac.value(tf.zeros([2, 3, 4])).shape
    ([2, 3], TensorShape([2, 3]))
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions_or_dim: int, discrete: bool,
                 hidden: tuple[int, ...] = (64, 64), activation: str = "tanh",
                 normalize_obs: bool = False, log_std_init: float = 0.0,
                 seed: int | Sequence[int] = 0):
        super().__init__(name="actor_critic")
        in_dim = int(np.prod(obs_shape))
        seeds = seed_list(seed)
        self.num_seeds = None if seeds is None else len(seeds)
        self.obs_rank = len(obs_shape)
        self.discrete = discrete
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs, num_seeds=self.num_seeds)
        self.policy_net = MLP(in_dim, tuple(hidden), n_actions_or_dim, activation, 0.01,
                              seed, name="policy")
        self.value_net = MLP(in_dim, tuple(hidden), 1, activation, 1.0, _shifted(seed, 1),
                             name="value")
        if not discrete:
            lead = () if seeds is None else (len(seeds),)
            self.log_std = tf.Variable(tf.fill(lead + (n_actions_or_dim,), float(log_std_init)),
                                       name="log_std")

    def _head(self, net: MLP, obs: tf.Tensor) -> tf.Tensor:
        """``net`` at the normalised ``obs [(S,) B, *obs_shape]``; plain layers (one seed) take
        the seed axis of one ``[1, B, ...]`` as their plain op on ``obs[0]``."""
        x = self.obs_norm(obs)
        one = self.num_seeds is None and x.shape.rank == self.obs_rank + 2  # [1, B, ...]
        return net(x[0])[None] if one else net(x)

    def policy_out(self, obs: tf.Tensor) -> tf.Tensor:
        """The policy network's output (logits or the Gaussian mean) at raw ``obs``."""
        return self._head(self.policy_net, obs)

    def distribution(self, obs: tf.Tensor) -> tfp.distributions.Distribution:
        """The policy at raw observations ``obs [(S,) B, *obs_shape]``: a ``Categorical`` over
        the actions, or a diagonal ``Normal`` (event shape ``[action_dim]``)."""
        out = self.policy_out(obs)
        if self.discrete:
            return tfd.Categorical(logits=out)
        log_std = self.log_std if self.num_seeds is None else self.log_std[:, None, :]
        std = tf.exp(log_std) * tf.ones_like(out)
        return tfd.Independent(tfd.Normal(out, std), reinterpreted_batch_ndims=1)

    def value(self, obs: tf.Tensor) -> tf.Tensor:
        """The state values ``V(obs)``, ``[B] float32`` (``[S, B]`` with the seed axis)."""
        return tf.squeeze(self._head(self.value_net, obs), -1)

    def mode(self, obs: tf.Tensor) -> tf.Tensor:
        """The most likely action at each observation (the deterministic policy)."""
        d = self.distribution(obs)
        return d.mode()

    @property
    def trainable(self) -> list[tf.Variable]:
        """The variables the optimiser updates: both networks and, continuous, ``log_std``."""
        v = list(self.policy_net.trainable_variables) + list(self.value_net.trainable_variables)
        if not self.discrete:
            v.append(self.log_std)
        return v


@dataclass
class OnPolicyConfig(AgentConfig):
    """Fields of the on-policy actor-critic agents (REINFORCE, A2C, PPO)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout (batch = ``num_envs * n_steps``)."""
    gae_lambda: float = 0.95
    """GAE lambda (1.0: Monte-Carlo returns minus the baseline)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the ``learn`` call."""
    normalize_advantages: bool = True
    """Standardise advantages (per minibatch for PPO, per batch otherwise)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions)."""
    num_seeds: int = 1
    """Train this many seeds at once (``seed, seed + 1, ...``) as one agent whose tensors carry a
    leading seed axis (:mod:`agents.algorithms.onpolicy`); ``agent.export(s)`` gives seed ``s`` as an
    ordinary agent. Robust training works on the axis: ``"sa"`` and ``"adv"`` (each seed attacked
    against its own policy, :mod:`agents.robustness.robust`), ``"atla"`` and ``"atla-sa"`` (each seed
    against its own learned adversary, :mod:`agents.robustness.atla`); not a custom ``transform``."""
    iterations_per_call: int = 1
    """Iterations (rollout + targets + update) per compiled call on ``backend="graph"``: a
    ``tf.while_loop`` inside the one call (XLA too with ``jit_compile``), so Python runs once per
    ``iterations_per_call`` iterations. Bit-identical to 1 (weights, optimiser state, history);
    what changes is when Python sees the agent: callbacks, checkpoints and interrupts act at call
    boundaries (:meth:`agents.Agent.learn`; :mod:`agents.algorithms.onpolicy`). 1 (the default) keeps a
    callback per iteration; the gymnasium backend and robust training need 1."""

    saved_fields = staticmethod(on_policy_saved_fields)
    """A saved config dict as this version reads it
    (:func:`agents.core.plugin.on_policy_saved_fields`)."""

    def __post_init__(self):
        super().__post_init__()
        self.num_seeds = positive_int(self.num_seeds, "num_seeds")
        self.n_steps = positive_int(self.n_steps, "n_steps", maximum=MAX_ROLLOUT_TRANSITIONS)
        check_rollout_size(self.n_steps, self.num_envs, self.num_seeds)
        self.iterations_per_call = check_iterations_per_call(self)
        probability(self.gae_lambda, "gae_lambda")
        nonnegative(self.ent_coef, "ent_coef")
        nonnegative(self.vf_coef, "vf_coef")
        number(self.log_std_init, "log_std_init")


class OnPolicyAgent(Agent):
    """Base of the actor-critic agents; subclasses implement ``_update``."""

    config_cls = OnPolicyConfig
    config: OnPolicyConfig
    atla_adversary: OnPolicyAgent  # robust="atla": its learned adversary (agents.robustness.atla)
    # where experience comes from (the backends wing, agents.backends.factory and agents.backends.distributed)
    make_collector = staticmethod(make_collector)
    rollout_workers_cls = RolloutWorkers
    monte_carlo = False  # REINFORCE: returns independent of the value estimates

    def _build(self):
        cfg = self.config
        space = self.env.single_action_space
        if self.discrete:
            n_out = int(space.n)
        else:
            if len(space.shape) != 1:
                raise ValueError(f"env: Box action spaces must be 1-D, got shape {space.shape}")
            n_out = int(space.shape[0])
        self._lead = (self.num_seeds,)  # the seed axis (one seed: the axis of one)
        self.model = ActorCritic(self.obs_shape, n_out, self.discrete, cfg.hidden_sizes,
                                 cfg.activation, cfg.normalize_obs, cfg.log_std_init,
                                 layer_seed(self.seeds))
        self.variables = self.model.trainable
        self.streams = SeedStreams.of(self.rng, self.seeds)  # each seed's as alone
        # per-seed clip, guard and Adam (agents.core._step); "optimizer" in the checkpoint
        self.gradient_step, self.optimizer = make_seed_axis_step(
            self.variables, cfg.learning_rate, cfg.max_grad_norm, self.transform, self.num_seeds)
        self.reward_norm = ReturnNormalizer(cfg.gamma, self.num_seeds, cfg.num_envs)
        self.reward_rms = self.reward_norm.rms
        self._obs = tf.Variable(tf.zeros(self._lead + (cfg.num_envs,) + self.obs_shape),
                                trainable=False, name="obs")
        if not self.discrete:
            self._low = tf.constant(self.env.action_low)
            self._high = tf.constant(self.env.action_high)
        self.trace_counts: collections.Counter[str] = collections.Counter()
        self._rollout = tf.function(own_function(self._rollout_graph))
        self._train = tf.function(own_function(self._train_graph), jit_compile=cfg.jit_compile)
        # backend="graph": rollout + targets + update of an iteration in one compiled call
        self._iteration = tf.function(own_function(self._iteration_graph),
                                      jit_compile=cfg.jit_compile)
        # iterations_per_call > 1 (the graph backend, the config checks it): up to K iterations
        # (rollout, targets, update) in one compiled call
        self.iteration_loop: IterationLoop | None = None if cfg.iterations_per_call == 1 else \
            IterationLoop(lambda: self._train_graph(self._rollout_graph()),
                          self.optimizer.learning_rate,
                          cast(GraphCollector, self.collector).episode_count, self._lead,
                          cfg.max_nonfinite_updates, cfg.jit_compile, self.trace_counts)

    def _checkpoint_modules(self):
        return {"model": self.model, "optimizer": self.optimizer,
                "gradient_step": self.gradient_step, "reward_rms": self.reward_rms,
                "return_acc": self.reward_norm.returns}

    def seed_axis_state(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """``(per seed, shared)`` (:meth:`agents.Agent.seed_axis_state`): networks and
        observation statistics, Adam's moments and count, reward statistics and return
        accumulator; the learning rate and step counts."""
        opt = self.optimizer
        per_seed = list(self.model.variables) + list(opt.m) + list(opt.v) + [opt.iterations]
        norm = self.reward_norm
        per_seed += list(norm.rms.variables) + [norm.returns, norm.last_end]
        return per_seed, [opt.learning_rate, self.num_timesteps, self.num_updates]

    # -- the seed axis: layouts -------------------------------------------------------------
    def _split_envs(self, x, axis=0):
        """The collector's envs ``S * N`` at ``axis`` of ``x`` -> ``S, N``."""
        shape = tuple(x.shape)
        return tf.reshape(x, shape[:axis] + self._lead + (self.config.num_envs,) + shape[axis + 1:])

    def _seed_major(self, x):
        """A rollout tensor ``[T, S, N, ...]`` -> the update's ``[S, T * N, ...]``."""
        x = tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
        return tf.reshape(x, self._lead + (-1,) + tuple(x.shape[3:]))

    def _rows(self, x, start, size):
        """Rows ``start:start + size`` of ``x [S, B, ...]`` (``size`` static, so XLA sees it)."""
        return tf.slice(x, [0, start] + [0] * (x.shape.rank - 2), [*self._lead, size, *x.shape[2:]])

    def _time_major(self, x):
        """``[S, T * N]`` -> ``[T, S, N]`` (the layout of the returns' scans)."""
        cfg = self.config
        return tf.transpose(tf.reshape(x, self._lead + (cfg.n_steps, cfg.num_envs)), [1, 0, 2])

    def export(self, index: int) -> OnPolicyAgent:
        """Seed ``self.seeds[index]`` as an ordinary (one-seed) agent of the same class: its
        weights, Adam moments and count, observation and reward statistics, step counts,
        ``history`` and recent returns (:func:`agents.backends.seed_axis.export_seed`). It saves, loads,
        evaluates and is attacked like any other.

        >>> import agents
        >>> many = agents.PPO(env="CartPole-v1", num_seeds=2, seed=5, n_steps=8, num_envs=2,
        ...                   n_minibatches=1, n_epochs=1, preset=None)
        >>> one = many.export(1)
        >>> one.config.seed, one.num_seeds, one.model.policy_net.weights_[0].shape.as_list()
        (6, 1, [4, 64])
        """
        return export_seed(self, index)

    def import_seed(self, index: int, one: Self) -> None:
        """Seed ``one`` (an ordinary agent) as slice ``index`` of this one (resume, ``load``;
        :func:`agents.backends.seed_axis.import_seed`)."""
        import_seed(self, index, one)

    def _obs_rms(self):
        return self.model.obs_norm.rms if self.config.normalize_obs else None

    def _model_variables(self):
        return list(self.model.variables)

    def _on_env_reset(self, obs):
        self._obs.assign(self._split_envs(tf.convert_to_tensor(obs, tf.float32)))
        self.reward_norm.reset()

    # -- public model access -------------------------------------------------------------
    def distribution(self, obs: tf.Tensor | np.ndarray) -> tfp.distributions.Distribution:
        """The policy's TFP distribution for a batch of raw observations (differentiable).

        Eagerly, NaN or infinite observations are a ``ValueError`` (inside a ``tf.function`` the
        caller's graph is trusted: the rollout replaces them and the guard rejects the update)."""
        self._one_seed("distribution")
        obs = tf.convert_to_tensor(obs, tf.float32)
        if tf.executing_eagerly():
            finite_rows(obs.numpy(), "obs", "observation")
        return self.model.distribution(obs)

    def value(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """State values ``V(obs)`` for a batch of raw observations (differentiable)."""
        self._one_seed("value")
        return self.model.value(tf.convert_to_tensor(obs, tf.float32))

    def policy_surface(self) -> PolicySurface:
        """The policy as attacks and certification see it: logits or the Gaussian mean of the
        normalised observation, the normaliser, the critic (``None`` when ``vf_coef == 0``: never
        trained) and the action bounds (:func:`agents.core.policy.actor_critic_surface`)."""
        return self._surface()

    def seed_axis_surface(self) -> PolicySurface:
        """The policy surface of all ``S`` seeds (``num_seeds > 1``): observations ``[S, B, d]``,
        each seed's through its own network and normaliser (robust training on the seed axis)."""
        return self._surface(self.num_seeds)

    def _surface(self, num_seeds: int | None = None) -> PolicySurface:
        return actor_critic_surface(self.model, self.obs_shape, self.discrete,
                                    self.env.single_action_space, self._obs_rms(),
                                    self.config.activation, self.config.vf_coef > 0, num_seeds)

    def _act_graph(self, obs, deterministic):
        dist = self.model.distribution(obs)
        if deterministic:
            a = dist.mode()
        else:
            a = dist.sample(seed=self._seed(self._act_rng))
        if not self.discrete:
            a = tf.clip_by_value(a, self._low, self._high)
        return a

    # -- rollout (agents.core.collectors: the collector steps the environments) ------------------
    def _sample_actions(self, obs, seed):
        """Actions ``[S, N]`` int32 (discrete) or ``[S, N, d]`` float32 drawn from the policy
        at the (finite) observations ``obs`` with the stateless ``seed`` (``[S, 2]``: each seed
        draws with its own key, as alone). Discrete: the draw
        ``Categorical(logits).sample(seed=seed)`` makes (one ``stateless_categorical``), without
        building the distribution object in the rollout's loop."""
        if self.discrete:
            return stateless_per_seed(
                lambda key, x: tf.random.stateless_categorical(x, 1, seed=key, dtype=tf.int32)[:, 0],
                seed, self.model.policy_out(obs), axis=True)
        return stateless_per_seed(lambda key, dist: dist.sample(seed=key), seed,
                                  self.model.distribution(obs), axis=True)

    def _rollout_graph(self):
        """``n_steps`` steps of the collector's environments with the policy (its traceable
        step: ``tf.numpy_function`` around a gymnasium env, or the env's TensorFlow ops); the
        batch of :mod:`agents.core.collectors` in the collector's layout ``[T, S * N, ...]``."""
        self.trace_counts["rollout"] += 1
        horizon, envs = self.config.n_steps, (self.collector.num_envs,)  # S * N
        a_dtype = tf.int32 if self.discrete else tf.float32
        tas = {
            "obs": tf.TensorArray(tf.float32, size=horizon, element_shape=envs + self.obs_shape),
            "actions": tf.TensorArray(a_dtype, size=horizon),
            "rewards": tf.TensorArray(tf.float32, size=horizon, element_shape=envs),
            "terminated": tf.TensorArray(tf.bool, size=horizon, element_shape=envs),
            "truncated": tf.TensorArray(tf.bool, size=horizon, element_shape=envs),
            "final_obs": tf.TensorArray(tf.float32, size=horizon, element_shape=envs + self.obs_shape),
        }
        obs = self._obs.read_value()  # [S, N, ...]
        collector, robust = self.collector, self._robust_hooks
        carry = collector.begin(horizon)
        seeds = self.streams.keys(horizon)  # [S, 2, T]: one read of each seed's stream
        for t in tf.range(horizon):
            key = seeds[..., t]  # [S, 2]
            # robust="adv", ATLA: attacked (on the seed axis with seed 0's key for all seeds)
            obs = robust.perceive(obs, key[0])
            # a NaN observation must not break action selection; it is stored raw, so the
            # update that sees it is rejected by the non-finite guard
            safe = tf.where(tf.math.is_finite(obs), obs, tf.zeros_like(obs))
            a = self._sample_actions(safe, key)
            a = tf.reshape(a, envs + tuple(a.shape[2:]))  # [S * N, ...]: the collector's layout
            a_env = a if self.discrete else tf.clip_by_value(a, self._low, self._high)
            carry, (nobs, r, term, trunc, fin) = collector.step(carry, a_env, t)
            tas["obs"] = tas["obs"].write(t, tf.reshape(obs, envs + self.obs_shape))
            tas["actions"] = tas["actions"].write(t, a)
            tas["rewards"] = tas["rewards"].write(t, r)
            tas["terminated"] = tas["terminated"].write(t, term)
            tas["truncated"] = tas["truncated"].write(t, trunc)
            tas["final_obs"] = tas["final_obs"].write(t, fin)
            obs = self._split_envs(nobs)
        self._obs.assign(obs)
        collector.end(carry)
        batch = {k: v.stack() for k, v in tas.items()}
        check_batch(batch, horizon, envs, self.obs_shape, self.discrete,  # static: at trace
                    None if self.discrete else int(self.env.single_action_space.shape[0]))
        return batch

    def _iteration_graph(self):
        """Rollout, targets and update of one iteration (``backend="graph"``: one call)."""
        self.trace_counts["iteration"] += 1
        return self._train_graph(self._rollout_graph())

    # -- targets and update --------------------------------------------------------------
    def _train_graph(self, batch):
        self.trace_counts["train"] += 1
        cfg = self.config
        batch = {k: self._split_envs(v, axis=1) for k, v in batch.items()}  # [T, S, N, ...]
        obs = self._seed_major(batch["obs"])  # [S, T * N, ...]
        fin = self._seed_major(batch["final_obs"])
        actions = self._seed_major(batch["actions"])
        term, trunc = batch["terminated"], batch["truncated"]  # [T, S, N]
        ends = tf.logical_or(term, trunc)
        rewards = batch["rewards"]
        if cfg.normalize_reward:
            rewards = self.reward_norm(rewards, ends)  # gymnasium's NormalizeReward
        values = self._time_major(self.model.value(obs))
        next_values = bootstrap_values(self._time_major(self.model.value(fin)), term)
        if self.monte_carlo:
            returns = discounted_returns(rewards, next_values, ends, cfg.gamma)
            advantages = tf.stop_gradient(returns - values)
        else:
            advantages, returns = gae(rewards, values, next_values, ends, cfg.gamma,
                                      cfg.gae_lambda)
        logp_old = tf.stop_gradient(self.model.distribution(obs).log_prob(actions))
        values = tf.stop_gradient(self._seed_major(values))
        returns = self._seed_major(returns)
        advantages = self._robust_hooks.shape_advantages(  # WocaR: its worst-attack critic
            {"obs": obs, "actions": actions, "rewards": self._seed_major(rewards),
             "next_obs": fin, "terminated": self._seed_major(term)}, self._seed_major(advantages))
        stats = self._update(obs, actions, logp_old, advantages, returns, values)
        var_y = tf.math.reduce_variance(returns, axis=-1)
        stats["explained_variance"] = tf.where(
            var_y > 0, 1.0 - tf.math.reduce_variance(returns - values, axis=-1) / var_y, np.nan)
        self.model.obs_norm.update(obs)
        return stats

    def _update(self, obs, actions, logp_old, advantages, returns, values) -> dict:
        """The algorithm's update on a batch ``[S, B, ...]`` (PPO's clipped epochs, A2C's and
        REINFORCE's one step: :mod:`agents.algorithms.pg`); returns its statistics ``[S]``,
        with ``grad_norm``, ``updates_applied`` and ``updates_tried``."""
        raise NotImplementedError

    def _step(self, tape, loss, active=None):
        """One gradient step of ``loss [S]`` (the tape differentiates the sum, whose gradient is
        the stack of each seed's), the seeds not ``active [S]`` frozen; statistics ``[S]``
        (:func:`agents.core._step.step_on_axis`)."""
        return step_on_axis(self.gradient_step, tape.gradient(loss, self.variables), active)

    @property
    def _robust_hooks(self):
        """The robustness plug-in's hooks on the seed axis (:func:`agents.core.plugin.on_seed_axis`)."""
        return on_seed_axis(self.robustness, self.num_seeds)

    def _learning_rate(self, steps_done, total) -> float:
        """The learning rate of an iteration at ``steps_done`` of ``total`` (linear annealing)."""
        cfg = self.config
        return linear(cfg.learning_rate, 0.0, steps_done, total) if cfg.anneal_lr \
            else cfg.learning_rate

    def _stats_logs(self, stats, lr) -> dict:
        """An iteration's logs from its statistics (tensors or NumPy values) and learning rate."""
        logs: dict = _sums.seed_logs(stats, self.num_seeds)  # means over seeds, each seed's
        logs["learning_rate"] = lr
        return logs

    def _train_call(self, steps_done, total, until, failures):
        """With ``iterations_per_call = K > 1``, up to ``K`` iterations in one compiled call
        (``iteration_loop``), the last one the first to reach ``until`` env steps, their logs in
        order; else one iteration (:meth:`agents.Agent._train_call`)."""
        loop = self.iteration_loop
        if loop is None:
            return super()._train_call(steps_done, total, until, failures)
        n = self.config.n_steps * self.config.num_envs
        k = max(1, min(self.config.iterations_per_call, -(-until // n)))
        lrs = [self._learning_rate(steps_done + i * n, total) for i in range(k)]
        # each iteration's statistics and finished episodes (queued for _record_update)
        stats, self._queued_episodes = loop(lrs, failures, self.collector.drain_seed_episodes)
        steps = int(self.num_timesteps.numpy())
        self.num_timesteps.assign_add(n * len(stats))
        self.num_updates.assign_add(len(stats))
        return [({**self._stats_logs(s, lr), "steps": steps + (i + 1) * n}, n)
                for i, (s, lr) in enumerate(zip(stats, lrs))]

    def _collection(self):
        return self._rollout()

    def _batch_shape(self, kwargs):
        return self.config.n_steps, (self.collector.num_envs,)

    def _train_iteration(self, steps_done, total):
        lr = self._learning_rate(steps_done, total)  # linear annealing
        self.optimizer.learning_rate.assign(lr)
        if self.collector.fused:  # the collector's step is TensorFlow ops: one compiled call
            stats = self._iteration()
        else:
            stats = self._train(self.collect())
        n = self.config.n_steps * self.config.num_envs  # env steps of each seed
        self.num_timesteps.assign_add(n)
        self.num_updates.assign_add(1)
        logs = self._stats_logs(stats, lr)
        logs.update(getattr(self.collector, "logs", {}))  # Ray: per-worker steps/s, restarts
        return logs, n
