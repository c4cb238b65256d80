"""AutoAttack's versions by name (attacks.autoattack), the self-checks they come with, targeted
attacks in general, and the bad input of issue 23 part 5."""

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks.autoattack import AUTOATTACK_VERSIONS, autoattack_attacks
from attacks.checks import randomness_warning
from attacks.square import p_schedule

from small_models import Linear, SmallNet, small_batch

BOX = dict(clip_min=0.0, clip_max=1.0)


def _summary(parts):
    out = []
    for label, attack in parts:
        c = attack.config
        out.append((label, type(attack).__name__, c.get("objective"), c.get("restarts", 1),
                    c.get("n_target_classes"), c.get("eot_iter", 1), c.get("steps")))
    return out


def test_the_versions_have_the_reference_components_order_and_settings():
    # fra31/auto-attack, autoattack.py: set_version and the constructors it configures
    for norm in ("linf", "l2"):
        assert _summary(autoattack_attacks("autoattack", norm)) == [
            ("apgd-ce", "APGD", "ce", 1, None, 1, 100),
            ("apgd-t", "APGD", "dlr", 1, 9, 1, 100),
            ("fab-t", "FAB", None, 1, 9, 1, 100),
            ("square", "Square", None, 1, None, 1, 5000)]
        square = autoattack_attacks("autoattack", norm)[3][1].config
        assert square["p_init"] == 0.8 and square["rescale_schedule"] is False
        assert _summary(autoattack_attacks("autoattack-plus", norm)) == [
            ("apgd-ce", "APGD", "ce", 5, None, 1, 100),
            ("apgd-dlr", "APGD", "dlr", 5, None, 1, 100),
            ("fab", "FAB", None, 5, None, 1, 100),
            ("square", "Square", None, 1, None, 1, 5000),
            ("apgd-t", "APGD", "dlr", 1, 9, 1, 100),
            ("fab-t", "FAB", None, 1, 9, 1, 100)]
    l1 = autoattack_attacks("standard", "l1")
    assert _summary(l1) == [("apgd-ce", "APGD", "ce", 5, None, 1, 100),
                            ("apgd-t", "APGD", "dlr", 1, 5, 1, 100),
                            ("fab-t", "FAB", None, 1, 9, 1, 100),
                            ("square", "Square", None, 1, None, 1, 5000)]
    assert all(a.config.get("eps_schedule", True) for _, a in l1[:2])  # use_largereps
    assert _summary(autoattack_attacks("rand", "linf")) == [
        ("apgd-ce", "APGD", "ce", 1, None, 20, 100), ("apgd-dlr", "APGD", "dlr", 1, None, 20, 100)]
    # AutoAttack's square schedule is not rescaled to its 5000 queries
    assert p_schedule(0.8, 11, 5000, rescale=False) == 0.4
    assert p_schedule(0.8, 4500, 5000, rescale=False) == 0.8 / 128


def test_square_l1_keeps_the_budget_and_the_box_and_breaks_examples():
    model = SmallNet()
    x = small_batch(32)
    y = np.argmax(model(x), 1)
    lo = np.zeros(x.shape[1:], np.float32)
    hi = np.ones(x.shape[1:], np.float32)
    hi[0] = 0.9
    x = np.minimum(x, hi)
    run = attacks.Square(steps=200, norm="l1").run(model, x, y, eps=1.5, clip_min=lo, clip_max=hi,
                                                   seed=0)
    x_adv = run.x_adv.numpy()
    assert run.gradient_passes == 0 and run.forward_passes > 0
    assert np.all(np.abs(x_adv - x).astype(np.float64).reshape(32, -1).sum(1) <= 1.5)
    assert np.all(x_adv >= lo) and np.all(x_adv <= hi)
    broken = np.argmax(model(x_adv), 1) != y
    assert 0.3 < broken.mean()


def test_version_names_are_known_everywhere_the_registry_is():
    assert [label for label, _ in attacks.parse_attacks("autoattack, pgd", norm="l2")] == [
        "apgd-ce", "apgd-t", "fab-t", "square", "pgd"]
    text = attacks.describe_attacks()
    for version in AUTOATTACK_VERSIONS:
        assert version in text
    with pytest.raises(ValueError, match="names several attacks"):
        attacks.parse_attack("autoattack")
    with pytest.raises(ValueError, match="version must be one of"):
        autoattack_attacks("autoattack-pro", "linf")


def test_evaluate_autoattack_by_name_on_a_small_net():
    model = SmallNet(classes=10)
    x = small_batch(24)
    y = np.argmax(model(x), 1)
    parts = autoattack_attacks("autoattack", "l2")  # the version, shortened for the test
    short = [(label, a.replace(steps=10 if label != "square" else 100)) for label, a in parts]
    report = attacks.evaluate(model, x, y, short, eps=0.3, norm="l2", sanity_checks=False,
                              **BOX)
    assert [r.attack for r in report.records] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert report.worst_case[0.3] < 1.0
    by_name = attacks.evaluate(model, x[:4], y[:4], "autoattack", eps=0.0, norm="l2",
                               sanity_checks=False, **BOX)
    assert by_name.attacks == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert by_name.worst_case[0.0] == 1.0


def test_fab_in_the_cascade_counts_only_points_within_eps():
    w = np.array([1.0, -2.0, 0.5], np.float32)
    x = np.array([[0.6, 0.4, 0.5], [0.9, 0.1, 0.5]], np.float32)  # x.w = 0.05 and 0.95
    y = np.array([0, 0])
    minimal = 0.05 / np.linalg.norm(w)
    report = attacks.evaluate(Linear(w), x, y, ["fab"], eps=[0.5 * minimal, 1.02 * minimal],
                              norm="l2", sanity_checks=False, **BOX)
    assert report.worst_case == {0.5 * minimal: 1.0, 1.02 * minimal: 0.5}
    assert not report.warnings  # never outside the budget


def test_randomised_model_warns_to_use_autoattack_rand():
    net = SmallNet()
    x = small_batch(16)
    y = np.argmax(net(x), 1)

    def noisy(z, training=False):
        logits = net(z)
        return logits + tf.random.normal(tf.shape(logits), stddev=0.3)

    message = randomness_warning(noisy, x, y, 256)
    assert "autoattack-rand" in message
    assert randomness_warning(net, x, y, 256) is None
    with pytest.warns(UserWarning, match="autoattack-rand"):
        report = attacks.evaluate(noisy, x, y, "fgsm", eps=0.05, **BOX)
    assert any("autoattack-rand" in w for w in report.warnings)
    # the rand version averages over passes: no warning to use itself
    parts = [(label, a.replace(steps=3)) for label, a in autoattack_attacks("rand", "linf")]
    report = attacks.evaluate(noisy, x, y, parts, eps=0.05, **BOX)
    assert not any("autoattack-rand" in w for w in report.warnings)


@pytest.mark.parametrize("name", ["pgd", "apgd", "fab", "cw"])
def test_targeted_attacks_take_targets_in_y(name):
    model = SmallNet()
    x = small_batch(32)
    targets = (np.argmax(model(x), 1) + 1) % 5
    run = {
        "pgd": lambda: attacks.projected_gradient_descent(model, x, targets, targeted=True,
                                                          eps=0.5, steps=40, **BOX),
        "apgd": lambda: attacks.apgd(model, x, targets, targeted=True, eps=0.5, steps=40, **BOX),
        "fab": lambda: attacks.fab(model, x, targets, targeted=True, steps=40, **BOX),
        "cw": lambda: attacks.carlini_wagner_l2(model, x, targets, targeted=True, steps=60,
                                                binary_search_steps=3, **BOX),
    }[name]
    assert np.mean(np.argmax(model(run()), 1) == targets) >= 0.8


def test_bad_input_of_issue_23_raises_before_the_work():
    model = SmallNet()  # 5 classes
    x = small_batch(8)
    y = np.argmax(model(x), 1)
    with pytest.raises(ValueError, match="norm must be one of"):
        attacks.FAB(norm="l0")
    with pytest.raises(ValueError, match=r"attacks: fab-t: n_target_classes must be < the "
                                         r"number of classes \(5\), got 9"):
        attacks.evaluate(model, x, y, "autoattack", eps=0.1, **BOX)
    with pytest.raises(ValueError, match="norm must be one of"):
        attacks.evaluate(model, x, y, "autoattack", eps=0.1, norm="l0", **BOX)
    with pytest.raises(ValueError, match="norm must be one of"):
        autoattack_attacks("autoattack", "l3")
    with pytest.raises(ValueError, match="targeted: DeepFool cannot be targeted"):
        attacks.DeepFool(targeted=True)
    with pytest.raises(ValueError, match="attacks: apgd-dlr: objective: DLR needs at least 3"):
        attacks.evaluate(Linear([1.0, 2.0]), np.full((2, 2), 0.5, np.float32), [0, 1],
                         "apgd-dlr", eps=0.1, **BOX)
    assert model.traces == 0
