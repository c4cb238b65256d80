"""Evaluation on real digits: a plain CNN loses most accuracy to PGD, APGD is at least as strong,
the cascade report, JSON/PNG outputs, the sanity checks and the CLI."""

import json

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks.reference import train_digits_cnn
from robustgrad.data import load_digits

from small_models import SmallNet, small_batch


@pytest.fixture(scope="module")
def digits():
    return load_digits()


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


# ---------------------------------------------------------------------------------------------
# the pipeline's parts: cascade, checks, report, arguments (small models with known answers)

from attacks.cascade import BudgetOutcome, run_cascade  # noqa: E402
from attacks.checks import (  # noqa: E402
    budget_warnings,
    input_gradient_warnings,
    non_monotone_warning,
    probability_warning,
    unbounded_attack_check,
)

_W = tf.constant([[1.0, -1.0], [-1.0, 1.0]])


def _linear(x, training=False):
    """Two classes, logits ``(x0 - x1, x1 - x0)``: FGSM at eps lowers the class-0 margin
    ``x0 - x1`` by exactly ``2 eps`` (inside the bounds), so it breaks ``x0 - x1 < 2 eps``."""
    return tf.matmul(tf.cast(x, tf.float32), _W)


# half-margins d: broken by FGSM at eps iff d < eps; the last example is misclassified (y=1)
_HALF_MARGINS = np.array([0.02, 0.07, 0.12, 0.3, 0.2])
_X = np.stack([0.5 + _HALF_MARGINS, 0.5 - _HALF_MARGINS], 1).astype(np.float32)
_Y = np.array([0, 0, 0, 0, 1])


def test_cascade_breaks_exactly_the_examples_within_their_margin_and_carries_them():
    outcomes = run_cascade(_linear, _X, _Y, [("fgsm", attacks.FGM())], [0.1, 0.05],
                           norm="linf", clip_min=0.0, clip_max=1.0)
    assert [o.eps for o in outcomes] == [0.05, 0.1]
    small, large = outcomes
    np.testing.assert_array_equal(small.robust, [False, True, True, True, False])
    np.testing.assert_array_equal(large.robust, [False, False, True, True, False])
    assert (small.robust_accuracy, large.robust_accuracy) == (0.6, 0.4)
    assert (small.carried, large.carried) == (0, 1)
    assert [o.records[0].attacked for o in outcomes] == [4, 3]  # correct, then still robust
    assert [o.records[0].broken for o in outcomes] == [1, 1]
    assert small.records[0].success_rate == pytest.approx(0.25)
    assert large.records[0].success_rate == pytest.approx(1 / 3)
    for outcome in outcomes:  # the successful perturbation is eps * (-1, +1) exactly
        assert outcome.records[0].mean_norm == pytest.approx(outcome.eps, abs=1e-6)
    # the worst case keeps each example's adversarial input from the eps that broke it
    np.testing.assert_allclose(large.x_worst[0], _X[0] + [-0.05, 0.05], atol=1e-6)
    np.testing.assert_allclose(large.x_worst[1], _X[1] + [-0.1, 0.1], atol=1e-6)
    np.testing.assert_array_equal(large.x_worst[2:], _X[2:])
    assert large.outside_budget == [] and large.regressed == 0


def test_every_attack_on_every_example_re_attacks_and_takes_the_last_budgets_inputs():
    outcomes = run_cascade(_linear, _X, _Y, [("fgsm", attacks.FGM())], [0.05, 0.1],
                           norm="linf", clip_min=0.0, clip_max=1.0, cascade=False)
    assert [o.records[0].attacked for o in outcomes] == [5, 5]
    assert [o.records[0].broken for o in outcomes] == [1, 2]
    assert [o.robust_accuracy for o in outcomes] == [0.6, 0.4]
    np.testing.assert_allclose(outcomes[1].x_worst[0], _X[0] + [-0.1, 0.1], atol=1e-6)


class _Recording(attacks.PGD):
    """PGD that records the early_stop keyword it is given (``supports_early_stop`` as PGD's)."""

    def __init__(self, **config):
        super().__init__(**config)
        self.early_stop_requests = []

    def run(self, model, x, y=None, **overrides):
        self.early_stop_requests.append(overrides.get("early_stop", "absent"))
        return super().run(model, x, y, **overrides)


class _RecordingWithoutEarlyStop(_Recording):
    supports_early_stop = False


def test_early_stop_is_requested_from_attacks_that_declare_it_and_saves_gradient_passes():
    net = SmallNet()
    x = small_batch(64)
    y = tf.argmax(net(x), 1).numpy()
    assert attacks.PGD.supports_early_stop and not attacks.FGM.supports_early_stop
    early, late = _Recording(steps=20), _RecordingWithoutEarlyStop(steps=20)
    kw = dict(clip_min=0.0, clip_max=1.0, sanity_checks=False, batch_size=32)
    with_stop = attacks.evaluate(net, x, y, [("pgd", early)], [0.3], **kw)
    without = attacks.evaluate(net, x, y, [("pgd", late)], [0.3], **kw)
    assert early.early_stop_requests == [True, True]
    assert late.early_stop_requests == ["absent", "absent"]
    assert with_stop.worst_case[0.3] < 0.5  # most examples break early: a real saving
    assert with_stop.gradient_passes < 0.8 * without.gradient_passes
    # the trajectories agree until an example breaks, so early stopping never breaks fewer
    assert with_stop.worst_case[0.3] <= without.worst_case[0.3] + 1e-9


def _outcome(**fields):
    base = dict(eps=0.1, records=[], robust=np.zeros(4, bool), x_worst=np.zeros((4, 2)),
                carried=0, broken_by_gradient_free=0, regressed=0, outside_budget=[],
                gradient_passes=0, forward_passes=0)
    return BudgetOutcome(**{**base, **fields})


def _record(label, robust_accuracy):
    return attacks.AttackRecord(label, 0.1, "linf", robust_accuracy, 0.0, 4, 0, float("nan"),
                                float("nan"), 0, 0, 1.0, 4.0)


def test_budget_warnings_name_each_sign_of_masking():
    free = {"pgd": False, "square": True}
    assert budget_warnings(_outcome(), free, 100, cascade=True) == []
    out = budget_warnings(_outcome(outside_budget=["pgd"]), free, 100, cascade=True,
                          sanity_checks=False)
    assert out == ["pgd returned points outside the eps=0.1 ball or the bounds (bug)"]
    # more than 0.2% of the examples (AutoAttack's check_square_sr) and at least one
    assert budget_warnings(_outcome(broken_by_gradient_free=0), free, 300, cascade=True) == []
    assert budget_warnings(_outcome(broken_by_gradient_free=2), free, 1000, cascade=True) == []
    (msg,) = budget_warnings(_outcome(broken_by_gradient_free=3), free, 1000, cascade=True)
    assert msg.startswith("eps=0.1: a gradient-free attack broke 3 examples")
    (msg,) = budget_warnings(_outcome(broken_by_gradient_free=1), free, 300, cascade=True)
    assert msg.startswith("eps=0.1: a gradient-free attack broke 1 examples")
    (msg,) = budget_warnings(_outcome(regressed=2), free, 100, cascade=False)
    assert msg.startswith("eps=0.1: 2 examples broken at a smaller eps survived every attack")
    assert budget_warnings(_outcome(regressed=2), free, 100, cascade=False,
                           sanity_checks=False) == []
    beaten = _outcome(records=[_record("pgd", 0.50), _record("square", 0.48)])
    (msg,) = budget_warnings(beaten, free, 100, cascade=False)
    assert msg == ("eps=0.1: a gradient-free attack beats every gradient attack "
                   "(0.480 < 0.500): a sign of gradient masking")
    close = _outcome(records=[_record("pgd", 0.50), _record("square", 0.499)])
    assert budget_warnings(close, free, 100, cascade=False) == []


def test_probability_and_monotonicity_checks():
    assert probability_warning(np.array([[0.1, 0.9], [0.5, 0.5]])).startswith(
        "model outputs look like probabilities")
    assert probability_warning(np.array([[2.0, -1.0], [0.5, 0.5]])) is None
    assert non_monotone_warning({0.1: 0.5, 0.2: 0.5, 0.3: 0.1}) is None
    assert non_monotone_warning({0.3: 0.2, 0.1: 0.5, 0.2: 0.3}) is None  # order of the keys
    assert non_monotone_warning({0.1: 0.5, 0.2: 0.51}).startswith(
        "worst-case robust accuracy increases with eps")


def test_input_gradient_checks_find_missing_zero_and_non_finite_gradients():
    x = _X[:4]
    y = _Y[:4]
    assert input_gradient_warnings(_linear, x, y, 256) == []
    constant = lambda z, training=False: tf.zeros([tf.shape(z)[0], 2])  # noqa: E731
    assert input_gradient_warnings(constant, x, y, 256) == [
        "the loss has no gradient with respect to the input (disconnected model)"]
    saturated = lambda z, training=False: _linear(tf.nn.relu(z - 2.0))  # noqa: E731
    (msg,) = input_gradient_warnings(saturated, x, y, 256)
    assert msg.startswith("input gradients are exactly zero on 100% of examples")
    broken = lambda z, training=False: _linear(tf.sqrt(z - 0.5))  # noqa: E731  (NaN below 0.5)
    msgs = input_gradient_warnings(broken, x, y, 256)
    assert msgs[0] == ("non-finite input gradients on 4 of 4 examples: gradient attacks "
                       "cannot be trusted")


def test_unbounded_attack_check_breaks_an_honest_model_and_flags_a_lying_gradient():
    check = unbounded_attack_check(_linear, _X, _Y, _Y == 0, norm="linf", clip_min=0.0,
                                   clip_max=1.0, num_classes=2)
    assert check.message is None and check.eps == 1.0
    assert 0 < check.gradient_passes <= 40 * 4

    @tf.custom_gradient
    def flip(z):
        return tf.identity(z), lambda dy: -dy

    net = SmallNet()  # 5 classes and 16 features: a random start alone rarely flips a label
    x = small_batch(32)
    y = tf.argmax(net(x), 1).numpy()
    lying = lambda z, training=False: net(flip(z))  # noqa: E731
    check = unbounded_attack_check(lying, x, y, np.ones(32, bool), norm="l2", clip_min=0.0,
                                   clip_max=1.0, num_classes=5, max_examples=20)
    assert check.eps == pytest.approx(4.0)  # sqrt(16 features * 1 ** 2)
    assert check.message.startswith("an unbounded attack (eps=4, the full input range) "
                                    "leaves accuracy ")
    assert "on 20 correctly classified examples, above chance (0.200)" in check.message
    skipped = unbounded_attack_check(_linear, _X, _Y, _Y == 0, norm="linf", clip_min=0.0,
                                     clip_max=None, num_classes=2)
    assert skipped.message is None and skipped.gradient_passes == 0


def _overshoot_run(model, x, y=None, *, eps=None, norm="linf", clip_min=None, clip_max=None,
                   targeted=False, seed=None):
    return attacks.AttackResult(x_adv=tf.constant(x) + 2 * eps, gradient_passes=0)


class _Overshoot(attacks.Attack):
    name = "overshoot"
    _run = staticmethod(_overshoot_run)


def test_evaluate_warns_about_outputs_outside_the_budget_even_without_sanity_checks():
    with pytest.warns(UserWarning, match="overshoot returned points outside the eps=0.05 ball"):
        rep = attacks.evaluate(_linear, _X, _Y, [_Overshoot()], [0.05], clip_min=-1.0,
                               clip_max=2.0, sanity_checks=False)
    assert rep.warnings == ["overshoot returned points outside the eps=0.05 ball or the bounds "
                            "(bug)"]


def test_progress_contract_and_work_accounting_on_the_linear_model():
    calls = []
    rep = attacks.evaluate(_linear, _X, _Y, ["fgsm", "pgd5"], [0.1, 0.05], clip_min=0.0,
                           clip_max=1.0, progress=lambda *a: calls.append(a))
    assert calls == [(0, 5, "fgsm eps=0.05"), (1, 5, "pgd5 eps=0.05"), (2, 5, "fgsm eps=0.1"),
                     (3, 5, "pgd5 eps=0.1"), (4, 5, "unbounded check"), (5, 5, "done")]
    assert rep.warnings == []
    assert rep.worst_case == {0.05: 0.6, 0.1: 0.4}
    assert [r.attacked for r in rep.records] == [4, 3, 3, 2]
    # FGSM: one gradient pass per example attacked; every attack output is predicted once
    assert [r.gradient_passes for r in rep.records[::2]] == [4, 3]
    assert rep.gradient_passes >= sum(r.gradient_passes for r in rep.records)
    attacked = sum(r.attacked for r in rep.records)
    assert rep.forward_passes >= len(_X) + attacked + sum(r.forward_passes for r in rep.records)


def test_no_example_grid_when_none_asked(tmp_path):
    rep = attacks.evaluate(_linear, _X, _Y, ["fgsm"], [0.1], clip_min=0.0, clip_max=1.0,
                           sanity_checks=False, n_examples=0)
    assert rep.examples == {}
    assert sorted(rep.save(tmp_path)) == ["json", "plot", "txt"]
    rep = attacks.evaluate(_linear, _X, _Y, ["fgsm"], [0.1], clip_min=0.0, clip_max=1.0,
                           sanity_checks=False, n_examples=3)
    grid = rep.examples[0.1]
    np.testing.assert_array_equal(grid["y"], [0, 0, 0])  # broken first, then robust
    np.testing.assert_array_equal(grid["pred_adv"], [1, 1, 0])
    with pytest.raises(ValueError, match=r"eps must be one of the report's budgets \[0.1\]"):
        rep.plot_examples(tmp_path / "e.png", eps=0.3)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(batch_size=0), ValueError, "batch_size must be an int >= 1, got 0"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an int >= 1, got 2.5"),
    (dict(eps=[]), ValueError, "eps: give at least one budget"),
    (dict(eps=[0.1, float("nan")]), ValueError, "eps must be a number >= 0, got nan"),
    (dict(attacks=[]), ValueError, "attacks: give at least one attack"),
    (dict(attacks=["pgd", "PGD"]), ValueError, "attacks: duplicate names"),
    (dict(norm="l3"), ValueError, "norm must be one of 'linf'"),
    (dict(n_examples=-1), ValueError, "n_examples must be an int >= 0, got -1"),
    (dict(target_seed=-1), ValueError, "target_seed must be an int >= 0, got -1"),
    (dict(progress="bar"), TypeError, "progress must be a callable"),
    (dict(y=_Y.astype(float)), TypeError, "y must hold integer class labels"),
    (dict(y=_Y + 1), ValueError, r"y has labels outside \[0, 2\)"),
])
def test_evaluate_refuses_bad_arguments_with_their_names(kwargs, error, message):
    call = dict(model=_linear, x=_X, y=_Y, attacks=["fgsm"], eps=[0.1], clip_min=0.0,
                clip_max=1.0)
    with pytest.raises(error, match=message):
        attacks.evaluate(**{**call, **kwargs})


def test_public_names_keep_their_homes():
    import importlib

    from attacks import registry, report

    # the function attacks.evaluate shadows its module's name on the package
    evaluate_module = importlib.import_module("attacks.evaluate")

    assert evaluate_module.make_attack is attacks.make_attack is registry.parse_attack
    assert evaluate_module.ATTACK_NAMES is attacks.ATTACK_NAMES
    assert attacks.EvaluationReport is evaluate_module.EvaluationReport is report.EvaluationReport
    assert attacks.AttackRecord is report.AttackRecord
