"""Benchmark: what a gradient-transformation chain adds to a compiled train step.

Measured side by side in one run, on a small MLP and a small CNN on the digits data
((N, 8, 8, 1), 10 classes, from ``robustgrad.data.load_digits``):

  * ``optimizer``: forward, backward, ``optimizer.apply_gradients`` (the reference);
  * ``zero_nonfinite+clip``: the same through ``GradientStep(chain(zero_nonfinite(),
    clip_by_global_norm(1.0)))``;
  * ``apply_if_finite(clip)``: ``GradientStep(apply_if_finite(clip_by_global_norm(1.0), 5))``
    (optimizer behind a ``tf.cond``);
  * ``hand-written clip+cond``: the same logic written inline with ``tf.linalg.global_norm``,
    ``tf.clip_by_global_norm`` and ``tf.cond`` -- what the abstraction is up against;
  * ``optimizer (control)``: a second copy of the reference, showing the measurement noise.

Each variant is one ``tf.function`` (optionally ``jit_compile=True``). Timing: after warm-up, many
rounds; in each round the variants run in a shuffled order, each for a block of ``--steps`` steps,
every step timed on its own. Reported per variant: the 10th percentile (the cost with the least
interference from other jobs on a shared machine; the primary figure) and the median of the step
times, and each as a ratio to the reference's. ``optimizer (control)`` shows the noise floor.

    .venv/bin/python benchmarks/transforms.py                 # graph mode and XLA
    .venv/bin/python benchmarks/transforms.py --jit off --rounds 40 --steps 25
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from robustgrad import transforms  # noqa: E402

# Tiny, so that every variant computes on (nearly) the same weights for the whole run: with a
# real learning rate the variants drift apart (clipped vs unclipped training on one batch) and the
# step time then depends on the values (an early run showed a 17% "speed-up" from clipping).
LEARNING_RATE = 1e-7


def make_model(kind):
    keras.utils.set_random_seed(0)
    if kind == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    else:
        layers = [keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                  keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                  keras.layers.MaxPooling2D(2), keras.layers.Flatten(), keras.layers.Dense(10)]
    return keras.Sequential([keras.Input((8, 8, 1)), *layers])


def loss_fn(model, x, y):
    logits = model(x, training=True)
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _step_fn(kind, transform):
    model = make_model(kind)
    opt = keras.optimizers.Adam(LEARNING_RATE)
    variables = model.trainable_variables
    opt.build(variables)
    if transform == "hand-written":
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(model, x, y)
            grads = tape.gradient(loss, variables)
            norm = tf.linalg.global_norm(grads)
            grads, _ = tf.clip_by_global_norm(grads, 1.0, use_norm=norm)

            def apply():
                opt.apply_gradients(zip(grads, variables))
                return tf.constant(True)

            tf.cond(tf.math.is_finite(norm), apply, lambda: tf.constant(False))
            return loss + 0.0 * norm
        return step
    if transform is None:
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(model, x, y)
            grads = tape.gradient(loss, variables)
            opt.apply_gradients(zip(grads, variables))
            return loss
        return step
    gstep = transforms.GradientStep(transform, opt, variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        stats = gstep(tape.gradient(loss, variables))
        return loss + 0.0 * stats["grad_norm"]
    return step


def make_steps(kind, jit, control=True):
    """Return {variant: compiled step(x, y)}; every variant has its own model and optimizer."""
    steps = {}
    variants = {
        "optimizer": None,
        "optimizer (control)": None,
        "zero_nonfinite+clip": transforms.chain(transforms.zero_nonfinite(),
                                                transforms.clip_by_global_norm(1.0)),
        "apply_if_finite(clip)": transforms.apply_if_finite(transforms.clip_by_global_norm(1.0), 5),
        "hand-written clip+cond": "hand-written",
    }
    for name, transform in variants.items():
        if name == "optimizer (control)" and not control:
            continue
        steps[name] = tf.function(_step_fn(kind, transform), jit_compile=jit)
    return steps


def run_block(fn, x, y, n):
    """Per-step wall times (s) of ``n`` consecutive calls (each result fetched)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(x, y).numpy()
        times.append(time.perf_counter() - t0)
    return times


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q))


def bench(kind, jit, x, y, rounds, steps_per_block, seed, control=True):
    steps = make_steps(kind, jit, control)
    for fn in steps.values():  # trace, compile, warm up
        run_block(fn, x, y, 20)
    times = {name: [] for name in steps}
    rng = random.Random(seed)
    names = list(steps)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            times[name] += run_block(steps[name], x, y, steps_per_block)
    ref = times["optimizer"]
    rows = []
    for name, ts in times.items():
        p10, p50 = percentile(ts, 10), percentile(ts, 50)
        rows.append((name, p10, p50, p10 / percentile(ref, 10), p50 / percentile(ref, 50)))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--jit", choices=["off", "on", "both"], default="both")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-control", action="store_true",
                   help="skip the second, identical optimizer-only step (the noise control)")
    args = p.parse_args(argv)

    try:
        from robustgrad.data import load_digits
        (x, y), _ = load_digits()
        source = "sklearn digits"
    except Exception:  # pragma: no cover - data module missing
        rng = np.random.default_rng(0)
        x = rng.uniform(size=(1347, 8, 8, 1)).astype(np.float32)
        y = rng.integers(0, 10, size=1347)
        source = "random"
    x = tf.constant(x[: args.batch])
    y = tf.constant(np.asarray(y[: args.batch]), tf.int64)

    jits = {"off": [False], "on": [True], "both": [False, True]}[args.jit]
    print(f"TF {tf.__version__}, Keras {keras.__version__}, batch {args.batch} ({source}), "
          f"{args.rounds} rounds x {args.steps} steps interleaved, Adam(lr={LEARNING_RATE}); "
          f"per-step time percentiles, ratio to 'optimizer'")
    print(f"{'model':5} {'mode':6} {'variant':24} {'p10 ms':>8} {'p50 ms':>8} "
          f"{'ratio p10':>9} {'ratio p50':>9}")
    worst = 0.0
    for kind in args.models.split(","):
        for jit in jits:
            for name, p10, p50, r10, r50 in bench(kind, jit, x, y, args.rounds, args.steps,
                                                  args.seed, not args.no_control):
                mode = "xla" if jit else "graph"
                print(f"{kind:5} {mode:6} {name:24} {p10 * 1e3:8.3f} {p50 * 1e3:8.3f} "
                      f"{r10:9.3f} {r50:9.3f}", flush=True)
                if name in ("zero_nonfinite+clip", "apply_if_finite(clip)"):
                    worst = max(worst, r10)
    print(f"worst GradientStep chain / optimizer ratio (p10): {worst:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
