"""A flag the run would ignore is refused (or warned about), never silently dropped (issue 24)."""

import json

import pytest

from robustgrad import cli

TRAIN = ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "64",
         "--no-progress", "--eval-episodes", "0"]


@pytest.mark.parametrize("flags, message", [
    (["--robust", "adv", "--robust-method", "sgld"],
     "--robust-method: only with --robust sa (the inner maximiser of the SA regulariser), not "
     "with --robust adv"),
    (["--robust", "adv", "--robust-kappa", "1"],
     "--robust-kappa: only with --robust sa (the weight of the SA regulariser), not with "
     "--robust adv"),
    (["--robust", "sa", "--robust-attack", "critic"],
     "--robust-attack: only with --robust adv (the attack adversarial training trains on), not "
     "with --robust sa"),
    (["--backend", "graph", "--async-envs"],
     "--async-envs: the graph backend steps its environments inside the compiled iteration"),
])
def test_train_agent_refuses_a_flag_the_method_would_ignore(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"robustgrad: error: {message}"), err
    assert not out.exists()


def test_train_agent_warns_of_a_preset_tuned_for_another_env(tmp_path, capsys):
    # --override (refused later, before any work) ends the run right after the preset check
    assert cli.main([*TRAIN, "--out", str(tmp_path / "run"), "--preset", "ppo-Acrobot-v1",
                     "--override", "lr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("robustgrad train-agent: warning: --preset ppo-Acrobot-v1 was tuned for "
                      "Acrobot-v1, not CartPole-v1")


def _fake_agent(tmp_path, env):
    d = tmp_path / "agent"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"env": env}))
    (d / "agent.json").write_text(json.dumps({"algo": "ppo", "num_timesteps": 0}))
    return str(d)


@pytest.mark.parametrize("flags", [["--eps", "0.1"], ["--norm", "l2"], ["--scale", "raw"]])
def test_evaluate_agent_budget_flags_without_attacks_are_refused(tmp_path, capsys, flags):
    agent = _fake_agent(tmp_path, "CartPole-v1")
    assert cli.main(["evaluate-agent", "--agent", agent, *flags]) == 2
    assert capsys.readouterr().err.strip() == (
        f"robustgrad: error: {flags[0]}: only with --attacks (a clean evaluation has no budget); "
        "name the attacks, e.g. --attacks action,mad")


def test_evaluate_agent_of_a_factory_trained_agent_says_what_to_do(tmp_path, capsys):
    agent = _fake_agent(tmp_path, None)
    assert cli.main(["evaluate-agent", "--agent", agent]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"robustgrad: error: --agent {agent}: the agent was trained on an env "
                          "factory (a Python function), which the command line cannot rebuild; "
                          "evaluate it from Python: agents.load(path, env=factory)")
    assert "pass env=" not in err


def test_an_env_whose_optional_dependency_is_missing_is_one_line_with_the_install(tmp_path,
                                                                                  capsys):
    import importlib.util

    if importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here")
    assert cli.main(["train-agent", "--env", "LunarLander-v3", "--steps", "64", "--out",
                     str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("robustgrad: error: --env 'LunarLander-v3' needs an optional "
                             "dependency that is not installed: Box2D is not installed")
    assert 'pip install "gymnasium[box2d]"' in err[0]
