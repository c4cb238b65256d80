"""Resumable certification (issue 35): `certify_run` commits each chunk, a SIGINT loses only the
chunk in flight, a resumed run equals an uninterrupted one per example, and a resume with other
settings or damaged files is refused by name."""

from __future__ import annotations

import json
import os
import signal

import keras
import numpy as np
import pytest

import attacks.certify as certify_module
from attacks.certification import CertifyConfig, certify_run
from robustgrad.cli import main as cli_main
from robustgrad.errors import ConfigError

BOUNDS = dict(model="m", method="crown", eps=(0.01, 0.03), limit=90, chunk_size=30)
SMOOTHING = dict(model="m", method="smoothing", eps=(0.0, 0.1), sigma=0.1, n0=10, n=100,
                 limit=60, chunk_size=20, batch_size=64)


@pytest.fixture(scope="module")
def mlp():
    from attacks.data import load_dataset

    d = load_dataset("digits")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(d.x_train, d.y_train, epochs=3, batch_size=64, verbose=0)
    return model


def _sigint_at(monkeypatch, name: str, call: int) -> list:
    """Send this process a real SIGINT during the ``call``-th call of
    ``attacks.certify.<name>`` (after its work, before the chunk is committed); count calls."""
    original, calls = getattr(certify_module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        out = original(*args, **kwargs)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt raised right here
        return out

    monkeypatch.setattr(certify_module, name, wrapped)
    return calls


def _committed(run) -> list[str]:
    return sorted(n for n in os.listdir(run / "results") if n.endswith(".npz"))


@pytest.mark.parametrize("settings, function, per_chunk", [
    (BOUNDS, "verified_mask", 2),          # two radii per chunk
    (SMOOTHING, "smooth_certify", 1),
], ids=["crown", "smoothing"])
def test_sigint_then_resume_equals_the_uninterrupted_run(mlp, tmp_path, monkeypatch, settings,
                                                         function, per_chunk):
    config = CertifyConfig(**settings)
    whole = certify_run(config, tmp_path / "whole", model=mlp, verbose=0)
    assert whole["chunks"] == 3
    _sigint_at(monkeypatch, function, per_chunk + 1)  # in chunk 1, after chunk 0 committed
    with pytest.raises(KeyboardInterrupt):
        certify_run(config, tmp_path / "cut", model=mlp, verbose=0)
    assert len(_committed(tmp_path / "cut")) == 1  # chunk 0; chunk 1 was in flight
    assert not (tmp_path / "cut" / "report.json").exists()
    calls = _sigint_at(monkeypatch, function, 0)
    resumed = certify_run(config, tmp_path / "cut", model=mlp, verbose=0, resume=True)
    assert len(calls) == 2 * per_chunk  # chunk 0 never certified again
    first, second = (np.load(p / "per_example.npz") for p in (tmp_path / "whole",
                                                               tmp_path / "cut"))
    assert set(first.files) == set(second.files) and len(first["label"]) == config.limit
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    assert [r["certified_accuracy"] for r in resumed["results"]] == \
        [r["certified_accuracy"] for r in whole["results"]]
    # the per-example file agrees with the report
    for r in whole["results"]:
        key = ("verified@" if config.method != "smoothing" else "certified@") + f"{r['eps']:g}"
        assert first[key].mean() == pytest.approx(r["certified_accuracy"])
        assert not np.any(first[key] & ~first["correct"]) or config.method == "smoothing"


def test_resume_with_other_settings_or_damaged_files_is_refused_by_name(mlp, tmp_path):
    run = tmp_path / "r"
    certify_run(CertifyConfig(**BOUNDS), run, model=mlp, verbose=0)
    for change, message in [
            (dict(eps=(0.01,)), r"eps: recorded \[0.01, 0.03\], now \[0.01\]"),
            (dict(method="ibp"), "method: recorded 'crown', now 'ibp'"),
            (dict(norm="l2"), "norm: recorded 'linf', now 'l2'"),
            (dict(limit=60), "data: other examples than the recorded run.s .*n: recorded 90, now 60"),
            (dict(clip_max=2.0), "clip_max: recorded 1.0, now 2.0"),
            (dict(chunk_size=45), "chunk_size: recorded 30, now 45")]:
        with pytest.raises(ConfigError, match=message):
            certify_run(CertifyConfig(**dict(BOUNDS, **change)), run, model=mlp, verbose=0,
                        resume=True)
    other = keras.models.clone_model(mlp)  # the same architecture, other weights
    with pytest.raises(ConfigError, match="model: other weights than the recorded run.s"):
        certify_run(CertifyConfig(**BOUNDS), run, model=other, verbose=0, resume=True)
    (run / "results" / "certified-crown-000001.npz").write_bytes(b"not an archive")
    with pytest.raises(ConfigError, match=r"certified-crown-000001.npz is not a readable "
                                          r"certificate .*not an npz archive.*remove it"):
        certify_run(CertifyConfig(**BOUNDS), run, model=mlp, verbose=0, resume=True)
    manifest = run / "results" / "manifest.json"
    recorded = json.loads(manifest.read_text())
    manifest.write_text(json.dumps(dict(recorded, settings={"eps": [0.01]})))  # evaluate's
    with pytest.raises(ConfigError, match=r"holds the results of an evaluation \(robustgrad "
                                          r"evaluate\), not of a certification"):
        certify_run(CertifyConfig(**BOUNDS), run, model=mlp, verbose=0, resume=True)
    manifest.write_text("{not json")
    with pytest.raises(ConfigError, match="is not a results manifest of this library"):
        certify_run(CertifyConfig(**BOUNDS), run, model=mlp, verbose=0, resume=True)
    with pytest.raises(ConfigError, match="holds no certification to resume"):
        certify_run(CertifyConfig(**BOUNDS), tmp_path / "new", model=mlp, verbose=0,
                    resume=True)
    # without resume the old results are replaced, not mixed in
    certify_run(CertifyConfig(**dict(BOUNDS, eps=(0.02,))), run, model=mlp, verbose=0)
    assert _committed(run) == [f"certified-crown-00000{c}.npz" for c in range(3)]


def test_cli_resume(mlp, tmp_path, capsys):
    path = str(tmp_path / "m.keras")
    mlp.save(path)
    out = str(tmp_path / "c")
    flags = ["certify", "--model", path, "--eps", "0.01", "--limit", "40", "--chunk-size", "20",
             "--method", "ibp", "--out", out]
    assert cli_main(flags) == 0
    assert "per_example.npz" in capsys.readouterr().out
    first = dict(np.load(os.path.join(out, "per_example.npz")))
    assert cli_main(flags + ["--resume"]) == 0
    assert "resuming: 2/2 chunks committed" in capsys.readouterr().out
    again = dict(np.load(os.path.join(out, "per_example.npz")))
    for key, values in first.items():
        np.testing.assert_array_equal(again[key], values, err_msg=key)
    for extra, message in [
            (["--resume", "--eps", "0.02"], r"eps: recorded [0.01], now [0.02]"),
            (["--resume", "--overwrite"], "--resume continues the results in --out; "
                                          "--overwrite replaces them: give one"),
            (["--chunk-size", "0"], "--chunk-size")]:
        assert cli_main(flags + extra) == 2
        assert message in capsys.readouterr().err
    empty = str(tmp_path / "empty")
    assert cli_main(flags[:-1] + [empty, "--resume"]) == 2
    assert "holds no certification to resume" in capsys.readouterr().err
