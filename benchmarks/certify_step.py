"""Cost of one CROWN-IBP certified-training step: the margins' lower bounds and their gradient
w.r.t. the weights, with the last backward pass carrying the upper bound's coefficients too (as
before) or the lower bound's only (``compute_bounds_unchecked(..., bound_upper=False)``, what
certified training uses). ibp-small on 28x28 inputs, batch 256, L-inf 0.1; median of 5
interleaved rounds.

Usage::

    python benchmarks/certify_step.py
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[0:1] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from attacks.training.architectures import ibp_small  # noqa: E402
from attacks.training.certified import _all_margins_spec  # noqa: E402
from robustgrad import bounds as rb  # noqa: E402

keras.utils.set_random_seed(0)
model = ibp_small((28, 28, 1), 10)
x = tf.constant(np.random.default_rng(0).uniform(0, 1, (256, 28, 28, 1)).astype("float32"))
y = tf.constant(np.random.default_rng(1).integers(0, 10, 256))
spec = _all_margins_spec(y, 10, tf.float32)


def make(upper):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            lb = rb.compute_bounds_unchecked(model, tf.maximum(x - 0.1, 0.0),
                                             tf.minimum(x + 0.1, 1.0), "crown-ibp", spec,
                                             bound_upper=upper)[0]
            loss = -tf.reduce_mean(lb)
        return tape.gradient(loss, model.trainable_variables)
    return step


def main():
    fns = {"lower+upper": make(True), "lower only": make(False)}
    for f in fns.values():  # warm-up: trace
        f()
    ts, cs = {k: [] for k in fns}, {k: [] for k in fns}
    for _ in range(5):
        for k, f in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            ts[k].append(time.perf_counter() - t0)
            cs[k].append(time.process_time() - c0)
    for k in fns:
        print(f"{k}: wall {statistics.median(ts[k]):.3f} s, cpu {statistics.median(cs[k]):.3f} s "
              f"per step")
    ratio = statistics.median(ts["lower only"]) / statistics.median(ts["lower+upper"])
    print(f"lower only / lower+upper (wall): {ratio:.2f}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
