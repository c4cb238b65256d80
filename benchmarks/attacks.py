"""Attack benchmarks on a small digits CNN, every figure a ratio to a reference measured in the
same run (issue 3, §5):

1. PGD-k time / (k x one compiled forward+backward input-gradient pass), k = 10 and 40
   (target <= 1.10). The reference is a ``tf.function`` computing the input gradient of the
   summed cross-entropy for the same batch; PGD is timed through the public API, validation
   included.
2. The evaluation cascade's gradient passes against running every attack on every example
   (naive: no early stop; and with early stop), with the worst-case robust accuracy of each
   (target >= 3x fewer, same accuracy).
3. Images per second for each attack.

Usage::

    .venv/bin/python benchmarks/attacks.py            # ~3-4 minutes on 2 CPU cores
    .venv/bin/python benchmarks/attacks.py --quick    # smaller, for a smoke test
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

import attacks  # noqa: E402
from attacks.reference import train_digits_cnn  # noqa: E402
from robustgrad.data import load_digits  # noqa: E402


def timeit(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), ts


def bench_pgd(model, x, y, ks, reps, jit):
    """Interleaved measurements (the machine is shared): each round times 10 single compiled
    gradient passes, a block of k passes, and one PGD-k call; the figure uses the minimum over
    rounds of each (the least-disturbed run), medians are printed too."""
    xt, yt = tf.constant(x), tf.constant(y)

    @tf.function(jit_compile=jit)
    def grad_pass(xb, yb):
        with tf.GradientTape() as tape:
            tape.watch(xb)
            logits = model(xb, training=False)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(yb, tf.int32), logits=logits))
        return tape.gradient(loss, xb)

    def one():
        grad_pass(xt, yt).numpy()

    rows = []
    for k in ks:
        attack = attacks.PGD(eps=0.1, steps=k, clip_min=0.0, clip_max=1.0, jit_compile=jit)

        def run():
            attack(model, x, y, seed=0).numpy()

        def block():
            for _ in range(k):
                g = grad_pass(xt, yt)
            g.numpy()

        for f in (one, block, run):
            f()
            f()
        t1, tb, tp = [], [], []
        for _ in range(reps):
            for _ in range(10):
                t = time.perf_counter()
                one()
                t1.append(time.perf_counter() - t)
            t = time.perf_counter()
            block()
            tb.append(time.perf_counter() - t)
            t = time.perf_counter()
            run()
            tp.append(time.perf_counter() - t)
        rows.append(dict(k=k, pgd=min(tp), one=min(t1), block=min(tb),
                         ratio=min(tp) / (k * min(t1)), ratio_block=min(tp) / min(tb),
                         ratio_median=float(np.median(tp) / (k * np.median(t1)))))
    return rows


def bench_cascade(model, x, y, names, eps, batch_size):
    out = {}
    for mode in ("cascade", "every+early", "every-naive"):
        if mode == "every-naive":
            specs = [(n, _NoEarly(attacks.make_attack(n)[1])) for n in names]
        else:
            specs = list(names)
        t = time.perf_counter()
        rep = attacks.evaluate(model, x, y, specs, eps, batch_size, clip_min=0.0, clip_max=1.0,
                               cascade=(mode == "cascade"), sanity_checks=False, seed=0)
        out[mode] = (rep, time.perf_counter() - t)
    return out


class _NoEarly(attacks.Attack):
    """Wraps an attack so evaluate's early_stop=True request is ignored (the naive baseline)."""

    def __init__(self, inner):
        self.inner = inner
        self.config = dict(inner.config)
        self.name = inner.name
        self.norms = inner.norms
        self.gradient_free = inner.gradient_free

    def run(self, model, x, y=None, **kw):
        kw.pop("early_stop", None)
        if getattr(self.inner, "supports_early_stop", False):
            kw["early_stop"] = False
        return self.inner.run(model, x, y, **kw)


def bench_throughput(model, x, y, names, eps):
    rows = []
    for n in names:
        label, att = attacks.make_attack(n)
        kw = dict(eps=eps, norm="l2" if n == "cw" else "linf", clip_min=0.0, clip_max=1.0,
                  seed=0)
        if n in ("cw", "deepfool"):
            kw["eps"] = None if n == "cw" else eps
            kw["norm"] = "l2"
        if getattr(att, "supports_early_stop", False):
            kw["early_stop"] = False
        att.run(model, x, y, **kw)  # warm-up / trace
        t = time.perf_counter()
        res = att.run(model, x, y, **kw)
        np.asarray(res.x_adv)
        dt = time.perf_counter() - t
        acc = float(np.mean(np.argmax(model(res.x_adv), 1) == y))
        rows.append((label + (" (L2)" if kw["norm"] == "l2" else ""), len(x) / dt, acc,
                     res.gradient_passes / len(x), res.forward_passes / len(x)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--jit", action="store_true", help="also measure jit_compile=True")
    ap.add_argument("--sections", default="1,2,3", help="which figures to measure (default 1,2,3)")
    ap.add_argument("--reps", type=int, default=None, help="rounds for figure 1 (default 15)")
    ap.add_argument("--threads", type=int, default=0,
                    help="TensorFlow intra/inter-op threads (default 0 = TF's choice); 1 makes "
                         "timings far less sensitive to other jobs on a shared machine")
    args = ap.parse_args(argv)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    reps = args.reps or (5 if args.quick else 15)
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s) visible, "
          f"threads intra={tf.config.threading.get_intra_op_parallelism_threads()}")
    data = load_digits()
    (_, _), (xte, yte) = data
    t = time.perf_counter()
    model = train_digits_cnn(epochs=10, data=data)
    clean = float(np.mean(np.argmax(model(xte), 1) == yte))
    print(f"small CNN (2 conv + 2 dense, {model.count_params()} parameters) trained in "
          f"{time.perf_counter() - t:.0f} s; clean test accuracy {clean:.3f}")
    xb = np.concatenate([xte] * (1 + args.batch // len(xte)))[: args.batch]
    yb = np.concatenate([yte] * (1 + args.batch // len(yte)))[: args.batch]

    sections = {int(v) for v in args.sections.split(",")}
    if 1 in sections:
        _section1(model, xb, yb, args, reps)
    if 2 in sections:
        _section2(model, xte, yte, args)
    if 3 in sections:
        _section3(model, xb, yb, args)


def _section1(model, xb, yb, args, reps):
    print(f"\n1. PGD-k / (k x compiled fwd+bwd input-gradient pass), batch {args.batch}, L∞")
    print(f"   {'k':>3}  {'PGD-k ms':>9}  {'1 pass ms':>9}  {'k passes ms':>11}  "
          f"{'PGD-k/(k x pass)':>16}  {'PGD-k/(k-pass block)':>20}  {'(medians)':>9}")
    for jit in ([False, True] if args.jit else [False]):
        for r in bench_pgd(model, xb, yb, (10, 40), reps, jit):
            print(f"   {r['k']:>3}  {r['pgd'] * 1e3:9.2f}  {r['one'] * 1e3:9.3f}  "
                  f"{r['block'] * 1e3:11.2f}  {r['ratio']:16.3f}  {r['ratio_block']:20.3f}  "
                  f"{r['ratio_median']:9.3f}" + ("  jit_compile=True" if jit else "")
                  + ("  OK" if r["ratio"] <= 1.10 else "  ABOVE 1.10"))


def _section2(model, xte, yte, args):
    names = ["fgsm", "pgd", "apgd-ce", "apgd-t", "square"]
    eps = [0.1, 0.15, 0.2]
    n_eval = 200 if args.quick else len(xte)
    print(f"\n2. evaluation of {n_eval} test images, attacks {','.join(names)}, L∞ eps "
          f"{eps}: gradient passes (example rows through forward+backward)")
    res = bench_cascade(model, xte[:n_eval], yte[:n_eval], names, eps, 512)
    base = res["cascade"][0].gradient_passes
    for mode, (rep, secs) in res.items():
        wc = ", ".join(f"{rep.worst_case[e]:.3f}" for e in eps)
        print(f"   {mode:<12} passes {rep.gradient_passes:>9}  ({rep.gradient_passes / base:5.2f}x "
              f"the cascade)  forward {rep.forward_passes:>9}  worst-case acc [{wc}]  "
              f"{secs:6.1f} s")


def _section3(model, xb, yb, args):
    print(f"\n3. images/second per attack, batch {args.batch}, eps 0.1 (L∞ unless noted), no "
          "early stop")
    tnames = ["fgsm", "bim", "mim", "pgd", "apgd-ce", "apgd-dlr", "apgd-t", "deepfool", "cw",
              "square"]
    print(f"   {'attack':<16} {'img/s':>8}  {'robust acc':>10}  {'grad/img':>8}  {'fwd/img':>8}")
    for label, ips, acc, g, f in bench_throughput(model, xb, yb, tnames, 0.1):
        print(f"   {label:<16} {ips:8.0f}  {acc:10.3f}  {g:8.0f}  {f:8.0f}")


if __name__ == "__main__":
    main()
