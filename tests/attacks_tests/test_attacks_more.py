"""APGD, Carlini-Wagner L2, DeepFool and Square: invariants, known answers, validation."""

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks import norms
from attacks.apgd import checkpoint_schedule

from small_models import Linear, SmallNet, small_batch

EPS = {"linf": 0.1, "l2": 0.5}

ATTACKS = {
    "apgd-ce": lambda m, x, y, **kw: attacks.apgd(m, x, y, steps=10, **kw),
    "apgd-dlr": lambda m, x, y, **kw: attacks.apgd(m, x, y, steps=10, objective="dlr", **kw),
    "apgd-t": lambda m, x, y, **kw: attacks.apgd(m, x, y, steps=5, n_target_classes=2, **kw),
    "deepfool": lambda m, x, y, **kw: attacks.deepfool(m, x, y, steps=10, **kw),
    "square": lambda m, x, y, **kw: attacks.square(m, x, y, steps=60, **kw),
}


@pytest.mark.parametrize("name", list(ATTACKS))
@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_invariants(name, norm):
    model = SmallNet()
    x = small_batch(24)
    x_copy = x.copy()
    eps = EPS[norm]
    kw = dict(eps=eps, norm=norm, clip_min=0.0, clip_max=1.0, seed=3)
    x_adv = ATTACKS[name](model, x, None, **kw).numpy()
    np.testing.assert_array_equal(x, x_copy)
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    assert np.all(norms.norm(tf.constant(x_adv - x), norm).numpy() <= eps + 1e-6)
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    np.testing.assert_array_equal(x_adv, ATTACKS[name](model, x, None, **kw).numpy())
    zero = ATTACKS[name](model, x, None, **{**kw, "eps": 0.0}).numpy()
    np.testing.assert_allclose(zero, x, atol=1e-7)
    assert model.training_seen == {False}


def test_cw_invariants_and_confidence_margin():
    model = SmallNet()
    x = small_batch(32)
    y = tf.argmax(model(x), 1).numpy()
    kappa = 2.0
    x_adv = attacks.carlini_wagner_l2(model, x, y, clip_min=0.0, clip_max=1.0, steps=60,
                                      binary_search_steps=4, confidence=kappa).numpy()
    assert x_adv.dtype == x.dtype and x_adv.min() >= 0 and x_adv.max() <= 1
    margin = attacks.objectives.cw_margin(model(x_adv), y).numpy()
    moved = np.abs(x_adv - x).reshape(len(x), -1).max(1) > 1e-5
    assert moved.mean() > 0.8  # most examples found an adversarial point
    assert np.all(margin[moved] >= kappa - 1e-3)  # every success clears the margin
    # eps bounds the output (projection) and targeted reaches the target
    xb = attacks.carlini_wagner_l2(model, x, y, eps=0.2, clip_min=0.0, clip_max=1.0, steps=30,
                                   binary_search_steps=2).numpy()
    assert np.all(np.linalg.norm((xb - x).reshape(len(x), -1), axis=1) <= 0.2 + 1e-6)
    t = (y + 1) % 5
    xt = attacks.carlini_wagner_l2(model, x, t, targeted=True, clip_min=0.0, clip_max=1.0,
                                   steps=60, binary_search_steps=4)
    assert np.mean(np.argmax(model(xt), 1) == t) > 0.8


def test_cw_on_linear_model_finds_near_minimal_l2():
    # for a linear binary model the minimal L2 perturbation is |x.w| / ||w|| along w
    w = np.array([1.0, -2.0, 0.5], np.float32)
    model = Linear(w)
    x = np.array([[0.6, 0.4, 0.5]], np.float32)  # x.w = 0.05 -> class 0
    x_adv = attacks.carlini_wagner_l2(model, x, [0], clip_min=0.0, clip_max=1.0, steps=200,
                                      binary_search_steps=6).numpy()
    # logits [s, -s] -> the margin is 2 s, boundary at s = 0: distance 0.05 / ||w||
    d = np.linalg.norm(x_adv - x)
    assert np.argmax(model(x_adv)) == 1
    assert d == pytest.approx(0.05 / np.linalg.norm(w), rel=0.25)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_deepfool_linear_model_minimal_step(norm):
    w = np.array([1.0, -2.0, 0.5], np.float32)
    x = np.array([[0.6, 0.4, 0.5]], np.float32)
    x_adv = attacks.deepfool(Linear(w), x, None, norm=norm, clip_min=0.0, clip_max=1.0,
                             overshoot=0.02).numpy()
    assert np.argmax(Linear(w)(x_adv)) == 1
    dual = np.linalg.norm(w) if norm == "l2" else np.abs(w).sum()
    dist = norms.norm(tf.constant(x_adv - x), norm).numpy()[0]
    # the exact distance to the boundary, plus the overshoot
    assert dist == pytest.approx(0.05 / dual * 1.02, rel=0.05)


def test_untargeted_strong_and_targeted_reach_on_small_net():
    model = SmallNet()
    x = small_batch(64)
    y = tf.argmax(model(x), 1).numpy()
    kw = dict(eps=0.3, clip_min=0.0, clip_max=1.0, seed=0)
    for x_adv in (attacks.apgd(model, x, y, steps=20, **kw),
                  attacks.apgd(model, x, y, steps=10, n_target_classes=3, **kw),
                  attacks.square(model, x, y, steps=300, **kw),
                  attacks.deepfool(model, x, y, clip_min=0.0, clip_max=1.0, eps=None)):
        assert np.mean(np.argmax(model(x_adv), 1) == y) < 0.5
    t = (y + 1) % 5
    for x_t in (attacks.apgd(model, x, t, targeted=True, steps=20, **kw),
                attacks.apgd(model, x, t, targeted=True, steps=20, objective="dlr", **kw),
                attacks.square(model, x, t, targeted=True, steps=300, **kw)):
        assert np.mean(np.argmax(model(x_t), 1) == t) > 0.5


def test_apgd_checkpoints_follow_the_paper():
    w = checkpoint_schedule(100)
    assert w[:4] == [22, 41, 57, 70]  # intervals 22, 19, 16, 13, ... down to 6
    diffs = np.diff([0] + w)
    assert diffs.min() >= 6 and all(a >= b for a, b in zip(diffs, diffs[1:]))


def test_apgd_not_weaker_than_pgd_on_small_net():
    model = SmallNet(seed=4)
    x = small_batch(128, seed=5)
    y = tf.argmax(model(x), 1).numpy()
    kw = dict(eps=0.06, clip_min=0.0, clip_max=1.0, seed=0)
    acc_pgd = np.mean(np.argmax(model(attacks.projected_gradient_descent(
        model, x, y, steps=30, **kw)), 1) == y)
    acc_apgd = np.mean(np.argmax(model(attacks.apgd(model, x, y, steps=30, **kw)), 1) == y)
    assert acc_apgd <= acc_pgd + 1e-9


def test_one_trace_per_signature_for_each_attack():
    model = SmallNet()
    runs = [
        lambda x, e, s: attacks.apgd(model, x, None, eps=e, steps=3, clip_min=0., clip_max=1.,
                                     seed=s),
        lambda x, e, s: attacks.square(model, x, None, eps=e, steps=5, clip_min=0., clip_max=1.,
                                       seed=s),
        lambda x, e, s: attacks.deepfool(model, x, None, eps=e, steps=3, clip_min=0.,
                                         clip_max=1.),
        lambda x, e, s: attacks.carlini_wagner_l2(model, x, None, eps=e, steps=3,
                                                  binary_search_steps=1, clip_min=0.,
                                                  clip_max=1.),
    ]
    for f in runs:
        before = model.traces
        f(small_batch(16), 0.1, 0)
        first = model.traces - before
        assert first >= 1
        f(small_batch(9), 0.2, 1)
        f(small_batch(31), 0.05, None)
        assert model.traces - before == first


def test_square_is_gradient_free_and_works_on_a_nondifferentiable_model():
    net = SmallNet()

    def quantised(x, training=False):  # zero gradient everywhere: masks gradient attacks
        return net(tf.round(x * 4.0) / 4.0)

    x = small_batch(64)
    y = tf.argmax(quantised(x), 1).numpy()
    with pytest.raises(ValueError, match="model: the (output does not depend|input gradient is zero)"):
        attacks.projected_gradient_descent(quantised, x, y, eps=0.3, clip_min=0.0, clip_max=1.0)
    res = attacks.Square(steps=200).run(quantised, x, y, eps=0.3, clip_min=0.0, clip_max=1.0,
                                        seed=0)
    assert res.gradient_passes == 0 and res.forward_passes > 0
    assert np.mean(np.argmax(quantised(res.x_adv), 1) == y) < 0.5


@pytest.mark.parametrize("name", ["apgd-ce", "deepfool", "square", "cw"])
def test_common_bad_input_raises_before_work(name):
    model = SmallNet()
    x = small_batch(4)
    f = ATTACKS.get(name) or (lambda m, x, y, **kw: attacks.carlini_wagner_l2(m, x, y, **kw))
    ok = dict(eps=0.1, clip_min=0.0, clip_max=1.0)
    cases = [
        (ValueError, "eps", dict(ok, eps=-0.1), x, None),
        (ValueError, "clip_min", dict(ok, clip_min=1.0, clip_max=0.0), x, None),
        (ValueError, "x has values outside", ok, x + 2.0, None),
        (ValueError, "x contains NaN", ok, np.where(x > 0.5, np.nan, x), None),
        (TypeError, "x must be a floating", dict(eps=1.0, clip_min=0, clip_max=255),
         (x * 255).astype(np.uint8), None),
        (ValueError, "y has labels outside", ok, x, np.array([0, 1, 2, 9])),
        (ValueError, "y has 3 labels", ok, x, np.array([0, 1, 2])),
        (TypeError, "y must hold integer", ok, x, np.zeros(4, np.float32)),
    ]
    for exc, msg, kw, xx, yy in cases:
        with pytest.raises(exc, match=msg):
            f(model, xx, yy, **kw)
    const = lambda z, training=False: tf.zeros([tf.shape(z)[0], 3]) + tf.Variable([1.0, 2, 3])  # noqa
    if name != "square":  # square is gradient-free: it needs no gradient path
        with pytest.raises(ValueError, match="model: the output does not depend"):
            f(const, x, None, **ok)
    assert model.traces == 0


def test_bad_arguments():
    model = SmallNet()
    x = small_batch(4)
    ok = dict(eps=0.1, clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="norm"):
        attacks.apgd(model, x, None, norm="l3", **ok)
    with pytest.raises(ValueError, match="norm"):
        attacks.carlini_wagner_l2(model, x, None, norm="linf", clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="clip_min/clip_max"):
        attacks.carlini_wagner_l2(model, x, None, clip_min=None, clip_max=None)
    with pytest.raises(ValueError, match="x: square needs images"):
        attacks.square(model, x.reshape(4, -1), None, **ok)
    with pytest.raises(ValueError, match="eps"):
        attacks.square(model, x, None, eps=-1.0, clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="targeted"):
        attacks.deepfool(model, x, [0, 1, 2, 3], targeted=True, clip_min=0.0, clip_max=1.0)
    with pytest.raises(ValueError, match="y has labels outside"):
        attacks.apgd(model, x, [0, 1, 2, 7], **ok)
    assert model.traces == 0
