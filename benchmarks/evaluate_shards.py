"""Sharded evaluation (issue 35 item 2): 2 local Ray workers against 1, one TensorFlow thread each.

A compute-bound model (``attacks.make_classifier((28, 28, 1), 10, width=16)``, trained one
epoch on the shared MNIST subset) is evaluated with PGD at L-inf eps 0.1 on ``--n`` test
examples in chunks of ``--chunk-size``:

1. ``workers=1``, one thread (the baseline: one single-threaded worker);
2. ``workers=2``, one thread each (the shape of a run over machines);
3. ``workers=2`` with TensorFlow's default threads (a fresh Ray: threads are fixed per process);
4. in this process (``workers=None``), default threads.

Per example, each run is compared with the 1-worker run and the in-process one. TensorFlow's
results depend on the thread count (a convolution's reductions are split per thread): runs with
the same threads per process agree bit for bit; across thread counts the margins may differ in
the last bits (and a borderline example could flip), which the comparison shows.

Each Ray session is warmed up first (workers started, TensorFlow imported, the model built) on
one chunk, so the figures are the evaluation's wall time. Prints wall seconds, the ratio
2 workers / 1 worker (the issue's goal: <= 0.6) and whether every per-example array equals the
in-process run's. Run it from a snapshot of the tree while nothing else loads the machine::

    .venv/bin/python benchmarks/evaluate_shards.py              # 512 examples, ~minutes
    .venv/bin/python benchmarks/evaluate_shards.py --n 64       # a smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ["PYTHONPATH"] = os.pathsep.join(  # the Ray workers import this tree too
    p for p in (os.path.abspath(os.path.join(os.path.dirname(__file__), "..")),
                os.environ.get("PYTHONPATH")) if p)

import numpy as np  # noqa: E402

import attacks  # noqa: E402
from robustgrad import ray_setup  # noqa: E402

DATA = "/work/shared/data/mnist_digits10k.npz"


def load(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with np.load(DATA) as d:
        xtr = d["x_train"].astype(np.float32)[..., None] / 255.0
        xte = d["x_test"][:n].astype(np.float32)[..., None] / 255.0
        return xtr, d["y_train"], xte, d["y_test"][:n]


def run(model, x, y, args, **kw) -> tuple[float, dict]:
    began = time.perf_counter()
    report = attacks.evaluate(model, x, y, ["pgd"], [0.1], clip_min=0.0, clip_max=1.0,
                              sanity_checks=False, n_examples=0, chunk_size=args.chunk_size,
                              batch_size=args.chunk_size, **kw)
    return time.perf_counter() - began, report.per_example


def sharded(model, x, y, args, workers: int, threads: int | None) -> tuple[float, dict]:
    """Wall of ``workers`` Ray workers on a warmed-up Ray session of its own."""
    ray = ray_setup.init_ray(None, num_cpus=2, purpose="the benchmark")
    try:
        run(model, x[: args.chunk_size * workers], y[: args.chunk_size * workers], args,
            workers=workers, worker_threads=threads)  # warm-up: start every worker
        return run(model, x, y, args, workers=workers, worker_threads=threads)
    finally:
        ray.shutdown()


def difference(a: dict, b: dict) -> str:
    """``equal`` or what differs: the margins' largest gap, the flags that changed."""
    if all(np.array_equal(a[k], b[k]) for k in b):
        return "equal"
    parts = []
    for k in b:
        if k.startswith("margin@"):
            gap = float(np.max(np.abs(a[k] - b[k])))
            if gap:
                parts.append(f"{k} max gap {gap:.1e}")
        elif not np.array_equal(a[k], b[k]):
            parts.append(f"{k} {int(np.sum(a[k] != b[k]))} differ")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=64)
    args = parser.parse_args()
    import keras

    xtr, ytr, x, y = load(args.n)
    keras.utils.set_random_seed(0)
    model = attacks.make_classifier((28, 28, 1), 10, width=16)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(xtr, ytr, epochs=1, batch_size=128, verbose=0)
    print(f"uptime: {os.getloadavg()}; {len(x)} examples, chunks of {args.chunk_size}, "
          f"pgd linf eps 0.1, make_classifier((28, 28, 1), 10, width=16)")
    figures = {}
    for name, workers, threads in (("1 worker, 1 thread", 1, 1), ("2 workers, 1 thread", 2, 1),
                                   ("2 workers, default threads", 2, None)):
        figures[name] = sharded(model, x, y, args, workers, threads)
    figures["in process, default threads"] = run(model, x, y, args)
    for name, (wall, per_example) in figures.items():
        print(f"{name:30s} wall {wall:7.2f} s   per example vs "
              f"1 worker: {difference(per_example, figures['1 worker, 1 thread'][1])}; "
              f"vs in process: {difference(per_example, figures['in process, default threads'][1])}")
    ratio = figures["2 workers, 1 thread"][0] / figures["1 worker, 1 thread"][0]
    print(f"2 workers / 1 worker (1 thread each): {ratio:.2f} (goal <= 0.6); "
          f"uptime after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
