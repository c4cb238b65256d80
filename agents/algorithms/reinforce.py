"""REINFORCE (Williams 1992) with a learned state-value baseline.

The policy gradient uses Monte-Carlo returns-to-go ``G_t`` minus the baseline
``V(s_t)``; the baseline is regressed on ``G_t``. Returns do not depend on the value
estimates except where the data stops before the episode does: the end of a rollout
and a time-limit truncation bootstrap from ``V`` of the next observation (a terminated
episode never does).
"""

from __future__ import annotations

from agents.algorithms.pg import PolicyGradient
from agents.core.config import REINFORCEConfig


class REINFORCE(PolicyGradient):
    """REINFORCE agent with baseline; see :class:`REINFORCEConfig`."""

    algo = "reinforce"
    config_cls = REINFORCEConfig
    config: REINFORCEConfig
    monte_carlo = True
