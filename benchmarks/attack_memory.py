"""Peak memory of one PGD call against the batch size: does it stay flat once the attack chunks?

Every attack function splits an ``x`` of more than ``batch_size`` examples (default 1024,
``attacks._base.DEFAULT_BATCH_SIZE``) into chunks itself, so the working memory of a call (the
model's activations and their gradients, the iterate, the best point) is that of one chunk;
what still grows with the batch are the input and output arrays themselves (3 KiB an example
here). Each measurement runs in a fresh interpreter so that the peak resident set size
(``ru_maxrss``) is that call's own; the figure is the growth over a warmed-up baseline
(TensorFlow, the model, a traced call, and the input array already in memory).

The reference is the model's own forward-backward memory at one chunk: one compiled input
gradient of the cross-entropy over ``--chunk`` examples, measured the same way.

    python benchmarks/attack_memory.py                      # 1024 8192 32768, default chunks
    python benchmarks/attack_memory.py --batches 2048 --whole   # one chunk of everything (old)

Prints one line per batch size: MiB above the baseline, the part that is input/output-sized
arrays (``x`` as a tensor, the chunks' results and their concatenation: 3 copies), the rest
(the attack's working memory), and its ratio to the reference.

Measured 2026-12-01 on the shared 2-core CPU box (load average ~20; memory figures do not depend
on the load), PGD-10, digits CNN width 16, default chunks: reference +380 MiB; batch 1024 +390
MiB, 8192 +475 MiB, 32768 +623 MiB, i.e. a working memory of 381 / 402 / 329 MiB (1.00 / 1.06 /
0.87x the reference) beside the input/output-sized arrays (taken as 3 copies of the input, an
upper estimate). Before the attacks chunked, 8192 examples in one call grew by 2676 MiB. See
docs/benchmarks/attacks.md ("Memory").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, resource, sys
import numpy as np, tensorflow as tf
import attacks
from attacks.training import make_classifier

mode, batch, steps, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = make_classifier((28, 28), 10, width=16)
rng = np.random.default_rng(0)

@tf.function(reduce_retracing=True)
def input_gradient(x, y):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
    return tape.gradient(loss, x)

def run(x, y):
    if mode == "gradient":
        out = input_gradient(tf.constant(x), tf.constant(y))
    else:
        out = attacks.projected_gradient_descent(
            model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0, steps=steps, seed=0,
            batch_size=len(x) if mode == "whole" else None)
    return float(tf.reduce_max(out))

small = rng.random((8, 28, 28, 1), dtype=np.float32)
run(small, rng.integers(0, 10, 8))  # trace and warm up
x = rng.random((batch, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, batch)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(x, y)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"batch": batch, "base_kib": base, "peak_kib": peak}))
"""


def measure(mode: str, batch: int, steps: int, chunk: int) -> float:
    """MiB of peak RSS growth of one call in a fresh interpreter (``mode``: attack, whole,
    gradient)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(batch), str(steps),
                           str(chunk)], env=env, capture_output=True, text=True, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return (r["peak_kib"] - r["base_kib"]) / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--chunk", type=int, default=1024, help="the reference's batch (the default "
                   "chunk of the attacks)")
    p.add_argument("--whole", action="store_true", help="attack each batch in one chunk "
                   "(batch_size=len(x)), the behaviour before the attacks chunked")
    args = p.parse_args(argv)
    ref = measure("gradient", args.chunk, args.steps, args.chunk)
    print(f"PGD-{args.steps}, 28x28x1 inputs, digits CNN width 16 (float32); peak RSS growth over "
          f"a warmed-up baseline (input array already allocated)\nreference: one compiled input "
          f"gradient of {args.chunk} examples: +{ref:.1f} MiB", flush=True)
    for b in args.batches:
        grow = measure("whole" if args.whole else "attack", b, args.steps, args.chunk)
        arrays = 3 * b * 28 * 28 * 4 / 2**20
        rest = grow - arrays
        print(f"batch {b:6d}: +{grow:8.1f} MiB = {arrays:7.1f} MiB input/output-sized arrays "
              f"+ {rest:7.1f} MiB working memory ({rest / ref:4.2f}x the reference)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
