"""``agents.config``, the path the guides import: the configs live in :mod:`agents.core.config`."""

from agents.core.config import (  # noqa: F401 - re-exported
    AUTO,
    PRESETS_FILE,
    A2CConfig,
    AgentConfig,
    DQNConfig,
    OnPolicyConfig,
    PPOConfig,
    REINFORCEConfig,
    check_seeds,
    get_preset,
    load_presets,
    make_config,
    preset_for,
)
