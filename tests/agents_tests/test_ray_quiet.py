"""Ray workers print no more than the main process: no TensorFlow start-up lines, no token
notice (issue 24)."""

import logging
import os
import re
import subprocess
import sys

import pytest

from robustgrad import ray_setup as _ray_setup  # its Ray-log filter (private names)
from robustgrad.native_stderr import is_startup_noise

WORKER_PREFIX = re.compile(r"^(\x1b\[\d+m)?\([^)]*pid=\d+[^)]*\)(\x1b\[0m)? ")  # Ray's "(pid=N) "
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_token_enabled_notice_is_dropped_and_the_disabled_warning_kept(caplog):
    log = logging.getLogger(_ray_setup._TOKEN_NOTICE_LOGGER)
    with caplog.at_level(logging.WARNING, logger=log.name), _ray_setup._without_token_notice():
        log.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=...")
        log.warning("Token authentication is disabled for this Ray cluster. Anyone with ...")
    assert [r.getMessage()[:36] for r in caplog.records] == ["Token authentication is disabled for"]
    assert not log.filters


def test_the_worker_setup_hook_loads_without_tensorflow():
    # Ray imports the hook's module in each worker before anything else: it must not import
    # TensorFlow itself, or the lines it filters would already be printed
    module, name = _ray_setup.WORKER_SETUP_HOOK.rsplit(".", 1)
    code = (f"import importlib, sys; m = importlib.import_module({module!r}); "
            f"print('tensorflow' in sys.modules, callable(m.{name}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "True"]


SCRIPT = """
from robustgrad.commands._startup import import_tensorflow
import_tensorflow()  # the main process, as the command line starts it
import agents
agent = agents.PPO(env="CartPole-v1", num_envs=2, n_steps=8, hidden_sizes=(8,), seed=0,
                   rollout_workers=1, num_cpus=1)
agent.learn(32)
import ray; ray.shutdown()
print("DONE")
"""


@pytest.mark.slow
def test_a_local_ray_run_prints_no_worker_startup_lines_nor_the_token_notice(tmp_path):
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("RAY_AUTH_MODE", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600)
    assert run.returncode == 0 and "DONE" in run.stdout, run.stderr[-2000:]
    lines = run.stderr.splitlines()
    noisy = [ln for ln in lines if is_startup_noise(WORKER_PREFIX.sub("", ln))]
    assert not noisy, noisy
    assert not [ln for ln in lines if "Token authentication is enabled" in ln], lines
