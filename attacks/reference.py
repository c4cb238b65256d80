"""A small reference classifier for the 8x8 digits that the demo, tests and benchmarks share.

:func:`digits_cnn` builds it (two convolutions and a dense layer, logits out, 38,282 parameters);
:func:`train_digits_cnn` trains it with Adam on :func:`robustgrad.data.load_digits`.

Example:
  >>> model = digits_cnn(seed=0)
  >>> model.input_shape, model.output_shape
  ((None, 8, 8, 1), (None, 10))
  >>> model.count_params()
  38282
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # keras loads with TensorFlow: only when a model is built
    import keras

__all__ = ["digits_cnn", "train_digits_cnn"]


def digits_cnn(seed: int = 0) -> keras.Sequential:
    """A plain (not robust) CNN for ``[N, 8, 8, 1]`` float32 images in [0, 1], returning
    ``[N, 10]`` logits (no softmax). ``seed`` fixes the initial weights."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def train_digits_cnn(epochs: int = 15, seed: int = 0,
                     data: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
                     verbose: int = 0) -> keras.Sequential:
    """Train :func:`digits_cnn` with Adam (3e-3, batch 64) on the digits training split.

    Args:
        epochs: training epochs (>= 1).
        seed: initial weights and shuffling.
        data: ``((x_train, y_train), (x_test, y_test))`` as :func:`robustgrad.data.load_digits`
            returns it (default: that function's split).
        verbose: Keras ``fit`` verbosity.

    Returns:
        The trained ``keras.Sequential``.
    """
    import keras

    from robustgrad.checks import positive_int
    from robustgrad.data import load_digits

    positive_int(epochs, "epochs")
    (x_train, y_train), _ = data if data is not None else load_digits()
    model = digits_cnn(seed)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=epochs, batch_size=64, verbose=verbose, shuffle=True)
    return model
