"""Proximal Policy Optimisation (Schulman et al. 2017), CleanRL-style.

The update, readable top to bottom: for ``n_epochs`` epochs, shuffle the rollout into
``n_minibatches`` minibatches; per minibatch, standardise advantages, take the clipped
surrogate, the (optionally clipped) value loss and the entropy bonus, and pass the
gradient through the non-finite guard and global-norm clipping to Adam. Approximate KL
(``mean((r - 1) - log r)``, Schulman's unbiased estimator) and the clip fraction are
reported; ``target_kl`` stops the remaining epochs. The whole update is one
``tf.function`` (``tf.range`` loops).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from agents.algorithms.onpolicy import OnPolicyAgent, OnPolicyConfig, _mean, _normalize
from agents.core import _sums
from agents.core.config import positive
from agents.core.limits import MAX_REPEATS, check_update_work
from agents.core.streams import stateless_per_seed
from robustgrad.checks import positive_int
from robustgrad.errors import ConfigError


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO (Schulman et al. 2017) with the CleanRL ``ppo.py`` defaults for CartPole.

    Implementation details (Huang et al. 2022) that apply to vector observations: vector
    envs, orthogonal init, Adam eps 1e-5, LR annealing, GAE, minibatch epochs, advantage
    normalisation, clipped surrogate, value clipping, entropy bonus, global gradient
    clipping, separate networks, truncation bootstrapping, target-KL early stop.
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 128
    """Steps per environment in each rollout."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    n_epochs: int = 4
    """Optimisation epochs over each rollout (``update_epochs`` in CleanRL)."""
    n_minibatches: int = 4
    """Minibatches per epoch."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient epsilon."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimate (same coefficient)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    target_kl: float | None = None
    """Stop the epochs of an update early once the approximate KL exceeds this."""

    def __post_init__(self):
        super().__post_init__()
        self.n_epochs = positive_int(self.n_epochs, "n_epochs", maximum=MAX_REPEATS)
        self.n_minibatches = positive_int(self.n_minibatches, "n_minibatches")
        positive(self.clip_coef, "clip_coef")
        if self.target_kl is not None:
            positive(self.target_kl, "target_kl")
        if (self.num_envs * self.n_steps) % self.n_minibatches:
            raise ConfigError(
                f"n_minibatches must divide num_envs * n_steps = {self.num_envs * self.n_steps},"
                f" got {self.n_minibatches}")
        check_update_work(self, self.n_epochs * self.n_steps * self.num_envs * self.num_seeds,
                          "n_epochs * n_steps * num_envs * num_seeds")


class PPO(OnPolicyAgent):
    """PPO agent. ``PPO(env="CartPole-v1", seed=0).learn(100_000)``; see :class:`PPOConfig`.

    ``robust="sa"`` is SA-PPO (Zhang et al. 2020): each minibatch's loss gets
    ``kappa * KL(pi(.|s) || pi(.|s_hat))`` with ``s_hat`` from the ``mad`` attack
    (:mod:`agents.robustness.robust`); ``robust="adv"`` acts on attacked observations. Robust training
    enters through the agent's plug-in (``self.robustness``, :mod:`agents.core.plugin`).
    """

    algo = "ppo"
    config_cls = PPOConfig
    config: PPOConfig

    def _update(self, obs, actions, logp_old, advantages, returns, values):
        cfg, robust = self.config, self._robust_hooks
        lead = self._lead  # (S,): every statistic below is per seed
        batch = cfg.n_steps * cfg.num_envs
        mb = batch // cfg.n_minibatches
        c = cfg.clip_coef
        sums = _sums.zeros(("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                            "sa_kl", "grad_norm", "updates_applied"), lead)
        n = tf.zeros(lead)  # gradient steps tried (a seed stopped by target_kl tries no more)
        epochs = tf.zeros(lead)
        active = tf.ones(lead, tf.bool)
        for _epoch in tf.range(cfg.n_epochs):
            # each seed's shuffle from its own stream, as alone (agents.core.streams)
            perm = tf.argsort(stateless_per_seed(
                lambda key: tf.random.stateless_uniform((batch,), seed=key),
                self.streams.keys(), axis=True), axis=-1)
            # the epoch's shuffled batch, one gather per array (as PureJaxRL); each minibatch is
            # then a slice of static size: with perm[..., k*mb:(k+1)*mb] XLA cannot see the
            # length and pads every minibatch to the whole batch (4x the work)
            shuffled = [tf.gather(x, perm, axis=1, batch_dims=1) for x in (
                obs, actions, logp_old, advantages, returns, values)]
            kl_sum = tf.zeros(lead)
            on = tf.cast(active, tf.float32)
            for k in tf.range(cfg.n_minibatches):
                mb_obs, mb_act, mb_logp_old, mb_adv, mb_ret, mb_val = (
                    self._rows(x, k * mb, mb) for x in shuffled)
                if cfg.normalize_advantages:
                    mb_adv = _normalize(mb_adv)
                mb_robust = robust.regularizer_inputs(mb_obs)  # outside the tape
                with tf.GradientTape() as tape:
                    dist = self.model.distribution(mb_obs)
                    logratio = dist.log_prob(mb_act) - mb_logp_old
                    ratio = tf.exp(logratio)
                    entropy = _mean(dist.entropy())
                    pg_loss = _mean(tf.maximum(
                        -mb_adv * ratio, -mb_adv * tf.clip_by_value(ratio, 1 - c, 1 + c)))
                    new_v = self.model.value(mb_obs)
                    if cfg.clip_vloss:
                        v_clipped = mb_val + tf.clip_by_value(new_v - mb_val, -c, c)
                        v_loss = 0.5 * _mean(tf.maximum(
                            tf.square(new_v - mb_ret), tf.square(v_clipped - mb_ret)))
                    else:
                        v_loss = 0.5 * _mean(tf.square(new_v - mb_ret))
                    sa_loss, sa_kl = robust.regularizer(mb_obs, mb_robust)
                    loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss + sa_loss
                step = self._step(tape, loss, active)
                approx_kl = _mean((ratio - 1.0) - logratio)
                clipfrac = _mean(tf.cast(tf.abs(ratio - 1.0) > c, tf.float32))
                kl_sum += approx_kl
                sums = _sums.add(sums, {
                    "policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
                    "approx_kl": approx_kl, "clip_fraction": clipfrac, "sa_kl": sa_kl,
                    "grad_norm": step["grad_norm"],
                    "updates_applied": tf.cast(step["applied"], tf.float32)}, on)
                n += on
            epochs += on
            if cfg.target_kl is not None:  # a seed past the target is frozen (a mask)
                active = active & (kl_sum / float(cfg.n_minibatches) <= cfg.target_kl)
                if not tf.reduce_any(active):
                    break
        stats = _sums.means(sums, n)
        stats.update(updates_applied=sums["updates_applied"], updates_tried=n, epochs=epochs)
        return stats
