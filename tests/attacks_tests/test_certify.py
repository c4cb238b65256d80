"""attacks.certify: verified accuracy is a lower bound of attacked accuracy, per example."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import attacks
from robustgrad.data import load_digits


@pytest.fixture(scope="module")
def digits_mlp():
    (xtr, ytr), (xte, yte) = load_digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(xtr, ytr, epochs=15, batch_size=64, verbose=0)
    return model, xte[:200], yte[:200]


def _correct(model, x, y):
    return np.argmax(model(x, training=False).numpy(), 1) == y


@pytest.mark.parametrize("norm,eps", [("linf", 0.01), ("linf", 0.03), ("l2", 0.1)])
def test_verified_examples_survive_pgd_and_are_correct(digits_mlp, norm, eps):
    model, x, y = digits_mlp
    clean = _correct(model, x, y)
    assert clean.mean() > 0.9
    x_adv = attacks.projected_gradient_descent(model, x, y, eps=eps, norm=norm, clip_min=0.0,
                                               clip_max=1.0, steps=20, restarts=2, seed=0)
    robust = _correct(model, x_adv, y)
    counts = {}
    for method in ("ibp", "crown-ibp", "crown"):
        mask = attacks.verified_mask(model, x, y, eps, norm=norm, method=method).numpy()
        # a certificate is a lower bound, per example: verified => correct under any attack
        assert not np.any(mask & ~robust), method
        assert not np.any(mask & ~clean), method
        acc = attacks.verified_accuracy(model, x, y, eps, norm=norm, method=method)
        assert acc == pytest.approx(mask.mean())
        counts[method] = int(mask.sum())
    # CROWN certifies something on this model at these radii, and more than IBP
    assert counts["crown"] > 0 and counts["crown"] >= counts["ibp"], counts


def test_tiny_eps_verifies_the_confidently_correct_examples(digits_mlp):
    model, x, y = digits_mlp
    logits = model(x, training=False).numpy()
    top2 = np.sort(logits, 1)[:, -2:]
    confident = _correct(model, x, y) & (top2[:, 1] - top2[:, 0] > 0.05)
    for method in ("ibp", "crown"):
        mask = attacks.verified_mask(model, x, y, 1e-5, method=method).numpy()
        np.testing.assert_array_equal(mask[confident], True)
        assert not np.any(mask & ~_correct(model, x, y))
    # eps = 0: the bounds are the logits themselves, the verified examples the correct ones
    mask0 = attacks.verified_mask(model, x, y, 0.0).numpy()
    np.testing.assert_array_equal(mask0, _correct(model, x, y))


def test_margin_lower_bounds_and_bad_input(digits_mlp):
    model, x, y = digits_mlp
    lb = attacks.margin_lower_bounds(model, x[:4], y[:4], 0.02, method="ibp")
    assert lb.shape == (4, 9)
    logits = model(x[:4]).numpy()
    margins = logits[np.arange(4), y[:4]][:, None] - np.stack(
        [np.delete(row, t) for row, t in zip(logits, y[:4])])
    assert np.all(lb.numpy() <= margins + 1e-5)
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        attacks.verified_accuracy(model, x, y, -0.1)
    with pytest.raises(ValueError, match="norm must be 'linf' or 'l2'"):
        attacks.verified_accuracy(model, x, y, 0.1, norm="l1")
    with pytest.raises(ValueError, match="method must be one of"):
        attacks.verified_accuracy(model, x, y, 0.1, method="deeppoly")
    with pytest.raises(ValueError, match="labels outside"):
        attacks.verified_accuracy(model, x, y + 10, 0.1)
    with pytest.raises(ValueError, match="outside"):
        attacks.verified_accuracy(model, x + 2.0, y, 0.1)


# -- randomized smoothing (Cohen et al. 2019) -----------------------------------------------

def linear_1d(x, training=False):
    """Class 0 iff x > 0: under N(0, sigma^2) noise pA = Phi(|x| / sigma), the radius is |x|."""
    return tf.concat([x, -x], axis=1)


def test_smooth_certify_radius_matches_the_analytic_one():
    from scipy import stats

    x = np.array([[0.1], [0.3], [0.5], [-0.3], [0.0]], np.float32)
    sigma = 0.25
    labels, radii = attacks.smooth_certify(linear_1d, x, sigma, n0=100, n=100_000, alpha=0.001,
                                           seed=0)
    assert labels.tolist() == [0, 0, 0, 1, attacks.certify.ABSTAIN]
    exact = np.abs(x[:4, 0])
    # the Clopper-Pearson bound is below the true pA (w.p. 1 - alpha): the radius is below the
    # exact one, and within the bound's slack of it (n = 1e5 draws)
    assert np.all(radii[:4] <= exact + 1e-6), radii
    assert np.all(radii[:4] > exact - 0.03), radii
    assert radii[4] == 0.0
    # what the counts estimate: the fraction of draws on class 0 is Phi(x / sigma)
    counts = attacks.certify._noise_counts(linear_1d, tf.constant(x), sigma, 20_000, 1000, 1, 0, 2)
    p = stats.norm.cdf(x[:, 0] / sigma)
    se = np.sqrt(p * (1 - p) / 20_000)
    assert np.all(np.abs(counts[:, 0] / 20_000 - p) < 4 * se + 1e-9)
    assert np.all(counts.sum(1) == 20_000)


def test_smooth_predict_answers_and_abstains():
    x = np.array([[0.5], [-0.5], [0.0]], np.float32)
    pred = attacks.smooth_predict(linear_1d, x, sigma=0.25, n=1000, alpha=0.001, seed=0)
    assert pred.tolist() == [0, 1, attacks.certify.ABSTAIN]


def test_smoothing_is_seeded_and_compiled_once():
    x = np.random.default_rng(0).normal(0, 0.3, (7, 1)).astype(np.float32)
    a = attacks.smooth_certify(linear_1d, x, 0.5, n0=50, n=2000, seed=3, batch_size=256)
    b = attacks.smooth_certify(linear_1d, x, 0.5, n0=50, n=2000, seed=3, batch_size=256)
    c = attacks.smooth_certify(linear_1d, x, 0.5, n0=50, n=2000, seed=4, batch_size=256)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])
    counter = attacks.certify._counter(linear_1d)
    assert counter.count.experimental_get_tracing_count() <= 2  # one relaxed shape (+ last chunk)


def test_smoothing_a_keras_classifier(digits_mlp):
    model, x, y = digits_mlp
    clean = np.argmax(model(x[:20]).numpy(), 1)
    labels, radii = attacks.smooth_certify(model, x[:20], sigma=0.05, n0=50, n=500, seed=0)
    answered = labels >= 0
    assert np.mean(labels[answered] == clean[answered]) >= 0.9  # small noise: mostly f's label
    assert np.all(radii >= 0) and np.all((radii > 0) == (labels >= 0))
    assert np.mean(labels >= 0) >= 0.5


def test_smoothing_bad_input():
    x = np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match="sigma must be a number > 0"):
        attacks.smooth_certify(linear_1d, x, 0.0)
    with pytest.raises(ValueError, match="n0 .* must be <= n"):
        attacks.smooth_certify(linear_1d, x, 0.5, n0=200, n=100)
    with pytest.raises(ValueError, match=r"alpha must be a number in \(0, 1\)"):
        attacks.smooth_predict(linear_1d, x, 0.5, alpha=1.0)
    with pytest.raises(ValueError, match=r"n must be an int in \[1, 10000000\], got 0"):
        attacks.smooth_predict(linear_1d, x, 0.5, n=0)
    with pytest.raises(ValueError, match="logits of shape"):
        attacks.smooth_predict(lambda v, training=False: v[:, 0], x, 0.5)
