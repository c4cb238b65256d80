"""Ray set-up for the rollout workers: the agents' argument check on top of the shared set-up.

The generic part (import check, address check, :func:`init_ray`, the workers' environment)
lives in :mod:`robustgrad.ray_setup`, shared with the evaluation shards of :mod:`attacks`; its
names are re-exported here so ``agents.backends.distributed`` and older imports keep working.

>>> check_ray_address("auto")
'auto'
"""

from __future__ import annotations

import types

from robustgrad.checks import positive_int
from robustgrad.ray_setup import (  # noqa: F401 - re-exported
    INSTALL_HINT,
    WORKER_SETUP_HOOK,
    address_host_port,
    check_ray_address,
    import_ray,
    init_ray,
    worker_runtime_env,
)


def _import_ray() -> types.ModuleType:
    """The ``ray`` module, or an ``ImportError`` that says rollout_workers needs it."""
    return import_ray("rollout_workers")


def check_rollout_args(rollout_workers: int, ray_address: str | None = None,
                       num_cpus: int | None = None) -> int:
    """Validate the distributed arguments of an agent before any work (Ray importable,
    ``rollout_workers`` and ``num_cpus`` positive ints, ``ray_address`` well formed).

    >>> check_rollout_args(0)
    Traceback (most recent call last):
    ...
    robustgrad.errors.ConfigError: rollout_workers must be an int >= 1, got 0
    """
    n = positive_int(rollout_workers, "rollout_workers")
    positive_int(num_cpus, "num_cpus", allow_none=True)
    address_host_port(ray_address)
    if ray_address is not None and num_cpus is not None:
        raise ValueError("num_cpus must be left out with ray_address (a running cluster "
                         f"already has its CPUs), got num_cpus={num_cpus!r}")
    _import_ray()
    return n
