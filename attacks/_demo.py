"""The attacks stage of ``robustgrad demo``: train a plain digits CNN briefly, evaluate its
robustness with a few attacks, write the report under ``out_dir/attacks``.

Also home of :func:`digits_cnn` / :func:`train_digits_cnn`, the small reference classifier the
tests, the benchmark and the demo share.
"""

from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["digits_cnn", "train_digits_cnn", "load_digits_arrays", "run"]


def load_digits_arrays():
    """``(x_train, y_train), (x_test, y_test)``: float32 [N, 8, 8, 1] in [0, 1], int64 labels."""
    try:
        from robustgrad.data import load_digits

        return load_digits()
    except ImportError:  # pragma: no cover - before the core's data module landed
        from sklearn.datasets import load_digits as sk
        from sklearn.model_selection import train_test_split

        b = sk()
        x = (b.images.astype(np.float32) / 16.0)[..., None]
        y = b.target.astype(np.int64)
        xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)
        return (xtr, ytr), (xte, yte)


def digits_cnn(seed=0):
    """A small plain CNN for 8x8x1 digits, returning logits (no softmax)."""
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


def train_digits_cnn(epochs=15, seed=0, data=None, verbose=0):
    """Train :func:`digits_cnn` with Adam on the digits training split; returns the model."""
    import keras

    (xtr, ytr), _ = data if data is not None else load_digits_arrays()
    model = digits_cnn(seed)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(xtr, ytr, epochs=epochs, batch_size=64, verbose=verbose, shuffle=True)
    return model


def run(out_dir="runs/demo"):
    """Train, evaluate (FGSM, PGD, APGD-CE, Square at eps 0.05/0.1/0.2, L∞), write the report."""
    from .evaluate import evaluate

    t0 = time.perf_counter()
    out = os.path.join(out_dir, "attacks")
    os.makedirs(out, exist_ok=True)
    data = load_digits_arrays()
    (_, _), (xte, yte) = data
    print("[attacks] training a plain CNN on digits (15 epochs) ...", flush=True)
    model = train_digits_cnn(epochs=15, data=data)
    model_path = os.path.join(out, "digits_cnn.keras")
    model.save(model_path)
    print(f"[attacks] saved the model to {model_path}; evaluating on {len(xte)} test images "
          "with fgsm, pgd, apgd-ce, square (cascade) at L∞ eps 0.05, 0.1, 0.2 ...", flush=True)
    report = evaluate(model, xte, yte, ["fgsm", "pgd", "apgd-ce", "square"], [0.05, 0.1, 0.2],
                      batch_size=512, clip_min=0.0, clip_max=1.0)
    paths = report.save(out)
    print(report.table())
    print(f"[attacks] wrote {', '.join(paths.values())} ({time.perf_counter() - t0:.0f} s)")
    print(f"[attacks] re-run from the command line: robustgrad evaluate --model {model_path} "
          f"--data digits --attacks fgsm,pgd,apgd-ce,square --eps 0.05,0.1,0.2 --out {out}")
    return report
