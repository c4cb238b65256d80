"""``agents.observation_attacks``, the path the guides import: the attacks live in
:mod:`agents.robustness.observation_attacks`."""

from agents.robustness.observation_attacks import *  # noqa: F403 - re-exported
from agents.robustness.observation_attacks import __all__  # noqa: F401
