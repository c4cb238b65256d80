"""--resume keeps the configuration in both training commands: a changed key is refused with
the keys named, unless --override names it (then it is applied and recorded in config.json);
train-agent refuses a budget below the steps done; history.json covers the whole run."""

import json
import os

import pytest

from robustgrad import cli

AGENT = ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--preset", "none",
         "--set", "n_steps=16", "--set", "hidden_sizes=[8]", "--num-envs", "2",
         "--eval-episodes", "0", "--no-progress", "--checkpoint-every", "32"]


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _json(*parts):
    with open(os.path.join(*parts)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("resume") / "ppo")
    assert cli.main([*AGENT, "--steps", "64", "--out", out]) == 0
    return out


@pytest.mark.parametrize("change, named", [
    (["--lr", "0.01"], "lr: saved 0.00025 != 0.01"),
    (["--env", "Acrobot-v1"], "env: saved 'CartPole-v1' != 'Acrobot-v1'"),
    (["--seed", "3"], "seed: saved 0 != 3"),
    (["--set", "gamma=0.5"], "gamma: saved 0.99 != 0.5"),
])
def test_train_agent_resume_refuses_a_changed_configuration(agent_run, capsys, change, named):
    capsys.readouterr()
    assert cli.main([*AGENT, "--steps", "128", "--out", agent_run, "--resume", *change]) == 2
    line = _error_line(capsys)
    key = named.split(":")[0]
    assert line == (f"robustgrad: error: --resume: the run in {agent_run}/checkpoint has a "
                    f"different configuration ({named}); pass --override {key} to change it")
    assert _json(agent_run, "agent.json")["num_timesteps"] == 64  # nothing trained


def test_train_agent_resume_refuses_a_budget_below_the_steps_done(agent_run, capsys):
    capsys.readouterr()
    assert cli.main([*AGENT, "--steps", "32", "--out", agent_run, "--resume"]) == 2
    assert _error_line(capsys) == (
        f"robustgrad: error: --steps 32 is below the 64 steps the checkpoint in "
        f"{agent_run}/checkpoint already holds (--steps is the total budget)")


def test_train_agent_override_applies_and_records(agent_run, capsys):
    first = _json(agent_run, "history.json")
    assert len(first["history"]) == 2 and first["resumed_at"] == []  # 64 steps = 2 updates
    assert cli.main([*AGENT, "--steps", "128", "--out", agent_run, "--resume", "--lr", "0.01",
                     "--override", "lr"]) == 0
    config = _json(agent_run, "config.json")
    assert config["learning_rate"] == 0.01
    assert config["overrides"] == [{"learning_rate": [0.00025, 0.01]}]
    record = _json(agent_run, "history.json")
    assert [h["steps"] for h in record["history"]] == [32, 64, 96, 128]  # from the start
    assert record["train_seconds"] > first["train_seconds"] > 0
    assert record["resumed_at"] == [64]
    # an unknown --override key is a one-line error naming it
    capsys.readouterr()
    assert cli.main([*AGENT, "--steps", "160", "--out", agent_run, "--resume",
                     "--override", "nope"]) == 2
    assert "--override: expected configuration keys" in _error_line(capsys)


CLF = ["train-classifier", "--data", "digits", "--limit", "64", "--method", "clean",
       "--epochs", "1", "--batch-size", "32", "--width", "4", "--no-eval", "--no-progress",
       "--verbose", "0"]


def test_train_classifier_resume_refuses_then_overrides(tmp_path, capsys):
    out = str(tmp_path / "clf")
    assert cli.main([*CLF, "--out", out]) == 0
    capsys.readouterr()
    more = [a if a != "1" else "2" for a in CLF]
    assert cli.main([*more, "--out", out, "--resume", "--lr", "0.01"]) == 2
    assert _error_line(capsys) == (
        f"robustgrad: error: --resume: the run in {out} has a different configuration "
        f"(epochs: saved 1 != 2, lr: saved 0.001 != 0.01); pass --override epochs,lr to "
        f"change it")
    assert cli.main([*more, "--out", out, "--resume", "--override", "epochs"]) == 0
    config = _json(out, "config.json")
    assert config["epochs"] == 2 and config["overrides"] == [{"epochs": [1, 2]}]
    record = _json(out, "history.json")
    assert len(record["history"]["loss"]) == 2 and record["resumed_at"] == [{"epoch": 1,
                                                                            "batch": 0}]
    capsys.readouterr()
    assert cli.main([*CLF, "--out", str(tmp_path / "new"), "--override", "epochs"]) == 2
    assert _error_line(capsys).startswith("robustgrad: error: --override: only with --resume")


def test_train_agent_resumes_whatever_a_crash_inside_a_save_left(tmp_path, capsys):
    """kill -9 at each step of a checkpoint switch, simulated by copying the run directory at
    that step (what a kill leaves on disk): --resume continues from the new checkpoint or the
    old one, and says which, never from step 0 (issue 24, serious 2)."""
    import shutil

    import agents
    from robustgrad import atomic

    out = str(tmp_path / "run")
    assert cli.main([*AGENT, "--steps", "64", "--out", out]) == 0
    ckpt = os.path.join(out, "checkpoint")
    agent = agents.load(ckpt, checkpoint_dir=None)
    agent.learn(32, progress_bar=False)  # the new checkpoint: 96 steps, the old one holds 64
    snapshots = []

    def snapshot(stage):
        snapshots.append((stage, str(tmp_path / f"{len(snapshots)}")))
        shutil.copytree(out, snapshots[-1][1], symlinks=True)

    saved_fault_point = atomic._fault_point
    atomic._fault_point = snapshot
    try:
        agent.save(ckpt)
    finally:
        atomic._fault_point = saved_fault_point
    assert [s for s, _ in snapshots] == [
        "staged", "manifest", "moved out agent.json", "moved out weights",
        "moved out config.json", "moved in weights", "moved in config.json",
        "moved in agent.json", "done"]
    capsys.readouterr()
    for stage, directory in snapshots:
        assert cli.main([*AGENT, "--steps", "128", "--out", directory, "--resume"]) == 0, stage
        lines = capsys.readouterr().out.splitlines()
        new = stage in ("moved in agent.json", "done")
        assert f"resuming PPO on CartPole-v1: {96 if new else 64} -> 128 steps" in "\n".join(
            lines), (stage, lines)
        said = [line for line in lines if line.startswith("--resume: ")]
        if stage == "done":
            assert said == []
        elif new:
            assert said == [f"--resume: {directory}/checkpoint: a save was interrupted once the "
                            "new checkpoint was complete: resuming the new checkpoint (step 96)"]
        else:
            assert said == [f"--resume: {directory}/checkpoint: a save was interrupted before "
                            "the new checkpoint was complete: resuming the previous checkpoint "
                            "(step 64)"], (stage, said)
        assert int(agents.load(directory).num_timesteps.numpy()) == 128


def _copy(agent_run, tmp_path):
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(agent_run, out)
    return out


def test_train_agent_override_with_no_steps_left_is_refused_not_recorded(agent_run, tmp_path,
                                                                         capsys):
    out = _copy(agent_run, tmp_path)
    done = _json(out, "checkpoint", "agent.json")["num_timesteps"]
    before = _json(out, "config.json")
    capsys.readouterr()
    # 0.02: not the saved lr, whichever test of this module ran first
    assert cli.main([*AGENT, "--steps", str(done), "--out", out, "--resume", "--lr", "0.02",
                     "--override", "lr"]) == 2
    assert _error_line(capsys) == (
        f"robustgrad: error: --override: the checkpoint in {out}/checkpoint already holds the "
        f"{done} steps of --steps; nothing is left to train with the new settings (raise --steps)")
    assert _json(out, "config.json") == before  # not rewritten


def test_train_agent_resume_of_a_finished_agent_without_checkpoint_says_so(agent_run, tmp_path,
                                                                           capsys):
    import shutil

    out = _copy(agent_run, tmp_path)
    shutil.rmtree(os.path.join(out, "checkpoint"))
    capsys.readouterr()
    assert cli.main([*AGENT, "--steps", "128", "--out", out, "--resume"]) == 2
    assert _error_line(capsys) == (
        f"robustgrad: error: --resume: {out} holds a finished agent but no checkpoint to resume "
        f"from ({out}/checkpoint is missing); agents.load({out!r}) loads it, --overwrite trains "
        "anew")
