"""robustgrad.ray_setup (issue 35): the checks every Ray user (rollout workers, evaluation shards)
runs before any work: worker counts, Ray installed, an address well formed and reachable."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from robustgrad import ray_setup
from robustgrad.errors import ConfigError


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_worker_counts_are_bounded():
    assert ray_setup.check_workers(1) == 1 and ray_setup.check_workers(1024.0) == 1024
    for bad in (0, -2, ray_setup.MAX_WORKERS + 1):
        with pytest.raises(ConfigError, match=r"--workers must be an int in \[1, 1024\]"):
            ray_setup.check_workers(bad, "--workers")
    with pytest.raises(TypeError, match="workers must be an int"):
        ray_setup.check_workers("2")


def test_missing_ray_names_the_caller_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"--workers needs Ray, which is not installed "
                                          r"\(the distributed extra\): pip install "
                                          r"'robustgrad\[distributed\]'"):
        ray_setup.import_ray("--workers")
    with pytest.raises(ImportError, match="rollout_workers needs Ray"):
        from agents.backends.distributed import check_rollout_args
        check_rollout_args(1)


def test_an_unreachable_address_is_refused_fast():
    address = f"127.0.0.1:{_closed_port()}"
    began = time.perf_counter()
    with pytest.raises(ConnectionError, match=rf"--ray-address: no Ray cluster reachable at "
                                              rf"'{address}'"):
        ray_setup.check_ray_address(address, "--ray-address")
    assert time.perf_counter() - began < 5
    for bad in ("localhost", "host:0", "host:99999", ":80", 6379):
        with pytest.raises(ValueError, match="ray_address must be 'auto' or 'HOST:PORT'"):
            ray_setup.check_ray_address(bad)
    assert ray_setup.address_host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)


def test_a_listening_address_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert ray_setup.check_ray_address(address) == address


def test_agents_keeps_its_names():
    from agents.backends import _ray_setup, distributed

    assert distributed.init_ray is ray_setup.init_ray
    assert distributed.check_ray_address is ray_setup.check_ray_address
    assert _ray_setup.WORKER_SETUP_HOOK == ray_setup.WORKER_SETUP_HOOK
    assert distributed.INSTALL_HINT == "pip install 'robustgrad[distributed]'"
