"""Resumable evaluation (issue 35): interrupted at three points, resumed, equal per example.

Trains the small digits CNN, saves it, then runs ``robustgrad evaluate --attacks autoattack
--eps 0.1`` on the digits test split in chunks, as separate processes:

1. uninterrupted, into ``A/`` (its chunk commits timed: the first one, then one every
   ``chunk_s`` seconds on average);
2. into ``B/``: stopped by SIGINT, resumed with ``--resume``, killed with SIGKILL (kill -9),
   resumed, stopped by SIGINT, resumed to the end.

Each stop falls after the run has committed 25/50/75 % of its chunks (``--points``), half a
chunk's time (``0.5 * chunk_s``) into the next one: the mean loss of an interruption at a random
moment, so every stop loses a chunk in flight as well as the process's start-up. It prints
whether the two ``per_example.npz`` are equal array for array, the attack work done twice (the
interrupted chunks), and the total CPU seconds (children's user + system, so every process's
start-up counts) of the interrupted runs against the uninterrupted one (goal: equal, at most
1.1x). ``--model`` evaluates a given digits classifier instead of training the small CNN (a
robust model makes the cascade run every attack on most examples: a longer run), ``--limit``
the first N examples only.

Usage (from a snapshot copy of the tree)::

    .venv/bin/python benchmarks/evaluate_resume.py             # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/evaluate_resume.py --attacks pgd --chunk-size 50   # quick
    # a longer run: a madry-trained classifier (benchmarks/multiworker_accuracy.py saves one),
    # every attack of the cascade on most examples, 40 chunks
    .venv/bin/python benchmarks/evaluate_resume.py --model madry.keras --limit 160 --chunk-size 4
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
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    return cmd + (["--resume"] if resume else [])


def _started(out: str) -> bool:
    """Whether an evaluation in ``out`` committed its manifest (then ``--resume`` continues it;
    a run stopped before that left nothing to resume)."""
    return os.path.isfile(os.path.join(out, "results", "manifest.json"))


def _chunks(out: str) -> int:
    """Chunks committed in ``out/results``."""
    results = os.path.join(out, "results")
    return len([n for n in os.listdir(results) if n.startswith("chunk-")]) \
        if os.path.isdir(results) else 0


def _run(cmd: list[str], out: str, stop_at_chunks: int | None = None, delay: float = 0.0,
         sig: int = signal.SIGINT) -> dict:
    """Run ``cmd`` (an evaluation into ``out``), watching its committed chunks. With
    ``stop_at_chunks``, send ``sig`` ``delay`` seconds after ``out`` holds that many chunks (so
    the process dies with a chunk in flight). Returns the exit code, wall and CPU seconds, the
    seconds at which each chunk was first seen, and the chunks this process committed."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    before = _chunks(out)
    cpu, start = _children_cpu(), time.perf_counter()
    # SIGINT back to its default in the child: a benchmark started in the background by a
    # shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: list[float] = []
    signalled = None
    while proc.poll() is None:
        count = _chunks(out)
        now = time.perf_counter() - start
        seen += [now] * (count - before - len(seen))
        if stop_at_chunks is not None and signalled is None and count >= stop_at_chunks:
            signalled = now + delay
        if signalled is not None and now >= signalled:
            proc.send_signal(sig)
            signalled = float("inf")
        time.sleep(0.05)
    _, err = proc.communicate()
    if proc.returncode not in (0, 130, -signal.SIGKILL, -signal.SIGINT):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    if stop_at_chunks is not None and proc.returncode == 0:
        print(f"warning: the process finished before its {signal.Signals(sig).name}")
    committed = _chunks(out) - before
    seen += [time.perf_counter() - start] * (committed - len(seen))
    return {"rc": proc.returncode, "wall": time.perf_counter() - start,
            "cpu": _children_cpu() - cpu, "seen": seen, "committed": committed}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", default="autoattack")
    ap.add_argument("--chunk-size", type=int, default=40)
    ap.add_argument("--points", default="0.25,0.5,0.75",
                    help="interruption points as fractions of the chunks (the work) done")
    ap.add_argument("--model", default=None,
                    help="a saved digits classifier to evaluate (default: train the small CNN)")
    ap.add_argument("--limit", type=int, default=None,
                    help="evaluate only the first N test examples (default all 450)")
    args = ap.parse_args(argv)

    work = tempfile.mkdtemp(prefix="evaluate_resume_")
    model = args.model
    if model is None:
        from attacks.reference import train_digits_cnn

        model = os.path.join(work, "cnn.keras")
        train_digits_cnn(epochs=10).save(model)
    print(f"load {os.getloadavg()[0]:.2f}; model {model}; attacks {args.attacks}; chunks of "
          f"{args.chunk_size}")

    a = os.path.join(work, "A")
    ra = _run(_command(model, a, args, resume=False), a)
    n_chunks = ra["committed"]
    gaps = np.diff(ra["seen"])
    chunk_s = float(np.mean(gaps)) if len(gaps) else ra["wall"]
    print(f"uninterrupted: {ra['wall']:.1f} s wall, {ra['cpu']:.1f} CPU s; {n_chunks} chunks, "
          f"first committed at {ra['seen'][0]:.1f} s, then one every {chunk_s:.2f} s "
          f"(mean), the last at {ra['seen'][-1]:.1f} s")

    b = os.path.join(work, "B")
    points = [float(p) for p in args.points.split(",")]
    signals = [signal.SIGINT, signal.SIGKILL, signal.SIGINT]
    wall_b = cpu_b = 0.0
    lost = 0
    for k, point in enumerate(points):
        sig = signals[k % len(signals)]
        # stop half a chunk (the mean loss of an interruption at a random moment) after the
        # run has committed this fraction of its chunks
        target = max(int(round(point * n_chunks)), _chunks(b) + 1)
        r = _run(_command(model, b, args, resume=_started(b)), b, stop_at_chunks=target,
                 delay=0.5 * chunk_s, sig=sig)
        wall_b, cpu_b = wall_b + r["wall"], cpu_b + r["cpu"]
        lost += r["rc"] != 0
        first = f"first commit at {r['seen'][0]:.1f} s" if r["seen"] else "no commit"
        print(f"run {k + 1}: {signal.Signals(sig).name} after {r['wall']:.1f} s (exit {r['rc']}), "
              f"{r['cpu']:.1f} CPU s; {first}; {_chunks(b)}/{n_chunks} chunks committed")
    r = _run(_command(model, b, args, resume=_started(b)), b)
    wall_b, cpu_b = wall_b + r["wall"], cpu_b + r["cpu"]
    first = f"first commit at {r['seen'][0]:.1f} s" if r["seen"] else "no commit"
    print(f"resumed to the end: {r['wall']:.1f} s (exit {r['rc']}), {r['cpu']:.1f} CPU s; {first}")

    first_npz = np.load(os.path.join(a, "per_example.npz"))
    second_npz = np.load(os.path.join(b, "per_example.npz"))
    equal = set(first_npz.files) == set(second_npz.files) and all(
        np.array_equal(first_npz[k], second_npz[k]) for k in first_npz.files)
    n = len(first_npz["label"])
    print(f"per example equal: {equal} ({n} examples, {len(first_npz.files)} arrays)")
    print(f"re-done attack work: {lost} chunks interrupted in flight, each about half attacked "
          f"(~{0.5 * lost * args.chunk_size:.0f} of {n} examples' attacks done twice, "
          f"~{0.5 * lost / n_chunks:.1%} of the attack work)")
    print(f"total work, interrupted / uninterrupted: CPU {cpu_b / ra['cpu']:.2f}x "
          f"({cpu_b:.1f} / {ra['cpu']:.1f} s), wall {wall_b / ra['wall']:.2f}x   goal <= 1.1x")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
