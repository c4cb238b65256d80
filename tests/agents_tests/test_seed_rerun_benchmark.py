"""Checks of ``benchmarks/seed_rerun.py``'s arguments (no training): ``--settings`` picks the
agent's keyword arguments, and bad combinations are refused with a message naming the flag
before any agent is built."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("seed_rerun")


def test_settings_are_the_preset_or_purejaxrls(bench):
    assert bench.SETTINGS["preset"] == {}
    # PPOConfig()'s defaults with 4 envs: what seeds_speed.py --settings purejaxrl trains
    assert bench.SETTINGS["purejaxrl"] == {"preset": None, "num_envs": 4}
    seeds_speed = open(bench.__file__.replace("seed_rerun.py", "seeds_speed.py")).read()
    assert 'make_config(agents.PPOConfig, "ppo", None, env="CartPole-v1",' in seeds_speed
    assert "backend=\"graph\", num_envs=4)" in seeds_speed


@pytest.mark.parametrize("argv,message", [
    (["--settings", "presets"], "argument --settings: invalid choice: 'presets' (choose from "
                                "'preset', 'purejaxrl')"),
    (["--algo", "dqn", "--settings", "purejaxrl"],
     "--settings purejaxrl: PureJaxRL's settings are PPO's; got --algo dqn"),
    (["--backends", "ray"], "argument --backends: invalid choice: 'ray'"),
    (["--seeds", "1"], "--steps must be >= 1, --seeds >= 2 and --seed >= 0; got --steps 50000, "
                       "--seeds 1, --seed 0"),
    (["--steps", "0"], "--steps must be >= 1, --seeds >= 2 and --seed >= 0; got --steps 0, "
                       "--seeds 2, --seed 0"),
])
def test_bad_arguments_are_refused_before_any_agent(bench, argv, message, capsys, monkeypatch):
    def no_agents(*args, **kwargs):  # an agent built would be a check come too late
        raise AssertionError("an agent was built")

    import agents

    monkeypatch.setattr(agents, "PPO", no_agents)
    monkeypatch.setattr(agents, "DQN", no_agents)
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
