"""Peak memory of one PGD call against the batch size: does it grow linearly with the batch?

The attack functions (``attacks.projected_gradient_descent`` and the others) run the whole
``x`` they are given as one batch -- the compiled loop keeps a few ``x``-sized tensors (the
iterate, the best point, the gradient) -- so their memory is linear in the batch;
``attacks.evaluate`` splits a large ``x`` into ``batch_size`` chunks itself. Each size runs in
a fresh interpreter so that the peak resident set size (``ru_maxrss``) is that call's own;
the figure is the growth over a warmed-up baseline (TensorFlow, the model and a traced call).

    python benchmarks/attack_memory.py                    # batches 256 1024 4096 16384
    python benchmarks/attack_memory.py --batches 512 2048 --steps 10

Prints one line per batch size: MiB above the baseline, and MiB per 1,000 examples (constant
when the growth is linear).

Measured 2026-12-01 on the shared 2-core CPU box (load average ~17; memory figures do not depend
on the load), ``--batches 512 2048 8192``, PGD-10: +192 MiB, +788 MiB, +2676 MiB, i.e. 375, 385
and 327 MiB per 1,000 examples: linear (the model's activations and their gradients, ~0.35 MiB
an example for this CNN, dominate; the input is 3 KiB an example). A 10,000-image test set
given to an attack function in one call needs ~3.5 GiB: split it, or use ``attacks.evaluate``
(``batch_size``, default 256).
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

batch, steps = int(sys.argv[1]), int(sys.argv[2])
model = make_classifier((28, 28), 10, width=16)
rng = np.random.default_rng(0)
def run(n):
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, n)
    out = attacks.projected_gradient_descent(model, x, y, eps=0.1, clip_min=0.0, clip_max=1.0,
                                             steps=steps, seed=0)
    return float(tf.reduce_max(out))
run(8)  # trace and warm up
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(batch)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"batch": batch, "base_kib": base, "peak_kib": peak}))
"""


def measure(batch: int, steps: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(batch), str(steps)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    print(f"PGD-{args.steps}, 28x28x1 inputs, digits CNN width 16 (float32); peak RSS growth "
          "over a warmed-up baseline")
    for b in args.batches:
        r = measure(b, args.steps)
        grow = (r["peak_kib"] - r["base_kib"]) / 1024
        print(f"batch {b:6d}: +{grow:8.1f} MiB  ({1000 * grow / b:6.2f} MiB per 1000 examples; "
              f"input itself {b * 28 * 28 * 4 / 2**20:6.1f} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
