"""Ctrl-C during `robustgrad train-agent`: one line, exit 130, a checkpoint, and --resume ends the run."""

import json
import os
import subprocess

from conftest import cli_command, interrupt_cli_once_ready


def test_sigint_during_train_agent_then_resume(tmp_path):
    out = str(tmp_path / "ppo")
    args = ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "400000",
            "--preset", "none", "--set", "n_steps=16", "--set", "hidden_sizes=[16]",
            "--num-envs", "2", "--checkpoint-every", "64", "--eval-episodes", "0",
            "--no-progress", "--out", out]
    marker = os.path.join(out, "checkpoint", "agent.json")
    returncode, err, line = interrupt_cli_once_ready(args, marker)
    assert returncode == 130, err[-3000:]
    assert "Traceback" not in err
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    assert "training stopped by SIGINT at step" in line
    assert f"checkpoint saved to {os.path.join(out, 'checkpoint')}" in line
    assert "resume with: robustgrad train-agent" in line and line.endswith("--resume")
    with open(marker) as f:
        stopped_at = json.load(f)["num_timesteps"]
    assert 0 < stopped_at < 400_000
    # the printed command, with a smaller budget so the test ends: it continues from the
    # checkpoint and ends exactly at the budget
    resume = [a if a != "400000" else str(stopped_at + 64) for a in args] + ["--resume"]
    done = subprocess.run(cli_command(*resume), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming PPO on CartPole-v1: {stopped_at} -> {stopped_at + 64} steps" in done.stdout
    with open(os.path.join(out, "agent.json")) as f:
        assert json.load(f)["num_timesteps"] == stopped_at + 64
