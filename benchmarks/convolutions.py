"""3x3 convolutions by Winograd (robustgrad.winograd) against TensorFlow's, per shape (issue 38).

For each shape ``NxHWxCIN->COUT`` (batch, square map, channels), one thread, float32, "same"
padding: the CPU seconds of the forward convolution and of its input gradient (the backward pass
of an attack's iteration) by ``robustgrad.convolution.conv2d`` ("direct": TensorFlow's forward
convolution, the input gradient by a forward convolution) and by
``robustgrad.winograd.winograd_conv2d`` with tiles 2 and 4, best of ``--repeats`` calls after a
warm-up, each as a ``tf.function``; the ratios to direct, and whether
``robustgrad.winograd.winograd_pays`` takes the shape. The default shapes are WideResNet-28-10's
and PreActResNet-18's 3x3 layers at batch 128 and two narrow ones the rule leaves direct
(docs/benchmarks/training.md, "Winograd convolutions").

    python benchmarks/convolutions.py                      # the table's shapes (~5 min here)
    python benchmarks/convolutions.py 32x8x256->256 --repeats 3 --json out.json
    python benchmarks/convolutions.py --quick              # a smoke run (tiny shapes)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

SHAPES = ("128x32x160->160", "128x16x320->320", "128x8x640->640", "128x16x128->128",
          "128x8x256->256", "128x4x512->512", "128x32x64->64", "128x32x16->160")
QUICK = ("2x8x8->8", "2x4x16->16")
_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)->(\d+)$")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``"NxHWxCIN->COUT"`` as ``(N, HW, CIN, COUT)``; ``ValueError`` naming the form."""
    match = _SHAPE.match(text.strip())
    if not match or min(int(g) for g in match.groups()) < 1:
        raise ValueError(f"shape must be NxHWxCIN->COUT with positive sizes, e.g. "
                         f"128x32x160->160; got {text!r}")
    n, hw, cin, cout = (int(g) for g in match.groups())
    return n, hw, cin, cout


def _best(fn, args, repeats: int) -> float:
    fn(*args)  # trace, compile, warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn(*args).numpy()
        best = min(best, time.process_time() - start)
    return best


def measure(shape: tuple[int, int, int, int], repeats: int, seed: int = 0) -> dict:
    """One shape's row: CPU seconds forward / input gradient per kind, ratios to direct."""
    import numpy as np
    import tensorflow as tf

    from robustgrad.convolution import conv2d
    from robustgrad.winograd import winograd_conv2d, winograd_pays

    n, hw, cin, cout = shape
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(n, hw, hw, cin)), tf.float32)
    k = tf.constant(rng.normal(size=(3, 3, cin, cout)) / np.sqrt(9 * cin), tf.float32)
    dy = tf.constant(rng.normal(size=(n, hw, hw, cout)), tf.float32)
    kinds = {"direct": lambda a, b: conv2d(a, b, 1, "SAME"),
             "winograd2": lambda a, b: winograd_conv2d(a, b, 2),
             "winograd4": lambda a, b: winograd_conv2d(a, b, 4)}
    row: dict = {"shape": f"{n}x{hw}x{cin}->{cout}", "pays": bool(winograd_pays(x, k))}
    for name, conv in kinds.items():
        def backward(a, b, g, conv=conv):
            with tf.GradientTape() as tape:
                tape.watch(a)
                y = conv(a, b)
            return tape.gradient(y, a, output_gradients=g)

        row[name] = {"forward_cpu_s": _best(tf.function(conv), (x, k), repeats),
                     "input_gradient_cpu_s": _best(tf.function(backward), (x, k, dy), repeats)}
    for name in ("winograd2", "winograd4"):
        for part in ("forward_cpu_s", "input_gradient_cpu_s"):
            row[name][part.replace("_cpu_s", "_ratio")] = (
                row[name][part] / max(row["direct"][part], 1e-12))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="NxHWxCIN->COUT (default: the table's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    try:
        shapes = [parse_shape(s) for s in (args.shapes or (QUICK if args.quick else SHAPES))]
    except ValueError as error:
        parser.error(str(error))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already runs in this process (a test): its pools stay
        print(f"threads: TensorFlow was already initialised; intra-op threads stay "
              f"{tf.config.threading.get_intra_op_parallelism_threads()}", flush=True)
    repeats = 1 if args.quick else args.repeats
    rows = []
    print("shape                 pays  direct fwd / grad s   F(2x2) ratio   F(4x4) ratio", flush=True)
    for shape in shapes:
        row = measure(shape, repeats)
        rows.append(row)
        d, w2, w4 = row["direct"], row["winograd2"], row["winograd4"]
        print(f"{row['shape']:<21} {'yes' if row['pays'] else 'no ':<5} "
              f"{d['forward_cpu_s']:7.3f} / {d['input_gradient_cpu_s']:7.3f}   "
              f"{w2['forward_ratio']:.2f} / {w2['input_gradient_ratio']:.2f}    "
              f"{w4['forward_ratio']:.2f} / {w4['input_gradient_ratio']:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": tf.config.threading.get_intra_op_parallelism_threads(),
                       "repeats": repeats, "rows": rows,
                       "tensorflow": tf.__version__, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
