"""Evaluation sharded across Ray workers (issue 35 item 2): per example equal to one process, the
driver commits every chunk (resume works across both), one progress over all chunks, errors of the
workers' arguments before any work, a worker's error raised as itself."""

from __future__ import annotations

import functools
import os
import socket
import sys

import numpy as np
import pytest

import attacks
from robustgrad.errors import ConfigError

SETTINGS = dict(attacks=["fgsm", "pgd"], eps=[0.05, 0.1], clip_min=0.0, clip_max=1.0,
                sanity_checks=False, n_examples=0)

from small_models import trained_digits_mlp


@pytest.fixture(scope="module")
def mlp():
    return trained_digits_mlp(epochs=3, n_test=60)


@pytest.fixture(scope="module")
def two_cpu_ray():
    """One local Ray of 2 CPUs for the tests that run workers (quiet: robustgrad's init_ray)."""
    ray = pytest.importorskip("ray")
    from robustgrad.ray_setup import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(None, num_cpus=2)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the factories below
    yield ray
    ray.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_same_per_example(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_two_workers_equal_one_process_per_example_and_commit_every_chunk(mlp, two_cpu_ray,
                                                                          tmp_path):
    model, x, y = mlp
    one = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=20)
    seen = []
    out = tmp_path / "results"
    two = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=20, workers=2,
                           results_dir=out, progress=lambda *a: seen.append(a))
    _assert_same_per_example(one.per_example, two.per_example)
    assert two.worst_case == one.worst_case
    assert [(r.attack, r.eps, r.attacked, r.broken) for r in two.records] == \
        [(r.attack, r.eps, r.attacked, r.broken) for r in one.records]
    assert two.gradient_passes == one.gradient_passes
    assert two.forward_passes == one.forward_passes
    assert sorted(os.listdir(out)) == ["chunk-000000.npz", "chunk-000001.npz",
                                       "chunk-000002.npz", "manifest.json"]
    # one progress over every chunk: 2 eps x 2 attacks per chunk, then the end
    chunk_steps = [(done, total) for done, total, text in seen if "chunks done" in text]
    assert chunk_steps == [(0, 12), (4, 12), (8, 12), (12, 12)]
    assert seen[-1][:2] == (12, 12)
    # a lost chunk is recomputed by a resumed sharded run (the others are read back), equal again
    os.remove(out / "chunk-000001.npz")
    seen.clear()
    again = attacks.evaluate(model, x, y, **SETTINGS, chunk_size=20, workers=2,
                             results_dir=out, progress=lambda *a: seen.append(a))
    assert [text for _, _, text in seen if "chunks done" in text] == ["2/3 chunks done",
                                                                     "3/3 chunks done"]
    _assert_same_per_example(one.per_example, again.per_example)


def _other_model():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(10)])


def test_a_factory_of_another_model_fails_in_the_worker_as_a_value_error(mlp, two_cpu_ray,
                                                                        tmp_path):
    model, x, y = mlp
    if model.input_shape[1:] != (8, 8, 1):
        pytest.skip(f"digits are {model.input_shape[1:]} here")
    with pytest.raises(ValueError, match="the model built in the worker does not have the "
                                         "weights of the model given to evaluate"):
        attacks.evaluate(model, x, y, **SETTINGS, chunk_size=30, workers=2,
                         model_factory=_other_model, results_dir=tmp_path / "r")
    assert os.listdir(tmp_path / "r") == ["manifest.json"]  # nothing committed


def _dies_once(path: str, marker: str):
    """Loads the model at ``path``; the first call (no ``marker`` yet) kills its process, as a
    lost machine would."""
    import keras

    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return keras.models.load_model(path, compile=False)


def test_a_worker_lost_mid_run_is_rerun_and_the_results_stay_equal(mlp, two_cpu_ray, tmp_path):
    model, x, y = mlp
    path, marker = str(tmp_path / "m.keras"), str(tmp_path / "died")
    model.save(path)
    one = attacks.evaluate(model, x[:40], y[:40], **SETTINGS, chunk_size=20)
    two = attacks.evaluate(model, x[:40], y[:40], **SETTINGS, chunk_size=20, workers=2,
                           model_factory=functools.partial(_dies_once, path, marker),
                           results_dir=tmp_path / "r")
    assert os.path.exists(marker)  # a worker did die
    _assert_same_per_example(one.per_example, two.per_example)
    assert len(os.listdir(tmp_path / "r")) == 3  # the manifest and both chunks


def test_cli_workers_write_the_one_process_results(mlp, two_cpu_ray, tmp_path):
    from robustgrad.cli import main

    model, _, _ = mlp
    path = str(tmp_path / "m.keras")
    model.save(path)
    flags = ["evaluate", "--model", path, "--data", "digits", "--attacks", "fgsm,pgd",
             "--eps", "0.1", "--limit", "40", "--chunk-size", "20", "--no-sanity-checks",
             "--no-progress"]
    assert main(flags + ["--out", str(tmp_path / "one")]) == 0
    assert main(flags + ["--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    _assert_same_per_example(dict(np.load(tmp_path / "one" / "per_example.npz")),
                             dict(np.load(tmp_path / "two" / "per_example.npz")))


def test_bad_worker_arguments_are_refused_before_any_work(mlp, monkeypatch):
    model, x, y = mlp
    calls = []  # the first work of evaluate is the clean pass
    monkeypatch.setattr(sys.modules["attacks.evaluate"], "predict_logits",
                        lambda *a, **k: calls.append(1))
    for bad in (0, 10**6):
        with pytest.raises(ConfigError, match=r"workers must be an int in \[1, 1024\]"):
            attacks.evaluate(model, x, y, **SETTINGS, workers=bad)
    with pytest.raises(TypeError, match="workers: the model must be a Keras model"):
        attacks.evaluate(lambda v, training=False: model(v), x, y, **SETTINGS, workers=2)
    with pytest.raises(ValueError, match="give workers too"):
        attacks.evaluate(model, x, y, **SETTINGS, ray_address="auto")
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConnectionError, match="ray_address: no Ray cluster reachable"):
        attacks.evaluate(model, x, y, **SETTINGS, workers=2, ray_address=address)
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    with pytest.raises(ImportError, match=r"workers needs Ray, which is not installed"):
        attacks.evaluate(model, x, y, **SETTINGS, workers=2)
    assert not calls


def test_cli_bad_worker_flags_are_refused_before_tensorflow(tmp_path, capsys, monkeypatch):
    from robustgrad.cli import main

    path = tmp_path / "m.keras"
    path.write_bytes(b"PK\x05\x06" + bytes(18))  # an (empty) zip: the flags fail first
    base = ["evaluate", "--model", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    cases = [(["--workers", "0"], "--workers must be an int in [1, 1024], got 0"),
             (["--workers", "5000"], "--workers must be an int in [1, 1024], got 5000"),
             (["--ray-address", "auto"], "--ray-address is where --workers run"),
             (["--workers", "2", "--ray-address", "nohost"],
              "--ray-address must be 'auto' or 'HOST:PORT'"),
             (["--workers", "2", "--ray-address", f"127.0.0.1:{_closed_port()}"],
              "--ray-address: no Ray cluster reachable")]
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        assert message in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(base + ["--workers", "2"]) == 2
    assert ("--workers needs Ray, which is not installed (the distributed extra): "
            "pip install 'robustgrad[distributed]'") in capsys.readouterr().err
