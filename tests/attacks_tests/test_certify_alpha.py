"""alpha-CROWN through attacks.certify, attacks.evaluate and the CLI (certify --method, evaluate
--certify): never fewer verified examples than CROWN, never more than the attacks leave."""

import json

import keras
import numpy as np
import pytest

import attacks
from attacks.certify import margin_lower_bounds, verified_accuracy
from robustgrad.cli import main as cli_main


def test_alpha_crown_certifies_at_least_crown_and_at_most_the_attacked(mlp, digits):
    x, y = digits.x_test[:100], digits.y_test[:100]
    eps = 0.03
    crown = margin_lower_bounds(mlp, x, y, eps, method="crown").numpy()
    alpha = margin_lower_bounds(mlp, x, y, eps, method="alpha-crown").numpy()
    assert np.all(alpha >= crown - 1e-5)
    assert float(np.mean(alpha - crown)) > 1e-3  # unstable ReLUs at this radius: a real gain
    report = attacks.evaluate(mlp, x, y, ["pgd"], [eps], clip_min=0.0, clip_max=1.0,
                              sanity_checks=False, n_examples=0, certify="alpha-crown")
    cert = report.certified[eps]["certified_accuracy"]
    assert cert == pytest.approx(verified_accuracy(mlp, x, y, eps, method="alpha-crown"))
    assert verified_accuracy(mlp, x, y, eps, method="crown") <= cert <= report.worst_case[eps]


def test_cli_certify_and_evaluate_take_alpha_crown(mlp, digits, tmp_path, capsys):
    path = tmp_path / "m.keras"
    mlp.save(path)
    out = tmp_path / "c"
    rc = cli_main(["certify", "--model", str(path), "--eps", "0.02", "--limit", "40",
                   "--method", "alpha-crown", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    model = keras.models.load_model(path)
    assert report["results"][0]["certified_accuracy"] == pytest.approx(verified_accuracy(
        model, digits.x_test[:40], digits.y_test[:40], 0.02, method="alpha-crown"))
    rc = cli_main(["evaluate", "--model", str(path), "--attacks", "fgsm", "--eps", "0.02",
                   "--limit", "40", "--certify", "alpha-crown", "--no-sanity-checks",
                   "--no-progress", "--out", str(tmp_path / "e")])
    assert rc == 0 and "CERTIFIED (alpha-crown)" in capsys.readouterr().out
    for argv, flag in ((["certify", "--method", "alpha"], "--method"),
                       (["evaluate", "--certify", "alpha"], "--certify")):
        rc = cli_main([argv[0], "--model", str(path), *argv[1:], "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert rc == 2 and flag in err and "alpha-crown" in err, err
