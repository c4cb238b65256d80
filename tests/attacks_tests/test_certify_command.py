"""robustgrad certify: flags checked before work, the report against attacks.certify."""

import json

import keras
import pytest

from attacks.certify import verified_accuracy
from attacks.data import load_dataset
from robustgrad.cli import main as cli_main


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    d = load_dataset("digits")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(d.x_train, d.y_train, epochs=5, batch_size=64, verbose=0)
    path = tmp_path_factory.mktemp("m") / "m.keras"
    model.save(path)
    return path


def test_certify_crown_report_matches_the_library(model_path, tmp_path, capsys):
    out = tmp_path / "c"
    rc = cli_main(["certify", "--model", str(model_path), "--eps", "0.02,0.01", "--limit", "60",
                   "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "eps=0.01: certified" in printed
    report = json.loads((out / "report.json").read_text())
    assert [r["eps"] for r in report["results"]] == [0.01, 0.02]
    d = load_dataset("digits")
    model = keras.models.load_model(model_path)
    for r in report["results"]:
        assert r["certified_accuracy"] == pytest.approx(
            verified_accuracy(model, d.x_test[:60], d.y_test[:60], r["eps"], method="crown"))
    assert report["results"][0]["certified_accuracy"] >= report["results"][1]["certified_accuracy"]
    assert (out / "report.txt").exists()


def test_certify_smoothing(model_path, tmp_path):
    out = tmp_path / "s"
    rc = cli_main(["certify", "--model", str(model_path), "--method", "smoothing", "--sigma",
                   "0.1", "--n0", "20", "--n", "200", "--eps", "0,0.1", "--limit", "20",
                   "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    accs = [r["certified_accuracy"] for r in report["results"]]
    assert accs[0] >= accs[1] and report["sigma"] == 0.1
    assert 0.0 <= report["abstained"] <= 1.0


@pytest.mark.parametrize("argv, match", [
    (["--eps", "-0.1"], "--eps"),
    (["--method", "deeppoly"], "--method"),
    (["--method", "smoothing", "--sigma", "0"], "--sigma"),
    (["--method", "smoothing", "--n0", "500", "--n", "100"], "--n0"),
    (["--method", "smoothing", "--alpha", "1.0"], "--alpha"),
    (["--norm", "l1"], "--norm"),
])
def test_certify_bad_flags(model_path, tmp_path, capsys, argv, match):
    rc = cli_main(["certify", "--model", str(model_path), "--out", str(tmp_path / "x"), *argv])
    assert rc == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_certify_unsupported_layer_and_softmax(tmp_path, capsys):
    for name, last in (("up", keras.layers.UpSampling2D(2)),
                       ("soft", keras.layers.Softmax())):
        layers = [keras.Input((8, 8, 1)), last, keras.layers.Flatten(), keras.layers.Dense(10)]
        if name == "soft":
            layers = [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10),
                      last]
        path = tmp_path / f"{name}.keras"
        keras.Sequential(layers).save(path)
        rc = cli_main(["certify", "--model", str(path), "--out", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert rc == 2 and "--model" in err
        assert ("UpSampling2D" in err) if name == "up" else ("softmax" in err)
