"""The backends wing of :mod:`agents`: where experience comes from.

The backend factory (:mod:`~agents.backends.factory`: a config's collector, decided once), the
compiled environments' backend (:mod:`~agents.backends.graph_backend`), the seed axis' environments
and seed export (:mod:`~agents.backends.seed_axis`) and Ray rollout workers
(:mod:`~agents.backends.distributed`). Above the core, below the algorithms, which give the core's
``Agent`` its collector factory and workers.
"""
