"""Ray set-up for the rollout workers: argument and address checks, connecting or starting Ray.

Private to :mod:`agents` (moved out of ``agents/backends/distributed.py``, which re-exports the public
names: ``check_rollout_args``, ``check_ray_address``, ``init_ray``, ``INSTALL_HINT``). Ray is
imported only when a function needs it, so the checks run before any heavy import.

>>> check_ray_address("auto")
'auto'
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import types
from collections.abc import Iterator

from robustgrad.checks import positive_int

INSTALL_HINT = "pip install 'robustgrad[distributed]'"
# run in every worker before the actor's class (and TensorFlow) is imported: TensorFlow's native
# start-up lines would otherwise reach the driver's terminal, which the main process hides
WORKER_SETUP_HOOK = "robustgrad.native_stderr.quiet_tensorflow_startup"
_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenNotice(logging.Filter):
    """Drops Ray's notice that token authentication is on (the safe default, said on every
    start); the warning that it is *off* is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_NOTICE)


@contextlib.contextmanager
def _without_token_notice() -> Iterator[None]:
    """Ray's start-up inside the block does not print the "token authentication is enabled"
    notice."""
    log, drop = logging.getLogger(_TOKEN_NOTICE_LOGGER), _DropTokenNotice()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def worker_runtime_env() -> dict:
    """The ``runtime_env`` of the rollout workers: TensorFlow's log level and ``PYTHONPATH``
    as in this process, and :data:`WORKER_SETUP_HOOK`.

    >>> worker_runtime_env()["worker_process_setup_hook"]
    'robustgrad.native_stderr.quiet_tensorflow_startup'
    """
    env_vars = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if os.environ.get("PYTHONPATH"):
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {"env_vars": env_vars, "worker_process_setup_hook": WORKER_SETUP_HOOK}


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
    robustgrad.errors.ConfigError: rollout_workers must be an int >= 1, got 0
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
    kwargs = {"runtime_env": worker_runtime_env(), "include_dashboard": False,
              "logging_level": "WARNING"}
    try:
        with _without_token_notice():
            if address is None:
                ray.init(num_cpus=num_cpus, **kwargs)
            else:
                ray.init(address=address, **kwargs)
    except ConnectionError as exc:
        raise ConnectionError(f"ray_address: cannot connect to Ray at {address!r}: {exc}") from None
    return ray
