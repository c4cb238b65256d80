"""Gaussian data augmentation (method "gaussian", Cohen et al. 2019): the noise's statistics and
seeding, and a short real run whose smoothed classifier certifies more than a clean model's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from attacks import training
from attacks.certify import smooth_certify
from attacks.data import load_dataset
from attacks.training import get_method


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_noise_has_std_eps_is_seeded_and_unclipped():
    method = get_method("gaussian")
    x = tf.fill([400, 8, 8, 1], 0.5)
    a = method.craft(None, x, None, eps=tf.constant(0.25), step_size=None, steps=0,
                     seed=tf.constant([3, 4]))
    b = method.craft(None, x, None, eps=tf.constant(0.25), step_size=None, steps=0,
                     seed=tf.constant([3, 4]))
    c = method.craft(None, x, None, eps=tf.constant(0.25), step_size=None, steps=0,
                     seed=tf.constant([3, 5]))
    noise = (a - x).numpy().ravel()
    assert abs(noise.std() - 0.25) < 0.01 and abs(noise.mean()) < 0.01  # 25,600 draws
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert float(tf.reduce_max(a)) > 1.0 and float(tf.reduce_min(a)) < 0.0  # no clipping
    assert training.get_method("gaussian").adversarial and "gaussian" in training.METHODS


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def test_gaussian_training_certifies_more_under_smoothing_than_clean_training(digits,
                                                                             clean_mlp64):
    """A real learning test (~10 s): at sigma 0.5 the clean model's smoothed classifier abstains
    or errs on most digits; the noise-trained one certifies many of them."""
    model = _mlp()
    tr = training.AdversarialTrainer(model, method="gaussian", eps=0.5, eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(3e-3))
    tr.fit(digits.x_train, digits.y_train, batch_size=64, epochs=15, verbose=0)
    models = {"gaussian": model, "clean": clean_mlp64}
    x, y = digits.x_test[:100], digits.y_test[:100]
    acc = {}
    for method, model in models.items():
        pred, radius = smooth_certify(model, x, 0.5, n0=50, n=500, alpha=0.01, seed=0)
        acc[method] = float(np.mean((np.asarray(pred) == y) & (np.asarray(radius) >= 0.25)))
    assert acc["gaussian"] > acc["clean"] + 0.2, acc
