"""Peak memory of one attack call against the batch size: does it stay flat once the attack chunks?

Every attack function splits an ``x`` of more than ``batch_size`` examples (default 1024,
``attacks._base.DEFAULT_BATCH_SIZE``) into chunks itself, so the working memory of a call (the
model's activations and their gradients, the iterate, the best point) is that of one chunk;
what still grows with the batch are the input and output arrays themselves (3 KiB an example
here). Each measurement runs in a fresh interpreter so that the peak resident set size
(``ru_maxrss``) is that call's own; the figure is the growth over a warmed-up baseline
(TensorFlow, the model, a traced call, and the input array already in memory).

The reference is the model's own forward-backward memory at one chunk: one compiled input
gradient of the cross-entropy over ``--chunk`` examples, measured the same way.

    python benchmarks/attack_memory.py                      # every attack at 1024 and 8192
    python benchmarks/attack_memory.py --attacks pgd --batches 1024 8192 32768
    python benchmarks/attack_memory.py --batches 2048 --whole   # PGD in one chunk (old)

Every registered attack is measured (``--attacks``): FGSM, PGD, APGD-CE/DLR/T, APGD under
L1, Carlini-Wagner L2, DeepFool, FAB, FAB-T, Square and the standard AutoAttack cascade (run
through ``attacks.evaluate``), at ``--steps`` iterations (Square: 10x as many queries).
The model is untrained: attacks that stop early once every example
is broken run fewer iterations than on a robust model, but what they allocate per chunk is the
same. Prints one line per attack and batch size: MiB above the baseline, the part that is input/output-sized
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
spec, norm = sys.argv[5], sys.argv[6]
model = make_classifier((28, 28), 10, width=16)
rng = np.random.default_rng(0)
EPS = {"linf": 0.1, "l2": 1.5, "l1": 10.0}[norm]

@tf.function(reduce_retracing=True)
def input_gradient(x, y):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
    return tape.gradient(loss, x)

def configured():
    if spec == "autoattack":  # the standard cascade, each component at `steps` iterations
        parts = attacks.autoattack.autoattack_attacks("autoattack", norm)
        return [(label, a.replace(steps=steps * (10 if label == "square" else 1)))
                for label, a in parts]
    label, attack = attacks.registry.parse_attack(spec)
    return [(label, attack)]

def run(x, y):
    if mode == "gradient":
        return float(tf.reduce_max(input_gradient(tf.constant(x), tf.constant(y))))
    if mode == "pgd-whole":
        out = attacks.projected_gradient_descent(
            model, x, y, eps=EPS, clip_min=0.0, clip_max=1.0, steps=steps, seed=0,
            batch_size=len(x))
        return float(tf.reduce_max(out))
    parts = configured()
    if len(parts) > 1:  # a cascade, as attacks.evaluate runs it
        report = attacks.evaluate(model, x, y, parts, eps=[EPS], norm=norm,
                                  clip_min=0.0, clip_max=1.0, sanity_checks=False,
                                  batch_size=1024)
        return float(report.worst_case[EPS])
    out = parts[0][1](model, x, y, eps=EPS, norm=norm, clip_min=0.0, clip_max=1.0, seed=0)
    return float(tf.reduce_max(out))

small = rng.random((8, 28, 28, 1), dtype=np.float32)
run(small, rng.integers(0, 10, 8))  # trace and warm up
x = rng.random((batch, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, batch)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
run(x, y)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
print(json.dumps({"batch": batch, "base_kib": base, "peak_kib": peak, "cpu_s": cpu}))
"""

#: every registered attack, with the norm it is measured under (steps set by --steps; Square's
#: queries are 10x that); "apgd-l1" is APGD under the L1 norm, "autoattack" the standard cascade
ATTACKS = {"fgsm": "linf", "pgd": "linf", "apgd-ce": "linf", "apgd-dlr": "linf",
           "apgd-t": "linf", "apgd-l1": "l1", "cw": "l2", "deepfool": "linf", "fab": "linf",
           "fab-t": "linf", "square": "linf", "autoattack": "linf"}


def spec_of(name: str, steps: int) -> str:
    """The registry name of ``name`` at ``steps`` iterations (``fgsm`` has none to set)."""
    if name in ("fgsm", "autoattack"):
        return name
    base = "apgd-ce" if name == "apgd-l1" else name
    return f"{base}{steps * 10 if name == 'square' else steps}"


def measure(mode: str, batch: int, steps: int, chunk: int, spec: str = "pgd",
            norm: str = "linf") -> tuple[float, float]:
    """(MiB of peak RSS growth, CPU seconds) of one call in a fresh interpreter (``mode``:
    attack, pgd-whole, gradient)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(batch), str(steps),
                           str(chunk), spec, norm], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{mode} {spec} {batch}: {done.stderr.strip().splitlines()[-1]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return (r["peak_kib"] - r["base_kib"]) / 1024, r["cpu_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS),
                   metavar="NAME", help=f"attacks to measure (default all: {', '.join(ATTACKS)})")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--chunk", type=int, default=1024, help="the reference's batch (the default "
                   "chunk of the attacks)")
    p.add_argument("--whole", action="store_true", help="PGD on each batch in one chunk "
                   "(batch_size=len(x)), the behaviour before the attacks chunked")
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; 28x28x1 inputs, digits CNN width 16 "
          f"(float32); peak RSS growth over a warmed-up baseline (input array already "
          "allocated)", flush=True)
    ref, ref_cpu = measure("gradient", args.chunk, args.steps, args.chunk)
    print(f"reference: one compiled input gradient of {args.chunk} examples: +{ref:.1f} MiB "
          f"({ref_cpu:.1f} CPU s)", flush=True)
    names = ["pgd"] if args.whole else args.attacks
    for name in names:
        spec = spec_of(name, args.steps)
        for b in args.batches:
            grow, cpu = measure("pgd-whole" if args.whole else "attack", b, args.steps,
                                args.chunk, spec, ATTACKS[name])
            arrays = 3 * b * 28 * 28 * 4 / 2**20
            rest = grow - arrays
            print(f"{name:10s} {spec:11s} batch {b:6d}: +{grow:8.1f} MiB = {arrays:7.1f} MiB "
                  f"input/output-sized arrays + {rest:7.1f} MiB working memory "
                  f"({rest / ref:4.2f}x the reference); {cpu:6.1f} CPU s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
