"""``agents.config``, the path the guides import: the configs live in :mod:`agents.core.config`."""

from agents.core.config import (  # noqa: F401 - re-exported
    ATLA,
    AUTO,
    PRESETS_FILE,
    SA,
    A2CConfig,
    Adversarial,
    AgentConfig,
    DQNConfig,
    OnPolicyConfig,
    PPOConfig,
    REINFORCEConfig,
    RobustMethod,
    check_seeds,
    get_preset,
    load_presets,
    make_config,
    preset_for,
)
