"""The algorithms wing of :mod:`agents`: PPO, A2C, REINFORCE and DQN.

The on-policy base (:mod:`~agents.algorithms.onpolicy`) and its algorithms, DQN (its config:
:mod:`~agents.algorithms.dqn_config`), each config beside its algorithm, the registry
(:mod:`~agents.algorithms.registry`: name -> agent class, also the table :func:`agents.load` reads)
and the seed sweeps (:mod:`~agents.algorithms.many`). An algorithm calls its robustness plug-in
(:mod:`agents.core.plugin`) and imports nothing of the robustness wing above it.
"""
