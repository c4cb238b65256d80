"""Ray set-up shared by every part that runs work on Ray (the rollout workers of :mod:`agents`,
the evaluation shards of :mod:`attacks`): the import check, worker-count and address checks,
connecting to a cluster or starting a local one, and the workers' environment.

Ray (the ``distributed`` extra, Ray Core only) is imported only when a function needs it, so the
checks run before any heavy import and this module loads without Ray or TensorFlow.

>>> check_ray_address("auto")
'auto'
>>> check_workers(2, "workers")
2
>>> check_workers(10**6, "--workers")
Traceback (most recent call last):
...
robustgrad.errors.ConfigError: --workers must be an int in [1, 1024], got 1000000
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import types
from collections.abc import Iterator

from robustgrad.checks import positive_int

__all__ = ["INSTALL_HINT", "MAX_WORKERS", "WORKER_SETUP_HOOK", "address_host_port", "check_ray_address",
           "check_workers", "import_ray", "init_ray", "worker_runtime_env"]

INSTALL_HINT = "pip install 'robustgrad[distributed]'"
MAX_WORKERS = 1024
"""The most workers a run may ask for: more is a typo (a cluster of a thousand machines is
beyond what these runs were made for), refused before any work."""
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
    """The ``runtime_env`` of the Ray workers: TensorFlow's log level and ``PYTHONPATH``
    as in this process, and :data:`WORKER_SETUP_HOOK`.

    >>> worker_runtime_env()["worker_process_setup_hook"]
    'robustgrad.native_stderr.quiet_tensorflow_startup'
    """
    env_vars = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if os.environ.get("PYTHONPATH"):
        env_vars["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return {"env_vars": env_vars, "worker_process_setup_hook": WORKER_SETUP_HOOK}


def import_ray(purpose: str = "this") -> types.ModuleType:
    """The ``ray`` module, or an ``ImportError`` that says ``purpose`` (e.g. ``"--workers"``)
    needs Ray and how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"{purpose} needs Ray, which is not installed (the distributed extra): "
                          f"{INSTALL_HINT}") from None
    return ray


def check_workers(workers: object, name: str = "workers") -> int:
    """``workers`` as an int in ``[1, MAX_WORKERS]`` (``ConfigError`` / ``ArgumentTypeError``
    naming ``name`` otherwise)."""
    return positive_int(workers, name, maximum=MAX_WORKERS)


def address_host_port(address: object, name: str = "ray_address") -> tuple[str, int] | None:
    """``(host, port)`` of a ``"HOST:PORT"`` address, ``None`` for ``None``/``"auto"``
    (``ValueError`` naming ``name`` otherwise)."""
    if address is None or address == "auto":
        return None
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name} must be 'auto' or 'HOST:PORT', got {address!r}")
    return host, int(port)


def check_ray_address(address: str | None, name: str = "ray_address") -> str | None:
    """``None``, ``"auto"`` or ``"HOST:PORT"`` (returned unchanged); a ``HOST:PORT`` that does
    not accept a TCP connection within 5 s raises ``ConnectionError`` (instead of a hang).

    >>> check_ray_address(None), check_ray_address("auto")
    (None, 'auto')
    >>> check_ray_address("localhost")
    Traceback (most recent call last):
    ...
    ValueError: ray_address must be 'auto' or 'HOST:PORT', got 'localhost'
    """
    host_port = address_host_port(address, name)
    if host_port is None:
        return address
    try:
        with socket.create_connection(host_port, timeout=5.0):
            pass
    except OSError as exc:
        raise ConnectionError(f"{name}: no Ray cluster reachable at {address!r} ({exc}); "
                              "start one with `ray start --head --port PORT`") from None
    return address


def init_ray(address: str | None = None, num_cpus: int | None = None,
             purpose: str = "this") -> types.ModuleType:
    """Connect to the Ray cluster at ``address`` (``"auto"`` or ``"HOST:PORT"``), or start a
    local instance with ``num_cpus`` CPUs when ``address`` is ``None``. Reuses an
    already initialised Ray. Returns the ``ray`` module (``purpose`` names the caller in the
    error when Ray is missing)."""
    ray = import_ray(purpose)
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
