"""PPO for ``S`` seeds at once with stacked parameters: a leading seed axis on every variable.

:class:`StackedPPO` takes ``S`` ordinary :class:`agents.PPO` agents (same config but the seed,
``backend="graph"``), stacks their initial weights into ``[S, ...]`` variables and trains all
seeds in one compiled call per iteration: batched matmuls ``[S, B, in] @ [S, in, out]``, one
compiled environment batch of ``S * N`` environments (``N = num_envs`` per seed, each seed's
``N`` environments reset from its own seed), per-seed minibatch permutations, per-seed losses
whose sum is differentiated (seed ``s``'s loss depends only on slice ``s``, so the gradient of
the sum is the stack of the per-seed gradients), per-seed global-norm clipping, non-finite
guard and Adam (bias corrections count each seed's applied steps). :meth:`StackedPPO.export`
writes the result back into the ``S`` agents, which then save, load and evaluate as any other.

The algorithm is :class:`agents.PPO`'s update (Schulman et al. 2017; the same clipped
surrogate, value loss, entropy bonus, GAE and advantage standardisation per minibatch), tested
against it loss by loss and gradient by gradient. The random numbers are not the ones a seed
would draw alone (one stateless draw covers every seed, and the environments' resets after the
first come from one key of the batch), so a seed in a group and the same seed alone agree in
distribution, not bit for bit. Supported: discrete and Box actions, ``clip_vloss``,
``anneal_lr``, ``normalize_advantages``, ``max_grad_norm``; not ``normalize_obs``,
``normalize_reward``, ``target_kl`` or a custom ``transform`` (``agents.many.train_many``
falls back to its batch-of-agents design for those).

>>> import agents
>>> group = [agents.PPO(env="CartPole-v1", backend="graph", seed=s, n_steps=16, num_envs=2,
...                     preset=None) for s in (0, 1)]
>>> stacked = StackedPPO(group)
>>> out = stacked.iteration()
>>> out["stats"]["policy_loss"].shape.as_list(), out["done"].shape.as_list()
([2], [16, 2, 2])
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from agents.graph_envs import GraphEnvState
from agents.networks import _ACTIVATIONS
from agents.schedules import linear

if TYPE_CHECKING:
    from agents.config import PPOConfig

tfd = tfp.distributions

SUPPORTED_FIELDS = frozenset({
    "env", "num_envs", "async_envs", "seed", "gamma", "learning_rate", "max_grad_norm",
    "hidden_sizes", "activation", "max_nonfinite_updates", "checkpoint_dir", "checkpoint_every",
    "jit_compile", "preset", "backend", "n_steps", "gae_lambda", "anneal_lr",
    "normalize_advantages", "ent_coef", "vf_coef", "log_std_init", "n_epochs", "n_minibatches",
    "clip_coef", "clip_vloss"})
"""PPOConfig fields the stacked engine implements; any other field must keep its default."""


def unsupported_fields(config: PPOConfig) -> list[str]:
    """The fields of ``config`` that :class:`StackedPPO` does not implement and that differ
    from their default (empty: the config can be stacked)."""
    out = []
    for f in dataclasses.fields(config):
        if f.name in SUPPORTED_FIELDS:
            continue
        if f.name.startswith("robust_") and getattr(config, "robust", None) is None:
            continue  # read only with robust set (a preset may carry robust_kappa)
        default = f.default if f.default is not dataclasses.MISSING else None
        if getattr(config, f.name) != default:
            out.append(f.name)
    return out


def _param_getters(agent) -> list:
    """Functions ``agent -> tf.Variable`` in a fixed order: policy weights, biases, value
    weights, biases, then ``log_std`` for Box actions."""
    model = agent.model
    getters = []
    for net in ("policy_net", "value_net"):
        layers = len(getattr(model, net).weights_)
        getters += [lambda a, n=net, i=i: getattr(a.model, n).weights_[i] for i in range(layers)]
        getters += [lambda a, n=net, i=i: getattr(a.model, n).biases[i] for i in range(layers)]
    if not agent.discrete:
        getters.append(lambda a: a.model.log_std)
    return getters


class StackedPPO(tf.Module):
    """``S`` PPO agents trained as one (module doc). ``agents``: PPO agents with
    ``backend="graph"`` and equal configs up to ``seed``."""

    def __init__(self, agents: list):
        super().__init__(name="stacked_ppo")
        first = agents[0]
        cfg = first.config
        for a in agents:
            if type(a) is not type(first) or a.algo != "ppo" or a.config.backend != "graph":
                raise ValueError(f"agents must all be PPO agents with backend='graph', got {a!r}")
            if dataclasses.replace(a.config, seed=cfg.seed) != cfg:
                raise ValueError("agents must share one config up to the seed")
        bad = unsupported_fields(cfg)
        if bad:
            raise ValueError(f"config: the stacked engine does not implement {', '.join(bad)} "
                             "(train_many(..., design='group') runs those)")
        self.agents = list(agents)
        self.config = cfg
        self.S, self.N = len(agents), cfg.num_envs
        self.discrete = first.discrete
        self.obs_shape = first.obs_shape
        self.spec = first.env.spec
        self.activation = _ACTIVATIONS[cfg.activation]
        self.layers = len(first.model.policy_net.weights_)
        self._getters = _param_getters(first)
        self.params = [tf.Variable(np.stack([g(a).numpy() for a in agents]), name=f"p{j}")
                       for j, g in enumerate(self._getters)]
        self.m = [tf.Variable(tf.zeros_like(p), trainable=False, name="m") for p in self.params]
        self.v = [tf.Variable(tf.zeros_like(p), trainable=False, name="v") for p in self.params]
        self.adam_steps = tf.Variable(tf.zeros([self.S]), trainable=False, name="adam_steps")
        self.learning_rate = tf.Variable(float(cfg.learning_rate), trainable=False, name="lr")
        seeds = [a.config.seed for a in agents]
        self.rng = tf.random.Generator.from_seed(int(np.random.SeedSequence(seeds).generate_state(1)[0]))
        resets = [self.spec.reset(s, self.N) for s in seeds]
        key = tf.constant([seeds[0], 1 + self.S], tf.int64)  # one key for the batch's resets
        initial = GraphEnvState(*(tf.concat([r[i] for r in resets], 0) for i in range(3)), key)
        self.env_state = GraphEnvState(*(tf.Variable(x, trainable=False, name=f"env_{k}")
                                         for k, x in initial._asdict().items()))
        obs = self.spec.observe(initial)
        self.obs = tf.Variable(tf.reshape(obs, (self.S, self.N) + self.obs_shape),
                               trainable=False, name="obs")
        if not self.discrete:
            self._low = tf.constant(first.env.action_low)
            self._high = tf.constant(first.env.action_high)
        self.steps = 0
        self.iteration = tf.function(self._iteration_graph, jit_compile=cfg.jit_compile)

    # -- model ------------------------------------------------------------------------------
    def _mlp(self, x, offset):
        """``x [S, B, in]`` through the stacked MLP whose weights start at ``params[offset]``."""
        n_layers = self.layers
        for i in range(n_layers):
            w, b = self.params[offset + i], self.params[offset + n_layers + i]
            x = tf.matmul(x, w) + b[:, None, :]
            if i < n_layers - 1:
                x = self.activation(x)
        return x

    def _flat(self, obs):
        return tf.reshape(obs, (self.S, -1, int(np.prod(self.obs_shape))))

    def distribution(self, obs: tf.Tensor) -> tfd.Distribution:
        """The policies of all seeds on ``obs [S, B, *obs_shape]``: batch shape ``[S, B]``."""
        out = self._mlp(self._flat(obs), 0)
        if self.discrete:
            return tfd.Categorical(logits=out)
        std = tf.exp(self.params[-1])[:, None, :] * tf.ones_like(out)
        return tfd.Independent(tfd.Normal(out, std), reinterpreted_batch_ndims=1)

    def value(self, obs: tf.Tensor) -> tf.Tensor:
        """``V`` of all seeds on ``obs [S, B, *obs_shape]``: ``[S, B]``."""
        return tf.squeeze(self._mlp(self._flat(obs), 2 * self.layers), -1)

    # -- rollout ----------------------------------------------------------------------------
    def _sample_actions(self, obs, seed):
        """``distribution(obs).sample(seed=seed)`` (``[S, N]`` actions); discrete: the one
        ``stateless_categorical`` that sample makes, without the distribution object."""
        if not self.discrete:
            return self.distribution(obs).sample(seed=seed)
        logits = self._mlp(self._flat(obs), 0)
        draws = tf.random.stateless_categorical(tf.reshape(logits, [-1, logits.shape[-1]]), 1,
                                                seed=seed, dtype=tf.int32)
        return tf.reshape(draws, tf.shape(logits)[:2])

    def _seed(self):
        return tf.cast(self.rng.make_seeds(1)[:, 0], tf.int32)

    def _rollout(self):
        horizon, n_seeds, n_envs = self.config.n_steps, self.S, self.N
        shape = (n_seeds, n_envs) + self.obs_shape
        a_dtype = tf.int32 if self.discrete else tf.float32
        names = ("obs", "actions", "rewards", "terminated", "truncated", "final_obs",
                 "ended_return", "ended_length")
        dtypes = (tf.float32, a_dtype, tf.float32, tf.bool, tf.bool, tf.float32, tf.float32,
                  tf.int32)
        tas = {k: tf.TensorArray(d, size=horizon) for k, d in zip(names, dtypes)}
        obs = self.obs.read_value()
        seeds = tf.cast(self.rng.make_seeds(horizon), tf.int32)
        # the env state is the loop's carry: read before the loop, assigned once after it
        state = GraphEnvState(*(v.read_value() for v in self.env_state))
        for t in tf.range(horizon):
            safe = tf.where(tf.math.is_finite(obs), obs, tf.zeros_like(obs))
            a = self._sample_actions(safe, seeds[:, t])
            a_env = a if self.discrete else tf.clip_by_value(a, self._low, self._high)
            flat = tf.reshape(a_env, [n_seeds * n_envs] if self.discrete else [n_seeds * n_envs, -1])
            new_state, nobs, r, term, trunc, fin = self.spec.step(state, flat)
            row = {"obs": obs, "actions": a, "rewards": r, "terminated": term,
                   "truncated": trunc, "final_obs": fin,
                   "ended_return": tf.cast(state.episode_return, tf.float32) + r,
                   "ended_length": state.time + 1}
            row = {k: x if k in ("obs", "actions") else tf.reshape(x, (n_seeds, n_envs) + tuple(x.shape[1:]))
                   for k, x in row.items()}
            tas = {k: tas[k].write(t, row[k]) for k in names}
            obs = tf.reshape(nobs, shape)
            state = new_state
        self.obs.assign(obs)
        for variable, value in zip(self.env_state, state):
            variable.assign(value)
        return {k: v.stack() for k, v in tas.items()}  # [T, S, N, ...]

    # -- update -----------------------------------------------------------------------------
    def _apply(self, grads):
        """Per-seed global-norm clipping, non-finite guard and Adam; returns ``(norm [S],
        applied [S] bool)``."""
        cfg = self.config
        sq = tf.add_n([tf.reduce_sum(tf.square(g), axis=list(range(1, g.shape.rank)))
                       for g in grads])
        norm = tf.sqrt(sq)
        ok = tf.math.is_finite(norm)
        if cfg.max_grad_norm:
            scale = tf.where(norm > cfg.max_grad_norm,
                             cfg.max_grad_norm / tf.maximum(norm, 1e-30), 1.0)
        else:
            scale = tf.ones_like(norm)
        b1, b2, eps = 0.9, 0.999, 1e-5
        t = self.adam_steps + tf.cast(ok, tf.float32)
        self.adam_steps.assign(t)
        c1, c2 = 1.0 - tf.pow(b1, t), 1.0 - tf.pow(b2, t)
        for p, m, v, g in zip(self.params, self.m, self.v, grads):
            b = (self.S,) + (1,) * (g.shape.rank - 1)
            keep = tf.reshape(ok, b)
            g = tf.where(keep, g * tf.reshape(scale, b), 0.0)
            m_new = b1 * m + (1 - b1) * g
            v_new = b2 * v + (1 - b2) * tf.square(g)
            step = self.learning_rate * (m_new / tf.reshape(c1, b)) / (
                tf.sqrt(v_new / tf.reshape(c2, b)) + eps)
            m.assign(tf.where(keep, m_new, m))
            v.assign(tf.where(keep, v_new, v))
            p.assign(tf.where(keep, p - step, p))
        return norm, ok

    def losses(self, obs: tf.Tensor, actions: tf.Tensor, logp_old: tf.Tensor,
               advantages: tf.Tensor, returns: tf.Tensor, values: tf.Tensor
               ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Per-seed PPO losses on a minibatch (``[S, mb, ...]`` inputs): ``(loss [S], stats)``
        with :class:`agents.PPO`'s terms."""
        cfg = self.config
        c = cfg.clip_coef
        if cfg.normalize_advantages:
            mean, var = tf.nn.moments(advantages, axes=[1], keepdims=True)
            advantages = (advantages - mean) / (tf.sqrt(var) + 1e-8)
        dist = self.distribution(obs)
        logratio = dist.log_prob(actions) - logp_old
        ratio = tf.exp(logratio)
        entropy = tf.reduce_mean(dist.entropy(), axis=1)
        pg_loss = tf.reduce_mean(tf.maximum(-advantages * ratio,
                                            -advantages * tf.clip_by_value(ratio, 1 - c, 1 + c)),
                                 axis=1)
        new_v = self.value(obs)
        if cfg.clip_vloss:
            v_clipped = values + tf.clip_by_value(new_v - values, -c, c)
            v_loss = 0.5 * tf.reduce_mean(tf.maximum(tf.square(new_v - returns),
                                                     tf.square(v_clipped - returns)), axis=1)
        else:
            v_loss = 0.5 * tf.reduce_mean(tf.square(new_v - returns), axis=1)
        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
                 "approx_kl": tf.reduce_mean((ratio - 1.0) - logratio, axis=1),
                 "clip_fraction": tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > c, tf.float32),
                                                 axis=1)}
        return loss, stats

    def _iteration_graph(self):
        """Rollout, targets and update of every seed (one compiled call)."""
        batch = self._rollout()
        return {"stats": self.train_on(batch), "done": batch["terminated"] | batch["truncated"],
                "ended_return": batch["ended_return"], "ended_length": batch["ended_length"]}

    def train_on(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Targets and the PPO update of every seed on a rollout ``batch`` of ``[T, S, N, ...]``
        tensors (``obs``, ``actions``, ``rewards``, ``terminated``, ``truncated``,
        ``final_obs``); returns ``[S]`` statistics."""
        cfg = self.config
        horizon, n_seeds, n_envs = cfg.n_steps, self.S, self.N
        batch_size = horizon * n_envs

        def per_seed(x):  # [T, S, N, ...] -> [S, T * N, ...]
            x = tf.transpose(x, [1, 0, 2] + list(range(3, x.shape.rank)))
            return tf.reshape(x, (n_seeds, batch_size) + tuple(x.shape[3:]))

        obs, fin, actions = per_seed(batch["obs"]), per_seed(batch["final_obs"]), \
            per_seed(batch["actions"])
        term = batch["terminated"]
        ends = term | batch["truncated"]

        def per_time(x):  # [S, T * N] -> [T, S, N]
            return tf.transpose(tf.reshape(x, (n_seeds, horizon, n_envs)), [1, 0, 2])

        values_tsn = per_time(self.value(obs))
        next_values = tf.stop_gradient(per_time(self.value(fin)) * (1.0 - tf.cast(term,
                                                                                    tf.float32)))
        from agents.returns import gae
        adv, ret = gae(batch["rewards"], values_tsn, next_values, ends, cfg.gamma,
                       cfg.gae_lambda)
        advantages, returns = per_seed(adv[..., None])[..., 0], per_seed(ret[..., None])[..., 0]
        values = tf.stop_gradient(per_seed(values_tsn[..., None])[..., 0])
        logp_old = tf.stop_gradient(self.distribution(obs).log_prob(actions))
        mb = batch_size // cfg.n_minibatches
        keys = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                "grad_norm", "updates_applied")
        sums = {k: tf.zeros([n_seeds]) for k in keys}
        for _epoch in tf.range(cfg.n_epochs):
            perm = tf.argsort(tf.random.stateless_uniform([n_seeds, batch_size], seed=self._seed()), axis=-1)
            for k in tf.range(cfg.n_minibatches):
                idx = perm[:, k * mb:(k + 1) * mb]

                def take(x, idx=idx):
                    return tf.gather(x, idx, batch_dims=1)

                with tf.GradientTape() as tape:
                    loss, stats = self.losses(take(obs), take(actions), take(logp_old),
                                              take(advantages), take(returns), take(values))
                    total = tf.reduce_sum(loss)
                grads = tape.gradient(total, self.params)
                norm, ok = self._apply(grads)
                stats.update(grad_norm=norm, updates_applied=tf.cast(ok, tf.float32))
                sums = {key: sums[key] + stats[key] for key in keys}
        n = float(cfg.n_epochs * cfg.n_minibatches)
        out = {k: v / n for k, v in sums.items() if k != "updates_applied"}
        out["updates_applied"] = sums["updates_applied"]
        out["updates_tried"] = tf.fill([n_seeds], n)
        var_y = tf.math.reduce_variance(returns, axis=1)
        out["explained_variance"] = tf.where(
            var_y > 0, 1.0 - tf.math.reduce_variance(returns - values, axis=1) / var_y, np.nan)
        return out

    # -- training loop ----------------------------------------------------------------------
    def train(self, steps: int, total: int | None = None) -> list:
        """``steps`` more environment steps per seed (whole iterations); ``total``: the length
        of the learning-rate schedule (default ``steps``). Records ``history`` and
        ``episode_returns`` on the agents, exports the weights into them and returns them."""
        from agents.base import NonFiniteTrainingError

        cfg = self.config
        per_iteration = cfg.n_steps * self.N
        total = total or steps
        failures = np.zeros(self.S, int)
        done = 0
        while done < steps:
            lr = linear(cfg.learning_rate, 0.0, self.steps, total) if cfg.anneal_lr \
                else cfg.learning_rate
            self.learning_rate.assign(lr)
            out = self.iteration()
            done += per_iteration
            self.steps += per_iteration
            ended = out["done"].numpy()
            returns = out["ended_return"].numpy()
            stats = {k: v.numpy() for k, v in out["stats"].items()}
            for s, agent in enumerate(self.agents):
                for t, n in zip(*np.nonzero(ended[:, s, :])):
                    agent.episode_returns.append(float(returns[t, s, n]))
                agent.num_timesteps.assign_add(per_iteration)
                agent.num_updates.assign_add(1)
                agent.history.append({
                    "steps": int(agent.num_timesteps.numpy()),
                    "episode_return": (float(np.mean(agent.episode_returns))
                                       if agent.episode_returns else float("nan"))})
                tried, applied = stats["updates_tried"][s], stats["updates_applied"][s]
                agent.rejected_steps += int(round(tried - applied))
                failures[s] = failures[s] + 1 if applied == 0 else 0
                if failures[s] >= cfg.max_nonfinite_updates:
                    self.export()
                    raise NonFiniteTrainingError(
                        f"seed {agent.config.seed}: training stopped after {failures[s]} "
                        "consecutive updates with non-finite gradients")
            self.last_logs = stats
        self.export()
        return self.agents

    def export(self) -> None:
        """Write every seed's weights, Adam moments and step count into its agent."""
        steps = self.adam_steps.numpy()
        for s, agent in enumerate(self.agents):
            opt = agent.optimizer  # agents._step.AdamSlots: m, v aligned with agent.variables
            index = {id(v): i for i, v in enumerate(agent.variables)}
            for j, getter in enumerate(self._getters):
                var = getter(agent)
                var.assign(self.params[j][s])
                i = index[id(var)]
                opt.m[i].assign(self.m[j][s])
                opt.v[i].assign(self.v[j][s])
            opt.iterations.assign(int(steps[s]))
            opt.learning_rate.assign(self.learning_rate)
            agent._env_ready = False  # its own env was not stepped: reset before learn()


__all__ = ["SUPPORTED_FIELDS", "StackedPPO", "unsupported_fields"]
