"""Rollouts on Ray workers (agents/backends/distributed.py): exactness, learning, faults, bad input.

One local Ray instance for the module (started by a fixture, shut down at the end), and one
PPO agent with two workers shared by the learning, restart and env-error tests (in that
order: starting a worker process costs seconds of TensorFlow import); the other tests close
their agents so that their worker actors free their CPUs.
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
from agents.backends.distributed import check_ray_address, merge_moments  # noqa: E402
from agents.config import DQNConfig, PPOConfig  # noqa: E402
from agents.envs import RunningMeanStd  # noqa: E402

from conftest import recording  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers get this module's envs
SHORT_CARTPOLE = functools.partial(gym.make, "CartPole-v1", max_episode_steps=12)
# while this file exists, every env of _FlaggedCartPole raises in step() (the workers run on
# this machine and read the path pickled with the class)
FAIL_FLAG = os.path.join(tempfile.gettempdir(), f"rg-distributed-fail-{os.getpid()}")


class _FlaggedCartPole(gym.Wrapper):
    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):
        if os.path.exists(FAIL_FLAG):
            raise KeyError("simulator lost its state")
        return self.env.step(action)


@pytest.fixture(scope="module")
def shared_agent(local_ray):
    """PPO (CartPole preset, 8 envs) on 2 workers of 4 envs each, for the whole module."""
    agent = agents.PPO(env=_FlaggedCartPole, preset="ppo-CartPole-v1", seed=0,
                       normalize_obs=True, rollout_workers=2)
    yield agent
    agent.close()
    if os.path.exists(FAIL_FLAG):
        os.remove(FAIL_FLAG)


def _small_config(**kw):
    base = dict(env=SHORT_CARTPOLE, num_envs=2, n_steps=16, n_minibatches=2, n_epochs=2, seed=5)
    return PPOConfig(**{**base, **kw})


def test_one_worker_equals_the_local_agent_exactly(local_ray):
    # truncation at 12 steps: every fragment has truncated and terminated rows
    cfg = _small_config(normalize_obs=True)
    local = agents.PPO(cfg)
    local_batches, dist_batches = [], []
    local._rollout = recording(local._rollout, local_batches)
    dist = agents.PPO(cfg, rollout_workers=1)
    try:
        dist.rollout_workers.collect = recording(dist.rollout_workers.collect, dist_batches)
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


def test_two_workers_learn_cartpole_with_exactly_merged_statistics(shared_agent):
    agent = shared_agent
    assert int(agent.num_timesteps.numpy()) == 0, "runs first on the shared agent"
    batches, logs = [], []
    agent.rollout_workers.collect = recording(agent.rollout_workers.collect, batches)
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
        del agent.rollout_workers.collect  # back to the class's method


def test_killed_worker_is_restarted_and_training_finishes(shared_agent):
    agent = shared_agent
    killed = []

    def kill_once(a, logs):
        if not killed:
            ray.kill(a.rollout_workers.actors[0], no_restart=False)
            killed.append(logs["steps"])

    start = int(agent.num_timesteps.numpy())
    restarts = agent.rollout_workers.restarts
    before = ray.get(agent.rollout_workers.actors[0].info.remote())["pid"]
    agent.learn(3 * 8 * 32, progress_bar=False, callbacks=[kill_once])
    assert int(agent.num_timesteps.numpy()) == start + 768
    assert agent.history[-1]["steps"] == start + 768
    assert agent.rollout_workers.restarts == restarts + 1
    after = ray.get(agent.rollout_workers.actors[0].info.remote())
    assert after["worker_id"] == 0 and after["pid"] != before  # a new process


def test_env_error_on_a_worker_surfaces_the_original_exception(shared_agent, tmp_path):
    agent = shared_agent
    agent.config.checkpoint_dir = str(tmp_path / "crash")  # where the crash checkpoint goes
    open(FAIL_FLAG, "w").close()
    try:
        with pytest.raises(KeyError, match="simulator lost its state") as info, \
                pytest.warns(UserWarning, match="the environment raised during step"):
            agent.learn(256, progress_bar=False)
    finally:
        os.remove(FAIL_FLAG)
        agent.config.checkpoint_dir = None
    assert type(info.value) is KeyError
    assert any("rollout worker 0 of 2" in n or "rollout worker 1 of 2" in n
               for n in getattr(info.value, "__notes__", []))
    steps = int(agent.num_timesteps.numpy())
    agent.learn(256, progress_bar=False)  # the workers' envs are reset and training goes on
    assert int(agent.num_timesteps.numpy()) == steps + 256


def _transitions(agent):
    buf = agent.buffer
    return {name: getattr(buf, name).numpy() for name in
            ("obs", "next_obs", "actions", "rewards", "terminated", "pos", "size")}


def test_dqn_one_worker_collects_the_local_agents_transitions_exactly(local_ray):
    # 12-step episodes: truncated transitions (next_obs = final_obs, terminated 0) in every
    # phase; random actions until learning_starts, then the global epsilon schedule
    cfg = DQNConfig(env=SHORT_CARTPOLE, num_envs=2, train_freq=16, gradient_steps=4,
                    learning_starts=40, batch_size=16, buffer_size=256, hidden_sizes=(16,),
                    target_update_interval=7, normalize_obs=True, exploration_fraction=0.5,
                    seed=4)
    local = agents.DQN(cfg)
    dist = agents.DQN(cfg, rollout_workers=1)
    eps_local, eps_dist, logs = [], [], []
    try:
        local.learn(160, progress_bar=False, callbacks=[lambda a, lg: eps_local.append(
            lg["epsilon"])])
        dist.learn(160, progress_bar=False, callbacks=[lambda a, lg: (
            eps_dist.append(lg["epsilon"]), logs.append(lg))])
        ref, got = _transitions(local), _transitions(dist)
        assert int(got["size"]) == 160
        for key in ref:
            np.testing.assert_array_equal(ref[key], got[key], err_msg=key)
        assert eps_local == eps_dist and eps_dist[0] == 1.0 and eps_dist[-1] < 1.0
        for lw, dw in zip(local.get_weights(), dist.get_weights()):
            np.testing.assert_array_equal(lw, dw)
        np.testing.assert_array_equal(local.rng.state.numpy(), dist.rng.state.numpy())
        assert list(local.episode_returns) == list(dist.episode_returns)
        assert len(dist.episode_returns) >= 10
        assert int(dist.num_timesteps.numpy()) == 160 and int(dist.num_updates.numpy()) >= 2
        assert logs[-1]["worker_0_steps_per_second"] > 0
    finally:
        dist.close()
        local.close()


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
    with pytest.raises(ValueError, match=r"rollout_workers must divide num_envs \(2\).*got 4"):
        agents.DQN(env=SHORT_CARTPOLE, num_envs=2, rollout_workers=4)
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


def _netns_prefix():
    """The command that runs a program in a new network namespace with only a loopback
    device (``unshare --net`` as root, else in a user namespace), or ``None``, and why."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return None, "needs unshare and ip (util-linux, iproute2) for a private network namespace"
    for flags in (["--net"], ["--user", "--map-root-user", "--net"]):
        probe = subprocess.run([unshare, *flags, ip, "link", "set", "lo", "up"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return [unshare, *flags], ""
    return None, ("cannot create a network namespace (unshare --net needs root or "
                  f"unprivileged user namespaces): {probe.stderr.strip()}")


_CLUSTER_DRIVER = """
import json, os, sys, time
import ray
import agents
from agents.backends.distributed import init_ray
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

# Runs inside the test's network namespace: a head and a second `ray start` node on
# 127.0.0.1, then the driver in a fresh interpreter (Ray reads the token settings at start);
# prints the namespace's interfaces and the driver's JSON line. Everything it starts stays in
# its process group, which the test stops.
_CLUSTER_RUNNER = """
import json, os, socket, subprocess, sys, time
ray_bin, driver, ray_tmp, tmp = sys.argv[1:5]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
common = ["--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
head = subprocess.Popen([ray_bin, "start", "--head", f"--port={port}",
                         "--include-dashboard=false", *common],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    log_path = os.path.join(ray_tmp, "second_node.log")
    with open(log_path, "w") as log:
        nodes.append(subprocess.Popen([ray_bin, "start", f"--address=127.0.0.1:{port}",
                                       *common], stdout=log, stderr=subprocess.STDOUT))
    address = f"127.0.0.1:{port}"
    run = subprocess.run([sys.executable, "-c", driver, address, tmp], capture_output=True,
                         text=True, timeout=900)
    if run.returncode != 0:
        with open(log_path) as f:
            sys.exit(run.stderr[-2000:] + f.read()[-2000:])
    print(json.dumps({"interfaces": [name for _i, name in socket.if_nameindex()]}))
    print(run.stdout.strip().splitlines()[-1])
finally:
    for p in reversed(nodes):
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
"""


@pytest.mark.slow
def test_two_node_cluster_in_a_private_network_namespace_trains_and_resumes(tmp_path):
    # both nodes and the driver run in one network namespace made for this test, whose only
    # device is the loopback: no Ray traffic can use the machine's interface address
    prefix, reason = _netns_prefix()
    if prefix is None:
        pytest.skip(reason)
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    ray_tmp = tempfile.mkdtemp(prefix="rg-ray-", dir="/tmp")  # Ray's socket paths must be short
    # token authentication with a token made for this throw-away cluster, shared by the two
    # nodes and the driver (not the user's ~/.ray token); cluster mode (conftest turns it off
    # so that the default suite's single local instance stays on 127.0.0.1)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_TMPDIR": ray_tmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    env = {**os.environ, **auth, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(agents.__file__)))]
        + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    script = ('ip link set lo up && exec "$0" -c "$1" "$2" "$3" "$4" "$5"')
    runner = subprocess.Popen(
        [*prefix, "sh", "-c", script, sys.executable, _CLUSTER_RUNNER, ray_bin, _CLUSTER_DRIVER,
         ray_tmp, str(tmp_path)],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        out, err = runner.communicate(timeout=1200)
    finally:
        try:
            os.killpg(runner.pid, 15)  # this test's process group only: nodes and workers
            runner.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, 9)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert runner.returncode == 0, err[-4000:]
    lines = out.strip().splitlines()
    assert json.loads(lines[-2])["interfaces"] == ["lo"], lines[-2]
    result = json.loads(lines[-1])
    assert result["nodes"] == 2 and result["steps"] == [10_240, 10_240, 20_480], result
    assert result["mean_return"] >= 150, result
