"""attacks.certify: verified accuracy is a lower bound of attacked accuracy, per example."""

import keras
import numpy as np
import pytest

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
        attacks.verified_accuracy(model, x, y, 0.1, method="alpha-crown")
    with pytest.raises(ValueError, match="labels outside"):
        attacks.verified_accuracy(model, x, y + 10, 0.1)
    with pytest.raises(ValueError, match="outside"):
        attacks.verified_accuracy(model, x + 2.0, y, 0.1)
