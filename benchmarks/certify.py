"""Bound cost benchmark (issue 21, section 3, last figure): time per example of IBP, CROWN-IBP and
CROWN (margin specification, L-inf ball) against one forward pass of the same model, as depth grows.

Models: ReLU MLPs of width ``--width`` with 2, 4, 6, 8 hidden layers on the 8x8 digits input, and
the digits CNN of ``attacks.reference`` (conv 16 - conv 32 / 2 - dense 64 - 10), each trained for
``--epochs`` epochs of plain training on digits first (CROWN's cost depends on how many ReLUs are
unstable, which a random network overstates: zero biases on the many zero pixels). Every
measurement is
the median over ``--rounds`` rounds in which the methods run interleaved (load from other processes
hits them alike), each round timing one compiled call on ``--batch`` examples after a warm-up call.

Usage::

    python benchmarks/certify.py              # ~1-2 min on 2 cores
    python benchmarks/certify.py --quick      # depths 2 and 4 only, 3 rounds

Prints a table of ratios to the forward pass (and the absolute milliseconds per example).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `python benchmarks/certify.py` puts benchmarks/ first on sys.path, where benchmarks/attacks.py
# would shadow the `attacks` package: drop the script's directory.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

METHODS = ("ibp", "crown-ibp", "crown")


def mlp(depth, width):
    import keras

    layers = [keras.Input((8, 8, 1)), keras.layers.Flatten()]
    layers += [keras.layers.Dense(width, activation="relu", kernel_initializer="he_normal")
               for _ in range(depth)]
    return keras.Sequential([*layers, keras.layers.Dense(10)])


def digits_cnn():
    import keras

    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def measure(model, x, y, eps, rounds):
    """Median seconds of one compiled call per method (and the forward pass) on ``x``."""
    import tensorflow as tf

    from robustgrad.bounds import BoundedModel, margin_spec

    bounded = BoundedModel(model)
    spec = margin_spec(y, 10)
    lower, upper = tf.clip_by_value(x - eps, 0, 1), tf.clip_by_value(x + eps, 0, 1)
    forward = tf.function(lambda v: model(v, training=False))
    calls = {"forward": lambda: forward(x)}
    for method in METHODS:
        calls[method] = (lambda m: lambda: bounded.bounds(lower, upper, m, spec,
                                                          batch_size=None))(method)
    for call in calls.values():  # warm-up: trace and compile
        tf.nest.map_structure(lambda t: t.numpy(), call())
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), call())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="2,4,6,8", help="hidden layers of the MLPs")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--eps", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="depths 2,4 and 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.depths, args.rounds = "2,4", 3

    import keras
    import tensorflow as tf

    from robustgrad.data import load_digits

    (x_train, y_train), (x_test, y_test) = load_digits()
    x = tf.constant(x_test[:args.batch])
    y = tf.constant(y_test[:args.batch])
    keras.utils.set_random_seed(0)
    models = [(f"mlp depth {d} x {args.width}", mlp(int(d), args.width))
              for d in args.depths.split(",")] + [("digits cnn", digits_cnn())]
    print(f"batch {args.batch}, eps {args.eps} (L-inf), median of {args.rounds} rounds; "
          f"ratio = time / forward pass time (ms per example)")
    print(f"{'model':<22}" + "".join(f"{m:>22}" for m in METHODS) + f"{'forward':>14}")
    for name, model in models:
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x_train, y_train, epochs=args.epochs, batch_size=64, verbose=0)
        t = measure(model, x, y, args.eps, args.rounds)
        per = {k: 1e3 * v / args.batch for k, v in t.items()}
        row = "".join(f"{t[m] / t['forward']:>12.1f}x ({per[m]:6.3f})" for m in METHODS)
        print(f"{name:<22}{row}{per['forward']:>11.4f} ms", flush=True)


if __name__ == "__main__":
    main()
