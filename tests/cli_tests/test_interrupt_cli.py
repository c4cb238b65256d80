"""Ctrl-C during `robustgrad train-agent`: one line, exit 130, a checkpoint, and --resume ends the run."""

import json
import os
import signal
import subprocess
import sys
import time


def _cli(*args):
    return [sys.executable, "-m", "robustgrad.cli", *args]


def test_sigint_during_train_agent_then_resume(tmp_path):
    out = str(tmp_path / "ppo")
    args = ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "400000",
            "--preset", "none", "--set", "n_steps=16", "--set", "hidden_sizes=[16]",
            "--num-envs", "2", "--checkpoint-every", "64", "--eval-episodes", "0",
            "--no-progress", "--out", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(_cli(*args), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    marker = os.path.join(out, "checkpoint", "agent.json")
    deadline = time.time() + 400
    while not os.path.exists(marker) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert os.path.exists(marker), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.startswith("robustgrad: interrupted")]
    assert len(last) == 1, err[-3000:]
    assert "training stopped by SIGINT at step" in last[0]
    assert f"checkpoint saved to {os.path.join(out, 'checkpoint')}" in last[0]
    assert "resume with: robustgrad train-agent" in last[0] and last[0].endswith("--resume")
    with open(marker) as f:
        stopped_at = json.load(f)["num_timesteps"]
    assert 0 < stopped_at < 400_000
    # the printed command, with a smaller budget so the test ends: it continues from the
    # checkpoint and ends exactly at the budget
    resume = [a if a != "400000" else str(stopped_at + 64) for a in args] + ["--resume"]
    done = subprocess.run(_cli(*resume), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming PPO on CartPole-v1: {stopped_at} -> {stopped_at + 64} steps" in done.stdout
    with open(os.path.join(out, "agent.json")) as f:
        assert json.load(f)["num_timesteps"] == stopped_at + 64
