"""attacks.evaluate(..., certify=...) and robustgrad evaluate --certify: the certified accuracy
beside the attacked accuracy per eps, and the undecided examples between them."""

import json

import keras
import pytest

import attacks
from attacks.certify import verified_accuracy
from robustgrad.cli import main as cli_main


def test_evaluate_certifies_every_budget(mlp, digits):
    x, y = digits.x_test[:120], digits.y_test[:120]
    calls = []
    report = attacks.evaluate(mlp, x, y, ["pgd"], [0.01, 0.05], clip_min=0.0, clip_max=1.0,
                              sanity_checks=False, n_examples=0, certify="crown",
                              progress=lambda d, t, s: calls.append((d, t, s)))
    assert report.certify == "crown" and sorted(report.certified) == [0.01, 0.05]
    for e in (0.01, 0.05):
        c = report.certified[e]
        assert c["certified_accuracy"] == pytest.approx(
            verified_accuracy(mlp, x, y, e, method="crown"))
        # lower bound <= upper bound, and the undecided examples are exactly the gap
        assert c["certified_accuracy"] <= report.worst_case[e] == c["attacked_accuracy"]
        assert c["undecided"] == pytest.approx(report.worst_case[e] - c["certified_accuracy"])
        assert c["undecided_count"] == round(c["undecided"] * len(y))
    # the small radius is mostly certified, the larger one leaves a real gap
    assert report.certified[0.01]["certified_accuracy"] > 0.8
    assert report.certified[0.05]["undecided"] > 0.05
    assert not [w for w in report.warnings if "verified" in w]
    assert calls[-1][0] == calls[-1][1] == 4 and any("certify" in s for _, _, s in calls)
    text = report.table()
    assert "CERTIFIED (crown)" in text and "undecided" in text
    d = json.loads(json.dumps(report.to_dict()))
    assert d["certify"] == "crown"
    assert d["certified"]["0.05"]["certified_accuracy"] == pytest.approx(
        report.certified[0.05]["certified_accuracy"])


def test_evaluate_without_certify_is_unchanged(mlp, digits):
    report = attacks.evaluate(mlp, digits.x_test[:16], digits.y_test[:16], ["fgsm"], 0.05,
                              clip_min=0.0, clip_max=1.0, sanity_checks=False, n_examples=0)
    assert report.certify is None and report.certified == {}
    assert "CERTIFIED" not in report.table() and report.to_dict()["certified"] == {}


def test_certify_bad_input_before_any_work(mlp, digits):
    x, y = digits.x_test[:8], digits.y_test[:8]
    calls = []
    kw = dict(clip_min=0.0, clip_max=1.0, sanity_checks=False, progress=lambda *a: calls.append(a))
    with pytest.raises(ValueError, match="certify"):
        attacks.evaluate(mlp, x, y, ["fgsm"], 0.1, certify="alpha", **kw)
    with pytest.raises(ValueError, match="certify.*norm 'l1'"):
        attacks.evaluate(mlp, x, y, ["fgsm"], 0.1, norm="l1", certify="crown", **kw)
    upsampled = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.UpSampling2D(2),
                                  keras.layers.Flatten(), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="certify='ibp'.*UpSampling2D"):
        attacks.evaluate(upsampled, x, y, ["fgsm"], 0.1, certify="ibp", **kw)
    assert calls == []


def test_cli_evaluate_certify(mlp, tmp_path, capsys):
    path = tmp_path / "m.keras"
    mlp.save(path)
    out = tmp_path / "eval"
    rc = cli_main(["evaluate", "--model", str(path), "--attacks", "fgsm", "--eps", "0.02",
                   "--limit", "40", "--certify", "crown", "--no-sanity-checks",
                   "--no-progress", "--out", str(out)])
    assert rc == 0
    assert "CERTIFIED (crown)" in capsys.readouterr().out
    d = json.loads((out / "report.json").read_text())
    assert 0.0 <= d["certified"]["0.02"]["certified_accuracy"] <= d["worst_case"]["0.02"]
    rc = cli_main(["evaluate", "--model", str(path), "--certify", "deeppoly", "--out",
                   str(tmp_path / "x")])
    assert rc == 2 and "--certify" in capsys.readouterr().err


def test_cli_evaluate_certify_on_the_default_classifier(digits, tmp_path, capsys):
    """The max-pooling CNN of make_classifier (train-classifier's default arch) is certified:
    CROWN's verified fraction is the lower end of the bracket, beside the attacks' upper end."""
    keras.utils.set_random_seed(0)
    clf = attacks.training.make_classifier((8, 8, 1), 10, width=4)
    clf.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clf.fit(digits.x_train, digits.y_train, epochs=4, batch_size=64, verbose=0)
    path = tmp_path / "cnn.keras"
    clf.save(path)
    out = tmp_path / "eval"
    rc = cli_main(["evaluate", "--model", str(path), "--data", "digits", "--attacks", "pgd",
                   "--eps", "0.005,0.05", "--limit", "40", "--certify", "crown",
                   "--no-sanity-checks", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "CERTIFIED (crown)" in capsys.readouterr().out
    d = json.loads((out / "report.json").read_text())
    small, large = d["certified"]["0.005"], d["certified"]["0.05"]
    assert 0.0 < small["certified_accuracy"] <= d["worst_case"]["0.005"]
    assert large["certified_accuracy"] <= small["certified_accuracy"]
    assert large["certified_accuracy"] <= d["worst_case"]["0.05"]
