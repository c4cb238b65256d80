"""Train a robust digits classifier with fast adversarial training, then attack it with PGD.

    .venv/bin/python examples/train_robust_classifier.py            # the full run (20 s of CPU)
    .venv/bin/python examples/train_robust_classifier.py --quick    # the tests' tiny budget

Guide: docs/guides/robust-classifiers.md.
"""
import sys

import keras

import attacks
from robustgrad.data import load_digits

QUICK = "--quick" in sys.argv                   # the tests' tiny budget

(x_train, y_train), (x_test, y_test) = load_digits()          # [N, 8, 8, 1] in [0, 1], int64
keras.utils.set_random_seed(0)                                  # weights and shuffling
# under train_classifier: the trainer is a keras.Model (fit, callbacks, tf.distribute, .keras)
classifier = attacks.make_classifier((8, 8, 1), 10, width=32)    # a small CNN, logits out
trainer = attacks.AdversarialTrainer(classifier, method="fast", eps=0.1, seed=0)
trainer.compile(optimizer=keras.optimizers.Adam(3e-3))
trainer.fit(x_train, y_train, batch_size=64, epochs=2 if QUICK else 15, verbose=0)

clean = attacks.training.robust_accuracy(classifier, x_test, y_test, eps=0.0, steps=0)
robust = attacks.training.robust_accuracy(classifier, x_test, y_test, eps=0.1, steps=20)
print(f"clean accuracy {clean:.3f}, PGD-20 accuracy at L-inf eps 0.1: {robust:.3f}")
classifier.save("robust_digits.keras")          # a plain Keras model: loads anywhere
