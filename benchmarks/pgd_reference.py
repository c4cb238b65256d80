"""PGD-10 against its limit and against CleverHans's PGD, side by side in one process (issue 38).

On a 28x28 CNN (batch 256, L∞ eps 0.3, step 0.01, random start, float32), each interleaved round
times three things on the same weights and the same examples:

* ``passes``: ten calls of one compiled forward+backward input-gradient pass (``tf.function``,
  the summed cross-entropy's gradient with respect to x) - the limit PGD-10 cannot beat by much;
  it differentiates with TensorFlow's own convolution gradients;
* ``passes-fwd``: the same pass traced inside :func:`robustgrad.convolution.forward_input_gradients`,
  as the attack engine traces its loop (stride-1 convolutions' input gradients by a forward
  convolution), so ``ours / passes-fwd`` is the loop's own overhead and ``ours / passes`` the
  issue's goal against TensorFlow's plain pass;
* ``ours``: ``attacks.projected_gradient_descent`` through the public API (validation included);
* ``cleverhans``: ``cleverhans.tf2.attacks.projected_gradient_descent`` wrapped in one
  ``tf.function`` (its Python loop unrolled into the graph: "compiled"), from a read-only scratch
  copy of github.com/cleverhans-lab/cleverhans given by ``--cleverhans DIR`` (the folder holding
  the ``cleverhans`` package). CleverHans's TF2 code needs only TensorFlow and NumPy, so it runs
  in this process on this TensorFlow; it is never installed into the project. ``ch-eager`` is the
  same function called as its tutorial calls it (a Python loop, each step a compiled gradient).

Figures are ratios of the minimum over rounds (the least-disturbed run) and of medians, in wall
time and in CPU seconds of this process (``time.process_time``). Goal: ours / passes <= 1.05 and
ours below CleverHans.

Usage (from a snapshot copy of the tree; AutoGraph re-reads source files)::

    git -C <cleverhans mirror> archive HEAD cleverhans | tar -x -C /tmp/ch
    .venv/bin/python benchmarks/pgd_reference.py --cleverhans /tmp/ch --threads 1
    .venv/bin/python benchmarks/pgd_reference.py --model classifier --width 8   # our default CNN
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def _cleverhans_cnn() -> tf.keras.Model:
    """The CNN of CleverHans's TF2 MNIST tutorial (three convolutions, dropout, two dense)."""
    from keras import Sequential, layers
    return Sequential([
        layers.Input((28, 28, 1)),
        layers.Conv2D(64, 8, strides=2, activation="relu", padding="same"),
        layers.Conv2D(128, 6, strides=2, activation="relu", padding="valid"),
        layers.Conv2D(128, 5, strides=1, activation="relu", padding="valid"),
        layers.Dropout(0.25),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dense(10),
    ])


def _data(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 images in [0, 1]: the shared MNIST subset when present, else seeded noise digits."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                        "mnist_digits10k.npz")
    if os.path.exists(path):
        d = np.load(path)
        x = d["x_test"][:batch].astype(np.float32)[..., None] / 255.0
        return x, d["y_test"][:batch].astype(np.int64)
    rng = np.random.default_rng(seed)
    return (rng.random((batch, 28, 28, 1), dtype=np.float32),
            rng.integers(0, 10, batch).astype(np.int64))


def _timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleverhans", default=None,
                    help="folder holding a scratch copy of the cleverhans package (optional)")
    ap.add_argument("--model", choices=("cleverhans", "classifier"), default="cleverhans",
                    help="the CleverHans tutorial CNN, or attacks.make_classifier")
    ap.add_argument("--width", type=int, default=32, help="make_classifier's width")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="TF threads (0: TF's choice)")
    ap.add_argument("--jit", action="store_true", help="XLA for every side")
    args = ap.parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import attacks
    from robustgrad.convolution import forward_input_gradients

    tf.keras.utils.set_random_seed(0)
    model = (_cleverhans_cnn() if args.model == "cleverhans"
             else attacks.make_classifier((28, 28, 1), 10, width=args.width))
    x, y = _data(args.batch, 0)
    xt, yt = tf.constant(x), tf.constant(y)
    eps, step, k = 0.3, 0.01, args.steps

    @tf.function(jit_compile=args.jit)
    def grad_pass(xb, yb):
        with tf.GradientTape() as tape:
            tape.watch(xb)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=yb, logits=model(xb, training=False)))
        return tape.gradient(loss, xb)

    def passes():
        for _ in range(k):
            g = grad_pass(xt, yt)
        g.numpy()

    # the same pass traced as the attack engine traces its loop: Keras Conv2D layers take their
    # input gradient by a forward convolution (robustgrad.convolution), as ours does
    grad_pass_fwd = tf.function(grad_pass.python_function, jit_compile=args.jit)

    def passes_fwd():
        with forward_input_gradients():
            for _ in range(k):
                g = grad_pass_fwd(xt, yt)
        g.numpy()

    def ours():
        attacks.projected_gradient_descent(model, xt, yt, eps=eps, step_size=step, steps=k,
                                           clip_min=0.0, clip_max=1.0, seed=0,
                                           jit_compile=args.jit).numpy()

    sides = {"passes": passes, "passes-fwd": passes_fwd, "ours": ours}
    if args.cleverhans:
        sys.path.insert(0, os.path.abspath(args.cleverhans))
        from cleverhans.tf2.attacks.projected_gradient_descent import (
            projected_gradient_descent as ch_pgd,
        )
        model_fn = lambda xb: model(xb, training=False)

        @tf.function(jit_compile=args.jit)
        def ch_compiled(xb, yb):
            return ch_pgd(model_fn, xb, eps, step, k, np.inf, clip_min=0.0, clip_max=1.0, y=yb,
                          rand_init=True, sanity_checks=False)

        sides["cleverhans"] = lambda: ch_compiled(xt, yt).numpy()
        # as its tutorial runs it: the Python loop, each step's gradient its own tf.function
        sides["ch-eager"] = lambda: ch_pgd(model_fn, xt, eps, step, k, np.inf, clip_min=0.0,
                                           clip_max=1.0, y=yt, rand_init=True,
                                           sanity_checks=False).numpy()

    print(f"TensorFlow {tf.__version__}; model {args.model}"
          f"{'' if args.model == 'cleverhans' else f' width {args.width}'} "
          f"({model.count_params()} parameters); batch {args.batch}; PGD-{k}; threads "
          f"{args.threads or 'default'}; jit {args.jit}; load {os.getloadavg()[0]:.2f}")
    for fn in sides.values():  # trace and warm up
        fn()
        fn()
    wall = {n: [] for n in sides}
    cpu = {n: [] for n in sides}
    for _ in range(args.rounds):
        for n, fn in sides.items():
            w, c = _timed(fn)
            wall[n].append(w)
            cpu[n].append(c)
    print(f"{'side':<12}{'min ms':>10}{'median ms':>11}{'CPU min ms':>12}")
    for n in sides:
        print(f"{n:<12}{min(wall[n]) * 1e3:10.1f}{np.median(wall[n]) * 1e3:11.1f}"
              f"{min(cpu[n]) * 1e3:12.1f}")

    def ratio(a, b):
        return (f"{min(wall[a]) / min(wall[b]):.3f} (medians {np.median(wall[a]) / np.median(wall[b]):.3f}, "
                f"CPU {min(cpu[a]) / min(cpu[b]):.3f})")

    print(f"ours / {k} passes:       {ratio('ours', 'passes')}   goal <= 1.05 (TensorFlow's "
          "own convolution gradients in the passes)")
    print(f"ours / {k} passes-fwd:   {ratio('ours', 'passes-fwd')}   (the passes with the "
          "attack's convolution gradients)")
    if "cleverhans" in sides:
        print(f"ours / CleverHans:      {ratio('ours', 'cleverhans')}   goal < 1.0")
        print(f"CleverHans / {k} passes: {ratio('cleverhans', 'passes')}")
        print(f"ours / CleverHans eager (its tutorial's loop): {ratio('ours', 'ch-eager')}")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
