"""Issue 36's last gaps (round seven): a stop at any moment after the checks says what --out
holds on one line, ATLA's start radius is bounded, compute_bounds on many models is quiet."""

import logging
import re

import numpy as np
import pytest

from robustgrad import cli


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- bounds before work


def test_atla_start_radius_is_bounded_like_the_radius_it_starts_from():
    from agents import PPOConfig
    from agents.core.plugin import MAX_ROBUST_EPS
    from agents.robustness.configs import ATLA
    from robustgrad.errors import ConfigError

    message = ("atla_start_radius must be a number <= 1000, got 1000000000.0: the learned "
               "adversary's first radius, in the units of robust_eps (standard deviations with "
               "normalize_obs, else raw units)")
    with pytest.raises(ConfigError, match=re.escape(message)):
        PPOConfig(robust="atla", robust_eps=0.1, atla_start_radius=1e9)
    with pytest.raises(ConfigError, match=re.escape(message)):
        PPOConfig(robust=ATLA(eps=0.1, start_radius=1e9))
    at_bound = PPOConfig(robust="atla", robust_eps=0.1, atla_start_radius=MAX_ROBUST_EPS)
    assert at_bound.atla_start_radius == 1e3


def test_train_agent_names_the_start_radius_over_its_bound(tmp_path, capsys):
    out = tmp_path / "a"
    assert cli.main(["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "1000",
                     "--out", str(out), "--robust", "atla", "--eps", "0.1", "--set",
                     "atla_start_radius=1e9"]) == 2
    assert _one_line(capsys) == (
        "robustgrad: error: --set atla_start_radius must be a number <= 1000, got "
        "1000000000.0: the learned adversary's first radius, in the units of --eps (standard "
        "deviations with normalize_obs, else raw units)")
    assert not out.exists()


# ---------------------------------------------------------------- no warning that is not yours


def test_compute_bounds_on_many_models_traces_each_once_without_tensorflows_warning():
    """One compiled function per model (its weights are its own) is a bounded, legitimate
    trace; TensorFlow counted them all as one function retracing and warned from the fifth."""
    import keras
    import tensorflow as tf

    from robustgrad.bounds import compute_bounds

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    tf.get_logger().addHandler(handler)
    try:
        x = np.zeros((3, 4), "float32")
        for _ in range(7):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                                      keras.layers.Dense(2)])
            for method in ("crown", "ibp"):
                lb, ub = compute_bounds(model, x, x + 0.1, method)
                assert np.all(lb.numpy() <= model(x).numpy() + 1e-6)
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in seen if "retracing" in m], seen


# ---------------------------------------------------------------- a stop at any moment

# A private test hook, run as its own process: PGD's step is gated while PGD is traced (the
# L2 step direction, called once inside the tracing of the step loop's ``tf.while_loop``),
# so that the test's signal lands in the middle of TensorFlow's tracing, every time.
_GATED_TRACING = """
import os, sys, time
import attacks._engine as engine

marker, argv = sys.argv[1], sys.argv[2:]
real = engine.steepest_ascent

def gated(*args, **kwargs):
    open(marker, "w").close()
    deadline = time.time() + 120
    while time.time() < deadline:  # the test's SIGTERM arrives here, mid-trace
        time.sleep(0.01)
    return real(*args, **kwargs)

engine.steepest_ascent = gated
from robustgrad import cli
sys.exit(cli.main(argv))
"""


def test_sigterm_while_an_attack_is_traced_stops_in_one_line_and_resumes(tmp_path):
    """The signal lands inside the tracing of PGD's while_loop (issue 36, round six's known
    defect: exit 1 and a traceback from the tracing); now 130, one line, and --resume runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import cli_command

    model = _keras_model(tmp_path)
    out, marker = str(tmp_path / "e"), str(tmp_path / "tracing")
    args = ["evaluate", "--model", model, "--attacks", "pgd5", "--norm", "l2", "--eps", "0.5",
            "--no-cascade", "--limit", "10", "--chunk-size", "5", "--out", out, "--no-progress"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen([sys.executable, "-c", _GATED_TRACING, marker, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not os.path.exists(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert os.path.exists(marker), proc.communicate()[1][-3000:]
    assert not os.path.exists(os.path.join(out, "results", "chunk-000000.npz"))  # before any
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"robustgrad: interrupted: SIGTERM received; --out {out} keeps the results committed so "
        f"far; continue with: robustgrad {' '.join(args)} --resume")
    done = subprocess.run(cli_command(*args, "--resume"), capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.isfile(os.path.join(out, "results", "chunk-000001.npz"))


def _keras_model(tmp_path) -> str:
    import keras

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    path = str(tmp_path / "m.keras")
    model.save(path)
    return path


def _commands(tmp_path):
    """Each command that stops in one line, with a valid command line (``--out`` last two)."""
    model = _keras_model(tmp_path)
    return {
        "evaluate": ["evaluate", "--model", model, "--attacks", "fgsm", "--eps", "0.1",
                     "--no-progress"],
        "certify": ["certify", "--model", model, "--eps", "0.01", "--no-progress"],
        "sensitivity": ["sensitivity", "--model", model],
        "train-classifier": ["train-classifier", "--arch", "mlp", "--epochs", "1",
                             "--no-progress"],
        "train-agent": ["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps",
                        "1000", "--no-progress"],
        "evaluate-agent": ["evaluate-agent", "--agent", _agent(tmp_path), "--episodes", "1"],
        "demo": ["demo"],
    }


def _agent(tmp_path) -> str:
    import agents

    path = str(tmp_path / "agent")
    agents.PPO(env="CartPole-v1", n_steps=64, num_envs=1).save(path)
    return path


@pytest.mark.parametrize("command", ["evaluate", "certify", "sensitivity", "train-classifier",
                                     "train-agent", "evaluate-agent", "demo"])
def test_sigterm_while_tensorflow_loads_stops_in_one_line(tmp_path, capsys, monkeypatch,
                                                          command):
    """The first moment after the checks: TensorFlow loading (it was not covered: status -15
    and no line)."""
    import os
    import signal

    from robustgrad.commands import _startup

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("this process handles SIGTERM itself")
    loaded = _startup.import_tensorflow

    def load_then_signal(*args, **kwargs):
        loaded(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(_startup, "import_tensorflow", load_then_signal)
    out = str(tmp_path / "out")
    assert cli.main([*_commands(tmp_path)[command], "--out", out]) == cli.EXIT_INTERRUPTED
    assert _one_line(capsys) == (
        f"robustgrad: interrupted: SIGTERM received; --out {out} holds nothing to resume (every "
        "file there is whole: each write is atomic); run the command again")
    assert not os.path.exists(out)  # as it was: the run lock went with the run
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_interrupt_a_library_turns_into_its_own_error_is_still_the_stop(tmp_path, capsys,
                                                                            monkeypatch):
    """A signal inside a library's clean-up (TensorFlow's graph stack while it traces) can end
    the run with the clean-up's error, the interrupt only its context."""
    from attacks import evaluation_run

    def traced(*args, **kwargs):
        try:
            raise KeyboardInterrupt("SIGTERM received")
        finally:
            raise AssertionError("Nesting violated for default stack of <class "
                                 "'tensorflow.python.framework.ops.Graph'> objects")

    monkeypatch.setattr(evaluation_run, "evaluate", traced)
    out = str(tmp_path / "e")
    assert cli.main([*_commands(tmp_path)["evaluate"], "--out", out]) == cli.EXIT_INTERRUPTED
    assert _one_line(capsys) == (
        f"robustgrad: interrupted: SIGTERM received; --out {out} holds nothing to resume (every "
        "file there is whole: each write is atomic); run the command again")


def test_an_interrupt_a_library_dropped_is_still_the_stop(tmp_path, capsys, monkeypatch):
    """A library that swallows the interrupt and fails later (its graph half-built): the
    signal received while the command ran says what the failure was."""
    import os
    import signal

    from attacks import evaluation_run

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("this process handles SIGTERM itself")

    def traced(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:  # noqa: S110 - what a careless library does
            pass
        raise ValueError("Tensor must be from the same graph as Tensor")

    monkeypatch.setattr(evaluation_run, "evaluate", traced)
    out = str(tmp_path / "e")
    assert cli.main([*_commands(tmp_path)["evaluate"], "--out", out]) == cli.EXIT_INTERRUPTED
    assert _one_line(capsys) == (
        f"robustgrad: interrupted: SIGTERM received; --out {out} holds nothing to resume (every "
        "file there is whole: each write is atomic); run the command again")
    # the next command in this process starts with no signal: its own error is its own
    assert cli.main(["evaluate", "--model", str(tmp_path / "missing.keras")]) == 2
    assert "interrupted" not in capsys.readouterr().err


# ---------------------------------------------------------------- round seven's probe


@pytest.mark.parametrize("argv, message", [
    (["--method", "trades", "--beta", "1e12"],
     "--beta must be a number in [0, 1000], got 1000000000000.0"),
    (["--method", "trades", "--beta", "-1"], "--beta must be a number in [0, 1000], got -1.0"),
    (["--method", "awp", "--awp-gamma", "5"], "--awp-gamma must be a number in [0, 1], got 5.0"),
    (["--weight-decay", "1e9"], "--weight-decay must be a number in [0, 1], got 1000000000.0"),
])
def test_classifier_loss_weights_are_bounded_before_work(tmp_path, capsys, argv, message):
    """`--method trades --beta 1e12` trained for minutes (round seven's probe)."""
    out = tmp_path / "c"
    assert cli.main(["train-classifier", "--epochs", "1", "--out", str(out), *argv]) == 2
    assert _one_line(capsys) == f"robustgrad: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("fields, message", [
    (dict(method="trades", beta=1e12), "beta must be a number in [0, 1000], got 1000000000000.0"),
    (dict(method="awp", awp_gamma=5.0), "awp_gamma must be a number in [0, 1], got 5.0"),
    (dict(method="madry", weight_decay=1e9),
     "weight_decay must be a number in [0, 1], got 1000000000.0"),
])
def test_classifier_loss_weights_are_bounded_in_the_python_api(fields, message):
    from attacks.training import ClassifierConfig, LossOptions, UpdateOptions
    from robustgrad.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        ClassifierConfig(**fields)
    options = {k: v for k, v in fields.items() if k != "method"}
    kind = UpdateOptions if "weight_decay" in options else LossOptions
    with pytest.raises(ConfigError, match=re.escape(message)):
        kind(**options)
    assert LossOptions(beta=1e3, awp_gamma=1.0).beta == 1e3  # at the bounds


def test_wocar_weight_is_bounded_like_kappa(tmp_path, capsys):
    """`--robust wocar --set wocar_weight=1e12` was accepted for PPO (DQN's is in [0, 1])."""
    from agents import PPOConfig
    from robustgrad.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(
            "wocar_weight must be a number in [0, 1000], got 1000000000000.0")):
        PPOConfig(robust="wocar", robust_eps=0.1, wocar_weight=1e12)
    assert PPOConfig(robust="wocar", robust_eps=0.1, wocar_weight=1e3).wocar_weight == 1e3
    out = tmp_path / "a"
    assert cli.main(["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "1000",
                     "--out", str(out), "--robust", "wocar", "--eps", "0.1", "--set",
                     "wocar_weight=1e12"]) == 2
    assert _one_line(capsys) == ("robustgrad: error: --set wocar_weight must be a number in "
                                 "[0, 1000], got 1000000000000.0")
    assert not out.exists()


def test_every_seed_of_a_seeds_run_is_bounded_like_seed(tmp_path, capsys):
    """`--seeds 18446744073709551616` trained while `--seed` refused the same number."""
    from robustgrad.commands._train_seeds import parse_seeds

    with pytest.raises(ValueError, match=re.escape(
            "--seeds: each seed must be at most 4294967295 (as --seed), got 4294967296")):
        parse_seeds("0,4294967290-4294967296")
    assert parse_seeds("4294967295") == [4294967295]
    out = tmp_path / "a"
    assert cli.main(["train-agent", "--algo", "ppo", "--env", "CartPole-v1", "--steps", "1000",
                     "--out", str(out), "--seeds", "18446744073709551616"]) == 2
    assert _one_line(capsys) == ("robustgrad: error: --seeds: each seed must be at most "
                                 "4294967295 (as --seed), got 18446744073709551616")
    assert not out.exists()


def test_an_interrupt_that_lands_in_a_finaliser_still_stops_the_run(tmp_path, capsys,
                                                                    monkeypatch):
    """A signal that arrives while a ``__del__`` runs (TensorFlow runs many while it loads and
    traces) raised KeyboardInterrupt there; Python prints "Exception ignored" and goes on, so
    the run went to its end and the stop was lost."""
    import gc
    import os
    import signal
    import time

    from attacks import evaluation_run

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("this process handles SIGTERM itself")
    finished = []

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs here, inside the finaliser
                pass

    def work(*args, **kwargs):
        Finaliser()
        gc.collect()
        deadline = time.time() + 20
        while time.time() < deadline:  # the rest of the run: the stop arrives here
            time.sleep(0.01)
        finished.append(True)
        raise AssertionError("the run was not stopped")

    monkeypatch.setattr(evaluation_run, "evaluate", work)
    out = str(tmp_path / "e")
    assert cli.main([*_commands(tmp_path)["evaluate"], "--out", out]) == cli.EXIT_INTERRUPTED
    assert not finished
    assert _one_line(capsys) == (
        f"robustgrad: interrupted: SIGTERM received; --out {out} holds nothing to resume (every "
        "file there is whole: each write is atomic); run the command again")
