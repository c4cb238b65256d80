"""The robustness wing of :mod:`agents`: attacks on observations and robust training.

Observation attacks (:mod:`~agents.robustness.observation_attacks`, on the :mod:`attacks` engine),
the SA / adversarial / convex regularisers and their plug-ins (:mod:`~agents.robustness.robust`),
certified actions (:mod:`~agents.robustness.certify`), the adversary MDP and learned adversaries
(:mod:`~agents.robustness.adversary`, :mod:`~agents.robustness.paad`), ATLA
(:mod:`~agents.robustness.atla`), Robust Sarsa and attack evaluation. The top wing: a robust
training method is one module here, a :class:`agents.core.plugin.RobustnessPlugin` and its
registry entry (:func:`agents.core.plugin.register_robustness`).
"""
