"""APGD-L1 ("Mind the box", Croce & Hein 2021): the exact L1-ball-and-box projection, the eps
schedule, budgets and boxes, strength against PGD-L1 and a linear model's optimum, APGD-T under
L1, expectation over transformation."""

import numpy as np
import pytest
import tensorflow as tf

import attacks
from attacks.apgd import l1_stages
from attacks.norms import project_l1_box

from small_models import Linear, SmallNet, small_batch

BOX = dict(clip_min=0.0, clip_max=1.0)


def _dykstra(v, eps, lower, upper, iterations=20000):
    """The projection of each row of ``v`` [rows, n] onto {||d||_1 <= eps[row]} and
    [lower, upper] (rows of the same shape) by Dykstra's alternating projections (each set's
    projection is simple; the iteration converges to the exact projection onto the
    intersection), in float64 NumPy, all rows at once (each row's iteration is its own)."""
    rows, n = v.shape
    index = np.arange(rows)

    def onto_ball(z):
        a = np.abs(z)
        u = -np.sort(-a, axis=1)
        css = np.cumsum(u, axis=1)
        above = u * np.arange(1, n + 1) > css - eps[:, None]  # True at k = 1 whenever eps > 0
        rho = n - 1 - np.argmax(above[:, ::-1], axis=1)  # the last index where it holds
        theta = (css[index, rho] - eps) / (rho + 1)
        shrunk = np.sign(z) * np.maximum(a - theta[:, None], 0.0)
        return np.where((a.sum(1) <= eps)[:, None], z, shrunk)

    x, p, q = v.copy(), np.zeros_like(v), np.zeros_like(v)
    for _ in range(iterations):
        y = np.clip(x + p, lower, upper)
        p = x + p - y
        x = onto_ball(y + q)
        q = y + q - x
    return x


def test_l1_box_projection_matches_dykstra_on_small_vectors():
    rng = np.random.default_rng(0)
    rows = 25
    v = rng.normal(0, 1, (rows, 7))
    lower = -rng.uniform(0, 0.8, (rows, 7))
    upper = rng.uniform(0, 0.8, (rows, 7))
    upper[:, 0] = 0.0  # a coordinate at its upper bound
    eps = rng.uniform(0.1, 2.5, rows)
    d = project_l1_box(tf.constant(v), tf.constant(eps), lower, upper).numpy()
    np.testing.assert_allclose(d, _dykstra(v, eps, lower, upper), atol=1e-9)
    assert np.all(np.abs(d).sum(1) <= eps + 1e-12)
    assert np.all(d >= lower) and np.all(d <= upper)
    inside = np.clip(v, lower, upper)  # a clip already inside the ball is the projection
    small = np.abs(inside).sum(1) <= eps
    np.testing.assert_allclose(d[small], inside[small])
    assert 3 <= small.sum() < rows


def test_l1_box_projection_stays_within_eps_in_float32():
    rng = np.random.default_rng(1)
    v = rng.normal(0, 1, (16, 3072)).astype(np.float32)
    d = project_l1_box(tf.constant(v), 12.0, -0.4, 0.6).numpy()
    used = np.abs(d).astype(np.float64).sum(1)  # the exact sum of the float32 values
    assert np.all(used <= 12.0)
    assert np.all(used >= 12.0 * (1 - 1e-6))  # the budget is used (float64 inside)


def test_l1_stages_follow_the_reference():
    assert l1_stages(100, True) == [(3.0, 30), (2.0, 30), (1.0, 40)]
    assert l1_stages(10, True) == [(3.0, 3), (2.0, 3), (1.0, 4)]
    assert l1_stages(7, False) == [(1.0, 7)]


@pytest.mark.parametrize("schedule", [True, False])
def test_apgd_l1_invariants_with_a_per_feature_box(schedule):
    model = SmallNet()
    x = small_batch(32)
    x_copy = x.copy()
    lo = np.full(x.shape[1:], 0.0, np.float32)
    hi = np.full(x.shape[1:], 1.0, np.float32)
    hi[0] = 0.7
    lo[1] = 0.2
    x = np.clip(x, lo, hi)
    x_copy = x.copy()
    eps = 1.0
    run = attacks.APGD(norm="l1", steps=20, eps_schedule=schedule).run(
        model, x, None, eps=eps, clip_min=lo, clip_max=hi, seed=0)
    x_adv = run.x_adv.numpy()
    np.testing.assert_array_equal(x, x_copy)
    assert x_adv.dtype == x.dtype and x_adv.shape == x.shape
    assert np.all(np.abs(x_adv - x).reshape(32, -1).sum(1) <= eps + 1e-6)
    assert np.all(x_adv >= lo) and np.all(x_adv <= hi)
    y = np.argmax(model(x), 1)
    assert np.mean(np.argmax(model(x_adv), 1) != y) > 0.5
    again = attacks.APGD(norm="l1", steps=20, eps_schedule=schedule).run(
        model, x, None, eps=eps, clip_min=lo, clip_max=hi, seed=0).x_adv.numpy()
    np.testing.assert_array_equal(x_adv, again)


def test_apgd_l1_as_autoattack_runs_it_is_not_weaker_than_pgd_l1():
    model = SmallNet()
    x = small_batch(64)
    y = np.argmax(model(x), 1)
    for eps in (0.4, 0.8):  # 5 restarts with the eps schedule, AutoAttack's APGD-CE for L1
        a = attacks.apgd(model, x, y, eps=eps, norm="l1", steps=100, restarts=5, seed=0, **BOX)
        p = attacks.projected_gradient_descent(model, x, y, eps=eps, norm="l1", steps=100,
                                               seed=0, **BOX)
        broken_apgd = np.sum(np.argmax(model(a), 1) != y)
        assert broken_apgd >= np.sum(np.argmax(model(p), 1) != y) - 1
        assert 40 < broken_apgd < 64


def test_apgd_l1_reaches_the_optimum_of_a_linear_model():
    # maximise the CE of class 0 <=> minimise x.w: the best L1 step spends eps on the
    # coordinate of largest |w| (here w_1 = -3: raise x_1) as far as the box allows, then on the next
    w = np.array([1.0, -3.0, 0.5, 2.0], np.float32)
    x = np.array([[0.5, 0.8, 0.5, 0.5]], np.float32)
    eps = 0.5  # x_1 can rise by 0.2 (gain 0.6), then x_3 falls by 0.3 (gain 0.6)
    best_gain = 0.2 * 3.0 + 0.3 * 2.0
    gains = {}
    for schedule in (False, True):
        x_adv = attacks.apgd(Linear(w), x, [0], eps=eps, norm="l1", steps=100, seed=0,
                             early_stop=False, eps_schedule=schedule, **BOX).numpy()
        gains[schedule] = float(((x - x_adv) @ w)[0])
        assert np.abs(x_adv - x).sum() <= eps + 1e-6 and x_adv.max() <= 1.0
    assert gains[False] == pytest.approx(best_gain, rel=1e-4)
    # from the larger balls' point the equal-weight sparse steps stall one coordinate short
    # (the soft threshold takes back what a two-coordinate step adds): a heuristic's limit
    assert 0.9 * best_gain <= gains[True] <= best_gain + 1e-5


def test_apgd_t_l1_and_the_passes():
    model = SmallNet()
    x = small_batch(16)
    y = np.argmax(model(x), 1)
    run = attacks.APGD(norm="l1", steps=10, n_target_classes=2, early_stop=False).run(
        model, x, y, eps=0.5, seed=0, **BOX)
    assert run.gradient_passes == 16 * 2 * (10 + 3)  # a pass at each stage's start
    assert np.all(np.abs(run.x_adv.numpy() - x).reshape(16, -1).sum(1) <= 0.5 + 1e-6)


def test_eot_averages_gradients_of_a_randomised_model():
    class Noisy(SmallNet):
        def __call__(self, x, training=False):
            logits = super().__call__(x, training)
            return logits + tf.random.normal(tf.shape(logits), stddev=0.5)

    model = Noisy()
    x = small_batch(16)
    y = np.argmax(SmallNet()(x), 1)
    run = attacks.APGD(steps=5, eot_iter=4, early_stop=False).run(model, x, y, eps=0.1, seed=0,
                                                                   **BOX)
    assert run.gradient_passes == 16 * 4 * 6  # 4 passes per gradient, 5 steps and the start
    assert np.all(np.abs(run.x_adv.numpy() - x) <= 0.1 + 1e-6)


def test_apgd_l1_bad_arguments():
    model, x = SmallNet(), small_batch(4)
    with pytest.raises(ValueError, match="eps schedule .* needs >= 3 steps"):
        attacks.apgd(model, x, eps=1.0, norm="l1", steps=2, **BOX)
    with pytest.raises(ValueError, match=r"eot_iter must be an int in \[1, 1000\], got 0"):
        attacks.apgd(model, x, eps=1.0, eot_iter=0, **BOX)
    assert model.traces == 0
