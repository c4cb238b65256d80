"""The algorithm registry: one table from an algorithm's name to its agent class.

Every place that turns a name (``--algo ppo``, ``agent.json``'s ``algo``, a benchmark's option)
into an agent uses :func:`algorithm`; the config class is the agent's ``config_cls``.
The command line checks its flags against :data:`ALGORITHM_NAMES` before TensorFlow loads (its
own copy of the names is tested equal to this table).

>>> algorithm("ppo").__name__, algorithm("dqn").config_cls.__name__
('PPO', 'DQNConfig')
>>> algorithm("sac")
Traceback (most recent call last):
ValueError: algo must be one of 'ppo', 'a2c', 'reinforce', 'dqn', got 'sac'
"""

from __future__ import annotations

from types import MappingProxyType

from agents.algorithms.a2c import A2C
from agents.algorithms.dqn import DQN
from agents.algorithms.ppo import PPO
from agents.algorithms.reinforce import REINFORCE
from agents.core._loading import register_algorithms
from agents.core.base import Agent

__all__ = ["ALGORITHMS", "ALGORITHM_NAMES", "algorithm", "algorithm_of_config"]

register_algorithms(PPO, A2C, REINFORCE, DQN)  # the table agents.load reads (agents.core._loading)
ALGORITHMS = MappingProxyType({cls.algo: cls for cls in (PPO, A2C, REINFORCE, DQN)})
"""``name -> agent class`` (read-only)."""

ALGORITHM_NAMES = tuple(ALGORITHMS)
"""The names, in the order the command line lists them."""


def algorithm(name: str, argument: str = "algo") -> type[Agent]:
    """The agent class called ``name``; ``ValueError`` naming ``argument`` otherwise."""
    cls = ALGORITHMS.get(name) if isinstance(name, str) else None
    if cls is None:
        names = ", ".join(repr(n) for n in ALGORITHM_NAMES)
        raise ValueError(f"{argument} must be one of {names}, got {name!r}")
    return cls


def algorithm_of_config(config_cls: type) -> type[Agent]:
    """The agent class whose ``config_cls`` is ``config_cls`` (exactly).

    >>> from agents.config import A2CConfig
    >>> algorithm_of_config(A2CConfig).algo
    'a2c'
    """
    for cls in ALGORITHMS.values():
        if cls.config_cls is config_cls:
            return cls
    raise ValueError(f"config: no algorithm takes a {getattr(config_cls, '__name__', config_cls)}"
                     f" (one of {', '.join(c.config_cls.__name__ for c in ALGORITHMS.values())})")
