"""Evaluation on real digits: a plain CNN loses most accuracy to PGD, APGD is at least as strong,
the cascade report, JSON/PNG outputs, the sanity checks and the CLI."""

import json

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks._demo import load_digits_arrays, train_digits_cnn
from test_attacks import SmallNet, small_batch


@pytest.fixture(scope="module")
def digits():
    return load_digits_arrays()


@pytest.fixture(scope="module")
def cnn(digits):
    return train_digits_cnn(epochs=10, data=digits)


def _acc(model, x, y):
    return float(np.mean(np.argmax(model(x, training=False), 1) == y))


def test_pgd_removes_most_accuracy_and_apgd_is_at_least_as_strong(cnn, digits):
    _, (x, y) = digits
    x, y = x[:300], y[:300]
    clean = _acc(cnn, x, y)
    assert clean > 0.9
    kw = dict(eps=0.1, clip_min=0.0, clip_max=1.0, seed=0)
    x_pgd = attacks.projected_gradient_descent(cnn, x, y, steps=20, **kw)
    acc_pgd = _acc(cnn, x_pgd, y)
    assert acc_pgd < 0.5 * clean, (clean, acc_pgd)
    x_apgd = attacks.apgd(cnn, x, y, steps=20, **kw)
    acc_apgd = _acc(cnn, x_apgd, y)
    assert acc_apgd <= acc_pgd + 1e-9, (acc_pgd, acc_apgd)


def test_evaluate_cascade_report(cnn, digits, tmp_path):
    _, (x, y) = digits
    x, y = x[:200], y[:200]
    calls = []
    rep = attacks.evaluate(cnn, x, y, ["fgsm", "pgd", "square100"], [0.05, 0.15],
                           batch_size=128, clip_min=0.0, clip_max=1.0,
                           progress=lambda d, t, s: calls.append((d, t)))
    assert calls[-1][0] == calls[-1][1]
    assert len(rep.records) == 6
    clean = _acc(cnn, x, y)
    assert rep.clean_accuracy == pytest.approx(clean)
    for e, before in ((0.05, clean), (0.15, rep.worst_case[0.05])):
        rows = [r for r in rep.records if r.eps == e]
        accs = [r.robust_accuracy for r in rows]
        assert all(a >= b for a, b in zip(accs, accs[1:]))  # cumulative in a cascade
        assert rep.worst_case[e] == pytest.approx(accs[-1])
        # only examples still robust are attacked: correct ones, minus those broken at 0.05
        assert rows[0].attacked == int(round(before * len(x)))
        assert rep.carried[e] == int(round((clean - before) * len(x)))
        assert rows[1].attacked == int(round(rows[0].robust_accuracy * len(x)))
        for r in rows:
            assert np.isnan(r.max_norm) or r.max_norm <= e + 1e-6
    assert rep.worst_case[0.15] <= rep.worst_case[0.05]
    # the worst-case examples really are adversarial at that budget
    ex = rep.examples[0.15]
    assert np.all(np.abs(ex["x_adv"] - ex["x"]) <= 0.15 + 1e-6)
    # outputs
    d = json.loads(open(rep.to_json(tmp_path / "r.json")).read())
    assert d["worst_case"]["0.15"] == pytest.approx(rep.worst_case[0.15])
    assert len(d["records"]) == 6
    paths = rep.save(tmp_path / "out")
    for p in paths.values():
        data = open(p, "rb").read()
        assert len(data) > 100
    assert open(paths["plot"], "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "WORST CASE" in str(rep)


def test_cascade_matches_every_attack_on_every_example_with_fewer_passes(cnn, digits):
    _, (x, y) = digits
    x, y = x[:150], y[:150]
    kw = dict(clip_min=0.0, clip_max=1.0, sanity_checks=False, batch_size=150)
    a = attacks.evaluate(cnn, x, y, ["fgsm", "pgd"], [0.15], cascade=True, **kw)
    b = attacks.evaluate(cnn, x, y, ["fgsm", "pgd"], [0.15], cascade=False, **kw)
    assert abs(a.worst_case[0.15] - b.worst_case[0.15]) <= 0.02
    assert a.gradient_passes < b.gradient_passes


def test_sanity_checks_flag_softmax_and_masked_gradients():
    net = SmallNet()
    x = small_batch(64)
    y = tf.argmax(net(x), 1).numpy()
    probs = lambda z, training=False: tf.nn.softmax(net(z))  # noqa: E731
    with pytest.warns(UserWarning, match="probabilities"):
        rep = attacks.evaluate(probs, x, y, ["fgsm"], [0.1], clip_min=0.0, clip_max=1.0)
    assert any("probabilities" in w for w in rep.warnings)

    @tf.custom_gradient
    def flip(z):  # a lying gradient: attacks following it make the model *more* confident
        return tf.identity(z), lambda dy: -dy

    def masked(z, training=False):
        return net(flip(z))

    with pytest.warns(UserWarning):
        rep = attacks.evaluate(masked, x, y, ["fgsm", "pgd", "square200"], [0.2],
                               clip_min=0.0, clip_max=1.0)
    text = " ".join(rep.warnings)
    assert "gradient-free attack broke" in text
    assert "unbounded attack" in text


def test_good_model_has_no_warnings(cnn, digits):
    _, (x, y) = digits
    rep = attacks.evaluate(cnn, x[:100], y[:100], ["fgsm", "pgd"], [0.1, 0.2], clip_min=0.0,
                           clip_max=1.0)
    assert rep.warnings == []


def test_evaluate_bad_arguments(cnn, digits):
    _, (x, y) = digits
    with pytest.raises(ValueError, match="attacks: unknown attack"):
        attacks.evaluate(cnn, x[:10], y[:10], ["nope"], [0.1])
    with pytest.raises(ValueError, match="attacks: cw does not support norm 'linf'"):
        attacks.evaluate(cnn, x[:10], y[:10], ["cw"], [0.1])
    with pytest.raises(ValueError, match="eps"):
        attacks.evaluate(cnn, x[:10], y[:10], ["fgsm"], [-0.1])
    with pytest.raises(ValueError, match="y has 9 labels"):
        attacks.evaluate(cnn, x[:10], y[:9], ["fgsm"], [0.1])


def test_cli_evaluate(cnn, tmp_path, capsys):
    from robustgrad.cli import main

    path = str(tmp_path / "m.keras")
    cnn.save(path)
    out = tmp_path / "eval"
    rc = main(["evaluate", "--model", path, "--data", "digits", "--attacks", "fgsm,pgd",
               "--eps", "0.05,0.1", "--limit", "80", "--out", str(out), "--no-sanity-checks"])
    assert rc == 0
    printed = capsys.readouterr()
    assert "WORST CASE" in printed.out
    assert (out / "report.json").exists() and (out / "robust_accuracy.png").exists()
    assert (out / "examples.png").exists()
    assert main(["evaluate", "--model", path, "--attacks", "nope", "--out", str(out)]) == 2


def test_evaluate_targeted_attack_and_labelled_specs():
    net = SmallNet()
    x = small_batch(48)
    y = tf.argmax(net(x), 1).numpy()
    specs = [("pgd-targeted", attacks.PGD(steps=10, targeted=True)), ("pgd", attacks.PGD(steps=5))]
    rep = attacks.evaluate(net, x, y, specs, [0.3], clip_min=0.0, clip_max=1.0,
                           sanity_checks=False)
    first = rep.records[0]
    assert first.attack == "pgd-targeted" and first.targeted
    assert first.success_rate > 0.5  # the fraction of examples that reached their target
    assert rep.worst_case[0.3] <= 1.0 - first.success_rate + 1e-9
    assert "pgd-targeted (t)" in rep.table()
