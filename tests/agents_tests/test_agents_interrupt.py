"""Interrupting, killing and corrupting agents: nothing lost, nothing silent."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import agents
from robustgrad.interrupts import TrainingInterrupted

SMALL = dict(env="CartPole-v1", num_envs=2, n_steps=16, hidden_sizes=(16,), seed=0)


def test_sigint_during_learn_saves_current_state_and_raises(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    agent = agents.PPO(checkpoint_dir=ckpt, **SMALL)
    calls = []

    def send_sigint_on_third_update(a, logs):
        calls.append(logs["steps"])
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted, match="stopped by SIGINT at step 96; checkpoint "
                                                  "saved to") as info:
        agent.learn(10_000, callbacks=[send_sigint_on_third_update], progress_bar=False)
    assert info.value.checkpoint == ckpt and isinstance(info.value, KeyboardInterrupt)
    assert calls == [32, 64, 96]  # stopped at the next safe point, not mid-update
    loaded = agents.load(ckpt)
    assert int(loaded.num_timesteps.numpy()) == 96
    for a, b in zip(loaded.get_weights(), agent.get_weights()):
        np.testing.assert_array_equal(a, b)
    # the handler is gone afterwards: SIGINT is Python's default again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_interrupts_can_be_left_to_the_caller(tmp_path):
    agent = agents.PPO(**SMALL)

    def interrupt(a, logs):
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt) as info:
        agent.learn(1_000, callbacks=[interrupt], progress_bar=False, handle_interrupts=False)
    assert not isinstance(info.value, TrainingInterrupted)


_KILL_DURING_SAVE = textwrap.dedent("""
    import os, sys
    import agents
    from robustgrad import atomic
    ckpt, stage = sys.argv[1], sys.argv[2]
    agent = agents.load(ckpt)
    agent.learn(32, progress_bar=False)          # a newer state: 64 steps
    def fault(s):
        if s == stage:
            os._exit(9)
    atomic._fault_point = fault
    agent.save(ckpt)
""")


# every step of the switch is killed in tests/robustgrad_tests/test_atomic_save.py (fast, no TF);
# here one point per outcome through a real agent, the two slower ones in the slow suite
@pytest.mark.parametrize("stage,expected_steps", [
    pytest.param("moved out agent.json", 32, marks=pytest.mark.slow),
    ("moved in weights", 32),
    pytest.param("moved in agent.json", 64, marks=pytest.mark.slow)])
def test_agent_killed_during_save_resumes_from_a_complete_version(tmp_path, stage,
                                                                  expected_steps):
    ckpt = str(tmp_path / "ckpt")
    agents.PPO(**SMALL).learn(32, progress_bar=False).save(ckpt)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _KILL_DURING_SAVE, ckpt, stage], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    loaded = agents.load(ckpt)
    assert int(loaded.num_timesteps.numpy()) == expected_steps
    assert sorted(n for n in os.listdir(ckpt) if n.startswith(".")) == []


def _saved(tmp_path, algo=agents.PPO, **kw):
    path = str(tmp_path / "agent")
    base = SMALL if algo is agents.PPO else {k: v for k, v in SMALL.items() if k != "n_steps"}
    algo(**{**base, **kw}).save(path)
    return path


@pytest.mark.parametrize("name,content,message", [
    ("agent.json", "{not json", r"agent.json is not valid JSON \(line 1"),
    ("agent.json", "", r"agent.json is not valid JSON"),
    ("config.json", "[1, 2]", r"config.json must hold a JSON object, got list"),
    ("agent.json", '{"history": []}', r"agent.json has no 'algo' field"),
])
def test_corrupt_metadata_is_one_clear_error(tmp_path, name, content, message):
    path = _saved(tmp_path)
    with open(os.path.join(path, name), "w") as f:
        f.write(content)
    with pytest.raises(ValueError, match=message):
        agents.load(path)


def test_binary_metadata_is_named(tmp_path):
    path = _saved(tmp_path)
    with open(os.path.join(path, "agent.json"), "wb") as f:
        f.write(b"\x80\x81\xfe\xff" * 8)
    with pytest.raises(ValueError, match="agent.json is not a text JSON file"):
        agents.load(path)


def test_truncated_weights_are_refused(tmp_path):
    path = _saved(tmp_path)
    data = [n for n in os.listdir(os.path.join(path, "weights")) if "data" in n][0]
    p = os.path.join(path, "weights", data)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)
    with pytest.raises(ValueError, match="saved weights do not match|cannot be read"):
        agents.load(path)


def test_weights_of_other_layer_sizes_are_refused_naming_both(tmp_path):
    path = _saved(tmp_path, hidden_sizes=(16,))
    other = _saved(tmp_path / "other", hidden_sizes=(32, 32))
    # metadata says (16,), the weights are from a (32, 32) agent
    import shutil
    shutil.rmtree(os.path.join(path, "weights"))
    shutil.copytree(os.path.join(other, "weights"), os.path.join(path, "weights"))
    with pytest.raises(ValueError, match=r"do not match this ppo agent \(hidden_sizes=\(16,\)\)"):
        agents.load(path)


def test_weights_of_another_algorithm_are_refused(tmp_path):
    path = _saved(tmp_path)
    other = _saved(tmp_path / "dqn", algo=agents.DQN, num_envs=1, learning_starts=0)
    import shutil
    shutil.rmtree(os.path.join(path, "weights"))
    shutil.copytree(os.path.join(other, "weights"), os.path.join(path, "weights"))
    with pytest.raises(ValueError, match="saved weights do not match this ppo agent"):
        agents.load(path)


def test_a_file_or_missing_directory_is_named(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file, not an agent directory"):
        agents.load(str(f))
    with pytest.raises(ValueError, match="does not exist"):
        agents.load(str(tmp_path / "nope"))
    path = _saved(tmp_path)
    os.remove(os.path.join(path, "weights", "ckpt.index"))
    with pytest.raises(ValueError, match=r"has no weights \(missing weights/ckpt.index\)"):
        agents.load(path)


# -- a loaded file never chooses where the program writes (issue 24, serious 1) ------------------


def _plant_checkpoint_dir(path, value):
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["checkpoint_dir"] = value
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_a_saved_checkpoint_dir_outside_the_agent_is_refused(tmp_path, where):
    victim = _saved(tmp_path / "victim")  # another run, which must stay as it is
    before = {n: os.path.getmtime(os.path.join(victim, n)) for n in os.listdir(victim)}
    path = _saved(tmp_path)
    _plant_checkpoint_dir(path, victim if where == "absolute" else "../victim/agent")
    with pytest.raises(ValueError, match=r"agent/config.json: checkpoint_dir .* points outside "
                                         r"the directory that holds it.*pass checkpoint_dir="):
        agents.load(path)
    # the caller may choose: then the file's value plays no part
    agent = agents.load(path, checkpoint_dir=str(tmp_path / "mine"))
    agent.learn(32, progress_bar=False)
    assert os.path.exists(tmp_path / "mine" / "agent.json")
    assert {n: os.path.getmtime(os.path.join(victim, n)) for n in os.listdir(victim)} == before


def test_checkpoint_dir_is_saved_relative_and_follows_the_directory(tmp_path, monkeypatch):
    ckpt = tmp_path / "run" / "checkpoint"
    agents.PPO(checkpoint_dir=str(ckpt), **SMALL).learn(32, progress_bar=False)
    assert json.loads((ckpt / "config.json").read_text())["checkpoint_dir"] == "."
    agent = agents.PPO(checkpoint_dir=str(ckpt), **SMALL)
    agent.save(tmp_path / "run")  # the final agent: its checkpoints are inside it
    assert json.loads((tmp_path / "run" / "config.json").read_text())["checkpoint_dir"] == \
        "checkpoint"
    agent.save(tmp_path / "elsewhere")  # checkpoints outside the saved directory: not recorded
    assert json.loads((tmp_path / "elsewhere" / "config.json").read_text())[
        "checkpoint_dir"] is None
    # moved and loaded from another working directory, it checkpoints into its new place
    os.rename(tmp_path / "run", tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    loaded = agents.load("checkpoint")
    assert loaded.config.checkpoint_dir == "checkpoint"
    assert agents.load(".").config.checkpoint_dir == "checkpoint"
