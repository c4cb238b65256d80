"""Multi-worker training (issue 35): 2 local workers against 1 on digits madry, same epochs and
global batch; the goal is the same accuracy within 1 point.

Trains ``robustgrad train-classifier --data digits --method madry --eps 0.1`` twice, as separate
processes: one process (``--strategy none``) and two worker processes on 127.0.0.1
(``--strategy multi-worker``, TF_CONFIG each), the same ``--epochs``, ``--batch-size`` (the
global batch: each worker computes half of it) and seed. Then evaluates both saved classifiers
here on the digits test split: clean accuracy and PGD-20 accuracy at eps 0.1, and prints the
differences in points with the wall and CPU seconds of the two trainings.

Usage (from a snapshot copy of the tree)::

    .venv/bin/python benchmarks/multiworker_accuracy.py              # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/multiworker_accuracy.py --epochs 3   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _train(flags: list[str], out: str, workers: int) -> tuple[float, float]:
    """Train with ``workers`` processes (1: no strategy); returns wall and CPU seconds."""
    cmd = [sys.executable, "-m", "robustgrad.cli", "train-classifier", *flags, "--out", out]
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TF_CONFIG", None)
    cpu, start = _children_cpu(), time.perf_counter()
    if workers == 1:
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)]
    else:
        addresses = [f"127.0.0.1:{p}" for p in _free_ports(workers)]
        procs = []
        for i in range(workers):
            config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
            procs.append(subprocess.Popen(cmd + ["--strategy", "multi-worker"],
                                          env=dict(env, TF_CONFIG=json.dumps(config)),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n"
                             f"{err.decode()[-2000:]}")
    return time.perf_counter() - start, _children_cpu() - cpu


def _accuracy(path: str, eps: float) -> tuple[float, float]:
    """Clean and PGD-20 accuracy (eps, L-inf) of the saved classifier on the digits test set."""
    import keras
    import numpy as np

    import attacks
    from attacks.data import load_test_set

    x, y, _, _ = load_test_set("digits")
    model = keras.models.load_model(path, compile=False)
    report = attacks.evaluate(model, x, np.asarray(y), ["pgd20"], [eps], clip_min=0.0,
                              clip_max=1.0, sanity_checks=False, n_examples=0)
    return report.clean_accuracy, report.worst_case[eps]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64, help="the global batch")
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    flags = ["--data", "digits", "--method", "madry", "--eps", str(args.eps), "--epochs",
             str(args.epochs), "--batch-size", str(args.batch_size), "--seed", str(args.seed),
             "--no-eval", "--verbose", "0"]
    work = tempfile.mkdtemp(prefix="multiworker_accuracy_")
    print(f"load {os.getloadavg()[0]:.2f}; digits madry eps {args.eps}, {args.epochs} epochs, "
          f"global batch {args.batch_size}, seed {args.seed}")
    rows = {}
    for workers in (1, 2):
        out = os.path.join(work, f"w{workers}")
        wall, cpu = _train(flags, out, workers)
        clean, robust = _accuracy(os.path.join(out, "model.keras"), args.eps)
        rows[workers] = (clean, robust)
        print(f"{workers} worker{'s' if workers > 1 else ' '}: clean {100 * clean:.2f} %, "
              f"PGD-20 {100 * robust:.2f} %; training {wall:.1f} s wall, {cpu:.1f} CPU s")
    clean_d = 100 * (rows[2][0] - rows[1][0])
    robust_d = 100 * (rows[2][1] - rows[1][1])
    print(f"2 workers - 1 worker: clean {clean_d:+.2f} points, PGD-20 {robust_d:+.2f} points   "
          f"goal: within 1 point ({'met' if max(abs(clean_d), abs(robust_d)) <= 1 else 'missed'})")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
