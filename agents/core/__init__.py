"""The core wing of :mod:`agents`: what every agent is made of.

The fields every agent's config shares and presets (:mod:`~agents.core.config`,
:mod:`~agents.core.presets`; each algorithm's config is beside it), the agent and its
learn driver (:mod:`~agents.core.base`; loading: :mod:`~agents.core._loading`, saving:
:mod:`~agents.core.persistence`, callbacks), the collector contract
(:mod:`~agents.core.collectors`), the robustness plug-in protocol (:mod:`~agents.core.plugin`),
what callbacks, plug-ins and the loader see of an agent (:mod:`~agents.core.interface`), the
policy surface, networks, returns, replay buffer, schedules, the optimiser step and the agents'
compiled functions (:mod:`~agents.core.compiled`). It imports
only the environments (:mod:`agents.envs`, :mod:`agents.graph_envs`); the wings above it
(backends < algorithms < robustness, the ``layers`` contract of ``pyproject.toml``) fill its
tables: the algorithm registry :func:`agents.load` reads, the robust training methods and their
typed configs.
"""
