"""Agent runs written by the previous version (48f1798, whose ``train-agent`` kept its records
through ``commands/_resume.py``) resume through :func:`agents.training.train_agent` and the
run directory's one resume rule (issue 34).

The old layout is built here file by file as 48f1798 wrote it: an interrupted run holds
``checkpoint/`` (a saved agent whose ``config.json`` carries the ``overrides`` record, and its
own ``history.json``) and ``history.json`` (``history``, ``train_seconds``, ``resumed_at``), and
no ``config.json`` of its own; a finished run also holds the saved agent with ``overrides`` in
its ``config.json``. No ``resolved`` record, no lock file."""

import json
import os

import pytest

import agents
from agents.config import A2CConfig
from robustgrad import cli

FLAGS = ["train-agent", "--algo", "a2c", "--env", "CartPole-v1", "--preset", "none",
         "--num-envs", "1", "--set", "n_steps=16", "--set", "hidden_sizes=[8]",
         "--eval-episodes", "0", "--no-progress"]
OLD_OVERRIDES = [{"learning_rate": [0.0007, 0.001]}]  # a resume of the old run changed lr


def _json(*parts):
    with open(os.path.join(*parts)) as f:
        return json.load(f)


def _write(value, *parts):
    with open(os.path.join(*parts), "w") as f:
        json.dump(value, f)


def _old_run(out: str, finished: bool) -> list:
    """A run of 32 steps in ``out`` as 48f1798 left it (interrupted, or finished); returns its
    history."""
    ckpt = os.path.join(out, "checkpoint")
    config = A2CConfig(env="CartPole-v1", num_envs=1, n_steps=16, hidden_sizes=(8,),
                       learning_rate=1e-3, checkpoint_dir=ckpt, checkpoint_every=16)
    agent = agents.A2C(config)
    agent.learn(32, progress_bar=False)  # checkpoints to out/checkpoint
    record = {"history": agent.history, "train_seconds": 5.0, "resumed_at": [16]}
    saved = _json(ckpt, "config.json")  # write_agent_record(ckpt, record, ...) on the interrupt
    _write({**saved, "overrides": OLD_OVERRIDES}, ckpt, "config.json")
    _write(record, ckpt, "history.json")
    if finished:  # agent.save(out), then write_agent_record(out, record, ...)
        agent.save(out)
        _write({**_json(out, "config.json"), "overrides": OLD_OVERRIDES}, out, "config.json")
    _write(record, out, "history.json")
    agent.close()
    assert "resolved" not in _json(ckpt, "config.json")
    return agent.history


def test_an_interrupted_run_of_the_previous_version_resumes(tmp_path, capsys):
    out = str(tmp_path / "a2c")
    history = _old_run(out, finished=False)
    assert not os.path.exists(os.path.join(out, "config.json"))
    assert cli.main([*FLAGS, "--lr", "0.001", "--steps", "64", "--out", out, "--resume"]) == 0
    assert "resuming A2C on CartPole-v1: 32 -> 64 steps" in capsys.readouterr().out
    record = _json(out, "history.json")
    assert json.dumps(record["history"][:len(history)]) == json.dumps(history)  # kept (NaNs too)
    assert [h["steps"] for h in record["history"]] == [16, 32, 48, 64]
    assert record["resumed_at"] == [16, 32] and record["train_seconds"] > 5.0
    config = _json(out, "config.json")
    assert config["overrides"] == OLD_OVERRIDES  # the old record carried on
    origin = config["resolved"]["origin"]  # the new record, from this resume's flags
    assert (origin["learning_rate"], origin["n_steps"], origin["gamma"]) == \
        ("user", "user", "default")
    assert agents.load(out).num_timesteps.numpy() == 64


def test_a_finished_run_of_the_previous_version_keeps_its_rule(tmp_path, capsys):
    out = str(tmp_path / "a2c")
    _old_run(out, finished=True)
    capsys.readouterr()
    again = [*FLAGS, "--steps", "48", "--out", out, "--resume", "--lr", "0.0007"]
    assert cli.main(again) == 2
    assert capsys.readouterr().err.strip() == (
        f"robustgrad: error: --resume: the run in {out}/checkpoint has a different "
        "configuration (lr: saved 0.001 != 0.0007); pass --override lr to change it")
    assert _json(out, "agent.json")["num_timesteps"] == 32  # nothing trained
    assert cli.main([*again, "--override", "lr"]) == 0
    config = _json(out, "config.json")
    assert config["learning_rate"] == pytest.approx(7e-4)
    assert config["overrides"] == [*OLD_OVERRIDES, {"learning_rate": [0.001, 0.0007]}]
    assert config["resolved"]["origin"]["learning_rate"] == "override"
    assert _json(out, "history.json")["resumed_at"] == [16, 32]
