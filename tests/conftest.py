"""Shared pytest set-up: quiet TensorFlow, deterministic seeds, small helpers."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MPLBACKEND", "Agg")
# Tests never touch the network: a dataset asked for by name and missing from the cache is an
# error, not a download (the download tests fake the fetch function and unset this).
os.environ.setdefault("ROBUSTGRAD_NO_DOWNLOAD", "1")
# Ray's local instances in the tests bind to 127.0.0.1 only: by default Ray advertises the
# machine's interface address, so test traffic would leave the loopback range. (The slow
# two-node test, which needs cluster mode, sets this back in its own subprocesses.)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# `make test` runs the suite on pytest-xdist workers, one per core: there each worker gets one
# intra-op thread, so that two workers do not run four compute threads on two cores. Inter-op
# threads stay automatic (>= 2): a learned adversary deadlocks on one
# (agents.robustness.adversary.check_inter_op_threads). A serial run keeps TensorFlow's defaults, and so
# does a worker with RG_TEST_INTRA_THREADS=0 (measured on 4 test files, -n 2: one thread 177 s
# wall / 319 CPU-s, the default 203 s / 366 CPU-s).
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("RG_TEST_INTRA_THREADS", "1") != "0":
    tf.config.threading.set_intra_op_parallelism_threads(1)

# A suite started in the background (`nohup make test &`, a script's `&`) inherits SIGINT
# *ignored*, and so do the CLIs its tests start: the interrupt tests (Ctrl-C saves and exits
# 130, resume after SIGINT, the run lock) would then see nothing arrive. Python's own handler
# is what a user's terminal gives; children started after this get the default disposition.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _seed_everything():
    tf.keras.utils.set_random_seed(0) if hasattr(tf.keras.utils, "set_random_seed") else None
    np.random.seed(0)
    yield


def central_difference(f, x, eps=1e-6):
    """Central finite-difference gradient of scalar ``f`` at numpy ``x`` (float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (float(f(xp)) - float(f(xm))) / (2 * eps)
    return g


def load_benchmark(name):
    """The module of ``benchmarks/<name>.py`` (a script, not a package), loaded without leaving
    its repo-root ``sys.path`` entry behind."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the script puts its repo root first; leave sys.path as it was
    return module


def cli_command(*args):
    """``python -m robustgrad.cli ARGS`` in this interpreter."""
    return [sys.executable, "-m", "robustgrad.cli", *args]


def signal_cli_once_ready(args, marker, signum=signal.SIGINT, timeout=400):
    """Run the CLI with ``args`` in a subprocess, send ``signum`` once ``marker`` (a checkpoint
    or results file) exists, and return ``(returncode, stderr, seconds from the signal to the
    exit)``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(cli_command(*args), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while not os.path.exists(marker) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert os.path.exists(marker), proc.communicate()[1][-3000:]
    proc.send_signal(signum)
    sent = time.time()
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err, time.time() - sent


def interrupt_cli_once_ready(args, marker, timeout=400):
    """:func:`signal_cli_once_ready` with SIGINT; ``(returncode, stderr, the one 'robustgrad:
    interrupted' line)``."""
    returncode, err, _ = signal_cli_once_ready(args, marker, signal.SIGINT, timeout)
    lines = [line for line in err.splitlines() if line.startswith("robustgrad: interrupted")]
    assert len(lines) == 1, err[-3000:]
    return returncode, err, lines[0]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 3 CPUs for one test module (any earlier one shut down first)."""
    ray = pytest.importorskip("ray")
    from agents.backends.distributed import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(None, num_cpus=3)
    yield
    ray.shutdown()


def recording(collect, store):
    """``collect`` wrapped so that every batch it returns is also appended to ``store`` as numpy."""
    def wrapper(*args, **kwargs):
        batch = collect(*args, **kwargs)
        store.append({k: v.numpy() for k, v in batch.items()})
        return batch
    return wrapper


def sigint_after_train_batches(monkeypatch, n):
    """Patch ``attacks.training.EpochTimer`` so that this process gets SIGINT at the end of its
    ``n``-th training batch (counted over the whole run). Returns ``(seen, restore)``: the batches
    seen so far and a function that puts the original hook back."""
    from attacks import training

    seen = []
    original = training.EpochTimer.on_train_batch_end

    def hook(self, batch, logs=None):
        original(self, batch, logs)
        seen.append(batch)
        if len(seen) == n:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(training.EpochTimer, "on_train_batch_end", hook)
    return seen, lambda: monkeypatch.setattr(training.EpochTimer, "on_train_batch_end", original)


# -- shared by the certification tests (tests/attacks_tests), built once per session: the digits
# data, a small ReLU MLP trained on it (8 epochs, seed 0) and the clean-trained baseline of the
# smoothing learning tests. Tests read the models; none changes them. (Here and not in a conftest
# of their own: tests import helpers with ``from conftest import ...``.)

@pytest.fixture(scope="session")
def _digits_once():
    # the session fixtures below take the data from here: several modules define a ``digits``
    # fixture of their own, with module scope, which a session fixture cannot request
    from attacks.data import load_dataset

    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits(_digits_once):
    return _digits_once


@pytest.fixture(scope="session")
def mlp(_digits_once):
    import keras

    digits = _digits_once
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train, digits.y_train, epochs=8, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="session")
def clean_mlp64(_digits_once):
    """The clean-trained baseline of the smoothing learning tests (Gaussian and SmoothAdv
    training against it): a 64-unit ReLU MLP, 15 epochs of ``method="clean"``, seed 0."""
    import keras

    from attacks import training

    digits = _digits_once
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    tr = training.AdversarialTrainer(model, method="clean", eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = tr.fit(digits.x_train, digits.y_train, batch_size=64, epochs=15, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    return model
