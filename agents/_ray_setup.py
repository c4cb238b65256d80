"""Ray set-up for the rollout workers: argument and address checks, connecting or starting Ray.

Private to :mod:`agents` (moved out of ``agents/distributed.py``, which re-exports the public
names: ``check_rollout_args``, ``check_ray_address``, ``init_ray``, ``INSTALL_HINT``). Ray is
imported only when a function needs it, so the checks run before any heavy import.

>>> check_ray_address("auto")
'auto'
"""

from __future__ import annotations

import os
import socket
import types

from robustgrad._checks import positive_int

INSTALL_HINT = "pip install 'robustgrad[distributed]'"


def _import_ray():
    """The ``ray`` module, or an ``ImportError`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"rollout_workers needs Ray, which is not installed: {INSTALL_HINT}") \
            from None
    return ray


def _address_host_port(address) -> tuple[str, int] | None:
    """``(host, port)`` of a ``"HOST:PORT"`` address, ``None`` for ``None``/``"auto"``."""
    if address is None or address == "auto":
        return None
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray_address must be 'auto' or 'HOST:PORT', got {address!r}")
    return host, int(port)


def check_rollout_args(rollout_workers: int, ray_address: str | None = None,
                       num_cpus: int | None = None) -> int:
    """Validate the distributed arguments of an agent before any work (Ray importable,
    ``rollout_workers`` and ``num_cpus`` positive ints, ``ray_address`` well formed).

    >>> check_rollout_args(0)
    Traceback (most recent call last):
    ...
    ValueError: rollout_workers must be an int >= 1, got 0
    """
    n = positive_int(rollout_workers, "rollout_workers")
    positive_int(num_cpus, "num_cpus", allow_none=True)
    _address_host_port(ray_address)
    if ray_address is not None and num_cpus is not None:
        raise ValueError("num_cpus must be left out with ray_address (a running cluster "
                         f"already has its CPUs), got num_cpus={num_cpus!r}")
    _import_ray()
    return n


def check_ray_address(address: str | None) -> str | None:
    """``None``, ``"auto"`` or ``"HOST:PORT"`` (returned unchanged); a ``HOST:PORT`` that does
    not accept a TCP connection within 5 s raises ``ConnectionError`` (instead of a hang).

    >>> check_ray_address(None), check_ray_address("auto")
    (None, 'auto')
    >>> check_ray_address("localhost")
    Traceback (most recent call last):
    ...
    ValueError: ray_address must be 'auto' or 'HOST:PORT', got 'localhost'
    """
    host_port = _address_host_port(address)
    if host_port is None:
        return address
    try:
        with socket.create_connection(host_port, timeout=5.0):
            pass
    except OSError as exc:
        raise ConnectionError(f"ray_address: no Ray cluster reachable at {address!r} ({exc}); "
                              "start one with `ray start --head --port PORT`") from None
    return address


def init_ray(address: str | None = None, num_cpus: int | None = None) -> types.ModuleType:
    """Connect to the Ray cluster at ``address`` (``"auto"`` or ``"HOST:PORT"``), or start a
    local instance with ``num_cpus`` CPUs when ``address`` is ``None``. Reuses an
    already initialised Ray. Returns the ``ray`` module."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    check_ray_address(address)
    env_vars = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if os.environ.get("PYTHONPATH"):
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    kwargs = {"runtime_env": {"env_vars": env_vars}, "include_dashboard": False,
              "logging_level": "WARNING"}
    try:
        if address is None:
            ray.init(num_cpus=num_cpus, **kwargs)
        else:
            ray.init(address=address, **kwargs)
    except ConnectionError as exc:
        raise ConnectionError(f"ray_address: cannot connect to Ray at {address!r}: {exc}") from None
    return ray
