"""Synchronous advantage actor-critic, A2C (Mnih et al. 2016).

Short ``n_steps`` rollouts from ``num_envs`` environments, n-step (or GAE) advantages
bootstrapped from the critic, and one gradient step per rollout on
``policy_loss - ent_coef * entropy + vf_coef * value_loss``. Defaults follow
Stable-Baselines3's A2C, with Adam (eps 1e-5) instead of RMSprop.
"""

from __future__ import annotations

from agents.config import A2CConfig
from agents.onpolicy import OnPolicyAgent


class A2C(OnPolicyAgent):
    """A2C agent; see :class:`A2CConfig`."""

    algo = "a2c"
    config_cls = A2CConfig
