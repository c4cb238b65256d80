"""Deep Q-Networks (Mnih et al. 2015) with Double DQN (van Hasselt et al. 2016) and
optional prioritised experience replay (Schaul et al. 2016).

One iteration of ``learn``: ``train_freq`` steps of every environment with an
epsilon-greedy policy (one compiled loop over the collector's traceable step,
:mod:`agents.core.collectors`), recorded into a replay buffer held in ``tf.Variable``s, then,
once ``learning_starts`` env steps have been taken, ``gradient_steps`` compiled gradient steps
on minibatches. The algorithm asks its collector, not the backend: a ``fused`` collector
(``backend="graph"``: the env is TensorFlow ops, its state in the loop carry) runs the
collection and the gradient steps of an iteration as one compiled call (``_iteration``; XLA
too with ``jit_compile``), the same algorithm as the separate calls; Ray workers run the same
collection of their copy (``Agent.collect``) and the learner records their batches:

* TD target ``r + gamma * (1 - terminated) * Q_target(s', argmax_a Q(s', a))`` (Double
  DQN; ``max_a Q_target(s', a)`` otherwise), built under ``tf.stop_gradient``. ``s'`` is
  the *final* observation of an episode that ended, so truncated transitions bootstrap
  and terminated ones do not.
* Huber loss on ``Q(s, a)``, gradient through the non-finite guard and global-norm
  clipping (default 10) to Adam.
* minibatches drawn uniformly, or with ``prioritized_replay`` in proportion to
  ``(|TD error| + eps) ** alpha`` with importance-sampling weights (Schaul et al. 2016),
  beta annealed to 1 over the budget. Priorities live in a ``tf.Variable`` beside the
  buffer; sampling is a stratified inverse-CDF lookup (``cumsum`` + ``searchsorted``) in
  the compiled update, which compiles under XLA too.
* every ``target_update_interval`` *environment* steps (as in Stable-Baselines3 and
  CleanRL) the target network is copied (``tau == 1``) or Polyak-averaged:
  ``target <- tau * online + (1 - tau) * target``.

The seed axis (``num_seeds=S``, DESIGN.md section 8; one seed is the axis of one): the same
functions for every ``S``, every training tensor with a leading ``[S, ...]``: the networks
(online and target, :class:`QNetwork`), the observation statistics, Adam
(:func:`agents.core._step.make_seed_axis_step`: per-seed clipping, guard and moments) and the
replay buffer (:class:`agents.core.buffers.ReplayBuffer` with ``num_seeds``: each seed samples
its own minibatch from its own transitions, with its own priorities). The environments are ``S
* num_envs`` (:mod:`agents.backends.seed_axis`), acted on epsilon-greedily by each seed's own
network; TD losses are reduced per seed and summed (seed ``s``'s loss depends only on slice
``s``, so the gradient of the sum is the stack of per-seed gradients); exploration and replay
sampling draw from each seed's own stream as that seed alone draws
(:mod:`agents.core.streams`). Epsilon, the learning rate, beta and the target-update schedule
are functions of the step count, which all seeds share. One seed's specialisation lives in
those axis ops, not here: its layers, statistics and buffer keep an ordinary agent's variables
(``layer_seed``; its checkpoint and ``get_weights()`` as before) and take the axis of one
through the plain ops, its streams are the agent's ``rng`` (``SeedStreams.of``), its step the
fused Adam kernel (``make_seed_axis_step``) and its robustness plug-in sees its own ``[B,
...]`` (``on_seed_axis``): a one-seed run keeps its bits. Robust training (``robust="sa"``,
``"adv"``) works on the axis: each seed's minibatch is attacked against its own Q-network in
its own units, one attack call for all seeds (:mod:`agents.robustness.robust`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.algorithms.dqn_config import DQNConfig
from agents.backends.distributed import RolloutWorkers
from agents.backends.factory import make_collector
from agents.backends.seed_axis import export_seed, import_seed
from agents.core import _sums
from agents.core._step import make_seed_axis_step, step_on_axis
from agents.core.base import Agent
from agents.core.buffers import ReplayBuffer
from agents.core.compiled import own_function
from agents.core.networks import MLP, ObsNormalizer, layer_seed, seed_list
from agents.core.plugin import on_seed_axis
from agents.core.policy import PolicySurface
from agents.core.schedules import linear
from agents.core.streams import SeedStreams
from robustgrad.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Self

TRAIN_STATS = ("loss", "q_mean", "sa_hinge", "grad_norm", "updates_applied", "updates_tried")
"""The statistics of an iteration's gradient steps (means; ``updates_*`` are counts)."""


def td_target(rewards: tf.Tensor, next_q: tf.Tensor, terminated: tf.Tensor, gamma: float
              ) -> tf.Tensor:
    """One-step TD target ``r + gamma * (1 - terminated) * next_q`` under stop_gradient.

    Truncated transitions are *not* terminated: they bootstrap from ``next_q`` of the
    final observation.

    >>> import tensorflow as tf
    >>> td_target(tf.constant([1.0, 1.0]), tf.constant([4.0, 4.0]), tf.constant([False, True]),
    ...           gamma=0.5).numpy().tolist()
    [3.0, 1.0]
    """
    terminated = tf.cast(terminated, tf.float32)
    return tf.stop_gradient(tf.cast(rewards, tf.float32) + gamma * (1.0 - terminated) * next_q)


class QNetwork(tf.Module):
    """Action values ``Q(s, .)`` for discrete actions. ``seed``: an int (``[B, ...]`` ->
    ``[B, n_actions]``; the seed axis of one ``[1, B, ...]`` -> ``[1, B, n_actions]`` through the
    same plain layers) or a list of ``S`` seeds (``S`` stacked networks with per-seed observation
    statistics: ``[S, B, ...]`` -> ``[S, B, n_actions]``).

    >>> q = QNetwork((4,), 2, (8,), seed=[0, 1])
    >>> q(tf.zeros([2, 3, 4])).shape.as_list()
    [2, 3, 2]
    >>> one = QNetwork((4,), 2, (8,), seed=0)
    >>> one(tf.zeros([3, 4])).shape.as_list(), one(tf.zeros([1, 3, 4])).shape.as_list()
    ([3, 2], [1, 3, 2])
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int,
                 hidden: tuple[int, ...] = (120, 84), activation: str = "relu",
                 normalize_obs: bool = False, seed: int | Sequence[int] = 0, name: str = "q"):
        super().__init__(name=name)
        in_dim = int(np.prod(obs_shape))
        seeds = seed_list(seed)
        self.num_seeds = None if seeds is None else len(seeds)
        self.obs_rank = len(obs_shape)
        self.obs_norm = ObsNormalizer(tuple(obs_shape), normalize_obs, num_seeds=self.num_seeds)
        self.net = MLP(in_dim, tuple(hidden), n_actions, activation, 1.0, seed, name="mlp")

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        x = self.obs_norm(obs)
        one = self.num_seeds is None and x.shape.rank == self.obs_rank + 2  # [1, B, ...]
        return self.net(x[0])[None] if one else self.net(x)

    @property
    def trainable(self) -> list[tf.Variable]:
        """The variables the optimiser updates (the observation statistics are not)."""
        return list(self.net.trainable_variables)


def _mean(x: tf.Tensor) -> tf.Tensor:
    """Each seed's mean of ``x [S, B]``: ``[S]``."""
    return tf.reduce_mean(x, axis=-1)


def huber(x: tf.Tensor, delta: float) -> tf.Tensor:
    """Huber loss (smooth L1) of ``x`` elementwise: quadratic within ``delta``, linear outside."""
    a = tf.abs(x)
    return tf.where(a <= delta, 0.5 * tf.square(x), delta * (a - 0.5 * delta))


class DQN(Agent):
    """DQN agent for discrete actions; see :class:`DQNConfig`.

    The greedy policy of a DQN can swing between good and poor late in training (on
    CartPole-v1 the cart drifts out of bounds after 100-200 steps in the poor phases,
    although the pole stays up); the default decaying learning rate (``learning_rate_final``)
    narrows the swings but does not remove them. Evaluate during training and keep the
    best weights with :class:`agents.EvalCallback`.

    Example::

        import agents
        agent = agents.DQN(env="CartPole-v1", seed=0)
        agent.learn(100_000, callbacks=[agents.EvalCallback(5_000, keep_best=True)])
        agent.evaluate(20)["mean_return"]
    """

    algo = "dqn"
    config_cls = DQNConfig
    config: DQNConfig
    value_based = True
    # where experience comes from (the backends wing, agents.backends.factory and agents.backends.distributed)
    make_collector = staticmethod(make_collector)
    rollout_workers_cls = RolloutWorkers
    fuse_graph_iteration = True
    """``backend="graph"``: collection and gradient steps in one compiled call (``False``: the
    two calls of the gymnasium backend, kept to compare the two)."""

    def _check_spaces(self, env):
        if not isinstance(env.single_action_space, gym.spaces.Discrete):
            raise ConfigError(f"env: DQN needs a Discrete action space, got "
                              f"{env.single_action_space} (use PPO, A2C or REINFORCE)")

    def _build(self):
        cfg = self.config
        n_actions = int(self.env.single_action_space.n)
        self.n_actions = n_actions
        self._lead = (self.num_seeds,)  # the seed axis (one seed: the axis of one)
        seed = layer_seed(self.seeds)
        self.q = QNetwork(self.obs_shape, n_actions, cfg.hidden_sizes, cfg.activation,
                          cfg.normalize_obs, seed, name="q")
        self.q_target = QNetwork(self.obs_shape, n_actions, cfg.hidden_sizes, cfg.activation,
                                 False, seed, name="q_target")
        self.q_target.obs_norm = self.q.obs_norm  # one normaliser, owned by the online net
        for t, s in zip(self.q_target.trainable, self.q.trainable):
            t.assign(s)
        self.variables = self.q.trainable
        self.streams = SeedStreams.of(self.rng, self.seeds)  # each seed's as alone
        # per-seed clip, guard and Adam (agents.core._step); "optimizer" in the checkpoint
        self.gradient_step, self.optimizer = make_seed_axis_step(
            self.variables, cfg.learning_rate, cfg.max_grad_norm, self.transform, self.num_seeds)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.obs_shape, cfg.num_envs,
                                   cfg.prioritized_replay, num_seeds=self.num_seeds,
                                   jit_compile=cfg.jit_compile)
        self.grad_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="grad_steps")
        self.epsilon = tf.Variable(cfg.exploration_initial_eps, trainable=False, name="eps")
        self._obs = tf.Variable(tf.zeros((self.env.num_envs,) + self.obs_shape), trainable=False,
                                name="obs")
        self.trace_counts: collections.Counter[str] = collections.Counter()
        # own_function: one trace per agent, not read as retracing when many agents are built
        self._collect = tf.function(own_function(self._collect_graph))
        self._record = tf.function(own_function(self._record_graph))
        self._train_steps = tf.function(own_function(self._train_graph),
                                        jit_compile=cfg.jit_compile)
        # backend="graph": collection + gradient steps of an iteration in one compiled call
        self._iteration = tf.function(own_function(self._iteration_graph),
                                      jit_compile=cfg.jit_compile)

    def _checkpoint_modules(self):
        return {"q": self.q, "q_target": self.q_target, "optimizer": self.optimizer,
                "gradient_step": self.gradient_step, "buffer": self.buffer,
                "grad_steps": self.grad_steps, "epsilon": self.epsilon}

    def _obs_rms(self):
        return self.q.obs_norm.rms if self.config.normalize_obs else None

    def _model_variables(self):
        # the target network shares the online network's normaliser: list it once
        return list(self.q.variables) + list(self.q_target.net.variables)

    def _on_env_reset(self, obs):
        self._obs.assign(obs)

    def seed_axis_state(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """``(per seed, shared)`` variables for :func:`agents.backends.seed_axis.export_seed`: networks,
        observation statistics, Adam's moments and count, the replay buffer's contents and
        priorities (each ``[S, ...]`` with the seed axis); the step counts, learning rate,
        epsilon and the buffer's position and size (one for all seeds)."""
        opt, buf = self.optimizer, self.buffer
        per_seed = self._model_variables() + list(opt.m) + list(opt.v) + [opt.iterations]
        per_seed += [buf.obs, buf.next_obs, buf.actions, buf.rewards, buf.terminated,
                     buf.priority, buf.max_priority]
        shared = [opt.learning_rate, self.num_timesteps, self.num_updates, self.grad_steps,
                  self.epsilon, buf.pos, buf.size]
        return per_seed, shared

    def export(self, index: int) -> DQN:
        """Seed ``self.seeds[index]`` as an ordinary (one-seed) DQN: its online and target
        networks, Adam moments and count, observation statistics, replay buffer, step counts,
        ``history`` and recent returns (:func:`agents.backends.seed_axis.export_seed`). It saves,
        loads, evaluates, is certified and attacked like any other.

        >>> import agents
        >>> many = agents.DQN(env="CartPole-v1", num_seeds=2, seed=5, hidden_sizes=(8,),
        ...                   buffer_size=64, batch_size=8, preset=None)
        >>> one = many.export(1)
        >>> one.config.seed, one.num_seeds, one.q.net.weights_[0].shape.as_list()
        (6, 1, [4, 8])
        """
        return export_seed(self, index)

    def import_seed(self, index: int, one: Self) -> None:
        """Seed ``one`` (an ordinary agent) as slice ``index`` of this one (resume, ``load``;
        :func:`agents.backends.seed_axis.import_seed`)."""
        import_seed(self, index, one)

    # -- public model access -------------------------------------------------------------
    def q_values(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """``Q(obs, .)`` for a batch of raw observations, differentiable w.r.t. ``obs``."""
        self._one_seed("q_values")
        return self.q(tf.convert_to_tensor(obs, tf.float32))

    def policy_surface(self) -> PolicySurface:
        """The greedy policy as attacks and certification see it: the online network's
        Q-values of the normalised observation (see :class:`agents.PolicySurface`)."""
        self._one_seed("policy_surface")
        net = self.q.net
        return PolicySurface("q_values", net, obs_shape=self.obs_shape, normalizer=self._obs_rms(),
                             layers=list(zip(net.weights_, net.biases)),
                             activation=self.config.activation)

    def seed_axis_surface(self) -> PolicySurface:
        """The greedy policies of all ``S`` seeds (``num_seeds > 1``) for robust training on the
        seed axis: Q-values of observations ``[S, B, d]``, each seed's own network and
        normaliser (:class:`agents.PolicySurface` ``num_seeds``)."""
        net = self.q.net
        return PolicySurface("q_values", net, obs_shape=self.obs_shape, normalizer=self._obs_rms(),
                             activation=self.config.activation, num_seeds=self.num_seeds,
                             seed_layers=list(zip(net.weights_, net.biases)))

    def _act_graph(self, obs, deterministic):
        greedy = tf.argmax(self.q(obs), axis=-1, output_type=tf.int32)
        if deterministic or self.config.eval_epsilon == 0:
            return greedy
        return self._explore(greedy, tf.constant(self.config.eval_epsilon), self._act_rng)

    def _explore(self, greedy, eps, rng):
        n = tf.shape(greedy)[0]
        u = rng.uniform([n])
        rand = rng.uniform([n], 0, self.n_actions, dtype=tf.int32)
        return tf.where(u < eps, rand, greedy)

    # -- collection (agents.core.collectors: the collector steps the environments) ---------------
    def _collection(self, n_steps, steps_done, explore_steps, timesteps, total_envs):
        return self._collect(tf.constant(n_steps), tf.constant(steps_done, tf.int64),
                             tf.constant(explore_steps, tf.float32),
                             tf.constant(timesteps, tf.int64), tf.constant(total_envs))

    def _batch_shape(self, kwargs):
        return int(kwargs["n_steps"]), (self.collector.num_envs,)

    def _collection_args(self, steps_done, explore_steps) -> dict:
        """The collection arguments of one iteration (plain numbers: Ray workers get them)."""
        cfg = self.config
        return {"n_steps": cfg.train_freq, "steps_done": int(steps_done),
                "explore_steps": float(explore_steps),
                "timesteps": int(self.num_timesteps.numpy()), "total_envs": cfg.num_envs}

    def _collect_graph(self, n_steps, steps_done, explore_steps, timesteps, total_envs):
        """``n_steps`` epsilon-greedy steps of every env of the collector (its traceable step);
        returns the batch of :mod:`agents.core.collectors` ``[n_steps, num_envs, ...]`` and each
        step's ``epsilon [n_steps]``. Step ``t`` is env step ``steps_done + t * total_envs`` of
        this ``learn`` budget and ``timesteps + t * total_envs`` overall (``total_envs``: every
        env of every rollout worker), which set epsilon. The observation statistics are
        updated after each step, so that the next greedy action sees them."""
        self.trace_counts["collect"] += 1
        n = self.collector.num_envs
        fields = (("obs", tf.float32, (n,) + self.obs_shape), ("actions", tf.int32, (n,)),
                  ("rewards", tf.float32, (n,)), ("terminated", tf.bool, (n,)),
                  ("truncated", tf.bool, (n,)), ("final_obs", tf.float32, (n,) + self.obs_shape),
                  ("epsilon", tf.float32, ()))
        tas = {k: tf.TensorArray(d, size=n_steps, element_shape=shape) for k, d, shape in fields}
        obs = self._obs.read_value()
        collector = self.collector
        carry = collector.begin(n_steps)
        for t in tf.range(n_steps):
            step = t * total_envs
            eps = self._collect_epsilon(tf.cast(steps_done, tf.float32) + tf.cast(step, tf.float32),
                                        timesteps + tf.cast(step, tf.int64), explore_steps)
            a = self._epsilon_greedy(obs, eps)
            carry, (nobs, r, term, trunc, fin) = collector.step(carry, a, t)
            tas = {k: tas[k].write(t, x)
                   for k, x in zip(list(tas), (obs, a, r, term, trunc, fin, eps))}
            self.q.obs_norm.update(obs)
            obs = nobs
        self._obs.assign(obs)
        collector.end(carry)
        return {k: ta.stack() for k, ta in tas.items()}

    def _collect_epsilon(self, done, timesteps, explore_steps):
        """Epsilon after ``done`` env steps of this ``learn`` budget (every env of every
        rollout worker counts): linear from the initial to the final value over
        ``explore_steps``, and 1 while ``timesteps < learning_starts``."""
        cfg = self.config
        eps = linear(cfg.exploration_initial_eps, cfg.exploration_final_eps, done, explore_steps)
        return tf.where(timesteps < cfg.learning_starts, 1.0, eps)

    def _epsilon_greedy(self, obs, eps):
        """``[E]`` int32 epsilon-greedy actions at the training envs' observations ``obs [E,
        ...]`` (``E = S * num_envs``, seed-major: each seed's block by its own network, explored
        from its own stream; non-finite entries read as 0)."""
        safe = tf.where(tf.math.is_finite(obs), obs, tf.zeros_like(obs))
        q = self.q(tf.reshape(safe, self._lead + (self.config.num_envs,) + self.obs_shape))
        greedy = tf.argmax(q, axis=-1, output_type=tf.int32)  # [S, N]
        return tf.reshape(self.streams.draw(lambda g, a: self._explore(a, eps, g), greedy), [-1])

    def _record_graph(self, batch, update_obs_stats):
        """The learner's side of a collected batch, step by step in time order: transitions
        into the replay buffer, the step count, the target-network update when due, the
        observation statistics (``update_obs_stats``: unless the collection already updated
        them, i.e. unless it ran elsewhere) and the last epsilon."""
        self.trace_counts["record"] += 1
        n = self.collector.num_envs // self.num_seeds  # env steps per seed (the step count's unit)
        obs = batch["obs"]
        for t in tf.range(tf.shape(batch["actions"])[0]):
            self.buffer.add(obs[t], batch["actions"][t], batch["rewards"][t],
                            batch["final_obs"][t], batch["terminated"][t])
            self.num_timesteps.assign_add(n)
            if self.num_timesteps % self.config.target_update_interval < n:
                self._update_target()
            if update_obs_stats:
                self.q.obs_norm.update(obs[t])
        self.epsilon.assign(batch["epsilon"][-1])
        return self.buffer.size

    # -- update --------------------------------------------------------------------------
    def td_targets(self, rewards: tf.Tensor, next_obs: tf.Tensor, terminated: tf.Tensor
                   ) -> tf.Tensor:
        """Double-DQN (or plain) TD targets ``[S, B]``, under ``tf.stop_gradient``."""
        cfg = self.config
        next_q_target = self.q_target(next_obs)
        scores = self.q(next_obs) if cfg.double_dqn else next_q_target
        # the robustness plug-in may choose the next action otherwise (WocaR-DQN); the value
        # at the argmax of the target's own scores is exactly their max
        scores = self._robust_hooks().target_action_scores(next_obs, scores)
        a_star = tf.argmax(scores, axis=-1, output_type=tf.int32)
        next_q = tf.gather(next_q_target, a_star, batch_dims=a_star.shape.rank)
        return td_target(rewards, next_q, terminated, cfg.gamma)

    def loss(self, obs: tf.Tensor, actions: tf.Tensor, rewards: tf.Tensor, next_obs: tf.Tensor,
             terminated: tf.Tensor, weights: tf.Tensor | None = None
             ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Mean (``weights``-weighted) Huber loss of ``Q(obs, actions)`` against the TD
        targets (as the robustness plug-in's
        :meth:`~agents.core.plugin.RobustnessPlugin.q_loss` shapes it per example; unchanged
        without one); returns ``(loss, Q(obs, actions), TD errors)``. Every input is ``[S, B,
        ...]`` (the seed axis) and the loss ``[S]``, each seed's mean over its own batch."""
        target = self.td_targets(rewards, next_obs, terminated)
        q_all = self.q(obs)
        q = tf.gather(q_all, actions, batch_dims=actions.shape.rank)
        per_example = huber(q - target, self.config.huber_delta)
        per_example = self._robust_hooks().q_loss(per_example, obs, actions, q_all, target)
        if weights is not None:
            per_example = weights * per_example
        return _mean(per_example), q, q - target

    def _sample(self, beta):
        """Minibatch indices into the replay buffer and their loss weights: uniform, or
        proportional to the priorities (stratified inverse-CDF sampling, float64 CDF) with
        importance-sampling weights ``(N P(i)) ** -beta / max``, ``[S, B]`` each (each seed's
        from its own stream)."""
        return self.buffer.sample(self.streams.generators, self.config.batch_size, beta)

    def _update_priorities(self, idx, td):
        """New priorities ``(|td| + eps) ** alpha``; a non-finite TD error (a NaN
        observation) gets priority 0, so that transition is not drawn again."""
        cfg = self.config
        self.buffer.update_priorities(idx, td, cfg.priority_alpha, cfg.priority_eps)

    def _update_target(self):
        tau = self.config.tau
        for t, s in zip(self.q_target.trainable, self.q.trainable):
            t.assign(s if tau >= 1.0 else tau * s + (1.0 - tau) * t)

    def _robust_hooks(self):
        """The robustness plug-in's hooks on the seed axis (:func:`agents.core.plugin.on_seed_axis`)."""
        return on_seed_axis(self.robustness, self.num_seeds)

    def _gradient_step(self, batch, weights):
        """One gradient step on ``batch`` (:meth:`ReplayBuffer.gather`'s fields, ``[S, B,
        ...]``) with importance ``weights`` (or ``None``); returns ``(stats, TD errors)``:
        the step's :data:`TRAIN_STATS` but ``updates_tried`` (``[S]`` each)."""
        robustness = self._robust_hooks()  # agents.core.plugin: robust="adv", SA-DQN, WocaR-DQN
        robustness.learn_from_replay(batch)  # WocaR-DQN: its worst-attack Q-network
        obs = robustness.learner_observations(batch["obs"])  # the buffer keeps clean ones
        inputs = robustness.regularizer_inputs(obs)  # outside the tape
        with tf.GradientTape() as tape:
            loss, q, td = self.loss(obs, batch["actions"], batch["rewards"],
                                    batch["next_obs"], batch["terminated"], weights)
            hinge = tf.zeros(self._lead)
            if inputs is not None:
                term, hinge = robustness.regularizer(obs, inputs)
                loss = loss + term
        grads = tape.gradient(loss, self.variables)  # of the sum over seeds: each seed's own
        step = step_on_axis(self.gradient_step, grads)
        self.grad_steps.assign_add(1)
        return {"loss": loss, "q_mean": _mean(q), "sa_hinge": hinge,
                "grad_norm": step["grad_norm"],
                "updates_applied": tf.cast(step["applied"], tf.float32)}, td

    def _train_graph(self, n_steps, beta):
        """``n_steps`` gradient steps on replay minibatches (each seed its own); returns
        :data:`TRAIN_STATS` (``[S]`` each)."""
        self.trace_counts["train"] += 1
        cfg = self.config
        sums = _sums.zeros(TRAIN_STATS[:-1], self._lead)
        for _ in tf.range(n_steps):
            idx, weights = self._sample(beta)
            stats, td = self._gradient_step(self.buffer.gather(idx), weights)
            if cfg.prioritized_replay:
                self._update_priorities(idx, td)
            sums = _sums.add(sums, stats)
        n = tf.cast(n_steps, tf.float32)
        stats = _sums.means(sums, n)
        stats.update(updates_applied=sums["updates_applied"], updates_tried=n + tf.zeros(self._lead))
        return stats

    def _iteration_graph(self, n_steps, steps_done, explore_steps, gradient_steps, beta):
        """Collection, recording and (once ``learning_starts`` env steps are taken) the gradient
        steps of one iteration (a ``fused`` collector: one compiled call). Returns ``(trained,
        stats)``: whether the gradient steps ran, and their :data:`TRAIN_STATS` (zeros if not)."""
        self.trace_counts["iteration"] += 1
        batch = self._collect_graph(n_steps, steps_done, explore_steps,
                                    self.num_timesteps.read_value(),
                                    self.collector.num_envs // self.num_seeds)  # per seed
        self._record_graph(batch, False)
        trained = self.num_timesteps >= max(self.config.learning_starts, self.config.batch_size)
        stats = tf.cond(trained, lambda: self._train_graph(gradient_steps, beta),
                        lambda: {k: tf.zeros(self._lead) for k in TRAIN_STATS})
        return trained, stats

    def _train_iteration(self, steps_done, total):
        cfg = self.config
        num_envs = cfg.num_envs
        lr = cfg.learning_rate
        if cfg.learning_rate_final is not None:
            lr = linear(lr, cfg.learning_rate_final, steps_done, total)
        self.optimizer.learning_rate.assign(lr)
        explore = cfg.exploration_fraction * total
        beta = linear(cfg.priority_beta, 1.0, steps_done, total)
        if self.collector.fused and self.fuse_graph_iteration:  # one compiled call
            trained, stats = self._iteration(
                tf.constant(cfg.train_freq), tf.constant(steps_done, tf.int64),
                tf.constant(explore, tf.float32), tf.constant(cfg.gradient_steps),
                tf.constant(beta))
            logs = {"epsilon": float(self.epsilon.numpy()), "learning_rate": lr}
            logs.update(self._stats_logs(stats if bool(trained) else None))
            if bool(trained):
                self.num_updates.assign_add(1)
            return logs, cfg.train_freq * num_envs
        batch = self.collect(**self._collection_args(steps_done, explore))
        self._record(batch, self.collector.remote)  # Ray: the workers' copies collected
        logs = {"epsilon": float(self.epsilon.numpy()), "learning_rate": lr}
        logs.update(getattr(self.collector, "logs", {}))  # Ray: per-worker steps/s, restarts
        if int(self.num_timesteps.numpy()) >= max(cfg.learning_starts, cfg.batch_size):
            stats = self._train_steps(tf.constant(cfg.gradient_steps), tf.constant(beta))
            logs.update(self._stats_logs(stats))
            self.num_updates.assign_add(1)
        else:
            logs.update(self._stats_logs(None))
        return logs, cfg.train_freq * num_envs

    def _stats_logs(self, stats) -> dict:
        """The logs of an iteration's :data:`TRAIN_STATS` ``[S]`` (``None``: no gradient step
        yet): their means over seeds, and with several seeds each seed's under ``"per_seed"``
        (:func:`agents.core._sums.seed_logs`)."""
        if stats is None:  # nothing tried; each seed's applied count is 0 too
            zeros = np.zeros(self.num_seeds)
            logs = _sums.seed_logs({"updates_tried": zeros, "updates_applied": zeros},
                                   self.num_seeds)
            del logs["updates_applied"]  # its mean is logged once gradient steps are tried
            return logs
        return _sums.seed_logs(stats, self.num_seeds)
