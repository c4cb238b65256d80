"""Resumable evaluation (issue 35): interrupted at three points, resumed, equal per example.

Trains the small digits CNN, saves it, then runs ``robustgrad evaluate --attacks autoattack
--eps 0.1`` on the digits test split in chunks, as separate processes:

1. uninterrupted, into ``A/``;
2. into ``B/``: stopped by SIGINT at the first point, resumed with ``--resume``, killed with
   SIGKILL (kill -9) at the second point, resumed, SIGINT at the third, resumed to the end.

The points are fractions of the uninterrupted run's wall time. It prints whether the two
``per_example.npz`` are equal array for array and the total CPU seconds (children's user + system)
of the interrupted runs against the uninterrupted one (goal: equal, at most 1.1x).

Usage (from a snapshot copy of the tree)::

    .venv/bin/python benchmarks/evaluate_resume.py             # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/evaluate_resume.py --attacks pgd --chunk-size 50   # quick
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _command(model: str, out: str, args: argparse.Namespace, resume: bool) -> list[str]:
    cmd = [sys.executable, "-m", "robustgrad.cli", "evaluate", "--model", model, "--data",
           "digits", "--attacks", args.attacks, "--eps", "0.1", "--chunk-size",
           str(args.chunk_size), "--out", out, "--no-progress"]
    return cmd + (["--resume"] if resume else [])


def _started(out: str) -> bool:
    """Whether an evaluation in ``out`` committed its manifest (then ``--resume`` continues it;
    a run stopped before that left nothing to resume)."""
    return os.path.isfile(os.path.join(out, "results", "manifest.json"))


def _run(cmd: list[str], stop_after: float | None = None,
         sig: int = signal.SIGINT) -> tuple[int, float, float]:
    """Run ``cmd``; with ``stop_after`` send ``sig`` after that many seconds. Returns the exit
    code, the wall time and the CPU seconds the process used."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    cpu, start = _children_cpu(), time.perf_counter()
    # SIGINT back to its default in the child: a benchmark started in the background by a
    # shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if stop_after is not None:
        try:
            proc.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
    _, err = proc.communicate()
    if proc.returncode not in (0, 130, -signal.SIGKILL, -signal.SIGINT):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    if stop_after is not None and proc.returncode == 0 and time.perf_counter() - start > \
            stop_after + 5:
        print(f"warning: the process outlived its {signal.Signals(sig).name} by more than 5 s "
              "(the signal ignored?)")
    return proc.returncode, time.perf_counter() - start, _children_cpu() - cpu


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", default="autoattack")
    ap.add_argument("--chunk-size", type=int, default=40)
    ap.add_argument("--points", default="0.25,0.5,0.75",
                   help="interruption points as fractions of the uninterrupted wall time")
    args = ap.parse_args(argv)
    from attacks.reference import train_digits_cnn

    work = tempfile.mkdtemp(prefix="evaluate_resume_")
    model = os.path.join(work, "cnn.keras")
    train_digits_cnn(epochs=10).save(model)
    print(f"load {os.getloadavg()[0]:.2f}; model {model}; attacks {args.attacks}; chunks of "
          f"{args.chunk_size}")

    a = os.path.join(work, "A")
    rc, wall_a, cpu_a = _run(_command(model, a, args, resume=False))
    print(f"uninterrupted: {wall_a:.1f} s wall, {cpu_a:.1f} CPU s")

    b = os.path.join(work, "B")
    points = [float(p) for p in args.points.split(",")]
    signals = [signal.SIGINT, signal.SIGKILL, signal.SIGINT]
    wall_b = cpu_b = 0.0
    elapsed = 0.0
    for k, point in enumerate(points):
        sig = signals[k % len(signals)]
        stop = max(point * wall_a - elapsed, 1.0)
        rc, wall, cpu = _run(_command(model, b, args, resume=_started(b)), stop_after=stop,
                             sig=sig)
        wall_b, cpu_b, elapsed = wall_b + wall, cpu_b + cpu, elapsed + wall
        results = os.path.join(b, "results")
        chunks = len([n for n in os.listdir(results) if n.startswith("chunk-")]) \
            if os.path.isdir(results) else 0
        print(f"run {k + 1}: {signal.Signals(sig).name} after {wall:.1f} s (exit {rc}); "
              f"{chunks} chunks committed")
    rc, wall, cpu = _run(_command(model, b, args, resume=_started(b)))
    wall_b, cpu_b = wall_b + wall, cpu_b + cpu
    print(f"resumed to the end: {wall:.1f} s (exit {rc})")

    first = np.load(os.path.join(a, "per_example.npz"))
    second = np.load(os.path.join(b, "per_example.npz"))
    equal = set(first.files) == set(second.files) and all(
        np.array_equal(first[k], second[k]) for k in first.files)
    print(f"per example equal: {equal} ({len(first['label'])} examples, {len(first.files)} arrays)")
    print(f"total work, interrupted / uninterrupted: CPU {cpu_b / cpu_a:.2f}x "
          f"({cpu_b:.1f} / {cpu_a:.1f} s), wall {wall_b / wall_a:.2f}x   goal <= 1.1x")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
