"""Synchronous advantage actor-critic, A2C (Mnih et al. 2016).

Short ``n_steps`` rollouts from ``num_envs`` environments, n-step (or GAE) advantages
bootstrapped from the critic, and one gradient step per rollout on
``policy_loss - ent_coef * entropy + vf_coef * value_loss``. Defaults follow
Stable-Baselines3's A2C, with Adam (eps 1e-5) instead of RMSprop. ``robust="sa"`` is SA-A2C
(Zhang et al. 2020): ``+ kappa * KL(pi(.|s) || pi(.|s_hat))`` (:mod:`agents.robustness.robust`).
"""

from __future__ import annotations

from agents.algorithms.pg import PolicyGradient
from agents.core.config import A2CConfig


class A2C(PolicyGradient):
    """A2C agent; see :class:`A2CConfig`. Its update is :class:`agents.algorithms.pg.PolicyGradient`'s
    (one gradient step on the whole batch, with the robustness plug-in's term: SA-A2C)."""

    algo = "a2c"
    config_cls = A2CConfig
    config: A2CConfig
