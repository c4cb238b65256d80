"""Synchronous advantage actor-critic, A2C (Mnih et al. 2016).

Short ``n_steps`` rollouts from ``num_envs`` environments, n-step (or GAE) advantages
bootstrapped from the critic, and one gradient step per rollout on
``policy_loss - ent_coef * entropy + vf_coef * value_loss``. Defaults follow
Stable-Baselines3's A2C, with Adam (eps 1e-5) instead of RMSprop. ``robust="sa"`` is SA-A2C
(Zhang et al. 2020): ``+ kappa * KL(pi(.|s) || pi(.|s_hat))`` (:mod:`agents.robust`).
"""

from __future__ import annotations

import tensorflow as tf

from agents.config import A2CConfig
from agents.onpolicy import OnPolicyAgent
from agents.robust import RobustOnPolicy


class A2C(RobustOnPolicy, OnPolicyAgent):
    """A2C agent; see :class:`A2CConfig`."""

    algo = "a2c"
    config_cls = A2CConfig

    def _update(self, obs, actions, logp_old, advantages, returns, values):
        if self.config.robust != "sa":
            return super()._update(obs, actions, logp_old, advantages, returns, values)
        obs_adv = self._sa_observations(obs)
        with tf.GradientTape() as tape:
            loss, stats = self._losses(obs, actions, advantages, returns)
            sa_loss, sa_kl = self._sa_term(obs, obs_adv)
            loss = loss + sa_loss
        step = self._apply_gradients(tape.gradient(loss, self.variables))
        stats = dict(stats, loss=loss, sa_kl=sa_kl, grad_norm=step["grad_norm"],
                     updates_applied=tf.cast(step["applied"], tf.float32),
                     updates_tried=tf.ones(self._lead))
        return stats
