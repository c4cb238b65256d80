"""``agents.config``, the path the guides import: every config in one place. They live beside
what they configure: the fields every agent shares in :mod:`agents.core.config`, each
algorithm's beside its code (:mod:`agents.algorithms.ppo`, ...), the typed robust configs in
:mod:`agents.robustness.configs`."""

from agents.algorithms.a2c import A2CConfig  # noqa: F401 - re-exported
from agents.algorithms.dqn_config import DQNConfig  # noqa: F401 - re-exported
from agents.algorithms.onpolicy import OnPolicyConfig  # noqa: F401 - re-exported
from agents.algorithms.ppo import PPOConfig  # noqa: F401 - re-exported
from agents.algorithms.reinforce import REINFORCEConfig  # noqa: F401 - re-exported
from agents.core.config import AgentConfig, check_seeds  # noqa: F401 - re-exported
from agents.core.plugin import RobustMethod  # noqa: F401 - re-exported
from agents.core.presets import (  # noqa: F401 - re-exported
    AUTO,
    PRESETS_FILE,
    get_preset,
    load_presets,
    make_config,
    preset_for,
)
from agents.robustness.configs import ATLA, SA, Adversarial, WocaR  # noqa: F401 - re-exported
