"""Rollouts on Ray workers (agents/distributed.py): exactness, learning, faults, bad input.

One local Ray instance for the module (started by a fixture, shut down at the end); each
test closes its agent so that its worker actors free their CPUs.
"""

import functools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import gymnasium as gym  # noqa: E402

import agents  # noqa: E402
from agents.config import PPOConfig  # noqa: E402
from agents.distributed import check_ray_address, init_ray, merge_moments  # noqa: E402
from agents.envs import RunningMeanStd  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers get this module's envs
SHORT_CARTPOLE = functools.partial(gym.make, "CartPole-v1", max_episode_steps=12)


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    init_ray(None, num_cpus=3)
    yield
    ray.shutdown()


def _recording(collect, store):
    def wrapper():
        batch = collect()
        store.append({k: v.numpy() for k, v in batch.items()})
        return batch
    return wrapper


def _small_config(**kw):
    base = dict(env=SHORT_CARTPOLE, num_envs=2, n_steps=16, n_minibatches=2, n_epochs=2, seed=5)
    return PPOConfig(**{**base, **kw})


def test_one_worker_equals_the_local_agent_exactly(local_ray):
    # truncation at 12 steps: every fragment has truncated and terminated rows
    cfg = _small_config(normalize_obs=True)
    local = agents.PPO(cfg)
    local_batches, dist_batches = [], []
    local._rollout = _recording(local._rollout, local_batches)
    dist = agents.PPO(cfg, rollout_workers=1)
    try:
        dist.rollout_workers.collect = _recording(dist.rollout_workers.collect, dist_batches)
        local.learn(64, progress_bar=False)
        dist.learn(64, progress_bar=False)
        assert len(local_batches) == len(dist_batches) == 2
        for lb, db in zip(local_batches, dist_batches):
            assert lb.keys() == db.keys()
            for key in lb:
                assert lb[key].dtype == db[key].dtype, key
                np.testing.assert_array_equal(lb[key], db[key], err_msg=key)
        assert any(b["truncated"].any() for b in dist_batches)
        for lw, dw in zip(local.get_weights(), dist.get_weights()):
            np.testing.assert_array_equal(lw, dw)
        assert list(local.episode_returns) == list(dist.episode_returns)
        assert dist.trace_counts["train"] == 1
    finally:
        dist.close()
        local.close()


def test_two_workers_learn_cartpole_with_exactly_merged_statistics(local_ray):
    agent = agents.PPO(env="CartPole-v1", seed=0, normalize_obs=True, rollout_workers=2)
    batches, logs = [], []
    agent.rollout_workers.collect = _recording(agent.rollout_workers.collect, batches)
    try:
        assert agent.config.num_envs == 8 and agent.rollout_workers.envs_per_worker == 4
        agent.learn(20_480, progress_bar=False, callbacks=[lambda a, lg: logs.append(lg)])
        assert {"worker_0_steps_per_second", "worker_1_steps_per_second"} <= logs[-1].keys()
        assert logs[-1]["worker_1_steps_per_second"] > 0
        # the learner's observation statistics are those of all workers' data in one process
        ref = RunningMeanStd(agent.obs_shape)
        for b in batches:
            ref.update(b["obs"].reshape((-1,) + agent.obs_shape))
        got = agent.model.obs_norm.rms.numpy_state()
        for key, value in ref.numpy_state().items():
            np.testing.assert_allclose(got[key], value, rtol=1e-12, err_msg=key)
        # sub-env i of worker k is seeded seed + 4k + i, as sub-env 4k + i of a local env
        first = batches[0]["obs"][0]
        env = agents.make_vec_env("CartPole-v1", 8, seed=0)
        np.testing.assert_array_equal(first, env.reset())
        env.close()
        # same-step autoreset across the fragments: after an end the next obs is a reset,
        # elsewhere it is the transition's final_obs
        b = batches[3]
        ends = b["terminated"][:-1] | b["truncated"][:-1]
        same = np.all(b["final_obs"][:-1] == b["obs"][1:], axis=-1)
        assert ends.any() and np.array_equal(same, ~ends)
        result = agent.evaluate(10)
        assert result["mean_return"] >= 150, result
    finally:
        agent.close()


def test_killed_worker_is_restarted_and_training_finishes(local_ray):
    agent = agents.PPO(_small_config(num_envs=4), rollout_workers=2)
    killed = []

    def kill_once(a, logs):
        if not killed:
            ray.kill(a.rollout_workers.actors[0], no_restart=False)
            killed.append(logs["steps"])

    try:
        before = ray.get(agent.rollout_workers.actors[0].info.remote())["pid"]
        agent.learn(16 * 4 * 4, progress_bar=False, callbacks=[kill_once])
        assert int(agent.num_timesteps.numpy()) == 256
        assert agent.history[-1]["steps"] == 256
        after = ray.get(agent.rollout_workers.actors[0].info.remote())
        assert after["worker_id"] == 0 and after["pid"] != before  # a new process
    finally:
        agent.close()


class _FailingCartPole(gym.Wrapper):
    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls > 20:
            raise KeyError("simulator lost its state")
        return self.env.step(action)


def test_env_error_on_a_worker_surfaces_the_original_exception(local_ray):
    agent = agents.PPO(_small_config(env=_FailingCartPole), rollout_workers=2)
    try:
        with pytest.raises(KeyError, match="simulator lost its state") as info:
            agent.learn(256, progress_bar=False)
        assert type(info.value) is KeyError
        assert any("rollout worker 0 of 2" in n or "rollout worker 1 of 2" in n
                   for n in getattr(info.value, "__notes__", []))
    finally:
        agent.close()


def test_merge_moments_is_exact():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 3)) * 5 + 2
    parts = [x[:5], x[5:6], x[6:30], x[30:]]
    m, v, n = merge_moments([(p.mean(0), p.var(0), len(p)) for p in parts])
    assert n == 37
    np.testing.assert_allclose(m, x.mean(0), rtol=1e-13)
    np.testing.assert_allclose(v, x.var(0), rtol=1e-12)
    with pytest.raises(ValueError, match="parts must be a non-empty sequence"):
        merge_moments([])


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_rollout_workers_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"rollout_workers must be an int >= 1, got {bad!r}"):
        agents.PPO(_small_config(), rollout_workers=bad)


def test_bad_distributed_arguments(local_ray):
    with pytest.raises(ValueError, match=r"rollout_workers must divide num_envs \(2\).*got 3"):
        agents.PPO(_small_config(), rollout_workers=3)
    with pytest.raises(ValueError, match="rollout_workers: only the on-policy agents"):
        agents.DQN(env="CartPole-v1", rollout_workers=1)
    with pytest.raises(ValueError, match="ray_address must be 'auto' or 'HOST:PORT', got 'nohost'"):
        agents.PPO(_small_config(), rollout_workers=1, ray_address="nohost")
    with pytest.raises(ValueError, match="num_cpus must be an int >= 1, got 0"):
        agents.PPO(_small_config(), rollout_workers=1, num_cpus=0)
    lock = threading.Lock()

    def unpicklable_env():
        with lock:
            return gym.make("CartPole-v1")

    with pytest.raises(ValueError, match="env: the env factory cannot be serialised"):
        agents.PPO(_small_config(env=unpicklable_env), rollout_workers=1)


def test_unreachable_address_fails_within_seconds():
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"ray_address: no Ray cluster reachable at "
                                              f"'127.0.0.1:{port}'"):
        check_ray_address(f"127.0.0.1:{port}")
    assert time.perf_counter() - start < 10


def test_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'robustgrad\[distributed\]'"):
        agents.PPO(_small_config(), rollout_workers=1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CLUSTER_DRIVER = """
import json, os, sys, time
import ray
import agents
from agents.distributed import init_ray
address, tmp = sys.argv[1], sys.argv[2]
init_ray(address)
deadline = time.time() + 120
while ray.cluster_resources().get("CPU", 0) < 2:
    assert time.time() < deadline, "the second node did not join"
    time.sleep(1)
ckpt = os.path.join(tmp, "ckpt")
agent = agents.PPO(env="CartPole-v1", seed=0, rollout_workers=2, ray_address=address,
                   checkpoint_dir=ckpt)
infos = ray.get([a.info.remote() for a in agent.rollout_workers.actors])
agent.learn(10_240, progress_bar=False)
steps = [int(agent.num_timesteps.numpy())]
agent.close()
resumed = agents.load(ckpt, rollout_workers=2, ray_address=address)
steps.append(int(resumed.num_timesteps.numpy()))
resumed.learn(10_240, progress_bar=False)
steps.append(int(resumed.num_timesteps.numpy()))
ret = resumed.evaluate(10)["mean_return"]
resumed.close()
print(json.dumps({"nodes": len({i["node_id"] for i in infos}), "steps": steps,
                  "mean_return": ret}))
"""


@pytest.mark.slow
def test_two_node_cluster_on_loopback_trains_and_resumes(tmp_path):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp")  # Ray's socket paths must be short
    # token authentication with a token made for this throw-away cluster, shared by the two
    # nodes and this driver (not the user's ~/.ray token)
    # cluster mode (conftest turns it off so that the default suite stays on 127.0.0.1)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_TMPDIR": ray_tmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    env = {**os.environ, **auth, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(agents.__file__)))]
        + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    common = ["--block", "--disable-usage-stats"]
    head = subprocess.Popen([ray_bin, "start", "--head", "--node-ip-address=127.0.0.1",
                             f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             *common], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    nodes = [head]
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "the head node did not start"
                time.sleep(1)
        second_log = open(os.path.join(ray_tmp, "second_node.log"), "w")  # noqa: SIM115
        nodes.append(subprocess.Popen(
            [ray_bin, "start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1",
             "--num-cpus=1", *common], env=env,
            start_new_session=True, stdout=second_log, stderr=subprocess.STDOUT))
        address = f"127.0.0.1:{port}"
        # the driver runs in a fresh interpreter so that Ray reads the token settings at start
        driver = subprocess.run([sys.executable, "-c", _CLUSTER_DRIVER, address, str(tmp_path)],
                                env=env, capture_output=True, text=True, timeout=900)
        with open(os.path.join(ray_tmp, "second_node.log")) as f:
            assert driver.returncode == 0, driver.stderr[-2000:] + f.read()[-2000:]
        result = json.loads(driver.stdout.strip().splitlines()[-1])
        assert result["nodes"] == 2 and result["steps"] == [10_240, 10_240, 20_480], result
        assert result["mean_return"] >= 150, result
    finally:
        for p in reversed(nodes):
            try:
                os.killpg(p.pid, 15)  # the process group of this test's `ray start` only
                p.wait(timeout=60)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        shutil.rmtree(ray_tmp, ignore_errors=True)
