"""The core wing of :mod:`agents`: what every agent is made of.

Configs and presets (:mod:`~agents.core.config`, :mod:`~agents.core.presets`), the agent and its
learn driver (:mod:`~agents.core.base`; loading: :mod:`~agents.core._loading`, saving:
:mod:`~agents.core.persistence`, callbacks), the collector contract
(:mod:`~agents.core.collectors`), the robustness plug-in protocol (:mod:`~agents.core.plugin`),
what callbacks, plug-ins and the loader see of an agent (:mod:`~agents.core.interface`), the
policy surface, networks, returns, replay buffer, schedules and the optimiser step. It imports
only the environments (:mod:`agents.envs`, :mod:`agents.graph_envs`); the wings above it
(backends < algorithms < robustness, the ``layers`` contract of ``pyproject.toml``) fill its
tables: the algorithm registry :func:`agents.load` reads, the robust training methods.
"""
