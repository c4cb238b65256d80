"""Fixtures shared by the certification tests, built once per session: the digits data, a small
ReLU MLP trained on it (8 epochs, seed 0) and the clean-trained baseline of the smoothing learning
tests. Tests read the models; none changes them."""

import keras
import numpy as np
import pytest

from attacks.data import load_dataset


@pytest.fixture(scope="session")
def _digits_once():
    # the session fixtures below take the data from here: several modules define a ``digits``
    # fixture of their own, with module scope, which a session fixture cannot request
    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits(_digits_once):
    return _digits_once


@pytest.fixture(scope="session")
def mlp(_digits_once):
    digits = _digits_once
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train, digits.y_train, epochs=8, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="session")
def clean_mlp64(_digits_once):
    """The clean-trained baseline of the smoothing learning tests (Gaussian and SmoothAdv
    training against it): a 64-unit ReLU MLP, 15 epochs of ``method="clean"``, seed 0."""
    from attacks import training

    digits = _digits_once
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    tr = training.AdversarialTrainer(model, method="clean", eval_steps=0)
    tr.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = tr.fit(digits.x_train, digits.y_train, batch_size=64, epochs=15, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    return model
