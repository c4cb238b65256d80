"""Two runs on one --out (issue 24, serious 3): the second is refused with one line."""

import os
import signal
import subprocess
import time

from robustgrad import rundir

from conftest import cli_command


def _wait_for(path, proc, timeout=300):
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert os.path.exists(path), proc.communicate()[1][-3000:]


def test_two_train_agent_runs_on_one_out(tmp_path):
    out = str(tmp_path / "run")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    args = ["train-agent", "--algo", "a2c", "--steps", "200000", "--out", out, "--no-progress",
            "--eval-episodes", "0", "--set", "hidden_sizes=[8]"]
    first = subprocess.Popen(cli_command(*args), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(os.path.join(out, rundir.LOCK_FILE), first)
        for second in (args, ["train-classifier", "--out", out, "--epochs", "1"]):
            proc = subprocess.run(cli_command(*second), env=env, capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 2
            assert proc.stderr.splitlines() == [
                f"robustgrad: error: --out {out}: in use by another run (process {first.pid}, "
                f"robustgrad train-agent, started {_started(out)}); wait for it to end or "
                "choose another --out"], proc.stderr
        first.send_signal(signal.SIGINT)  # the first run is untouched: it stops as usual
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err[-2000:]
    assert not os.path.exists(os.path.join(out, rundir.LOCK_FILE))  # released on exit
    assert "robustgrad: interrupted" in err


def _started(out):
    import json

    with open(os.path.join(out, rundir.LOCK_FILE)) as f:
        return json.load(f)["started"]


def test_train_agent_out_an_existing_file_is_one_line_before_any_work(tmp_path):
    out = tmp_path / "file"
    out.write_text("mine")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cli_command("train-agent", "--steps", "64", "--out", str(out)),
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"robustgrad: error: --out {out}: exists and is not a directory"]
    assert out.read_text() == "mine"
