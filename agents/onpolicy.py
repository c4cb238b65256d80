"""On-policy actor-critic machinery shared by REINFORCE, A2C and PPO.

Two compiled functions per iteration, each traced once (one, ``_iteration()``, with
``backend="graph"``: the environment is then TensorFlow ops stepped inside the rollout):

* ``_rollout()``: ``n_steps`` vector-env steps in one ``tf.function`` loop. The policy
  samples in the graph; the environment is stepped through ``tf.numpy_function``; the
  whole rollout is one graph call (no per-step Python beyond the env itself).
* ``_train(batch)``: values, bootstrap values of final observations, targets (GAE or
  Monte-Carlo, under ``tf.stop_gradient``), then the algorithm's ``_update``.

Observation statistics are frozen during a rollout and its update (so PPO's ratio starts
at exactly 1) and updated afterwards, skipping non-finite rows.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents._step import make_adam_step
from agents.base import Agent
from agents.config import OnPolicyConfig
from agents.envs import RunningMeanStd
from agents.networks import ActorCritic
from agents.policy import PolicySurface
from agents.returns import bootstrap_values, discounted_returns, gae
from agents.schedules import linear

if TYPE_CHECKING:
    import tensorflow_probability as tfp


def _normalize(x):
    mean, var = tf.nn.moments(x, axes=[0])
    return (x - mean) / (tf.sqrt(var) + 1e-8)


class OnPolicyAgent(Agent):
    """Base of the actor-critic agents; subclasses implement ``_update``."""

    config_cls = OnPolicyConfig
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
        self.model = ActorCritic(self.obs_shape, n_out, self.discrete, cfg.hidden_sizes,
                                 cfg.activation, cfg.normalize_obs, cfg.log_std_init, cfg.seed)
        self.variables = self.model.trainable
        self.gradient_step, self.optimizer = make_adam_step(  # transforms.adam, fused kernel
            self.variables, cfg.learning_rate, cfg.max_grad_norm, self.transform)
        self.reward_rms = RunningMeanStd((), name="reward_rms")
        n_envs = cfg.num_envs
        self._ret_acc = tf.Variable(tf.zeros([n_envs]), trainable=False, name="return_acc")
        self._last_end = tf.Variable(tf.zeros([n_envs], tf.bool), trainable=False, name="last_end")
        self._obs = tf.Variable(tf.zeros((n_envs,) + self.obs_shape), trainable=False, name="obs")
        if not self.discrete:
            self._low = tf.constant(self.env.action_low)
            self._high = tf.constant(self.env.action_high)
        self.trace_counts = collections.Counter()
        self._rollout = tf.function(self._rollout_graph)
        self._train = tf.function(self._train_graph, jit_compile=cfg.jit_compile)
        # backend="graph": rollout + targets + update of an iteration in one compiled call
        self._iteration = tf.function(self._iteration_graph, jit_compile=cfg.jit_compile)

    def _checkpoint_modules(self):
        return {"model": self.model, "optimizer": self.optimizer,
                "gradient_step": self.gradient_step, "reward_rms": self.reward_rms,
                "return_acc": self._ret_acc}

    def _obs_rms(self):
        return self.model.obs_norm.rms if self.config.normalize_obs else None

    def _model_variables(self):
        return list(self.model.variables)

    def _on_env_reset(self, obs):
        self._obs.assign(obs)
        self._ret_acc.assign(tf.zeros_like(self._ret_acc))
        self._last_end.assign(tf.zeros_like(self._last_end))

    # -- public model access -------------------------------------------------------------
    def distribution(self, obs: tf.Tensor | np.ndarray) -> tfp.distributions.Distribution:
        """The policy's TFP distribution for a batch of raw observations (differentiable).

        Eagerly, NaN or infinite observations are a ``ValueError`` (inside a ``tf.function`` the
        caller's graph is trusted: the rollout replaces them and the guard rejects the update)."""
        obs = tf.convert_to_tensor(obs, tf.float32)
        if tf.executing_eagerly() and not bool(tf.reduce_all(tf.math.is_finite(obs))):
            rows = tf.reshape(tf.math.is_finite(obs), [tf.shape(obs)[0], -1]) \
                if obs.shape.rank and obs.shape.rank > 1 else tf.reshape(tf.math.is_finite(obs), [1, -1])
            bad = np.flatnonzero(~tf.reduce_all(rows, axis=1).numpy())
            raise ValueError(f"obs: must be finite; observation(s) {bad[:5].tolist()} of "
                             f"{int(rows.shape[0])} hold NaN or inf")
        return self.model.distribution(obs)

    def value(self, obs: tf.Tensor | np.ndarray) -> tf.Tensor:
        """State values ``V(obs)`` for a batch of raw observations (differentiable)."""
        return self.model.value(tf.convert_to_tensor(obs, tf.float32))

    def policy_surface(self) -> PolicySurface:
        """The policy as attacks and certification see it: logits or the Gaussian mean of the
        normalised observation, the normaliser, the critic (``None`` when ``vf_coef == 0``: never
        trained) and the action bounds (see :class:`agents.PolicySurface`)."""
        m, cfg, space = self.model, self.config, self.env.single_action_space
        net = m.policy_net
        return PolicySurface(
            "logits" if self.discrete else "gaussian_mean", net, obs_shape=self.obs_shape,
            normalizer=self._obs_rms(), value=m.value if cfg.vf_coef > 0 else None,
            log_std=None if self.discrete else m.log_std,
            action_low=None if self.discrete else space.low,
            action_high=None if self.discrete else space.high,
            layers=list(zip(net.weights_, net.biases)), activation=cfg.activation)

    def _perceived(self, obs, seed):
        """What the policy sees of the rollout's ``obs`` ``[N, d]`` (and what is stored and
        learned from): ``obs`` itself; ``robust="adv"`` returns it attacked (agents.robust).
        ``seed``: the step's stateless seed ``[2]`` int32."""
        return obs

    def _act_graph(self, obs, deterministic):
        dist = self.model.distribution(obs)
        if deterministic:
            a = dist.mode()
        else:
            a = dist.sample(seed=self._seed(self._act_rng))
        if not self.discrete:
            a = tf.clip_by_value(a, self._low, self._high)
        return a

    # -- rollout -------------------------------------------------------------------------
    def _env_step_np(self, actions):
        return self.env.step(actions)

    def _sample_actions(self, obs, seed):
        """Actions ``[N]`` int32 (discrete) or ``[N, d]`` float32 drawn from the policy at the
        (finite) observations ``obs`` with the stateless ``seed``. Discrete: the draw
        ``Categorical(logits).sample(seed=seed)`` makes (one ``stateless_categorical``), without
        building the distribution object in the rollout's loop."""
        if self.discrete:
            logits = self.model.policy_net(self.model.obs_norm(obs))
            return tf.random.stateless_categorical(logits, 1, seed=seed, dtype=tf.int32)[:, 0]
        return self.model.distribution(obs).sample(seed=seed)

    def _rollout_graph(self):
        self.trace_counts["rollout"] += 1
        horizon, n_envs = self.config.n_steps, self.config.num_envs
        graph_env = self.config.backend == "graph"
        obs_shape = (n_envs,) + self.obs_shape
        a_dtype = tf.int32 if self.discrete else tf.float32
        tas = {
            "obs": tf.TensorArray(tf.float32, size=horizon, element_shape=obs_shape),
            "actions": tf.TensorArray(a_dtype, size=horizon),
            "rewards": tf.TensorArray(tf.float32, size=horizon, element_shape=(n_envs,)),
            "terminated": tf.TensorArray(tf.bool, size=horizon, element_shape=(n_envs,)),
            "truncated": tf.TensorArray(tf.bool, size=horizon, element_shape=(n_envs,)),
            "final_obs": tf.TensorArray(tf.float32, size=horizon, element_shape=obs_shape),
        }
        obs = self._obs.read_value()
        # backend="graph": the env state is carried by the loop, read and assigned once, and
        # the episodes that end are recorded once after the loop (placeholders otherwise)
        env_state, ended = tf.constant(0), tf.constant(0)
        if graph_env:
            env_state = self.env.state
            ended = (tf.TensorArray(self.env.spec.dtype, size=horizon, element_shape=(n_envs,)),
                     tf.TensorArray(tf.int32, size=horizon, element_shape=(n_envs,)))
        seeds = tf.cast(self.rng.make_seeds(horizon), tf.int32)  # one RNG read per rollout
        for t in tf.range(horizon):
            obs = self._perceived(obs, seeds[:, t])
            # a NaN observation must not break action selection; it is stored raw, so the
            # update that sees it is rejected by the non-finite guard
            safe = tf.where(tf.math.is_finite(obs), obs, tf.zeros_like(obs))
            a = self._sample_actions(safe, seeds[:, t])
            a_env = a if self.discrete else tf.clip_by_value(a, self._low, self._high)
            if graph_env:
                env_state, (nobs, r, term, trunc, fin), (ended_return, ended_length) = \
                    self.env.step_state(env_state, a_env)
                ended = (ended[0].write(t, ended_return), ended[1].write(t, ended_length))
            else:
                nobs, r, term, trunc, fin = self._env_step_in_graph(a_env)
            tas["obs"] = tas["obs"].write(t, obs)
            tas["actions"] = tas["actions"].write(t, a)
            tas["rewards"] = tas["rewards"].write(t, r)
            tas["terminated"] = tas["terminated"].write(t, term)
            tas["truncated"] = tas["truncated"].write(t, trunc)
            tas["final_obs"] = tas["final_obs"].write(t, fin)
            obs = nobs
        self._obs.assign(obs)
        batch = {k: v.stack() for k, v in tas.items()}
        if graph_env:
            self.env.write_state(env_state)
            self.env.record_episodes(batch["terminated"] | batch["truncated"],
                                     ended[0].stack(), ended[1].stack())
        return batch

    def _iteration_graph(self):
        """Rollout, targets and update of one iteration (``backend="graph"``: one call)."""
        self.trace_counts["iteration"] += 1
        return self._train_graph(self._rollout_graph())

    # -- targets and update --------------------------------------------------------------
    def _scale_rewards(self, rewards, ends):
        """Divide rewards by the running std of the discounted return (gymnasium's
        ``NormalizeReward``), updating the statistics with this rollout's returns."""
        gamma = self.config.gamma

        def body(carry, inp):
            ret, prev_end = carry
            r, end = inp
            ret = r + gamma * ret * (1.0 - tf.cast(prev_end, tf.float32))
            return ret, end

        rets, ends_seq = tf.scan(body, (rewards, ends),
                                 initializer=(self._ret_acc.read_value(),
                                              self._last_end.read_value()))
        self._ret_acc.assign(rets[-1])
        self._last_end.assign(ends_seq[-1])
        self.reward_rms.update(tf.reshape(rets, [-1]))
        return self.reward_rms.scale(rewards)

    def _train_graph(self, batch):
        self.trace_counts["train"] += 1
        cfg = self.config
        horizon, n_envs = cfg.n_steps, cfg.num_envs
        batch_size = horizon * n_envs
        obs = tf.reshape(batch["obs"], (batch_size,) + self.obs_shape)
        fin = tf.reshape(batch["final_obs"], (batch_size,) + self.obs_shape)
        actions = tf.reshape(batch["actions"], (batch_size,) + tuple(batch["actions"].shape[2:]))
        term, trunc = batch["terminated"], batch["truncated"]
        ends = tf.logical_or(term, trunc)
        rewards = batch["rewards"]
        if cfg.normalize_reward:
            rewards = self._scale_rewards(rewards, ends)
        values = tf.reshape(self.model.value(obs), [horizon, n_envs])
        next_values = bootstrap_values(tf.reshape(self.model.value(fin), [horizon, n_envs]), term)
        if self.monte_carlo:
            returns = discounted_returns(rewards, next_values, ends, cfg.gamma)
            advantages = tf.stop_gradient(returns - values)
        else:
            advantages, returns = gae(rewards, values, next_values, ends, cfg.gamma,
                                      cfg.gae_lambda)
        logp_old = tf.stop_gradient(self.model.distribution(obs).log_prob(actions))
        values = tf.stop_gradient(tf.reshape(values, [batch_size]))
        returns = tf.reshape(returns, [batch_size])
        stats = self._update(obs, actions, logp_old, tf.reshape(advantages, [batch_size]), returns,
                             values)
        var_y = tf.math.reduce_variance(returns)
        stats["explained_variance"] = tf.where(
            var_y > 0, 1.0 - tf.math.reduce_variance(returns - values) / var_y, np.nan)
        self.model.obs_norm.update(obs)
        return stats

    def _losses(self, obs, actions, advantages, returns):
        """Vanilla policy-gradient loss (REINFORCE/A2C) on a batch."""
        cfg = self.config
        dist = self.model.distribution(obs)
        logp = dist.log_prob(actions)
        entropy = tf.reduce_mean(dist.entropy())
        adv = _normalize(advantages) if cfg.normalize_advantages else advantages
        pg_loss = -tf.reduce_mean(logp * tf.stop_gradient(adv))
        v_loss = 0.5 * tf.reduce_mean(tf.square(self.model.value(obs) - returns))
        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}

    def _update(self, obs, actions, logp_old, advantages, returns, values):
        """One gradient step on the whole batch (REINFORCE, A2C)."""
        with tf.GradientTape() as tape:
            loss, stats = self._losses(obs, actions, advantages, returns)
        grads = tape.gradient(loss, self.variables)
        step = self._apply_gradients(grads)
        stats = dict(stats)
        stats["loss"] = loss
        stats["grad_norm"] = step["grad_norm"]
        stats["updates_applied"] = tf.cast(step["applied"], tf.float32)
        stats["updates_tried"] = tf.constant(1.0)
        return stats

    def _start_iteration(self, steps_done, total) -> float:
        """Set this iteration's learning rate (linear annealing); returns it."""
        cfg = self.config
        lr = cfg.learning_rate
        if cfg.anneal_lr:
            lr = linear(lr, 0.0, steps_done, total)
        self.optimizer.learning_rate.assign(lr)
        return lr

    def _finish_iteration(self, stats, lr) -> tuple[dict, int]:
        """Count the iteration's steps and update; returns ``(logs, env steps)``."""
        cfg = self.config
        n = cfg.n_steps * cfg.num_envs
        self.num_timesteps.assign_add(n)
        self.num_updates.assign_add(1)
        logs = {k: float(v) for k, v in stats.items()}
        logs["learning_rate"] = lr
        return logs, n

    def _train_iteration(self, steps_done, total):
        cfg = self.config
        lr = self._start_iteration(steps_done, total)
        workers = self.rollout_workers  # agents.distributed: the same rollout on Ray actors
        if cfg.backend == "graph":
            stats = self._iteration()
        else:
            batch = self._rollout() if workers is None else workers.collect()
            stats = self._train(batch)
        logs, n = self._finish_iteration(stats, lr)
        if workers is not None:
            logs.update(workers.logs)  # per-worker steps/s, rollout time, restarts
        return logs, n
