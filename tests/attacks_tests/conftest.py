"""Fixtures shared by the certification tests: the digits data and one small ReLU MLP trained on
it (8 epochs, seed 0), built once per session. Tests read the model; none changes it."""

import keras
import pytest

from attacks.data import load_dataset


@pytest.fixture(scope="session")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="session")
def mlp(digits):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits.x_train, digits.y_train, epochs=8, batch_size=64, verbose=0)
    return model
