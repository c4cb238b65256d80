"""Tuned presets (agents/presets.json), the replay buffer, the linear schedule and the
command line's --preset / --set handling."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import agents
from agents.core import presets as agent_config
from agents.core.buffers import ReplayBuffer
from agents.core.schedules import linear
from robustgrad.cli import main as cli_main

ALGOS = agents.ALGORITHMS
ENVS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0")


# -- the data file --------------------------------------------------------------------------
def test_presets_cover_the_five_envs_and_are_valid_configs():
    presets = agent_config.load_presets()
    covered = {name.split("-", 1)[1] for name in presets}
    assert covered == set(ENVS)
    for name, entry in presets.items():
        algo, env = name.split("-", 1)
        # make_config validates every value
        cfg = agent_config.make_config(agents.algorithm(algo).config_cls, algo, name, env=env)
        assert cfg.preset == name and cfg.env == env
        for key, value in entry["config"].items():
            got = getattr(cfg, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, (name, key)
        assert isinstance(entry["zoo"], str) and entry["steps"] > 0
        assert set(entry.get("learn", {})) <= {"eval_every", "keep_best"}


def test_preset_file_is_package_data():
    assert os.path.dirname(agent_config.PRESETS_FILE) == os.path.dirname(agents.__file__)
    with open(os.path.join(os.path.dirname(agent_config.PRESETS_FILE), os.pardir, "pyproject.toml")) as f:
        assert '"presets.json"' in f.read()


# -- agents use them -------------------------------------------------------------------------
def test_agent_uses_the_preset_and_records_it(tmp_path):
    agent = agents.PPO(env="CartPole-v1", seed=1, n_epochs=2)
    cfg = agent.config
    assert cfg.preset == "ppo-CartPole-v1"
    assert (cfg.n_steps, cfg.n_minibatches, cfg.gamma, cfg.clip_vloss) == (32, 1, 0.98, False)
    assert cfg.n_epochs == 2  # an override wins over the preset
    agent.save(tmp_path / "a")
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["preset"] == "ppo-CartPole-v1"
    assert saved == cfg.to_dict()  # every value, not only the preset's
    loaded = agents.load(tmp_path / "a")
    assert loaded.config == cfg  # recorded, not re-applied (n_epochs stays 2)


def test_preset_none_gives_the_dataclass_defaults():
    agent = agents.PPO(env="CartPole-v1", preset=None)
    assert agent.config == agents.PPOConfig(env="CartPole-v1")
    assert agents.PPO(env="CartPole-v1", preset="none").config.preset is None


def test_no_preset_for_the_pair_or_a_factory_gives_defaults():
    import gymnasium as gym

    assert agents.REINFORCE(env="CartPole-v1").config.preset is None
    agent = agents.PPO(env=lambda: gym.make("CartPole-v1"))
    assert agent.config.preset is None and agent.config.n_steps == 128


def test_explicit_preset_name():
    agent = agents.PPO(env="Pendulum-v1", preset="ppo-Pendulum-v1")
    assert agent.config.normalize_reward and agent.config.n_steps == 512


@pytest.mark.parametrize("kwargs, message", [
    ({"preset": "ppo-Nowhere-v0"}, r"^preset must be one of 'a2c-CartPole-v1', .* or None, "
                                   r"got 'ppo-Nowhere-v0'$"),
    ({"preset": 3}, r"^preset must be one of .* got 3$"),
    ({"preset": "dqn-CartPole-v1"}, r"^preset must be a preset of ppo \(e.g. ppo-<env id>\), "
                                    r"got 'dqn-CartPole-v1'$"),
    ({"n_step": 8}, r"^n_step is not a field of PPOConfig; fields: "),
])
def test_bad_preset_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        agents.PPO(env="CartPole-v1", **kwargs)


def test_preset_with_a_config_is_refused():
    with pytest.raises(ValueError, match="^preset must be left out when a config is given"):
        agents.PPO(agents.PPOConfig(), preset=None)


def test_config_messages_name_the_field():
    with pytest.raises(ValueError, match=r"^num_envs must be an int in \[1, 65536\], got 0$"):
        agents.PPOConfig(num_envs=0)
    with pytest.raises(ValueError, match=r"^tau must be a number in \(0, 1\], got 0.0$"):
        agents.DQNConfig(tau=0.0)
    with pytest.raises(ValueError, match=r"^activation must be one of"):
        agents.PPOConfig(activation="gelu")


# -- command line ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--preset", "nope"], "robustgrad: error: --preset must be one of "),
    (["--preset", "dqn-CartPole-v1"], "robustgrad: error: --preset must be a preset of ppo"),
    (["--set", "n_steps"], "robustgrad: error: --set must be KEY=VALUE with KEY a config "
                           "field, got 'n_steps'"),
    (["--set", "=3"], "--set must be KEY=VALUE with KEY a config field, got '=3'"),
    (["--set", "n_step=8"], "robustgrad: error: --set n_step is not a field of PPOConfig"),
    (["--set", "n_steps=eight"], "robustgrad: error: --set n_steps must be an int in [1, 16777216], "
                                 "got 'eight'"),
])
def test_cli_bad_preset_or_set(tmp_path, capsys, argv, message):
    status = cli_main(["train-agent", "--algo", "ppo", "--steps", "256",
                       "--out", str(tmp_path / "o"), "--no-progress", *argv])
    assert status == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o" / "agent.json").exists()


def test_cli_says_which_preset_and_records_it(tmp_path, capsys):
    out = tmp_path / "dqn"
    status = cli_main(["train-agent", "--algo", "dqn", "--steps", "256", "--seed", "0",
                       "--out", str(out), "--no-progress", "--eval-episodes", "0"])
    assert status == 0
    text = capsys.readouterr().out
    assert "preset dqn-CartPole-v1 (agents/presets.json" in text
    assert "evaluation every 5000 steps, keeping the best weights" in text  # its learn options
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] == "dqn-CartPole-v1" and saved["learning_rate_final"] == 0.0


def test_cli_preset_none(tmp_path, capsys):
    out = tmp_path / "ppo"
    status = cli_main(["train-agent", "--algo", "ppo", "--steps", "64", "--preset", "none",
                       "--set", "num_envs=2", "--set", "n_steps=32", "--out", str(out),
                       "--no-progress", "--eval-episodes", "0"])
    assert status == 0
    assert "preset " not in capsys.readouterr().out
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] is None and saved["n_epochs"] == 4 and saved["num_envs"] == 2


# -- plumbing --------------------------------------------------------------------------------
def test_replay_buffer_wraps_around_and_gathers():
    buf = ReplayBuffer(capacity=5, obs_shape=(1,), num_envs=2, prioritized=True)
    for step in range(3):  # 6 writes into 5 slots: slot 0 is overwritten by the last one
        o = tf.constant([[2.0 * step], [2.0 * step + 1]])
        buf.add(o, tf.constant([step, step]), tf.constant([1.0, 2.0]), o + 10.0,
                tf.constant([False, True]))
    assert int(buf.size) == 5 and int(buf.pos) == 1
    np.testing.assert_array_equal(buf.obs.numpy()[:, 0], [5.0, 1.0, 2.0, 3.0, 4.0])
    batch = buf.gather(tf.constant([[0, 1]], tf.int64))  # the seed axis of one: [1, B]
    np.testing.assert_array_equal(batch["next_obs"].numpy()[..., 0], [[15.0, 11.0]])
    np.testing.assert_array_equal(batch["terminated"].numpy(), [[1.0, 1.0]])
    np.testing.assert_array_equal(batch["actions"].numpy(), [[2, 0]])
    np.testing.assert_array_equal(buf.priority.numpy(), np.ones(5))  # entered at the max
    buf.update_priorities(tf.constant([[2]], tf.int64), tf.constant([[3.0]]), alpha=1.0, eps=0.0)
    assert buf.max_priority.shape == () and float(buf.max_priority) == 3.0  # a plain buffer's
    buf.add(tf.zeros([2, 1]), tf.constant([0, 0]), tf.zeros([2]), tf.zeros([2, 1]),
            tf.constant([False, False]))
    np.testing.assert_array_equal(buf.priority.numpy()[1:3], [3.0, 3.0])


def test_replay_buffer_bad_capacity():
    with pytest.raises(ValueError, match=r"^capacity must be an int >= 1, got 0$"):
        ReplayBuffer(0, (2,))


def test_linear_schedule_python_and_tensor_agree():
    for done in (0, 10, 99, 100, 250):
        py = linear(0.4, 1.0, done, 100)
        assert py == 0.4 + 0.6 * min(done / 100, 1.0)
        tf_value = linear(0.4, 1.0, tf.constant(float(done)), tf.constant(100.0))
        np.testing.assert_allclose(float(tf_value), py, rtol=1e-6)
    assert linear(1.0, 0.0, 5, 0) == 0.0  # a zero horizon is the end value at once
