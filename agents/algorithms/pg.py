"""The vanilla policy-gradient update of REINFORCE and A2C: one gradient step per rollout.

``policy_loss - ent_coef * entropy + vf_coef * value_loss`` on the whole batch, where
``policy_loss = -mean(log pi(a|s) * A)`` (advantages ``A`` standardised when
``normalize_advantages``, under ``tf.stop_gradient``) and ``value_loss = 0.5 * mean((V(s) -
R)^2)``; REINFORCE's ``A`` and ``R`` are Monte-Carlo returns, A2C's GAE/n-step
(:meth:`agents.algorithms.onpolicy.OnPolicyAgent._train_graph`). With the seed axis every term
is ``[S]``, one per seed. The robustness plug-in adds its term (SA-A2C: ``sa_kl``).
"""

from __future__ import annotations

import tensorflow as tf

from agents.algorithms.onpolicy import OnPolicyAgent, _mean, _normalize


class PolicyGradient(OnPolicyAgent):
    """The base of :class:`agents.A2C` and :class:`agents.REINFORCE`: their update (module doc)."""

    def _losses(self, obs, actions, advantages, returns):
        """The loss ``[S]`` and its terms on a batch ``[S, B, ...]``."""
        cfg = self.config
        dist = self.model.distribution(obs)
        logp = dist.log_prob(actions)
        entropy = _mean(dist.entropy())
        adv = _normalize(advantages) if cfg.normalize_advantages else advantages
        pg_loss = -_mean(logp * tf.stop_gradient(adv))
        v_loss = 0.5 * _mean(tf.square(self.model.value(obs) - returns))
        loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
        return loss, {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}

    def _update(self, obs, actions, logp_old, advantages, returns, values):
        """One gradient step on the whole batch, with the robustness plug-in's term when it has
        one (``sa_kl`` in the statistics: SA-A2C)."""
        robust = self._robust_hooks
        inputs = robust.regularizer_inputs(obs)  # outside the tape
        robust_stats = {}
        with tf.GradientTape() as tape:
            loss, stats = self._losses(obs, actions, advantages, returns)
            if inputs is not None:
                term, robust_stats["sa_kl"] = robust.regularizer(obs, inputs)
                loss = loss + term
        step = self._step(tape, loss)
        stats = dict(stats)
        stats["loss"] = loss
        stats.update(robust_stats)
        stats["grad_norm"] = step["grad_norm"]
        stats["updates_applied"] = tf.cast(step["applied"], tf.float32)
        stats["updates_tried"] = tf.ones(self._lead)
        return stats
