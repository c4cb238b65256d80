"""Synchronous advantage actor-critic, A2C (Mnih et al. 2016).

Short ``n_steps`` rollouts from ``num_envs`` environments, n-step (or GAE) advantages
bootstrapped from the critic, and one gradient step per rollout on
``policy_loss - ent_coef * entropy + vf_coef * value_loss``. Defaults follow
Stable-Baselines3's A2C, with Adam (eps 1e-5) instead of RMSprop. ``robust="sa"`` is SA-A2C
(Zhang et al. 2020): ``+ kappa * KL(pi(.|s) || pi(.|s_hat))`` (:mod:`agents.robustness.robust`).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.algorithms.onpolicy import OnPolicyConfig
from agents.algorithms.pg import PolicyGradient


@dataclass
class A2CConfig(OnPolicyConfig):
    """Synchronous advantage actor-critic (Mnih et al. 2016): short n-step rollouts, one
    gradient step each. Defaults follow Stable-Baselines3's A2C (with Adam)."""

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 5
    """Steps per environment in each rollout."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0: plain n-step returns)."""
    learning_rate: float = 7e-4
    """Adam learning rate."""
    normalize_advantages: bool = False
    """Standardise advantages over the batch."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""


class A2C(PolicyGradient):
    """A2C agent; see :class:`A2CConfig`. Its update is :class:`agents.algorithms.pg.PolicyGradient`'s
    (one gradient step on the whole batch, with the robustness plug-in's term: SA-A2C)."""

    algo = "a2c"
    config_cls = A2CConfig
    config: A2CConfig
