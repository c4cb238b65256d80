"""REINFORCE (Williams 1992) with a learned state-value baseline.

The policy gradient uses Monte-Carlo returns-to-go ``G_t`` minus the baseline
``V(s_t)``; the baseline is regressed on ``G_t``. Returns do not depend on the value
estimates except where the data stops before the episode does: the end of a rollout
and a time-limit truncation bootstrap from ``V`` of the next observation (a terminated
episode never does).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.algorithms.onpolicy import OnPolicyConfig
from agents.algorithms.pg import PolicyGradient
from robustgrad.errors import ConfigError


@dataclass
class REINFORCEConfig(OnPolicyConfig):
    """REINFORCE (Williams 1992) with a learned state-value baseline.

    Returns are Monte-Carlo returns-to-go, independent of the value estimates; only the
    end of a rollout that cuts an episode (and a time-limit truncation) bootstraps from
    the baseline. Use long rollouts (``n_steps`` near the episode length).
    """

    num_envs: int = 8
    """Number of parallel environments."""
    n_steps: int = 256
    """Steps per environment in each rollout."""
    learning_rate: float = 1e-3
    """Adam learning rate (policy and baseline)."""
    gae_lambda: float = 1.0
    """Fixed at 1 (Monte-Carlo returns)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""

    def __post_init__(self):
        super().__post_init__()
        if self.gae_lambda != 1.0:
            raise ConfigError(f"gae_lambda must be 1.0 for REINFORCE (Monte-Carlo returns), got "
                             f"{self.gae_lambda!r}")
        if self.robust is not None:
            raise ConfigError(f"robust: REINFORCE has no robust variant (use PPO, A2C or DQN), "
                             f"got {self.robust!r}")


class REINFORCE(PolicyGradient):
    """REINFORCE agent with baseline; see :class:`REINFORCEConfig`."""

    algo = "reinforce"
    config_cls = REINFORCEConfig
    config: REINFORCEConfig
    monte_carlo = True
