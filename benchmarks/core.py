"""Core benchmark: HVP vs gradient cost, chunked Jacobian memory/time vs TF's tape.jacobian.

Measured side by side in one run, on this machine, with compiled (tf.function) functions:

1. An HVP (forward-over-reverse and reverse-over-reverse) against one gradient of the same loss
   w.r.t. the model's parameters, for a small MLP and a small CNN on digits-shaped data.
   Target: each HVP costs at most 3x a gradient.
2. ``robustgrad.jacobian(fn, x, chunk_size=c)`` of a batch's logits w.r.t. the batch: peak
   allocator memory (``tf.config.experimental.get_memory_info``) falls with ``c`` while the time
   stays within 1.5x of TF's ``tape.jacobian``.

(The transformation-chain overhead on a train step is in ``benchmarks/transforms.py``.)

Run:  .venv/bin/python benchmarks/core.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import robustgrad as rg  # noqa: E402


def _median_time(fn, repeats: int) -> float:
    fn()  # compile / warm up
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _interleaved(fns: dict, repeats: int) -> dict:
    """Median time of each function, calls interleaved so machine noise hits all alike."""
    for f in fns.values():
        f()
        f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            out = f()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def models():
    mlp = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                            keras.layers.Dense(256, activation="tanh"),
                            keras.layers.Dense(256, activation="tanh"), keras.layers.Dense(10)])
    cnn = keras.Sequential([keras.Input((8, 8, 1)),
                            keras.layers.Conv2D(32, 3, padding="same", activation="tanh"),
                            keras.layers.Conv2D(32, 3, padding="same", activation="tanh"),
                            keras.layers.Flatten(), keras.layers.Dense(10)])
    return {"MLP": mlp, "CNN": cnn}


def bench_hvp(repeats: int):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((256, 8, 8, 1)), tf.float32)
    y = tf.constant(rng.integers(0, 10, 256))
    rows = []
    for name, model in models().items():
        ntv = [v.value for v in model.non_trainable_variables]

        def loss(params, model=model, ntv=ntv):
            logits, _ = model.stateless_call(params, ntv, x, training=False)
            return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

        params = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
        vec = [tf.constant(rng.standard_normal(p.shape), tf.float32) for p in params]
        g = tf.function(lambda p, loss=loss: rg.grad(loss)(p))
        fr = tf.function(lambda p, v, loss=loss: rg.hvp(loss, (p,), (v,)))
        rr = tf.function(lambda p, v, loss=loss: rg.hvp(loss, (p,), (v,),
                                                        mode="reverse_over_reverse"))
        t = _interleaved({"grad": lambda: g(params), "fwd": lambda: fr(params, vec),
                          "rev": lambda: rr(params, vec)}, repeats)
        rows.append((name, t["grad"], t["fwd"], t["rev"]))
    print("\n## HVP vs gradient (batch 256, compiled, median of interleaved runs)")
    print(f"{'model':6} {'grad ms':>9} {'fwd/rev ms':>11} {'ratio':>6} {'rev/rev ms':>11} {'ratio':>6}")
    for name, tg, tfw, trr in rows:
        print(f"{name:6} {tg * 1e3:9.2f} {tfw * 1e3:11.2f} {tfw / tg:6.2f} {trr * 1e3:11.2f} "
              f"{trr / tg:6.2f}")
    return rows


def bench_jacobian(repeats: int, batch: int):
    model = models()["MLP"]
    x = tf.constant(np.random.default_rng(1).random((batch, 8, 8, 1)), tf.float32)

    def tf_jacobian(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = model(x)
        return tape.jacobian(y, x)

    fns = {"tape.jacobian": tf.function(tf_jacobian)}
    m = batch * 10
    chunks = [None, m // 4, m // 16, m // 64]
    for c in chunks:
        fns[f"chunk_size={c}"] = tf.function(lambda x, c=c: rg.jacobian(model, x, chunk_size=c))
    results = []
    for name, f in fns.items():
        f(x)  # compile
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        f(x).numpy()
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
        results.append([name, peak])
    times = _interleaved({k: (lambda f=f: f(x)) for k, f in fns.items()}, repeats)
    ref = times["tape.jacobian"]
    print(f"\n## jacobian of a batch of {batch} (MLP logits [B,10] w.r.t. x [B,8,8,1], "
          f"{m} rows), compiled")
    print(f"{'method':20} {'peak MiB':>9} {'time ms':>9} {'time / tape.jacobian':>21}")
    for name, peak in results:
        print(f"{name:20} {peak / 2**20:9.1f} {times[name] * 1e3:9.1f} {times[name] / ref:21.2f}")
    return results, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores, "
          f"GPUs: {len(tf.config.list_physical_devices('GPU'))}")
    bench_hvp(args.repeats)
    bench_jacobian(max(5, args.repeats // 3), args.batch)


if __name__ == "__main__":
    main()
