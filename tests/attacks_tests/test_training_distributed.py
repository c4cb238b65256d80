"""train-classifier in subprocesses: kill from outside and resume (same final weights), and
tf.distribute parity (MirroredStrategy on 2 logical CPUs, MultiWorkerMirroredStrategy with two
worker processes on 127.0.0.1) against the single-device run."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

TINY = ["--method", "madry", "--steps", "2", "--width", "4", "--no-eval", "--verbose", "0",
        "--eps", "0.1"]


def _env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    return env


def _train(*argv, env=None, check=True):
    cmd = [sys.executable, "-m", "robustgrad.cli", "train-classifier", *argv]
    proc = subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def _load_weights(path):
    import keras

    return [w for w in keras.models.load_model(path).get_weights()]


def _history(out):
    with open(os.path.join(out, "history.json")) as f:
        return json.load(f)["history"]


def _wait_for(path, proc, timeout=600.0):
    """Poll until ``path`` exists (True) or ``proc`` ends first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return os.path.exists(path)
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def test_kill_after_first_checkpoint_then_resume_matches_uninterrupted(tmp_path):
    """SIGKILL from outside once the first epoch's checkpoint is complete (the CheckpointManager
    writes its ``checkpoint`` index file last), then --resume: the final weights equal those of
    an uninterrupted run, bit for bit, and so does the history: the epochs trained before the
    kill are in it (``history.json`` is written at every epoch end, before its checkpoint)."""
    common = [*TINY, "--limit", "192", "--batch-size", "32", "--epochs", "6", "--seed", "5"]
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    cmd = [sys.executable, "-m", "robustgrad.cli", "train-classifier", *common, "--out", killed]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        appeared = _wait_for(os.path.join(killed, "checkpoints", "checkpoint"), proc)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert appeared, err[-2000:]
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert not os.path.exists(os.path.join(killed, "model.keras"))  # killed before the end
    _train(*common, "--out", full)
    _train(*common, "--out", killed, "--resume")
    for a, b in zip(_load_weights(os.path.join(full, "model.keras")),
                    _load_weights(os.path.join(killed, "model.keras"))):
        np.testing.assert_array_equal(a, b)
    assert len(_history(full)["loss"]) == 6
    np.testing.assert_array_equal(_history(killed)["loss"], _history(full)["loss"])


def test_mirrored_two_logical_cpus_matches_single_device(tmp_path):
    common = [*TINY, "--limit", "128", "--batch-size", "64", "--epochs", "2",
              "--no-random-start", "--seed", "1"]
    single, mirrored = str(tmp_path / "single"), str(tmp_path / "mirrored")
    cmd = [sys.executable, "-m", "robustgrad.cli", "train-classifier", *common, "--out", single]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    _train(*common, "--out", mirrored, "--strategy", "mirrored", "--logical-cpus", "2")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    h1, h2 = _history(single), _history(mirrored)
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-4, atol=1e-5)
    for a, b in zip(_load_weights(os.path.join(single, "model.keras")),
                    _load_weights(os.path.join(mirrored, "model.keras"))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _start_workers(argv, out, ports, strategy="multiworker"):
    """Two ``train-classifier --strategy multiworker`` processes on 127.0.0.1 ``ports``,
    both given the same ``--out`` (the chief writes it, worker 1 ``out/workers/1``);
    ``strategy`` the flag's spelling (``multi-worker`` is the same)."""
    workers = [f"127.0.0.1:{p}" for p in ports]
    procs = []
    for i in range(2):
        env = _env()
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": i}})
        cmd = [sys.executable, "-m", "robustgrad.cli", "train-classifier", *argv,
               "--out", out, "--strategy", strategy]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs):
    for p in procs:
        try:
            _, err = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]


@pytest.mark.slow  # four TensorFlow processes (about 60 s on this 2-core machine)
def test_multiworker_two_processes_match_single_device_and_resume(tmp_path):
    """Two worker processes on 127.0.0.1 train 2 epochs, then resume to 3 (--override epochs):
    the chief alone writes the run's checkpoints and model into --out, worker 1 its working
    copy into --out/workers/1; both end with the same weights, equal (to float tolerance) to
    one process training 3 epochs on the same global batch."""
    common = [*TINY, "--limit", "128", "--batch-size", "64", "--no-random-start", "--seed", "1",
              "--schedule", "constant", "--optimizer", "adam", "--lr", "0.001"]
    single, shared = str(tmp_path / "single"), str(tmp_path / "shared")
    procs = _start_workers([*common, "--epochs", "2"], shared, _free_ports(2))
    _train(*common, "--epochs", "3", "--out", single)  # concurrently with the workers
    _finish(procs)
    worker = os.path.join(shared, "workers", "1")
    for out in (shared, worker):
        assert os.path.exists(os.path.join(out, "checkpoints", "checkpoint")), out
        assert len(_history(out)["loss"]) == 2
    assert not os.path.exists(os.path.join(shared, "workers", "0"))  # the chief writes --out
    _finish(_start_workers([*common, "--epochs", "3", "--resume", "--override", "epochs"],
                           shared, _free_ports(2)))
    h1 = _history(single)
    for out in (shared, worker):
        np.testing.assert_allclose(_history(out)["loss"], h1["loss"], rtol=1e-4, atol=1e-5)
    chief_weights = _load_weights(os.path.join(shared, "model.keras"))
    worker_weights = _load_weights(os.path.join(worker, "model.keras"))
    for a, b, c in zip(chief_weights, worker_weights, _load_weights(
            os.path.join(single, "model.keras"))):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)  # one all-reduced update each step
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # six TensorFlow processes (about 70 s on this 2-core machine)
def test_multi_worker_resumes_after_one_worker_is_killed(tmp_path):
    """Two workers (``--strategy multi-worker``, the issue's spelling) train 4 epochs; once the
    chief has committed epoch 1's checkpoint, worker 1 is killed with SIGKILL (a lost machine).
    The chief cannot go on without it (its collectives fail or wait): it is stopped too, as a
    cluster manager restarts the job. Both restarted with --resume continue from the last
    checkpoint and end as one process training 4 epochs on the same global batch."""
    common = [*TINY, "--limit", "512", "--batch-size", "64", "--no-random-start", "--seed", "1",
              "--schedule", "constant", "--optimizer", "adam", "--lr", "0.001", "--epochs", "4"]
    single, shared = str(tmp_path / "single"), str(tmp_path / "shared")
    chief, worker = _start_workers(common, shared, _free_ports(2), strategy="multi-worker")
    assert _wait_for(os.path.join(shared, "checkpoints", "checkpoint"), chief)
    worker.kill()
    worker.communicate()
    assert worker.returncode == -signal.SIGKILL  # killed mid-run, not finished
    try:
        chief.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        chief.kill()
        chief.communicate()
    assert chief.returncode != 0  # it did not finish alone
    assert not os.path.exists(os.path.join(shared, "model.keras"))
    _train(*common, "--out", single)
    _finish(_start_workers([*common, "--resume"], shared, _free_ports(2),
                           strategy="multi-worker"))
    expected = _history(single)["loss"]
    worker_out = os.path.join(shared, "workers", "1")
    for out in (shared, worker_out):
        np.testing.assert_allclose(_history(out)["loss"], expected, rtol=1e-4, atol=1e-5)
    for a, b in zip(_load_weights(os.path.join(shared, "model.keras")),
                    _load_weights(os.path.join(single, "model.keras"))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
